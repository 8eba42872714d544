"""``lonnymq msg get|cancel``: one message by id or key, read without taking it, or cancelled.

``msg get`` exits 1 when no live message matches; ``msg cancel`` exits 1 when nothing was live
to cancel (so scripts can tell), 0 otherwise.
"""

from __future__ import annotations

import argparse

from . import CommandError, _util, common

_COLUMNS = ["id", "status", "attempt", "token", "priority", "kind", "key", "channel", "payload"]
_TIMES = ["scheduled_at", "enqueued_at", "lease_until"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("msg", help="read or cancel one message by id or key")
    ms = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    g = ms.add_parser("get", help="show a live message (ready, scheduled or leased) without taking it")
    common(g)
    g.add_argument("queue")
    which = g.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=int, help="the message id")
    which.add_argument("--key", help="the message key")
    g.set_defaults(func=get)

    c = ms.add_parser(
        "cancel",
        help="remove live messages, even leased ones (their holder's ack then fails with LeaseLost)",
    )
    common(c)
    c.add_argument("queue")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=int, action="append", dest="ids", help="a message id (repeatable)")
    which.add_argument("--key", help="the message key")
    c.add_argument("--archive", action="store_true", help="keep them in the archive as 'cancelled'")
    c.set_defaults(func=cancel)


def get(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        m = c.get(args.queue, id=args.id, key=args.key)
    if m is None:
        what = f"id {args.id}" if args.id is not None else f"key {args.key!r}"
        raise CommandError(f"no live message with {what} in queue {args.queue!r}")
    _util.emit(args, [m], [*_COLUMNS, *_TIMES], title=args.queue, times=_TIMES)
    return 0


def cancel(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        if args.key is not None:
            removed = [args.key] if c.cancel(args.queue, key=args.key, archive=args.archive) else []
        else:
            removed = list(c.cancel(args.queue, ids=args.ids, archive=args.archive))
    where = " into the archive" if args.archive else ""
    _util.done(
        args,
        f"cancelled {len(removed)} message(s) of {args.queue!r}{where}"
        + (f": {', '.join(map(str, removed))}" if removed else " (none was live)"),
        queue=args.queue,
        cancelled=removed,
    )
    return 0 if removed else 1
