"""``shard add`` rebalances partitioned queues: after doubling the shard count, each partition
whose place under the new count is a new shard moves there (``shard move --partition``) with
all its live messages, while producers and consumers run through the router and direct; by
message number: 0 lost, 0 duplicated, 0 resurrected. And ``moved_ids`` is pruned once no
message holds a moved partition's old ids, so the shard it left may take another partition.
Routers over fresh databases of the session's two clusters (the other tests keep theirs)."""

from __future__ import annotations

import json
import time
from collections import Counter

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from shard_helpers import Traffic, home, kill_all

from lonnymq import Client, errors, shard
from lonnymq.cli import main
from lonnymq.client.direct import STRIDE, key_partition
from lonnymq.shard import admin

pytestmark = [pytest.mark.once, pytest.mark.slow]

#: A queue's live message ids on a shard database, read there.
HELD = "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id WHERE q.name = %s ORDER BY 1"


def database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


def held_on(shard_dsn: str, queue: str) -> list[int]:
    with psycopg.connect(shard_dsn) as conn:
        return [int(r[0]) for r in conn.execute(HELD, (queue,))]


def named(r: str, prefix: str, home4: int) -> str:
    """The first ``prefix_<i>`` whose hash names shard ``home4`` of 4."""
    return next(n for n in (f"{prefix}_{i}" for i in range(200)) if home(r, n, 4) == home4)


def moved_ids(router: str) -> dict[str, dict[int, int]]:
    with psycopg.connect(router) as conn:
        return admin.moved_ids(conn, "lonnymq")


def test_add_moves_partitions_to_the_new_shards_under_traffic(sharded) -> None:  # type: ignore[no-untyped-def]
    a, b = sharded.shards
    r = database(sharded.router.dsn, "pgrow_router")
    old = [database(a.dsn, "pgrow_s0"), database(b.dsn, "pgrow_s1")]
    new = [database(a.dsn, "pgrow_s2"), database(b.dsn, "pgrow_s3")]
    shard.init(r, old)
    # Partition k is on (hash + k) mod shards: with 4 shards `hot` belongs on [2, 3] (both
    # partitions move), `half` on [3, 0] (partition 0 moves from 1 to 3), `calm` on [0, 1] (none).
    hot, half, calm = named(r, "pgrow_hot", 2), named(r, "pgrow_half", 3), named(r, "pgrow_calm", 0)
    plain = named(r, "pgrow_plain", 2)
    # A queue dead-lettering into a partitioned dead-letter queue: its partitions belong on the
    # new shards, where the dead-letter queue has none (moving them together is not built).
    fed, dlq = named(r, "pgrow_fed", 2), named(r, "pgrow_dlq", 0)
    # One whose dead-letter queue's name hashes with its own: each partition of the dead-letter
    # queue takes the queue's partition on its shard along (the feeder, sorted first, is
    # refused on its own first: no dead-letter partition on the new shard yet).
    afed, adlq = named(r, "pgrow_a_fed", 2), named(r, "pgrow_z_dlq", 2)
    with Client(r) as c, Client(r, direct=True) as dc:
        for q in (hot, half, calm):
            c.create_queue(q, partitions=2)
        c.create_queue(plain)
        c.create_queue(dlq, partitions=2)
        c.create_queue(fed, partitions=2, dead_letter_queue=dlq)
        c.send(fed, "fed")
        c.create_queue(adlq, partitions=2)
        c.create_queue(afed, partitions=2, max_attempts=1, dead_letter_queue=adlq)
        for i in range(6):
            c.send(afed, f"x{i}", key=f"x{i}")
        dead_before = kill_all(c, afed, 6)
        assert {i % STRIDE for i in dead_before} == {0, 1}
        for i in range(6):
            c.send(afed, f"y{i}", key=f"y{i}")
        assert shard.status(r).partitioned == {
            hot: [0, 1],
            half: [1, 0],
            calm: [0, 1],
            fed: [0, 1],
            dlq: [0, 1],
            afed: [0, 1],
            adlq: [0, 1],
        }
        later = {f"later-{i}": c.send(hot, {"n": -1 - i}, key=f"later-{i}", delay=3600) for i in range(12)}
        assert {m.id % STRIDE for m in later.values()} == {0, 1}
        pre = list(range(10**7, 10**7 + 40))
        for n in pre:
            c.send(hot, {"n": n})
        c.send_batch(half, [{"n": i} for i in range(10)])
        c.send_batch(plain, [{"n": i} for i in range(5)])
        held = [m for _ in range(2) for m in c.take(hot, 5)]  # leases on both partitions
        assert {m.id % STRIDE for m in held} == {0, 1}
        dc.take(calm, 1)  # the direct client's map: from before the add
        with Traffic(r, hot) as routed, Traffic(r, hot, first=10**6, direct=True) as direct:
            time.sleep(1.5)
            t0 = time.monotonic()
            result = shard.add(r, new)
            t1 = time.monotonic()
            time.sleep(1.5)
        assert not routed.errors and not direct.errors, (routed.errors + direct.errors)[:3]
        assert (result.before, result.after) == (2, 4)
        assert sorted(result.failed) == [f"{fed} partition 0", f"{fed} partition 1"]
        assert all(
            f"dead-letter queue {dlq!r}" in e and "no partition on shard" in e for e in result.failed.values()
        )
        parts = sorted(
            (m.queues[0], m.partition, m.source, m.target) for m in result.moved if m.partition is not None
        )
        assert parts == sorted(
            [(hot, 0, 0, 2), (hot, 1, 1, 3), (half, 0, 1, 3), (adlq, 0, 0, 2), (adlq, 1, 1, 3)]
        )
        assert [m.partitions for m in result.moved if m.queues[0] == adlq] == [
            {adlq: 0, afed: 0},
            {adlq: 1, afed: 1},
        ]
        assert [m.queues for m in result.moved if m.partition is None] == [[plain]]
        status = shard.status(r)
        assert status.healthy
        assert status.partitioned == {
            hot: [2, 3],
            half: [3, 0],
            calm: [0, 1],
            fed: [0, 1],
            dlq: [0, 1],
            afed: [2, 3],
            adlq: [2, 3],
        }
        assert held_on(old[0], hot) == [] and held_on(old[1], hot) == []
        assert held_on(old[1], half) == []
        assert moved_ids(r) == {hot: {0: 0, 1: 1}, half: {1: 0}, afed: {0: 0, 1: 1}, adlq: {0: 0, 1: 1}}
        # Leases taken before the add settle after it, by id and token.
        assert c.ack(held) == {m.id for m in held}
        # Keys still land on their partition: the same key again is the same live message.
        for key, first in later.items():
            for client in (c, dc):
                again = client.send(hot, {"n": 0}, key=key, delay=3600)
                assert (again.outcome, again.id) == ("ignored", first.id), key
            got = dc.get(hot, key=key)
            assert got is not None and got.id == first.id
            assert first.id % STRIDE == key_partition(key, 2)  # made on the partition's old shard
        by_shard = [sorted(m.id for m in later.values() if m.id % STRIDE == i) for i in (0, 1)]
        assert c.cancel(hot, ids=by_shard[0]) == by_shard[0]  # moved with partition 0 to shard 2
        assert dc.cancel(hot, ids=by_shard[1]) == by_shard[1]  # moved with partition 1 to shard 3
        rest: list[int] = []
        while batch := c.take(hot, 500):
            rest += [m.payload["n"] for m in batch]
            assert c.ack(batch) == {m.id for m in batch}
        time.sleep(0.2)
        assert c.take(hot, 500) == [] and dc.take(hot, 500) == []  # nothing comes back
        assert sorted(m.payload["n"] for m in c.take(half, 20)) == list(range(10))
        assert sorted(m.payload["n"] for m in c.take(plain, 20)) == list(range(5))
        assert [m.payload for m in c.take(fed, 5)] == ["fed"]  # where it was
        # The moved queue dead-letters into its dead-letter queue's partitions on the new shards.
        live = [m for _ in range(3) for m in c.take(afed, 7)]
        assert sorted(m.payload for m in live) == [f"y{i}" for i in range(6)]
        assert c.ack(live) == {m.id for m in live}
        zs = [[k for k in (f"z{i}" for i in range(100)) if key_partition(k, 2) == p][:3] for p in (0, 1)]
        zs = zs[0] + zs[1]  # three keys in each partition
        for z in zs:
            c.send(afed, z, key=z)
        kill_all(c, afed, 6)
        assert {i % STRIDE for i in held_on(new[0], adlq) + held_on(new[1], adlq)} == {0, 1, 2, 3}
        drained = [m for _ in range(4) for m in c.take(adlq, 7)]
        assert Counter(m.payload for m in drained) == Counter([f"x{i}" for i in range(6)] + zs)
        assert c.ack(drained) == {m.id for m in drained} and c.take(adlq, 7) == []
    delivered = Counter(
        [
            *(n for n, _ in routed.delivered),
            *(n for n, _ in direct.delivered),
            *rest,
            *(m.payload["n"] for m in held),
        ]
    )
    sent = Counter([*pre, *routed.sent, *direct.sent])
    assert delivered - sent == Counter(), "delivered but never sent, or twice"
    assert sent - delivered == Counter(), "lost"
    assert routed.sent and direct.sent and routed.delivered and direct.delivered
    # Run again: nothing left to move.
    again = shard.add(r, new)
    assert again.moved == [] and sorted(again.failed) == sorted(result.failed)
    # The pauses as measured (docs/sharding.md quotes runs of this test with -s).
    measured = {
        "add_ms": round((t1 - t0) * 1000, 1),
        "moves": [
            {"partitions": m.partitions, "pause_ms": round(m.pause_ms, 1), "messages": m.rows["message"]}
            for m in result.moved
            if m.partition is not None
        ],
        "longest_call_during_add_ms": {
            "router": round(routed.stalls(t0, t1) * 1000, 1),
            "direct": round(direct.stalls(t0, t1) * 1000, 1),
        },
        "sent": len(routed.sent) + len(direct.sent) + len(pre),
    }
    print("shard add, partitions:", json.dumps(measured, sort_keys=True))


def test_moved_ids_are_pruned_once_no_message_holds_them(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    """After partition 0 left shard s, partition 1 cannot go to s while a message (live, or
    remembered by ack's settle memory or a send's idempotency record) holds an id s made; once
    none does, ``prune_moved_ids`` forgets s and the move (which prunes by itself) goes through;
    ids route right before and after."""
    a, b = sharded.shards
    r = database(sharded.router.dsn, "prune_router")
    shard.init(r, [database(c.dsn, f"prune_s{i}") for i, c in enumerate([a, b, a, b])])
    q = "prune_hot"
    keys = [[k for k in (f"k{i}" for i in range(100)) if key_partition(k, 2) == p][:2] for p in (0, 1)]
    with Client(r) as c, Client(r, direct=True) as dc:
        c.create_queue(q, partitions=2)
        s0, s1 = shard.status(r).partitioned[q]
        free = next(i for i in range(4) if i not in (s0, s1))
        first = c.send(q, "first", key=keys[0][0])  # made on s0
        shard.move(r, q, free, partition=0)
        assert moved_ids(r) == {q: {s0: 0}}
        assert shard.prune_moved_ids(r) == {}  # "first" holds an id of s0
        with pytest.raises(errors.InvalidArgument, match="still hold such ids"):
            shard.move(r, q, s0, partition=1)
        [m] = c.take(q, 5)
        assert m.id == first.id and c.ack([m]) == {m.id}
        assert shard.prune_moved_ids(r) == {}  # ack's memory of the settle (an hour) still holds it
        capsys.readouterr()
        assert main(["shard", "prune", q, "--dsn", r]) == 0
        assert capsys.readouterr().out.strip() == "nothing to forget"
        with pytest.raises(errors.InvalidArgument, match="still hold such ids"):
            shard.move(r, q, s0, partition=1)
        other = dc.send(q, "second", key=keys[1][0])  # partition 1, made on s1: moves with it
        assert other.id % STRIDE == s1
        with psycopg.connect(r, autocommit=True) as conn:  # two hours later: settles and send keys forgotten
            conn.execute("SELECT lonnymq.maintain(100000, lonnymq.now_ms() + 7200000)")
        moved = shard.move(r, q, s0, partition=1)  # prunes s0 first, then moves
        assert (moved.source, moved.target) == (s1, s0)
        assert shard.status(r).partitioned[q] == [free, s0]
        assert moved_ids(r) == {q: {s1: 1}}
        # Partition 1's ids, made on s1 (moved) and on s0 (new), settle where it is now.
        third = c.send(q, "third", key=keys[1][1])
        assert third.id % STRIDE == s0
        for client in (c, dc):
            assert {i: (g.payload if (g := client.get(q, id=i)) else None) for i in (other.id, third.id)} == {
                other.id: "second",
                third.id: "third",
            }
        got = [x for _ in range(2) for x in dc.take(q, 5)]
        assert sorted(x.payload for x in got) == ["second", "third"]
        assert dc.ack(got) == {other.id, third.id}
        assert c.take(q, 5) == []
        # Once ack's memory of "second" (made on s1) is gone too, s1 is forgotten (by the CLI).
        assert main(["shard", "prune", "--dsn", r, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {}
        with psycopg.connect(r, autocommit=True) as conn:
            conn.execute("SELECT lonnymq.maintain(100000, lonnymq.now_ms() + 7200000)")
        assert main(["shard", "prune", "--dsn", r, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {q: [s1]}
        assert moved_ids(r) == {}
