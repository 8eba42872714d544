"""Helpers of the shard tests."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster

#: No plpgsql_check preload: these clusters only run the core and PL/Proxy.
SETTINGS = {"shared_preload_libraries": "''"}


def start_clusters(
    n: int, stack: ExitStack, settings: dict[str, str] | None = None
) -> list[pgcluster.Cluster]:
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")
    pgcluster.ensure_plproxy()
    conf = settings or SETTINGS
    return [stack.enter_context(pgcluster.temporary_cluster(conf, install=False)) for _ in range(n)]


def home(router_dsn: str, queue: str, shards: int = 2) -> int:
    """The shard the router sends ``queue``'s calls to (PL/Proxy: hashtext & (shards - 1))."""
    with psycopg.connect(router_dsn) as conn:
        row = conn.execute("SELECT hashtext(%s) & %s", (queue, shards - 1)).fetchone()
    assert row is not None
    return int(row[0])
