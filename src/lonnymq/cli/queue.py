"""``lonnymq queue create|list|drop|purge|stats``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import psycopg
from psycopg import sql

from ..client import Client
from ..errors import QueueNotFound
from . import UsageError, _util, common

# Exact counts of one queue on one snapshot, by the same definitions as queue_metrics (ready:
# due now, an expired lease included; leased: held; scheduled: due later, not held). queue_metrics
# stops counting at its cap to stay cheap; these scan the queue's rows.
_EXACT_COUNTS = """
WITH n AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms),
     q AS (SELECT id FROM {schema}.queue WHERE name = %(name)s)
SELECT (SELECT id FROM q),
       count(*) FILTER (WHERE m.dequeue_at <= n.now_ms),
       count(*) FILTER (WHERE m.dequeue_at > n.now_ms AND NOT m.leased),
       count(*) FILTER (WHERE m.dequeue_at > n.now_ms AND m.leased),
       (SELECT count(*) FROM {schema}.archive a WHERE a.queue_id = (SELECT id FROM q) AND a.status = 'dead')
  FROM n LEFT JOIN {schema}.message m ON m.queue_id = (SELECT id FROM q)
"""
_DEFAULT_CAP = 100_000


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("queue", help="manage queues")
    qs = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    c = qs.add_parser("create", help="create a queue")
    common(c)
    c.add_argument("name")
    c.add_argument("--lease", type=float, default=30, help="default lease (visibility timeout), seconds")
    c.add_argument("--max-attempts", type=int, default=5)
    c.add_argument("--dead-letter-queue", help="queue receiving dead messages (default: archive)")
    c.add_argument("--archive", action="store_true", help="keep acknowledged messages in the archive")
    c.add_argument("--retention", type=float, default=7 * 24 * 3600, help="archive retention, seconds")
    c.add_argument("--unlogged", action="store_true", help="faster, but emptied by a server crash")
    c.add_argument("--max-payload-bytes", type=int, default=1024 * 1024)
    c.add_argument("--priority-step", type=float, default=1, help="seconds one priority level is worth")
    c.add_argument("--if-not-exists", action="store_true")
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

    st = qs.add_parser("stats", help="exact ready/scheduled/leased/dead counts")
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


def create(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
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
        ],
    )
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


def exact_counts(conn: psycopg.Connection[Any], schema: str, name: str) -> tuple[int, int, int, int]:
    """(ready, scheduled, leased, dead) of queue ``name``, counted row by row."""
    query = sql.SQL(_EXACT_COUNTS).format(schema=sql.Identifier(schema))
    row = conn.execute(query, {"name": name}).fetchone()
    if row is None or row[0] is None:
        raise QueueNotFound(f"queue {name!r} does not exist")
    return int(row[1]), int(row[2]), int(row[3]), int(row[4])


def purge(args: argparse.Namespace) -> int:
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        ready, scheduled, leased, _dead = exact_counts(conn, c.schema, args.name)
        total = ready + scheduled + leased
        question = (
            f"delete all {total} message(s) of queue {args.name!r} ({ready} ready, {scheduled} scheduled,"
            f" {leased} leased)?"
        )
        if not _util.confirm(args, question):
            print("nothing deleted", flush=True)
            return 1
        with conn.transaction():
            # Counted again in the purge's transaction: what was there when it ran.
            ready, scheduled, leased, _dead = exact_counts(conn, c.schema, args.name)
            c.purge_queue(args.name, conn=conn)
    total = ready + scheduled + leased
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
            if args.exact or args.cap in (m.ready, m.scheduled, m.leased, m.dead):
                ready, scheduled, leased, dead = exact_counts(conn, c.schema, name)
                m = dataclasses.replace(
                    m,
                    ready=ready,
                    scheduled=scheduled,
                    leased=leased,
                    dead=dead,
                    ready_at_least=False,
                    scheduled_at_least=False,
                    leased_at_least=False,
                    dead_at_least=False,
                )
            rows.append(m)
    _util.emit(
        args,
        rows,
        ["queue", "ready", "scheduled", "leased", "dead", "oldest_ready_age_ms", "next_scheduled_at"],
        times=("next_scheduled_at",),
    )
    return 0
