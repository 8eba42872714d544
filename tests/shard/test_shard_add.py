"""``shard.add``: doubling the shard count under traffic, then moving the queues whose hash
moved, by message number: nothing lost, duplicated or resurrected. A second router over fresh
databases of the session's clusters (so the other tests keep their two shards)."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from shard_helpers import WAKE_LAG, Traffic, drain, home, waiter_follows

from lonnymq import Client, errors, shard
from lonnymq.cli import main

pytestmark = [pytest.mark.once, pytest.mark.slow]


def database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


def test_add_doubles_the_shards_and_rehomes_queues_under_traffic(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = sharded.shards
    r = database(sharded.router.dsn, "grow_router")
    old = [database(a.dsn, "grow_s0"), database(b.dsn, "grow_s1")]
    new = [database(a.dsn, "grow_s2"), database(b.dsn, "grow_s3")]
    shard.init(r, old)
    names = [f"grow_{i}" for i in range(12)]
    busy = next(n for n in (f"grow_busy_{i}" for i in range(100)) if home(r, n, 4) >= 2)
    leased = {}
    with Client(r) as c:
        for n in names:
            c.create_queue(n)
            c.send_batch(n, [{"q": n, "n": i} for i in range(5)])
            leased[n] = c.take(n)  # held across the move
        c.create_queue(busy)
    assert {home(r, n, 4) >= 2 for n in names} == {True, False}  # some queues move, some stay
    with pytest.raises(errors.InvalidArgument, match="give 2 new ones"):
        shard.add(r, new[:1])

    # One moving queue's rows are held by a long transaction on its shard: it cannot move now.
    stuck = next(n for n in names if home(r, n, 4) >= 2)
    stuck_dsn = old[home(r, stuck, 2)]
    with psycopg.connect(stuck_dsn) as holder, Traffic(r, busy) as traffic:
        holder.execute(
            "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
            " WHERE q.name = %s FOR UPDATE OF m",
            (stuck,),
        )
        time.sleep(0.3)
        result = shard.add(r, new, lock_timeout=0.2, attempts=2, retry_delay=0.1)
        time.sleep(0.3)
        holder.rollback()
    assert not traffic.errors, traffic.errors[:3]
    assert (result.before, result.after, list(result.failed)) == (2, 4, [stuck])
    assert "gave up after 2 attempt" in result.failed[stuck]
    moving = sorted(n for n in [*names, busy] if home(r, n, 4) >= 2)
    assert sorted(q for m in result.moved for q in m.queues) == sorted(set(moving) - {stuck})
    # It keeps working from its old shard, routed there by its override.
    assert shard.status(r).overrides == {stuck: home(r, stuck, 2)}
    with Client(r) as c:
        c.send(stuck, {"q": stuck, "n": 5})
    # The same shards again: the rest moves; a wrong count is one line from the CLI.
    again = shard.add(r, new)
    assert (again.before, again.after, again.failed) == (2, 4, {})
    assert [m.queues for m in again.moved] == [[stuck]]
    assert main(["shard", "add", new[0], "--dsn", r]) == 1
    err = capsys.readouterr().err.strip()
    assert "give 4 new ones" in err and "\n" not in err

    status = shard.status(r)
    assert status.healthy and status.overrides == {} and len(status.shards) == 4
    for s in status.shards:
        assert all(home(r, q, 4) == s.index for q in s.queues)
    with Client(r) as c:
        for n in names:
            assert c.ack(leased[n]) == {m.id for m in leased[n]}  # leases survive the move
            rest = c.take(n, 10)
            assert sorted(m.payload["n"] for m in rest) == [1, 2, 3, 4] + [5] * (n == stuck), n
        # New queues go where the new count says.
        fresh = next(n for n in (f"grow_new_{i}" for i in range(100)) if home(r, n, 4) == 3)
        c.create_queue(fresh)
    assert fresh in shard.status(r).shards[3].queues
    delivered = [n for n, _ in traffic.delivered] + drain(r, busy)
    assert sorted(delivered) == sorted(traffic.sent)  # 0 lost, 0 duplicated


def test_a_waiting_receive_follows_its_queue_to_a_new_shard(sharded) -> None:  # type: ignore[no-untyped-def]
    """A receive() waiting (poll=30) on a queue that ``shard add`` moves to a new shard is told by
    the move: it registers on the new shard at once and wakes for a send there, not at its next
    look at the shard map (10 s)."""
    a, b = sharded.shards
    r = database(sharded.router.dsn, "wake_grow_router")
    old = [database(a.dsn, "wake_grow_s0"), database(b.dsn, "wake_grow_s1")]
    new = [database(a.dsn, "wake_grow_s2"), database(b.dsn, "wake_grow_s3")]
    shard.init(r, old)
    for d in new:  # migrated beforehand, so that the add itself takes a moment only
        with Client(d) as c:
            c.migrate()
    q = next(n for n in (f"wake_grow_{i}" for i in range(100)) if home(r, n, 4) >= 2)
    src, dst = old[home(r, q, 2)], new[home(r, q, 4) - 2]
    with Client(r) as c:
        c.create_queue(q)

        def add() -> None:
            result = shard.add(r, new)
            assert [m.queues for m in result.moved] == [[q]] and not result.failed

        got, lag = waiter_follows(c, q, src, dst, add, lambda: c.send(q, "on the new shard"))
    assert got == ["on the new shard"]
    assert lag < WAKE_LAG, lag
