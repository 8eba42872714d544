"""``lonnymq shard init|status``: a PL/Proxy router over several LonnyMQ servers
(docs/sharding.md)."""

from __future__ import annotations

import argparse

from .. import shard
from . import _util, common


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
    i.set_defaults(func=init)

    st = ss.add_parser("status", help="the router's shards, their health and their queues")
    common(st)
    st.add_argument(
        "router", metavar="ROUTER_DSN", nargs="?", help="the router (default: --dsn / $LONNYMQ_DSN ...)"
    )
    st.set_defaults(func=status)


def init(args: argparse.Namespace) -> int:
    result = shard.init(args.router, args.shards, schema=_util.schema(args))
    _print(args, result, f"router {shard.admin.where(args.router)} over {len(result.shards)} shard(s)")
    return 0 if result.healthy else 1


def status(args: argparse.Namespace) -> int:
    router = args.router or _util.resolve(args)
    result = shard.status(router, schema=_util.schema(args))
    _print(args, result, f"router {shard.admin.where(router)}, schema version {result.version}")
    return 0 if result.healthy else 1


def _print(args: argparse.Namespace, result: shard.RouterStatus, title: str) -> None:
    if args.json:
        _util.print_json(result)
        return
    print(title)
    for s in result.shards:
        health = "ok" if s.healthy else f"UNHEALTHY: {s.error}"
        print(f"  shard {s.index} {s.where}: {health}; {len(s.queues)} queue(s)")
        if s.queues:
            print(f"    queues: {', '.join(s.queues)}")
        if s.misplaced:
            print(f"    misplaced (the router sends their calls elsewhere): {', '.join(s.misplaced)}")
