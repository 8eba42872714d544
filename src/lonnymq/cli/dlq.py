"""``lonnymq dlq list|requeue|purge``: dead messages kept in the archive."""

from __future__ import annotations

import argparse

from . import _util, common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dlq", help="inspect and requeue dead messages")
    ds = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = ds.add_parser("list", help="list dead messages of a queue")
    common(ls, json=True)
    ls.add_argument("queue")
    ls.add_argument("-n", type=int, default=100)
    ls.add_argument("--after-id", type=int, default=0)
    ls.set_defaults(func=list_)
    rq = ds.add_parser("requeue", help="put dead messages back (all, or --id ...)")
    common(rq)
    rq.add_argument("queue")
    rq.add_argument("--id", type=int, action="append", dest="ids")
    rq.set_defaults(func=requeue)
    pu = ds.add_parser("purge", help="delete the dead messages of a queue")
    common(pu)
    pu.add_argument("queue")
    pu.set_defaults(func=purge)


def list_(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        dead = c.dead_letters(args.queue, args.n, after_id=args.after_id)
    _util.emit(
        args, dead, ["id", "attempts", "kind", "key", "last_error", "payload"], title=f"{args.queue} (dead)"
    )
    return 0


def requeue(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        n = c.requeue_dead(args.queue, args.ids)
    print(f"requeued {n} dead message(s) into {args.queue!r}")
    return 0


def purge(args: argparse.Namespace) -> int:
    with _util.client(args) as c:
        n = c.purge_dead(args.queue)
    print(f"deleted {n} dead message(s) of {args.queue!r}")
    return 0
