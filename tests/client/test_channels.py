"""Channels: round robin and fairness, max_concurrency (never exceeded, strict FIFO at 1),
release_interval, max_size, exact counters through every way a message can leave or move,
and index-only dequeue cost (plan tests) with the plain fast path kept for other queues."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from psycopg import sql

from channel_helpers import Db, consumer
from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client, Envelope, errors
from lonnymq.sql import function_text


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Db:
    return Db(conn, schema)


def _items(channel: str | None, n: int, prefix: str | None = None) -> list[tuple[str | None, str]]:
    return [(channel, f"{prefix or channel}{i}") for i in range(1, n + 1)]


# -- round robin and fairness --------------------------------------------------------------------


def test_round_robin_order(client: Client, db: Db) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", _items("a", 3) + _items("b", 3) + _items("c", 3), t)
    assert db.payloads("q", 9, t) == ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]


def test_round_robin_one_take_at_a_time(client: Client, db: Db) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", _items("a", 3) + _items("b", 2), t)
    # Every take at the same millisecond: ties go to the least recently served channel.
    got = [db.payloads("q", 1, t + 1)[0] for _ in range(5)]
    assert got == ["a1", "b1", "a2", "b2", "a3"]
    assert db.take("q", 1, t + 1) == []


def test_a_channel_that_joins_late_takes_turns_from_its_arrival(client: Client, db: Db) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", _items("a", 5), t)
    assert db.payloads("q", 2, t + 10) == ["a1", "a2"]
    db.send("q", _items("b", 2), t + 20)
    # a has waited since t + 10, b since t + 20: a, then b, then alternately.
    assert db.payloads("q", 4, t + 30) == ["a3", "b1", "a4", "b2"]


def test_fairness_small_channel_is_not_starved_by_a_big_backlog(client: Client, db: Db) -> None:
    client.create_queue("q")
    big = [Envelope(f"a{i}", channel="a") for i in range(10_000)]
    client.send_batch("q", big)
    client.send_batch("q", [Envelope(f"b{i}", channel="b") for i in range(10)])
    order = []
    for _ in range(30):  # real clock, one message per call
        order += [m.channel for m in client.take("q", 1)]
    first_20 = Counter(order[:20])
    assert first_20 == {"a": 10, "b": 10}, order
    assert Counter(order) == {"a": 20, "b": 10}
    # The same in one call.
    client.purge_queue("q")
    client.send_batch("q", big)
    client.send_batch("q", [Envelope(f"b{i}", channel="b") for i in range(10)])
    one_call = [m.channel for m in client.take("q", 30)]
    assert Counter(one_call[:20]) == {"a": 10, "b": 10}, one_call


def test_plain_messages_interleave_with_channels_by_time(client: Client, db: Db) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", _items("a", 3), t)
    db.send("q", _items(None, 2, "p"), t + 5)
    # a1 (head t) goes first; the plain messages (t + 5) come before a's next turn (t + 10).
    assert db.payloads("q", 5, t + 10) == ["a1", "p1", "p2", "a2", "a3"]


def test_priority_orders_within_a_channel(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.send_batch("q", [Envelope("low", channel="a"), Envelope("high", channel="a", priority=5)])
    assert [m.payload for m in client.take("q", 2)] == ["high", "low"]


# -- max_concurrency -----------------------------------------------------------------------------


def test_max_concurrency_limits_leases(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "a", max_concurrency=2)
    t = db.now()
    db.send("q", _items("a", 5) + _items("b", 2), t)
    got = db.take("q", 10, t)
    assert [bytes(d["payload"]).decode() for d in got] == ["a1", "b1", "a2", "b2"]
    assert db.take("q", 10, t) == []
    assert db.channel("q", "a")["current_concurrency"] == 2  # type: ignore[index]
    db.ack("q", got[:1], t)
    assert db.payloads("q", 10, t) == ["a3"]
    db.nack("q", [got[2]], t, delay_ms=60_000)  # a2 back, later: a slot frees now
    assert db.payloads("q", 10, t) == ["a4"]
    db.check_channels("q")


def test_max_concurrency_is_never_exceeded_by_concurrent_consumers(dsn: str, schema: str, db: Db) -> None:
    limits = {"one": 1, "two": 2, "three": 3}
    with Client(dsn, schema=schema) as c:
        c.create_queue("q")
        for name, limit in limits.items():
            c.set_channel("q", name, max_concurrency=limit)
        c.send_batch(
            "q",
            [Envelope(f"{i}", channel=name) for name in limits for i in range(60)]
            + [Envelope(f"{i}", channel="free") for i in range(60)],
        )
    qid = db.qid("q")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(dsn, schema, "q", 3, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    seen: dict[str, int] = defaultdict(int)
    counted: dict[str, int] = defaultdict(int)
    samples = 0
    try:
        # Sample from a connection of our own, as often as we can, until the consumers are done.
        while any(p.is_alive() for p in procs) and out.qsize() < len(procs):
            for r in db.q(
                "SELECT channel, count(*) AS n FROM {s}.message WHERE queue_id = %s"
                " AND leased AND dequeue_at > {s}.now_ms() GROUP BY channel",
                (qid,),
            ):
                seen[r["channel"]] = max(seen[r["channel"]], r["n"])
            for r in db.q("SELECT name, current_concurrency FROM {s}.channel WHERE queue_id = %s", (qid,)):
                counted[r["name"]] = max(counted[r["name"]], r["current_concurrency"])
            samples += 1
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * 4
    done = [d for per in results for d in per]
    assert Counter((d[1], d[2]) for d in done) == {
        (n, f"{i}"): 1 for n in [*limits, "free"] for i in range(60)
    }
    assert samples > 50
    for name, limit in limits.items():
        assert seen[name] <= limit and counted[name] <= limit, (name, seen, counted)
    # The limits were reached (so the sampling could have caught an excess).
    assert seen["two"] == 2 and seen["three"] == 3, seen
    assert seen["free"] >= 2
    db.check_channels("q")


def test_max_concurrency_1_is_strict_fifo_per_channel_under_concurrency(
    dsn: str, schema: str, db: Db
) -> None:
    with Client(dsn, schema=schema) as c:
        c.create_queue("q", channel_max_concurrency=1)
        c.send_batch("q", [Envelope(f"{i}", channel=f"k{i % 4}") for i in range(160)])
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [ctx.Process(target=consumer, args=(dsn, schema, "q", 4, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
    by_channel: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for per in results:
        for _id, channel, payload, taken, acked in per:
            by_channel[channel].append((taken, acked, int(payload)))
    assert sorted(by_channel) == ["k0", "k1", "k2", "k3"]
    for channel, runs in by_channel.items():
        runs.sort()
        assert [r[2] for r in runs] == sorted(r[2] for r in runs), channel  # FIFO
        assert all(a[1] < b[0] for a, b in pairwise(runs)), channel  # one at a time
    assert len({d[0] for per in results for d in per}) == 160


def test_strict_fifo_retry_keeps_its_place(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "k", max_concurrency=1)
    t = db.now()
    db.send("q", _items("k", 3), t)
    [m1] = db.take("q", 5, t)
    assert db.nack("q", [m1], t + 10, delay_ms=5_000) == {m1["id"]: "retry"}
    # The delay holds the channel: k2 does not overtake k1.
    assert db.take("q", 5, t + 4_999) == []
    [again] = db.take("q", 5, t + 5_010)
    assert (bytes(again["payload"]), again["attempt"]) == (b"k1", 2)
    # A release (no delay, not counted) puts it back first too.
    db.nack("q", [again], t + 5_020, count_attempt=False)
    assert db.payloads("q", 5, t + 5_020) == ["k1"]
    db.check_channels("q")


def test_retry_without_strict_fifo_goes_behind(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "k", max_concurrency=2)
    t = db.now()
    db.send("q", _items("k", 3), t)
    [m1] = db.take("q", 1, t)
    db.nack("q", [m1], t + 10)
    assert db.payloads("q", 5, t + 10) == ["k2", "k3"]


def test_expired_lease_is_retaken_without_counting_twice(client: Client, db: Db) -> None:
    client.create_queue("q", lease=1)
    client.set_channel("q", "k", max_concurrency=1)
    t = db.now()
    db.send("q", _items("k", 2), t)
    [m1] = db.take("q", 5, t)
    assert db.take("q", 5, t + 999) == []
    assert db.channel("q", "k")["ready_at"] == t + 1000  # type: ignore[index]
    [again] = db.take("q", 5, t + 1000)  # the lease expired: the same message, attempt 2
    assert (again["id"], again["attempt"]) == (m1["id"], 2)
    ch = db.channel("q", "k")
    assert (ch["current_concurrency"], ch["current_size"]) == (1, 2)  # type: ignore[index]
    assert db.ack("q", [m1], t + 1001) == []  # the old holder lost it
    assert db.ack("q", [again], t + 1001) == [m1["id"]]
    assert db.payloads("q", 5, t + 1001) == ["k2"]
    db.check_channels("q")


def test_extended_lease_heals_an_early_ready_at(client: Client, db: Db) -> None:
    client.create_queue("q", lease=1)
    client.set_channel("q", "k", max_concurrency=1)
    t = db.now()
    db.send("q", _items("k", 2), t)
    [m1] = db.take("q", 5, t)
    db.q("SELECT * FROM {s}.extend('q', %s, %s, 10000, %s)", ([m1["id"]], [m1["token"]], t + 500))
    # extend leaves the channel alone: ready_at still says t + 1000, and take corrects it.
    assert db.take("q", 5, t + 1000) == []
    assert db.channel("q", "k")["ready_at"] == t + 10_500  # type: ignore[index]
    db.check_channels("q")


def test_dead_letter_on_take_frees_the_channel(client: Client, db: Db) -> None:
    client.create_queue("dlq")
    client.create_queue("q", lease=1, max_attempts=1, dead_letter_queue="dlq")
    client.set_channel("q", "k", max_concurrency=1)
    t = db.now()
    db.send("q", _items("k", 2), t)
    db.take("q", 5, t)
    # k1's lease expired on its last attempt: dead-lettered (keeping its channel); k2 delivered.
    assert db.payloads("q", 5, t + 1000) == ["k2"]
    [dead] = db.take("dlq", 5, t + 1000)
    assert (bytes(dead["payload"]), dead["channel"]) == (b"k1", "k")
    db.check_channels("q")
    db.check_channels("dlq")


# -- release_interval ----------------------------------------------------------------------------


def test_release_interval_with_a_controlled_clock(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "slow", release_interval=1.0)
    t = db.now()
    db.send("q", _items("slow", 4) + _items("fast", 3), t)
    assert db.payloads("q", 10, t) == ["slow1", "fast1", "fast2", "fast3"]
    assert db.take("q", 10, t + 999) == []
    assert db.q("SELECT {s}.next_ready_in('q', %s) AS n", (t + 999,))[0]["n"] == 1
    assert db.payloads("q", 10, t + 1000) == ["slow2"]
    assert db.payloads("q", 10, t + 2500) == ["slow3"]  # one per interval, no burst after a pause
    assert db.take("q", 10, t + 3499) == []
    assert db.payloads("q", 10, t + 3500) == ["slow4"]


def test_release_interval_survives_an_empty_channel(client: Client, db: Db) -> None:
    client.create_queue("q", channel_release_interval=10)
    t = db.now()
    db.send("q", _items("a", 1), t)
    [d] = db.take("q", 1, t)
    db.ack("q", [d], t + 1)
    assert db.channel("q", "a") is not None  # empty, but its rate limit still applies
    db.send("q", _items("a", 1, "again"), t + 2)
    assert db.take("q", 1, t + 9_999) == []
    [d] = db.take("q", 1, t + 10_000)
    db.ack("q", [d], t + 10_001)
    db.q("SELECT {s}.maintain(10, %s)", (t + 19_999,))
    assert db.channel("q", "a") is not None  # served at t + 10000: kept until t + 20000
    db.q("SELECT {s}.maintain(10, %s)", (t + 20_000,))
    assert db.channel("q", "a") is None


def test_release_interval_in_real_time(client: Client, db: Db) -> None:
    client.create_queue("q", lease=60)
    client.set_channel("q", "r", release_interval=0.2)
    client.send_batch("q", [Envelope(i, channel="r") for i in range(50)])
    served: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        served += [m.lease_until - 60_000 for m in client.take("q", 10)]  # type: ignore[operator]
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    assert 1 <= len(served) <= 1 + elapsed / 0.2
    assert all(b - a >= 200 for a, b in pairwise(served)), served


# -- max_size ------------------------------------------------------------------------------------


def test_max_size_rejects_the_whole_batch(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "small", max_size=3)
    assert [r.outcome for r in client.send_batch("q", [Envelope(i, channel="small") for i in range(2)])] == [
        "created"
    ] * 2
    with pytest.raises(errors.ChannelFull, match="small"):
        client.send_batch(
            "q", [Envelope("other", channel="x"), Envelope(1, channel="small"), Envelope(2, channel="small")]
        )
    assert db.channel("q", "x") is None  # nothing of the batch was written
    assert client.send("q", 3, channel="small").outcome == "created"
    with pytest.raises(errors.ChannelFull):
        client.send("q", 4, channel="small")
    [m] = client.take("q")
    client.ack(m)
    assert client.send("q", 4, channel="small").outcome == "created"
    db.check_channels("q")


def test_max_size_drops_the_newest(client: Client, db: Db) -> None:
    client.create_queue("q", channel_max_size=2, channel_on_full="drop")
    results = client.send_batch(
        "q", [Envelope(i, channel="a") for i in range(5)] + [Envelope("b", channel="b")]
    )
    assert [r.outcome for r in results] == ["created", "created", "dropped", "dropped", "dropped", "created"]
    assert [r.id is None for r in results] == [False, False, True, True, True, False]
    assert sorted(m.payload for m in client.take("q", 10) if m.channel == "a") == [0, 1]
    db.check_channels("q")


def test_a_keyed_resend_to_a_full_channel_is_ignored(client: Client, db: Db) -> None:
    client.create_queue("q", channel_max_size=1)
    first = client.send("q", "x", key="k", channel="a")
    again = client.send("q", "x", key="k", channel="a")
    assert (again.outcome, again.id) == ("ignored", first.id)


# -- counters ------------------------------------------------------------------------------------


def test_counters_stay_exact_through_every_path(client: Client, db: Db) -> None:
    client.create_queue("dlq")
    client.create_queue("q", lease=1, max_attempts=2, dead_letter_queue="dlq")
    client.create_queue("arch", archive=True)
    t = db.now()
    db.send("q", _items("a", 6) + _items("b", 4) + _items(None, 3, "p"), t)
    db.check_channels("q")
    got = db.take("q", 6, t)
    db.check_channels("q")
    db.ack("q", got[:2], t)
    db.nack("q", got[2:3], t)  # retry
    db.nack("q", got[3:4], t, count_attempt=False)  # defer
    db.check_channels("q")
    again = db.take("q", 20, t + 1)
    assert db.nack("q", [d for d in again if d["attempt"] == 2][:1], t + 1) != {}
    db.check_channels("q")
    db.check_channels("dlq")
    db.take("q", 20, t + 5_000)  # some leases expired: retaken or dead-lettered
    db.check_channels("q")
    db.check_channels("dlq")
    # give_up-style dead-lettering goes through the same path
    db.q(
        "SELECT {s}._dead_letter(q, ARRAY(SELECT id FROM {s}.message WHERE queue_id = q.id"
        " AND channel = 'b' LIMIT 1), ARRAY['gave up'], %s) FROM {s}.queue q WHERE q.name = 'q'",
        (t,),
    )
    db.check_channels("q")
    db.check_channels("dlq")
    # replace moves a message between channels and ends an expired lease
    db.send("q", [("a", "keyed")], t + 6_000, keys=["k1"])
    [kd] = [d for d in db.take("q", 50, t + 6_000) if d["key"] == "k1"]
    db.check_channels("q")
    assert (
        db.send("q", [("b", "moved")], t + 10_000, keys=["k1"], on_conflict="replace")[0]["outcome"]
        == "updated"
    )
    db.check_channels("q")
    db.send("q", [(None, "unchanneled")], t + 10_000, keys=["k1"], on_conflict="replace")
    db.check_channels("q")
    assert db.ack("q", [kd], t + 10_000) == []  # replaced: the old delivery is stale
    # take_tx (committed and rolled back), on an archiving queue as well
    db.send("arch", _items("a", 3) + _items("b", 3), t)
    with db.conn.transaction():
        assert [bytes(d["payload"]) for d in db.take_tx("arch", 2, t)] == [b"a1", b"b1"]
    with pytest.raises(psycopg.errors.RaiseException), db.conn.transaction():
        assert len(db.take_tx("arch", 2, t)) == 2
        db.q("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
    db.check_channels("arch")
    assert [bytes(d["payload"]) for d in db.take_tx("arch", 10, t)] == [b"a2", b"b2", b"a3", b"b3"]
    assert len(db.q("SELECT * FROM {s}.archive WHERE queue_id = %s", (db.qid("arch"),))) == 6
    db.check_channels("arch")
    # dead letters kept in the archive come back into their channel when requeued
    client.create_queue("solo", max_attempts=1)
    db.send("solo", _items("a", 2), t)
    assert set(db.nack("solo", db.take("solo", 2, t), t).values()) == {"dead"}
    db.check_channels("solo")
    assert client.channels("solo") == []
    assert client.requeue_dead("solo") == 2
    assert [c.size for c in client.channels("solo")] == [2]
    db.check_channels("solo")
    # purge empties every channel; configured ones stay
    client.set_channel("q", "cfg", max_concurrency=1)
    db.send("q", _items("cfg", 2), t + 20_000)
    client.purge_queue("q")
    assert [c.name for c in client.channels("q")] == ["cfg"]
    assert client.channels("q")[0].size == 0
    db.check_channels("q")


def test_a_recount_corrects_drifted_counters(client: Client, db: Db) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", _items("a", 3), t)
    db.take("q", 1, t)
    db.q("UPDATE {s}.channel SET current_size = 7, current_concurrency = 0")
    assert db.q("SELECT {s}.channel_recount('q', %s) AS n", (t,))[0]["n"] == 1
    db.check_channels("q")


# -- API -----------------------------------------------------------------------------------------


def test_set_list_and_reset_channels(client: Client, db: Db) -> None:
    client.create_queue("q", channel_max_concurrency=4, channel_release_interval=0.5)
    info = client.set_channel("q", "vip", max_concurrency=10, max_size=100, on_full="drop")
    assert (
        info.queue,
        info.name,
        info.max_concurrency,
        info.release_interval_ms,
        info.max_size,
        info.on_full,
        info.explicit,
        info.size,
        info.leased,
        info.ready_at,
    ) == ("q", "vip", 10, None, 100, "drop", True, 0, 0, None)
    client.send_batch("q", [Envelope(1, channel="vip"), Envelope(2, channel="std")])
    [m] = [m for m in client.take("q", 2) if m.channel == "std"]
    std = {c.name: c for c in client.channels("q")}["std"]
    assert (std.max_concurrency, std.release_interval_ms, std.explicit, std.size, std.leased) == (
        4,
        500,
        False,
        1,
        1,
    )
    assert [c.name for c in client.channels("q", after="std")] == ["vip"]
    assert client.reset_channel("q", "vip") is True
    assert client.reset_channel("q", "vip") is False
    assert client.reset_channel("q", "std") is False
    assert client.channels("q", limit=1)[0].name == "std"
    client.ack(m)
    db.check_channels("q")


def test_bad_channel_arguments(client: Client) -> None:
    client.create_queue("q")
    for kwargs in (
        {"max_concurrency": 0},
        {"max_size": -1},
        {"on_full": "block"},
        {"release_interval": -1},
        {"max_concurrency": True},
    ):
        with pytest.raises(errors.InvalidArgument):
            client.set_channel("q", "a", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument):
        client.set_channel("q", "")
    with pytest.raises(errors.InvalidArgument):
        client.create_queue("r", channel_on_full="wait")  # type: ignore[arg-type]
    with pytest.raises(errors.QueueNotFound):
        client.set_channel("nope", "a")
    assert client.channels("q") == []


def test_bad_channel_arguments_in_sql(client: Client, db: Db) -> None:
    client.create_queue("q")
    for args in (
        ("a", 0, None, None, "reject"),
        ("a", None, -1, None, "reject"),
        ("a", None, None, 0, "reject"),
        ("a", None, None, None, "block"),
        ("", None, None, None, "reject"),
        ("x" * 513, None, None, None, "reject"),
    ):
        with pytest.raises(psycopg.Error) as e:
            db.q("SELECT * FROM {s}.channel_set('q', %s, %s, %s, %s, %s)", args)
        assert e.value.sqlstate == "LQ002"
    with pytest.raises(psycopg.Error) as e:
        db.send("q", [("", "x")], db.now())
    assert e.value.sqlstate == "LQ002"


def test_take_tx_holds_a_strict_fifo_channel_until_commit(dsn: str, client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "k", max_concurrency=1)
    client.send_batch("q", [Envelope(1, channel="k"), Envelope(2, channel="k"), Envelope(3, channel="j")])
    with psycopg.connect(dsn) as tx:
        [m] = client.take_tx("q", 1, conn=tx)
        assert m.payload == 1
        # In flight in tx: nobody else gets k2 until it commits.
        assert [x.payload for x in client.take("q", 5)] == [3]
        tx.commit()
    assert [x.payload for x in client.take("q", 5)] == [2]
    db.check_channels("q")


def test_async_client_channels(dsn: str, schema: str) -> None:
    import asyncio

    from lonnymq import AsyncClient

    async def main() -> None:
        async with AsyncClient(dsn, schema=schema) as c:
            await c.create_queue("q", channel_max_size=1, channel_on_full="drop")
            r = await c.send_batch("q", [Envelope(1, channel="a"), Envelope(2, channel="a")])
            assert [x.outcome for x in r] == ["created", "dropped"]
            [info] = await c.channels("q")
            assert (info.name, info.size, info.max_size) == ("a", 1, 1)

    asyncio.run(main())


def test_threads_sending_to_new_channels_do_not_deadlock(dsn: str, schema: str, db: Db) -> None:
    names = [f"c{i}" for i in range(12)]
    with Client(dsn, schema=schema, pool_size=4) as c:
        c.create_queue("q", channel_max_size=10_000)
        failures: list[BaseException] = []

        def send(order: list[str]) -> None:
            try:
                for _ in range(15):
                    c.send_batch("q", [Envelope(n, channel=n) for n in order])
                    for m in c.take("q", 5):
                        c.ack(m)
            except BaseException as e:  # pragma: no cover - reported below
                failures.append(e)

        threads = [threading.Thread(target=send, args=(names if i % 2 else names[::-1],)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert failures == []
    db.check_channels("q")


# -- plans: an index lookup per step, whatever the number of channels ---------------------------

CHANNELS = 10_000
PER_CHANNEL = 20


_VARS = {
    r"\bq\.max_attempts\b": "5",
    r"\bq\.id\b": "$1",
    r"\bp_now\b": "$2",
    r"\bv_bound\b": "$2",
    r"\bv_skip\b": "$3",
    r"\bp_queue_id\b": "$1",
    r"\bp_name\b": "$4",
    r"\bv_name\b": "$4",
    r"\bp_limit\b": "10",
    r"\bv_want\b": "10",
    r"\bv_at\b": "$5",
    r"\bv_turn\b": "$6",
    r"\bv_open\b": "ARRAY[]::text[]",
    r"\bv_names\b": "$7",
    r"\bv_keys\b": "$8",
    r"\bv_turns\b": "$9",
    r"\bv_limited\b": "$10",
    r"\bv_gen\b": "1",  # the current generation (generations.sql)
    r"\bv_old\b": "0",  # a frozen generation
    r"\bv_more\b": "10",
    r"\bv_held\b": "ARRAY[]::bigint[]",  # the frozen rows locked, and their columns
    r"\bv_held_ats\b": "ARRAY[]::bigint[]",
    r"\bv_held_tries\b": "ARRAY[]::integer[]",
    r"\bv_held_live\b": "ARRAY[]::boolean[]",
}
_PARAMS = "(int, bigint, text[], text, bigint, bigint, text[], bigint[], bigint[], boolean[])"


def hot_queries() -> dict[str, str]:
    """The statements of the channel path of take that read the channel and message tables,
    verbatim from their sql/ files, with plpgsql variables as the parameters of _PARAMS:
    $1 queue id, $2 now, $3 channels passed by, $4 a channel name, $5 $6 the pick's cursor,
    $7 .. $10 the picked channels (names, ready_at, turn, at their concurrency limit)."""
    found = {}
    for fn in ("_lock_ready", "_take_channels", "_channel_ready_at"):  # _lock_ready: plain candidates
        body = function_text(fn)
        # The served channels' UPDATE (_take_channels): its lookups are its subqueries, each
        # reached by the channel's key ($4; the row's other columns: constants): the two head
        # lookups of ready_at (_channel_ready_at's, inline) and the probe for the row's ctid.
        texts = []
        for update in re.findall(r"UPDATE \{schema\}\.channel c\s+SET current_size [^;]*;", body):
            body = body.replace(update, "")
            texts += [
                f"{sub};"
                for sub in re.findall(
                    r"\((SELECT (?:greatest\(|x\.ctid)[^;]*?(?:LIMIT 1|OFFSET 0))\)", update
                )
            ]
        for name, value in (("release_interval_ms", "0"), ("blocked_until", "NULL::bigint"), ("name", "$4")):
            texts = [re.sub(rf"\b[cs]\.{name}\b", value, t) for t in texts]
        for text in texts + re.findall(r"(SELECT [^;]*?FROM \{schema\}\.(?:channel|message) [^;]*?);", body):
            # Of "SELECT array_agg(...) FROM (SELECT ... FOR UPDATE SKIP LOCKED) c", the inner
            # statement is the lookup; the outer one only orders the rows it locked.
            inner = re.search(r"\((SELECT\s[^()]*?FOR UPDATE SKIP LOCKED)\)", text)
            if inner and "LATERAL" not in text:
                text = inner[1]
            text = re.sub(r"\s+INTO\s+\w+(?:,\s*\w+)*\s+", " ", text, count=1)
            for var, param in _VARS.items():
                text = re.sub(var, param, text)
            unknown = re.findall(r"\b(?:p|v)_\w+|\bq\.\w+|\bch\.\w+", text)
            assert not unknown, f"{fn}: teach this test about {unknown}"
            found[" ".join(text.split())] = fn
    return found


def _expected_indexes(query: str) -> list[str]:
    """Partition indexes are named after their columns: message_logged_<cols>_idx."""
    if "x.ctid" in query:
        return [r"\bchannel_pkey\b"]
    if "FROM {schema}.channel" in query:
        # the pick, and with it the heads (LATERAL)
        heads = [r"_queue_id_channel_dequeue_at_id_idx\b", r"_queue_id_channel_dequeue_at_idx\b"]
        return [r"\bchannel_ready_idx\b"] + (heads if "LATERAL" in query else [])
    if "m.channel IS NULL" in query:
        return [r"_gen_queue_id_dequeue_at_id_idx\b"]
    if "LATERAL" in query:
        return [r"_queue_id_channel_dequeue_at_id_idx\b", r"_queue_id_channel_dequeue_at_idx\b"]
    if "AND m.leased" in query:
        return [r"_queue_id_channel_dequeue_at_idx\b"]
    return [r"_queue_id_channel_dequeue_at_id_idx\b"]


def _sorts_a_table(plan: str) -> bool:
    """Whether a Sort node of the plan has a scan of a table below it (sorting a handful of
    rows already fetched, say for array_agg(... ORDER BY), is fine)."""
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(("Sort ", "->  Sort ", "Sort")) and "Sort Key" not in line:
            indent = len(line) - len(line.lstrip())
            for below in lines[i + 1 :]:
                if len(below) - len(below.lstrip()) <= indent:
                    break
                if re.search(r"(Index|Index Only|Seq|Bitmap Heap) Scan .* on (message|channel)", below):
                    return True
    return False


@pytest.fixture(scope="module")
def crowded(dsn: str) -> Iterator[tuple[str, int, int]]:
    """A queue of 10,000 channels with 20 messages each (a quarter of them leased), next to a
    plain queue; analysed. Yields (schema, queue id, now)."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("plain")
        c.create_queue("q", channel_max_concurrency=5)
        c.send_batch("plain", list(range(1000)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = Db(conn, schema)
        qid, now = db.qid("q"), db.now()
        db.q(
            """INSERT INTO {s}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, attempts,
                                         deliveries, leased, channel, payload)
                SELECT %(q)s, 1, CASE WHEN i %% 4 = 0 THEN %(now)s + 30000 + i ELSE %(now)s - 1000000 + i END,
                       %(now)s - 1000000 + i, %(now)s - 1000000 + i, (i %% 4 = 0)::int,
                       (i %% 4 = 0)::int, i %% 4 = 0, 'c' || (i %% %(ch)s), '\\x7b7d'
                  FROM generate_series(1, %(n)s) i""",
            {"q": qid, "now": now, "ch": CHANNELS, "n": CHANNELS * PER_CHANNEL},
        )
        assert db.q("SELECT {s}.channel_recount('q', %s) AS n", (now,))[0]["n"] == CHANNELS
        db.q("ANALYZE {s}.message")
        db.q("ANALYZE {s}.channel")
        yield schema, qid, now
    drop_schema(dsn, schema)


def test_hot_queries_are_found() -> None:
    # plain candidates (shared with take()); the pick with the heads, and the served channels'
    # update (the two head lookups of ready_at, inline, and the probe of the row); the two head
    # lookups of _channel_ready_at
    assert Counter(hot_queries().values()) == {"_lock_ready": 2, "_take_channels": 4, "_channel_ready_at": 2}
    assert "{schema}._lock_ready(q, p_limit, p_now)" in function_text("_take_channels")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_channel_take_queries_use_indexes(dsn: str, crowded: tuple[str, int, int], mode: str) -> None:
    schema, qid, now = crowded
    args = (
        qid,
        now,
        ["c1", "c2"],
        "c77",
        now - 10**9,
        0,
        ["c3", "c4", "c8"],
        [now] * 3,
        [1, 2, 3],
        [False, True, False],
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Identifier(mode)))
        for i, query in enumerate(hot_queries()):
            q = sql.SQL(query.replace("{schema}", "{s}")).format(s=sql.Identifier(schema))  # type: ignore[arg-type]
            name = sql.Identifier(f"p{i}")
            # Client-side binding: the $n stay in the text for PREPARE, not for the protocol.
            psycopg.ClientCursor(conn).execute(sql.SQL("PREPARE {} " + _PARAMS + " AS ").format(name) + q)
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    sql.SQL("EXPLAIN (COSTS OFF) EXECUTE {} ({})").format(
                        name, sql.SQL(", ").join(map(sql.Literal, args))
                    )
                )
            )
            assert "Seq Scan" not in plan and not _sorts_a_table(plan), f"{query}\n{plan}"
            for expected in _expected_indexes(query):
                assert re.search(r"Index (Only )?Scan using \S*" + expected, plan), f"{query}\n{plan}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_channel_take_reads_a_bounded_number_of_index_entries(
    dsn: str, crowded: tuple[str, int, int], mode: str
) -> None:
    """The real take(): no sequential scan anywhere, and a handful of index entries read per
    message delivered, with 10,000 ready channels and 200,000 messages."""
    schema, _qid, now = crowded
    with psycopg.connect(dsn) as conn:
        db = Db(conn, schema)
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Identifier(mode)))
        for _ in range(6):  # past plpgsql's custom-plan warm-up
            db.take("q", 1, now)
        conn.rollback()
        got = db.take("q", 50, now)
        assert len({d["channel"] for d in got}) == 50
        stats = db.q(
            """SELECT relname, seq_scan FROM pg_stat_xact_user_tables
                         WHERE schemaname = %s AND relname IN ('channel', %s)""",
            (schema, "message_logged"),
        )
        assert {r["relname"] for r in stats} == {"channel", "message_logged"}
        assert all(r["seq_scan"] == 0 for r in stats), stats
        read = {
            r["idx"]: r["n"]
            for r in db.q(
                """SELECT i.indexrelid::regclass::text AS idx,
                      pg_stat_get_xact_tuples_returned(i.indexrelid) AS n
                 FROM pg_index i WHERE i.indrelid IN (%s::regclass, %s::regclass)""",
                (f'"{schema}".channel', f'"{schema}".message_logged'),
            )
        }
        # About 8 per message (pick, head, ready_at, two updates by key); a pick rereading the
        # entries this call left behind would add 50 * 49 / 2.
        assert sum(read.values()) < 50 * 12, read
        conn.rollback()


def test_a_queue_without_channels_keeps_the_set_based_path(dsn: str, client: Client, db: Db) -> None:
    client.create_queue("plain")
    client.create_queue("chan")
    client.send_batch("plain", list(range(20)))
    client.send_batch("chan", [Envelope(i, channel="a") for i in range(20)])
    assert {r["name"]: r["uses_channels"] for r in db.q("SELECT name, uses_channels FROM {s}.queue")} == {
        "plain": False,
        "chan": True,
    }
    with psycopg.connect(dsn) as conn:
        other = Db(conn, db.schema)

        def channel_reads() -> int:
            r = other.q(
                "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) AS n"
                " FROM pg_stat_xact_user_tables WHERE schemaname = %s AND relname = 'channel'",
                (db.schema,),
            )
            return int(r[0]["n"])

        for _ in range(3):
            assert len(other.take("plain", 2, other.now())) == 2
            ms = other.take("plain", 1, other.now())
            other.ack("plain", ms, other.now())
        assert channel_reads() == 0  # take and ack never looked at the channel table
        conn.rollback()
        assert len(other.take("chan", 2, other.now())) == 2
        assert channel_reads() > 0
        conn.rollback()
    # The plain candidate query of take() (in _lock_ready) uses the plain dequeue index (see
    # test_plans.py).
    assert "{schema}._lock_ready(q, v_want, v_now)" in function_text("take")
    assert "m.gen = g.gen AND m.queue_id = q.id AND m.channel IS NULL" in function_text("_lock_ready")


def test_metrics_peek_and_next_ready_in_see_channel_messages(client: Client, db: Db) -> None:
    client.create_queue("q")
    client.set_channel("q", "slow", release_interval=60)
    t = db.now()
    db.send("q", _items("a", 2) + _items("slow", 2) + _items(None, 1, "p"), t)
    db.send("q", _items("b", 1), t, delays=[10_000])
    db.take("q", 1, t)
    m = db.q("SELECT * FROM {s}.queue_metrics('q', 1000, %s)", (t,))[0]
    assert (m["ready"], m["leased"], m["scheduled"], m["next_scheduled_at"]) == (4, 1, 1, t + 10_000)
    assert m["oldest_ready_age_ms"] == 0
    # p1 (plain, dequeue_at t) went first; peek lists by dequeue_at: b1 due at t + 10 s, p1's
    # lease ends at t + 30 s.
    peeked = [bytes(r["payload"]).decode() for r in db.q("SELECT * FROM {s}.peek('q', 10, %s)", (t,))]
    assert peeked == ["a1", "a2", "slow1", "slow2", "b1", "p1"]
    assert db.q("SELECT {s}.next_ready_in('q', %s) AS n", (t,))[0]["n"] == 0
