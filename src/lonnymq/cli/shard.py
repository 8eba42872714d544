"""``lonnymq shard init|upgrade|status|move|add|prune``: a PL/Proxy router over several LonnyMQ servers
(docs/sharding.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from . import _util, common

if TYPE_CHECKING:  # imported by each command: every other lonnymq command would load it too
    from .. import shard


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("shard", help="queues sharded over several servers through a PL/Proxy router")
    ss = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    i = ss.add_parser(
        "init",
        help="migrate the shards and (re)build the router's functions and shard map",
        description="Migrates each shard, installs plproxy and the shard map in the router and"
        " generates its functions from the installed core. The number of shards must be a power"
        " of two; their order is the shard map (keep it). Safe to run again (after an upgrade).",
    )
    common(i)
    i.add_argument("router", metavar="ROUTER_DSN", help="the router's database (clients connect here)")
    i.add_argument("shards", metavar="SHARD_DSN", nargs="+", help="the shards' databases, in order")
    i.add_argument(
        "--pgmq",
        action="store_true",
        help="also install the pgmq facade on the shards and proxy it on the router (pgmq clients)",
    )
    i.set_defaults(func=init)

    u = ss.add_parser(
        "upgrade",
        help="after upgrading lonnymq: migrate the router's shards and rebuild its functions",
        description="Runs `shard init` again with the router's own shards (read from the router:"
        " give a superuser's DSN) and the pgmq facade if the router proxies it. Moved queues,"
        " partitioned queues and messages are kept; clients keep calling (the rebuild waits at"
        " most --lock-timeout per attempt for the router's locks).",
    )
    common(u)
    u.add_argument(
        "router", metavar="ROUTER_DSN", nargs="?", help="the router (default: --dsn / $LONNYMQ_DSN ...)"
    )
    u.add_argument(
        "--lock-timeout", type=float, default=2.0, metavar="SECONDS", help="per attempt (default 2)"
    )
    u.add_argument("--attempts", type=int, default=5, help="attempts before giving up (default 5)")
    u.set_defaults(func=upgrade)

    st = ss.add_parser("status", help="the router's shards, their health and their queues")
    common(st)
    st.add_argument(
        "router", metavar="ROUTER_DSN", nargs="?", help="the router (default: --dsn / $LONNYMQ_DSN ...)"
    )
    st.set_defaults(func=status)

    m = ss.add_parser(
        "move",
        help="move a queue with all its messages to another shard, while it is in use",
        description="Moves QUEUE (and the queues tied to it by dead-letter links) with its live"
        " messages, leases, keys, channels and dead letters to SHARD, exactly once, while clients"
        " keep calling through the router: the queue's calls pause for the copy. A partitioned"
        " queue moves one partition at a time (--partition K), to a shard holding none of its"
        " partitions, with the partitions on its shard of the partitioned queues that"
        " dead-letter into it. The router is --dsn / $LONNYMQ_DSN.",
    )
    common(m)
    m.add_argument("queue", metavar="QUEUE")
    m.add_argument("shard", metavar="SHARD", help="the target: its index in `shard status` or its DSN")
    m.add_argument(
        "--partition",
        type=int,
        metavar="K",
        help="a partitioned queue's partition to move (0..N-1, as `shard status` numbers them)",
    )
    m.add_argument(
        "--archive",
        action="store_true",
        help="move the archive of acked/cancelled messages too (else dropped)",
    )
    m.add_argument(
        "--lock-timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="longest wait for any lock per attempt, so the longest pause of the queue (default 1)",
    )
    m.add_argument("--attempts", type=int, default=5, help="attempts before giving up (default 5)")
    m.set_defaults(func=move)

    a = ss.add_parser(
        "add",
        help="double the shard count and move the queues whose hash moves, while in use",
        description="Migrates the new shards (as many as the router has, empty), adds them to"
        " the router's shard map (queues whose hash moves stay reachable where they are) and"
        " moves those queues to their new shard one by one (as `shard move`), then the partitions"
        " of partitioned queues whose place under the new count is a new shard. Run it again with"
        " the same shards to retry queues that could not move. The router is --dsn / $LONNYMQ_DSN.",
    )
    common(a)
    a.add_argument("shards", metavar="SHARD_DSN", nargs="+", help="the new shards' databases, in order")
    a.add_argument(
        "--lock-timeout", type=float, default=1.0, metavar="SECONDS", help="as for move (default 1)"
    )
    a.add_argument("--attempts", type=int, default=5, help="attempts per lock, as for move (default 5)")
    a.set_defaults(func=add)

    pr = ss.add_parser(
        "prune",
        help="forget moved partitions' old shards once no message holds an id they made",
        description="For each partitioned queue (or QUEUE), drops from the router's moved_ids the"
        " shards whose ids no message of the partition holding them has any more (live, archived,"
        " in ack's settle memory or a send's idempotency record), so such a shard may take another"
        " partition of the queue. `shard move` does it by itself when it needs to. The router is"
        " --dsn / $LONNYMQ_DSN.",
    )
    common(pr)
    pr.add_argument("queue", metavar="QUEUE", nargs="?", help="only this partitioned queue")
    pr.set_defaults(func=prune)


def init(args: argparse.Namespace) -> int:
    from .. import shard

    result = shard.init(_util.check_dsn(args.router), args.shards, schema=_util.schema(args), pgmq=args.pgmq)
    _print(args, result, f"router {shard.admin.where(args.router)} over {len(result.shards)} shard(s)")
    return 0 if result.healthy else 1


def upgrade(args: argparse.Namespace) -> int:
    from .. import shard

    router = _util.check_dsn(args.router) if args.router else _util.resolve(args)
    result = shard.upgrade(
        router, schema=_util.schema(args), lock_timeout=args.lock_timeout, attempts=args.attempts
    )
    _print(args, result, f"router {shard.admin.where(router)} upgraded, schema version {result.version}")
    return 0 if result.healthy else 1


def status(args: argparse.Namespace) -> int:
    from .. import shard

    router = _util.check_dsn(args.router) if args.router else _util.resolve(args)
    result = shard.status(router, schema=_util.schema(args))
    _print(args, result, f"router {shard.admin.where(router)}, schema version {result.version}")
    return 0 if result.healthy else 1


def move(args: argparse.Namespace) -> int:
    from .. import shard

    router = _util.resolve(args)
    r = shard.move(
        router,
        args.queue,
        args.shard,
        schema=_util.schema(args),
        archive=args.archive,
        lock_timeout=args.lock_timeout,
        attempts=args.attempts,
        partition=args.partition,
    )
    if args.json:
        _util.print_json(r)
        return 0
    what = _moved(r)
    print(
        f"moved {what} from shard {r.source} to shard {r.target}:"
        f" {r.rows.get('message', 0)} message(s), {r.rows.get('archive', 0)} archived/dead,"
        f" {r.rows.get('channel', 0)} channel(s); paused {r.pause_ms:.0f} ms"
        f" (attempt {r.attempts})"
    )
    return 0


def prune(args: argparse.Namespace) -> int:
    from .. import shard

    router = _util.resolve(args)
    pruned = shard.prune_moved_ids(router, args.queue, schema=_util.schema(args))
    if args.json:
        _util.print_json(pruned)
        return 0
    for q, shards in sorted(pruned.items()):
        print(f"{q}: forgot the ids of shard(s) {', '.join(map(str, shards))}")
    if not pruned:
        print("nothing to forget")
    return 0


def _moved(r: shard.MoveResult) -> str:
    """What a move moved: its queues, or the partitions (a partition and those moved with it)."""
    if r.partitions is None:
        return ", ".join(r.queues)
    return ", ".join(f"partition {k} of {q}" for q, k in r.partitions.items())


def add(args: argparse.Namespace) -> int:
    from .. import shard

    router = _util.resolve(args)
    r = shard.add(
        router,
        args.shards,
        schema=_util.schema(args),
        lock_timeout=args.lock_timeout,
        attempts=args.attempts,
    )
    if args.json:
        _util.print_json(r)
        return 0 if not r.failed else 1
    print(f"router {shard.admin.where(router)}: {r.before} -> {r.after} shards")
    for m in r.moved:
        print(
            f"  moved {_moved(m)}: shard {m.source} -> {m.target},"
            f" {m.rows.get('message', 0)} message(s), paused {m.pause_ms:.0f} ms"
        )
    for q, e in sorted(r.failed.items()):
        print(f"  NOT MOVED {q} (still served from where it was): {e}")
    return 0 if not r.failed else 1


def _print(args: argparse.Namespace, result: shard.RouterStatus, title: str) -> None:
    if args.json:
        _util.print_json({**_util.jsonable(result), "degraded": result.degraded})
        return
    print(title)
    for s in result.shards:
        health = "ok" if s.healthy else f"UNHEALTHY: {s.error}"
        print(f"  shard {s.index} {s.where}: {health}; {len(s.queues)} queue(s)")
        if s.queues:
            print(f"    queues: {', '.join(s.queues)}")
        moved = sorted(q for q, i in result.overrides.items() if i == s.index)
        if moved:
            print(f"    moved here (routed by override): {', '.join(moved)}")
        parts = sorted(
            f"{q} (partition {p.index(s.index)} of {len(p)})"
            for q, p in result.partitioned.items()
            if s.index in p
        )
        if parts:
            print(f"    partitioned queues: {', '.join(parts)}")
        if s.misplaced:
            print(f"    misplaced (the router sends their calls elsewhere): {', '.join(s.misplaced)}")
    for q, down in sorted(result.degraded.items()):
        print(
            f"  partitioned queue {q}: partition(s) on shard(s) {', '.join(map(str, down))} unreachable;"
            " takes serve the others, its sends and settles there fail"
        )
