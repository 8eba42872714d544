"""Queues sharded over several PostgreSQL servers through PL/Proxy (docs/sharding.md).

A router database holds, for every public function of the core, a PL/Proxy function with the
same signature that runs the call on the shard holding the queue (``hashtext(queue)`` over a
power-of-two number of shards) or on every shard with the results merged. Clients connect to the
router as to any LonnyMQ database; a call runs in the shard's own transaction, not the caller's.

    from lonnymq import shard
    shard.init(router_dsn, [shard0_dsn, shard1_dsn])
    print(shard.status(router_dsn))
    shard.upgrade(router_dsn)   # after upgrading lonnymq: shards migrated, router rebuilt
    shard.move(router_dsn, "orders", 1)   # the queue, with its messages, to shard 1
    shard.add(router_dsn, [shard2_dsn, shard3_dsn])   # 2 -> 4 shards, queues and partitions rehomed
    shard.prune_moved_ids(router_dsn)   # forget moved partitions' old ids once none is left

A client may skip the router's hop for the calls of one queue: ``Client(router_dsn,
direct=True)`` reads the shard map from the router and calls the queue's shard itself
(:mod:`lonnymq.client.direct`).
"""

from .add import AddResult, add
from .admin import InitBlocked, RouterStatus, ShardStatus, init, shard_dsns, status, upgrade
from .catalog import ROUTER_MARKER, NoRoute
from .move import MoveBlocked, MoveError, MoveResult, move, prune_moved_ids

__all__ = [
    "ROUTER_MARKER",
    "AddResult",
    "InitBlocked",
    "MoveBlocked",
    "MoveError",
    "MoveResult",
    "NoRoute",
    "RouterStatus",
    "ShardStatus",
    "add",
    "init",
    "move",
    "prune_moved_ids",
    "shard_dsns",
    "status",
    "upgrade",
]
