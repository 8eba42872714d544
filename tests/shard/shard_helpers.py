"""Helpers of the shard tests."""

from __future__ import annotations

import psycopg


def home(router_dsn: str, queue: str, shards: int = 2) -> int:
    """The shard the router sends ``queue``'s calls to (PL/Proxy: hashtext & (shards - 1))."""
    with psycopg.connect(router_dsn) as conn:
        row = conn.execute("SELECT hashtext(%s) & %s", (queue, shards - 1)).fetchone()
    assert row is not None
    return int(row[0])
