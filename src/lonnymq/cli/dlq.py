"""``lonnymq dlq list|requeue|purge``: the dead messages of a queue, wherever they went.

A queue without a dead-letter queue keeps its dead messages in its archive (status ``dead``);
a queue with one moves them into that queue as live messages whose ``lonnymq_dead_letter``
header names the queue they died in. ``dlq list`` shows both.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..client import Client
from ..client.ops import MAX_LIMIT
from ..errors import QueueNotFound
from . import _util, common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dlq", help="inspect and requeue dead messages")
    ds = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = ds.add_parser(
        "list",
        help="list dead messages of a queue (its archive, and its dead-letter queue if it has one)",
    )
    common(ls)
    ls.add_argument("queue")
    ls.add_argument("-n", type=int, default=100, help="at most this many of each (default 100)")
    ls.add_argument("--after-id", type=int, default=0, help="archived dead messages after this id")
    ls.set_defaults(func=list_)
    rq = ds.add_parser("requeue", help="put dead messages of the archive back (all, or --id ...)")
    common(rq)
    rq.add_argument("queue")
    rq.add_argument("--id", type=int, action="append", dest="ids")
    rq.set_defaults(func=requeue)
    pu = ds.add_parser("purge", help="delete the dead messages of a queue's archive")
    common(pu)
    pu.add_argument("queue")
    pu.set_defaults(func=purge)


def list_(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    with _util.connection(args) as conn, Client(conn, schema=_util.schema(args)) as c:
        queues = {q.name: q for q in c.list_queues()}
        if args.queue not in queues:
            raise QueueNotFound(f"queue {args.queue!r} does not exist")
        for d in c.dead_letters(args.queue, args.n, after_id=args.after_id):
            rows.append(
                {
                    "in": "archive",
                    "id": d.id,
                    "died_as": d.id,
                    "attempts": d.attempts,
                    "kind": d.kind,
                    "key": d.key,
                    "last_error": d.last_error,
                    "dead_since": d.archived_at,
                    "payload": _util.jsonable(d.payload),
                }
            )
        dlq = queues[args.queue].dead_letter_queue
        if dlq is not None:
            # A dead-letter queue shared by several queues holds the others' dead too: look
            # further into it and keep ours (named by the header the move adds).
            shared = sum(1 for q in queues.values() if q.dead_letter_queue == dlq) > 1
            found = 0
            for m in c.peek(dlq, MAX_LIMIT if shared else args.n):
                origin = (m.headers or {}).get("lonnymq_dead_letter") or {}
                if origin.get("queue") != args.queue or found >= args.n:
                    continue
                found += 1
                rows.append(
                    {
                        "in": dlq,
                        "id": m.id,
                        "died_as": origin.get("id"),
                        "attempts": origin.get("attempts"),
                        "kind": m.kind,
                        "key": origin.get("key"),
                        "last_error": m.last_error,
                        "dead_since": m.enqueued_at,
                        "payload": _util.jsonable(m.payload),
                    }
                )
    title = f"{args.queue}: dead messages" + (f" (its dead-letter queue is {dlq!r})" if dlq else "")
    _util.emit(
        args,
        rows,
        ["in", "id", "died_as", "attempts", "kind", "key", "last_error", "dead_since", "payload"],
        title=title,
        times=("dead_since",),
    )
    return 0


def requeue(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        n = c.requeue_dead(args.queue, args.ids)
    _util.done(args, f"requeued {n} dead message(s) into {args.queue!r}", queue=args.queue, requeued=n)
    return 0


def purge(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        n = c.purge_dead(args.queue)
    _util.done(args, f"deleted {n} dead message(s) of {args.queue!r}", queue=args.queue, deleted=n)
    return 0
