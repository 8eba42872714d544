"""``lonnymq archive list``: the archived messages of a queue (acked with archiving on, dead,
cancelled with ``--archive``), by id, a page at a time."""

from __future__ import annotations

import argparse
import re
from datetime import datetime

from ..client import Client
from ..client.ops import MAX_LIMIT
from . import UsageError, _util, common

_COLUMNS = ["id", "status", "attempts", "kind", "key", "channel", "last_error", "archived_at", "payload"]
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("archive", help="read the archive of a queue")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = acts.add_parser("list", help="list archived messages by id (--after-id for the next page)")
    common(ls)
    ls.add_argument("queue")
    ls.add_argument(
        "--since",
        help="archived at or after: an ISO 8601 time (local unless it has an offset), epoch ms,"
        " or a duration ago (90s, 15m, 2h, 7d)",
    )
    ls.add_argument("--until", help="archived before (same forms as --since)")
    ls.add_argument("--after-id", type=int, help="the last id of the previous page")
    ls.add_argument("--limit", type=int, default=100, help=f"at most this many (1..{MAX_LIMIT}, default 100)")
    ls.add_argument("--status", choices=["acked", "dead", "cancelled"], help="only this outcome")
    ls.set_defaults(func=list_)


def parse_time(text: str | None, option: str, now_ms: int) -> int | None:
    """An ISO 8601 time, epoch milliseconds or a duration ago, as epoch milliseconds."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    match = _DURATION.match(text)
    if match:
        return now_ms - round(float(match[1]) * _UNIT_MS[match[2]])
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: give an ISO 8601 time, epoch ms or a duration like 15m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time
    return round(moment.timestamp() * 1000)


def list_(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be between 1 and {MAX_LIMIT}, got {args.limit}")
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        now = _util.db_now_ms(conn)
        rows = c.archived(
            args.queue,
            after_id=args.after_id,
            since=parse_time(args.since, "--since", now),
            until=parse_time(args.until, "--until", now),
            limit=args.limit,
            status=args.status,
        )
    _util.emit(args, rows, _COLUMNS, title=f"{args.queue} (archive)", times=["archived_at"])
    return 0
