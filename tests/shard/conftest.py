"""A router and two shard clusters from Debian's PostgreSQL 15 (tools/pgcluster.py), started once
for the session with PL/Proxy installed (apt-get when missing, as the README's set-up does) and
stopped afterwards."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from lonnymq import shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster

#: No plpgsql_check preload: these clusters only run the core and PL/Proxy.
SETTINGS = {"shared_preload_libraries": "''"}


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


def start_clusters(n: int, stack: ExitStack) -> list[pgcluster.Cluster]:
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")
    pgcluster.ensure_plproxy()
    return [stack.enter_context(pgcluster.temporary_cluster(SETTINGS, install=False)) for _ in range(n)]


@pytest.fixture(scope="session")
def sharded() -> Iterator[Sharded]:
    """A router over two shards, initialised with ``lonnymq.shard.init``."""
    with ExitStack() as stack:
        router, *shards = start_clusters(3, stack)
        shard.init(router.dsn, [c.dsn for c in shards])
        yield Sharded(router, shards)
