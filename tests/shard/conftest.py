"""A router and two shard clusters from Debian's PostgreSQL 15 (tools/pgcluster.py), started once
for the session with PL/Proxy installed (apt-get when missing, as the README's set-up does) and
stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from shard_helpers import pgcluster, start_clusters

from lonnymq import Client, shard


@dataclass(frozen=True)
class Sharded:
    router: pgcluster.Cluster
    shards: list[pgcluster.Cluster]

    @property
    def dsn(self) -> str:
        return self.router.dsn

    @property
    def shard_dsns(self) -> list[str]:
        return [c.dsn for c in self.shards]


# tryfirst: xdist's own hook reads the groups to pin the tests to processes.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (--dist loadgroup) the tests on the session's clusters run on one
    # worker: one set of clusters. Those that start their own (test_kill_9_of_a_shard: 215 s in a
    # loaded rehearsal) or need none run wherever a worker is free, not in that group's queue.
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and "sharded" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("shard"))


@pytest.fixture(scope="session")
def sharded() -> Iterator[Sharded]:
    """A router over two shards, initialised with ``lonnymq.shard.init``."""
    with ExitStack() as stack:
        router, *shards = start_clusters(3, stack)
        shard.init(router.dsn, [c.dsn for c in shards])
        yield Sharded(router, shards)


@pytest.fixture
def with_pgmq(sharded: Sharded) -> Iterator[Sharded]:
    """The router re-made over shards with the pgmq facade; the facade gone again after."""
    shard.init(sharded.dsn, sharded.shard_dsns, pgmq=True)
    try:
        yield sharded
    finally:
        for dsn in sharded.shard_dsns:
            with Client(dsn, pool_size=1) as c:
                c.uninstall_pgmq()
        shard.init(sharded.dsn, sharded.shard_dsns)
