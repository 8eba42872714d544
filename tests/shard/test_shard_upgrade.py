"""``shard upgrade`` (and ``shard init`` run again): the router rebuilt from its own shards
while a producer and a consumer call through it; moved queues, partitioned queues and messages
survive; a router transaction that holds the shard map makes it give up typed, unchanged."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from shard_helpers import Traffic, drain, home, map_version

from lonnymq import Client, errors, shard

pytestmark = [pytest.mark.once, pytest.mark.slow]


def test_upgrade_keeps_queues_while_in_use(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    plain, hot, moved = "upg_plain", "upg_hot", "upg_moved"
    with Client(r) as c:
        c.create_queue(plain)
        c.create_queue(hot, partitions=2)
        c.create_queue(moved)
        c.send_batch(hot, [{"n": n} for n in range(5)])
        c.send_batch(moved, [{"n": n} for n in range(3)])
    target = 1 - home(r, moved)
    shard.move(r, moved, target)
    # A router made by an older lonnymq lacks a function of today's core: here, stats_totals.
    with psycopg.connect(r) as conn:
        conn.execute("DROP FUNCTION lonnymq.stats_totals(text[])")
    with Client(r) as c, pytest.raises(errors.NotInstalled):
        c.run(c.ops.stats_totals([plain]))
    before = map_version(r)
    with Traffic(r, plain) as traffic:
        traffic.progress(sent=5)
        result = shard.upgrade(r)
        during = len(traffic.sent)
        traffic.progress(sent=1)  # a send after the upgrade (waited for, not slept)
    assert not traffic.errors, traffic.errors[:3]
    assert len(traffic.sent) > during, "no send after the upgrade"
    assert result.healthy, result
    assert map_version(r) > before  # direct clients re-read the map
    assert result.overrides[moved] == target and sorted(result.partitioned[hot]) == [0, 1]
    with Client(r) as c:
        [totals] = c.run(c.ops.stats_totals([hot]))  # the function is back, summed over partitions
        assert totals.sent == 5
        assert c.metrics(hot).ready == 5 and c.metrics(moved).ready == 3
    acked = {n for n, _ in traffic.acked}
    left = drain(r, plain)
    assert len(left) == len(set(left)) and not acked & set(left)
    assert acked | set(left) == set(traffic.sent), "lost"
    with Client(r) as c:
        for q in (plain, hot, moved):
            c.drop_queue(q)


def test_upgrade_gives_up_behind_a_held_map_and_cli(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    before = map_version(r)
    with psycopg.connect(r) as holder:  # e.g. a queue_create stuck in an open transaction
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('lonnymq/map'), 0)")
        with pytest.raises(shard.InitBlocked, match="gave up after 2 attempt"):
            shard.upgrade(r, lock_timeout=0.2, attempts=2, retry_delay=0.05)
        holder.rollback()
    assert map_version(r) == before  # unchanged
    out = subprocess.run(
        [sys.executable, "-m", "lonnymq", "shard", "upgrade", r],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "upgraded" in out.stdout and "shard 1" in out.stdout
    assert map_version(r) == before + 1
