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


def test_upgrade_marks_the_partitioned_queues_of_an_older_router(sharded) -> None:  # type: ignore[no-untyped-def]
    """A router made before partitioned queues were marked in shard_route (its CHECK shard >= 0,
    no marks; a name's override left from a plain queue that was moved, then dropped, next to
    the partitioned queue of that name) is upgraded: the partitioned queues marked (a plain
    queue's route reads shard_route only), the overrides kept, and a dropped partitioned queue's
    mark goes with it."""
    r = sharded.dsn
    plain, hot, reborn, moved = "upg_old_plain", "upg_old_hot", "upg_old_reborn", "upg_old_moved"
    with Client(r) as c:
        c.create_queue(plain)
        c.create_queue(moved)
        c.create_queue(hot, partitions=2)
        c.create_queue(reborn, partitions=2)
    target = 1 - home(r, moved)
    shard.move(r, moved, target)
    with psycopg.connect(r) as conn:  # the older router's layout
        conn.execute("DELETE FROM lonnymq.shard_route WHERE shard < 0")
        conn.execute(
            "INSERT INTO lonnymq.shard_route (queue, shard) VALUES (%s, %s)", (reborn, 1 - home(r, reborn))
        )
        conn.execute("ALTER TABLE lonnymq.shard_route DROP CONSTRAINT shard_route_shard_check")
        conn.execute(
            "ALTER TABLE lonnymq.shard_route ADD CONSTRAINT shard_route_shard_check CHECK (shard >= 0)"
        )
    result = shard.upgrade(r)
    assert result.healthy, result
    assert {q: result.overrides.get(q) for q in (plain, moved, hot, reborn)} == {
        plain: None,
        moved: target,
        hot: None,
        reborn: None,
    }
    assert sorted(result.partitioned[hot]) == [0, 1] and sorted(result.partitioned[reborn]) == [0, 1]
    with psycopg.connect(r, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT queue, shard FROM lonnymq.shard_route WHERE queue = ANY(%s) ORDER BY queue",
            ([plain, moved, hot, reborn],),
        ).fetchall()
        assert rows == [(hot, -1), (moved, target), (reborn, -1)]
        for q in (hot, reborn):  # routed as partitioned: unkeyed sends take turns
            got = {
                conn.execute("SELECT lonnymq._send_shard(%s, NULL, NULL)", (q,)).fetchone() for _ in range(4)
            }
            assert got == {(0,), (1,)}
            with pytest.raises(psycopg.Error, match="partitioned"):
                conn.execute("SELECT lonnymq._shard_of(%s)", (q,))
        row = conn.execute("SELECT lonnymq._shard_of(%s) & 1", (moved,)).fetchone()
        assert row == (target,)
    with Client(r) as c:
        c.drop_queue(hot)
        with psycopg.connect(r) as conn:
            assert conn.execute("SELECT FROM lonnymq.shard_route WHERE queue = %s", (hot,)).fetchall() == []
        c.create_queue(hot)  # a plain queue of the name, where its hash says
        c.send(hot, {"n": 1})
        assert c.metrics(hot).ready == 1
        for q in (plain, moved, hot, reborn):
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
