"""``lonnymq queue create|list|drop|purge|pause|resume|stats``."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

from ..client import Client
from ..errors import QueueNotFound
from . import CommandError, UsageError, _util, common

_DEFAULT_CAP = 100_000
_RATE_WINDOW_MS = 5 * 60_000


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("queue", help="manage queues")
    qs = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    c = qs.add_parser("create", help="create a queue")
    common(c)
    c.add_argument("name")
    c.add_argument(
        "--lease", type=float, default=30, help="default lease (visibility timeout), seconds (default 30)"
    )
    c.add_argument(
        "--max-attempts", type=int, default=5, help="deliveries before a message is dead (default 5)"
    )
    c.add_argument("--dead-letter-queue", help="queue receiving dead messages (default: archive)")
    c.add_argument("--archive", action="store_true", help="keep acknowledged messages in the archive")
    c.add_argument(
        "--retention",
        type=float,
        default=7 * 24 * 3600,
        help="archive retention, seconds (default 604800: 7 days)",
    )
    c.add_argument("--unlogged", action="store_true", help="faster, but emptied by a server crash")
    c.add_argument(
        "--max-payload-bytes",
        type=int,
        default=1024 * 1024,
        help="largest payload accepted (default 1048576: 1 MiB; at most 100 MiB)",
    )
    c.add_argument(
        "--priority-step", type=float, default=1, help="seconds one priority level is worth (default 1)"
    )
    c.add_argument("--if-not-exists", action="store_true", help="succeed if the queue exists (unchanged)")
    c.add_argument(
        "--partitions",
        type=int,
        help="a shard router only: one hot queue over this many shards (docs/sharding.md)",
    )
    c.set_defaults(func=create)

    ls = qs.add_parser("list", help="list queues and their settings")
    common(ls, json=True)
    ls.set_defaults(func=list_)

    d = qs.add_parser("drop", help="drop a queue, its messages and archive")
    common(d)
    d.add_argument("name")
    d.add_argument("--if-exists", action="store_true")
    d.set_defaults(func=drop)

    pu = qs.add_parser(
        "purge", help="delete all messages of a queue (asks first; the archive and dead letters stay)"
    )
    common(pu)
    pu.add_argument("name")
    pu.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    pu.set_defaults(func=purge)

    pa = qs.add_parser(
        "pause", help="stop handing out a queue's messages (sends are still accepted; workers idle)"
    )
    common(pa)
    pa.add_argument("name")
    pa.set_defaults(func=pause)

    re_ = qs.add_parser("resume", help="hand out a paused queue's messages again (wakes its consumers)")
    common(re_)
    re_.add_argument("name")
    re_.set_defaults(func=resume)

    st = qs.add_parser(
        "stats",
        help="exact ready/scheduled/leased/dead counts, and messages sent, acked and failed"
        " (nacked or dead) per minute over the last five minutes",
    )
    common(st, json=True)
    st.add_argument("names", nargs="*", help="queues (default: all)")
    st.add_argument(
        "--exact",
        action="store_true",
        help="count every state row by row (default: only counts that reach --cap are recounted)",
    )
    st.add_argument(
        "--cap",
        type=int,
        default=_DEFAULT_CAP,
        help="the cheap bounded count goes up to this many per state (default 100000)",
    )
    st.set_defaults(func=stats)


@contextlib.contextmanager
def _missing_dead_letter_queue(name: str | None) -> Iterator[None]:
    """A queue created with a dead-letter queue that does not exist: say to create that first
    (the only queue ``create_queue`` looks up)."""
    try:
        yield
    except QueueNotFound as e:
        if name is None:
            raise
        raise CommandError(
            f"dead-letter queue {name!r} does not exist: create it first (`lonnymq queue create {name}`)"
        ) from e


def create(args: argparse.Namespace) -> int:
    with _util.client(args) as c, _missing_dead_letter_queue(args.dead_letter_queue):
        created = c.create_queue(
            args.name,
            lease=args.lease,
            max_attempts=args.max_attempts,
            dead_letter_queue=args.dead_letter_queue,
            archive=args.archive,
            retention=args.retention,
            unlogged=args.unlogged,
            max_payload_bytes=args.max_payload_bytes,
            priority_step=args.priority_step,
            if_not_exists=args.if_not_exists,
            partitions=args.partitions,
        )
    _util.done(
        args,
        f"created queue {args.name!r}" if created else f"queue {args.name!r} exists",
        queue=args.name,
        created=created,
    )
    return 0


def list_(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        queues = c.list_queues()
    _util.emit(
        args,
        queues,
        [
            "name",
            "lease_ms",
            "max_attempts",
            "dead_letter_queue",
            "archive",
            "retention_ms",
            "unlogged",
            "max_payload_bytes",
            "priority_step_ms",
            "paused",
        ],
    )
    return 0


def pause(args: argparse.Namespace) -> int:
    return _set_paused(args, True)


def resume(args: argparse.Namespace) -> int:
    return _set_paused(args, False)


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    with _util.client(args) as c:
        changed = c.pause_queue(args.name) if paused else c.resume_queue(args.name)
    if paused:
        said = f"paused queue {args.name!r}" if changed else f"queue {args.name!r} was paused already"
    else:
        said = f"resumed queue {args.name!r}" if changed else f"queue {args.name!r} was not paused"
    _util.done(args, said, queue=args.name, paused=paused, changed=changed)
    return 0


def drop(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        dropped = c.drop_queue(args.name, if_exists=args.if_exists)
    _util.done(
        args,
        f"dropped queue {args.name!r}" if dropped else f"no queue {args.name!r}",
        queue=args.name,
        dropped=dropped,
    )
    return 0


def purge(args: argparse.Namespace) -> int:
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        m = c.metrics(args.name, conn=conn)  # exact: no cap
        total = m.ready + m.scheduled + m.leased
        question = (
            f"delete all {total} message(s) of queue {args.name!r} ({m.ready} ready, {m.scheduled} scheduled,"
            f" {m.leased} leased)?"
        )
        if not _util.confirm(args, question):
            print("nothing deleted", flush=True)
            return 1
        with conn.transaction():
            # Counted again in the purge's transaction: what was there when it ran.
            m = c.metrics(args.name, conn=conn)
            c.purge_queue(args.name, conn=conn)
    total = m.ready + m.scheduled + m.leased
    _util.done(args, f"purged {total} message(s) of queue {args.name!r}", queue=args.name, purged=total)
    return 0


def stats(args: argparse.Namespace) -> int:
    if not 1 <= args.cap <= _DEFAULT_CAP:
        raise UsageError(f"--cap must be between 1 and {_DEFAULT_CAP}")
    rows = []
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        names = args.names or [q.name for q in c.list_queues()]
        for name in names:
            m = c.metrics(name, cap=args.cap)
            if args.exact or m.ready_at_least or m.scheduled_at_least or m.leased_at_least or m.dead_at_least:
                m = c.metrics(name)  # exact: no cap
            rows.append(m)
        # Throughput: the per-minute counters (sql/stats.sql) of the last five minutes.
        since = int(time.time() * 1000) - _RATE_WINDOW_MS
        recent = c.run(c.ops.stats_minutes(names, since=since)) if names else []
    per_min: dict[str, dict[str, float]] = {}
    for r in recent:
        rate = per_min.setdefault(r.queue, {"sent_per_min": 0.0, "acked_per_min": 0.0, "failed_per_min": 0.0})
        rate["sent_per_min"] += r.sent * 60_000 / _RATE_WINDOW_MS
        rate["acked_per_min"] += r.acked * 60_000 / _RATE_WINDOW_MS
        rate["failed_per_min"] += (r.nacked + r.dead) * 60_000 / _RATE_WINDOW_MS
    zero = {"sent_per_min": 0.0, "acked_per_min": 0.0, "failed_per_min": 0.0}
    out = [{**_util.jsonable(m), **per_min.get(m.queue, zero)} for m in rows]
    _util.emit(
        args,
        out,
        [
            "queue",
            "ready",
            "scheduled",
            "leased",
            "dead",
            "oldest_ready_age_ms",
            "next_scheduled_at",
            "sent_per_min",
            "acked_per_min",
            "failed_per_min",
            "paused",
        ],
        times=("next_scheduled_at",),
    )
    return 0
