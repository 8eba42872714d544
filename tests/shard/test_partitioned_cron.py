"""Schedules (cron) of a partitioned queue, through the router: a schedule is one row on its
partition 0's shard, so each tick is sent once (not once per shard), to partition 0, however
many schedulers race; workers (router and direct clients) running the scheduler together send
every tick once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from test_partition_move import four_shards

from lonnymq import AsyncClient, Client, shard
from lonnymq.client.direct import STRIDE
from lonnymq.worker import App, Worker
from lonnymq.worker.meters import total
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow]

T0 = 1_700_000_000_000  # a fixed "now" for the SQL calls (epoch ms, a whole minute)


def _fire(dsn: str, name: str, tick: int) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT lonnymq.cron_fire(%s, %s, %s)", (name, tick, tick + 10)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _rows_on_shards(sharded, name: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """The queue of schedule ``name`` on each shard (read on the shard itself)."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            out.append(
                [str(r[0]) for r in conn.execute("SELECT queue FROM lonnymq.cron WHERE name = %s", (name,))]
            )
    return out


def test_a_schedule_lives_on_one_shard_and_each_tick_is_sent_once(sharded) -> None:  # type: ignore[no-untyped-def]
    q = "hot_cron"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
    parts = shard.status(sharded.dsn).partitioned[q]
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:

        def upsert(payload: bytes = b'{"x":1}') -> str:
            row = conn.execute(
                "SELECT lonnymq.cron_upsert('hot_beat', '@every 1s', %s, %s, p_now => %s)", (q, payload, T0)
            ).fetchone()
            assert row is not None
            return str(row[0])

        assert upsert() == "created"
        assert upsert() == "unchanged"  # routed to the same shard again: the same row
        on = _rows_on_shards(sharded, "hot_beat")
        assert on[parts[0]] == [q] and on[parts[1]] == [], on
        listed = [
            r for r in conn.execute("SELECT name, queue FROM lonnymq.cron_list()") if r[0] == "hot_beat"
        ]
        assert listed == [("hot_beat", q)]

    # 8 schedulers race for each of 5 ticks through the router: one send per tick.
    ticks = [T0 + k * 1000 for k in range(1, 6)]
    results: dict[int, list[int | None]] = {t: [] for t in ticks}
    for tick in ticks:
        barrier = threading.Barrier(8)

        def racer(tick: int = tick, barrier: threading.Barrier = barrier) -> None:
            with psycopg.connect(sharded.dsn, autocommit=True) as conn:
                barrier.wait()
                row = conn.execute(
                    "SELECT lonnymq.cron_fire('hot_beat', %s, %s)", (tick, tick + 10)
                ).fetchone()
                results[tick].append(None if row is None else row[0])

        threads = [threading.Thread(target=racer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    sent = {t: [i for i in r if i is not None] for t, r in results.items()}
    assert all(len(v) == 1 for v in sent.values()), results
    assert {v[0] % STRIDE for v in sent.values()} == {parts[0]}  # partition 0's shard made them
    assert _fire(sharded.dsn, "hot_beat", ticks[2]) is None  # an old tick: not again
    with Client(sharded.dsn) as c:
        got = [m for _ in range(4) for m in c.take(q, 10)]
        assert sorted(m.headers["lonnymq_cron"]["tick"] for m in got if m.headers) == ticks
        assert sorted(m.id for m in got) == sorted(v[0] for v in sent.values())
        c.ack(got)
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT lonnymq.cron_set_enabled('hot_beat', false)").fetchone() == (True,)
        assert _fire(sharded.dsn, "hot_beat", T0 + 9000) is None
        assert conn.execute("SELECT lonnymq.cron_set_enabled('hot_beat', true)").fetchone() == (True,)
        assert _fire(sharded.dsn, "hot_beat", T0 + 10000) is not None
        assert conn.execute("SELECT lonnymq.cron_delete('hot_beat')").fetchone() == (True,)
    assert _rows_on_shards(sharded, "hot_beat") == [[], []]


def test_workers_send_every_tick_of_a_partitioned_queue_once(sharded) -> None:  # type: ignore[no-untyped-def]
    """Two workers, one with a client of the router and one direct, both running the
    scheduler of one schedule on a partitioned queue: every tick is handled once, and the
    schedulers count exactly the ticks they sent, per schedule. A worker's scheduler fires
    every schedule of the database (``cron_list``), not only its app's: here another queue's
    schedule with a tick due, as the ``* * * * *`` schedules other tests of this session leave
    behind (test_move's mv_cron) had one whenever a minute began during this test (a worker's
    counter summed over every schedule was one more than this queue's messages, once in ~14
    runs): its fires are counted under its own label."""
    q = "hot_cron_workers"
    other = "hot_cron_other"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
        c.create_queue(other)
    parts = shard.status(sharded.dsn).partitioned[q]
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT lonnymq.now_ms()").fetchone()
        assert row is not None
        # Created just before the last minute began: that minute's tick (or the next's) is due.
        conn.execute(
            "SELECT lonnymq.cron_upsert('hot_other_beat', '* * * * *', %s, '\\x7b7d'::bytea, p_now => %s)",
            (other, row[0] - row[0] % 60000 - 1),
        )
    app = App()
    app.periodic("hot_workers_beat", "@every 1s", queue=q, payload={"hello": "world"})
    got: list[tuple[int, int]] = []

    @app.handler(q)
    async def on_tick(job):  # type: ignore[no-untyped-def]
        assert job.payload == {"hello": "world"}
        got.append((job.headers["lonnymq_cron"]["tick"], job.id))

    workers: list[Worker] = []

    async def main() -> None:
        async with (
            AsyncClient(sharded.dsn) as via_router,
            AsyncClient(sharded.dsn, direct=True) as direct,
        ):
            for client in (via_router, direct):
                w = Worker(app, client, poll_interval=0.2)
                await w.start()
                workers.append(w)
            try:
                await eventually(lambda: len(got) >= 4, what="four ticks handled")
                await asyncio.sleep(1.2)  # a tick sent twice would show
            finally:
                for w in workers:
                    await w.stop()

    asyncio.run(main())
    ticks = [t for t, _ in got]
    assert len(ticks) == len(set(ticks)), ticks
    assert all(t % 1000 == 0 for t in ticks)
    assert {i % STRIDE for _, i in got} == {parts[0]}
    # Ticks the schedulers sent, per schedule (a worker's counter of every schedule counts
    # the other queue's too).
    sent = sum(total(w.m_cron, schedule="hot_workers_beat") for w in workers)
    sent_other = sum(total(w.m_cron, schedule="hot_other_beat") for w in workers)
    with Client(sharded.dsn) as c:
        m = c.metrics(q)
        m_other = c.metrics(other)
        with psycopg.connect(sharded.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT lonnymq.cron_delete('hot_other_beat')").fetchone() == (True,)
        c.drop_queue(other)
    # Every message sent is a handled tick (each once, above) or still in the queue, and each
    # was counted once by the scheduler that sent it.
    assert m.total_sent == len(ticks) + m.ready + m.scheduled + m.leased, (m, ticks, sent)
    assert m.total_sent == sent >= len(ticks), (m, ticks, sent)
    assert m_other.total_sent == sent_other >= 1, (m_other, sent_other)
    assert all(total(w.m_cron_errors) == 0 for w in workers)
    on: list[Any] = _rows_on_shards(sharded, "hot_workers_beat")
    assert on[parts[0]] == [q] and on[parts[1]] == []


def test_a_schedule_moves_with_partition_0_and_still_fires_once(sharded) -> None:  # type: ignore[no-untyped-def]
    """A scheduler fires tick after tick through the router while partition 0 moves: the
    schedule's row goes with it (on the new shard only, found there by the next upsert), and
    no tick is sent twice (the router's merge would hide a second shard's send: the messages
    are counted). A fire that meets the copy may send nothing (the source's row is gone when
    its lock is released, the target's not yet committed when it looked): fired again, as the
    worker's scheduler does at its next pass, it is sent then, once."""
    router, shards = four_shards(sharded, "pcron")  # 4 shards: partition 0 has somewhere to go
    q = "pcron_moving"
    with Client(router) as c:
        c.create_queue(q, partitions=2)
    parts = shard.status(router).partitioned[q]
    target = next(i for i in range(4) if i not in parts)
    with psycopg.connect(router, autocommit=True) as conn:
        upsert = "SELECT lonnymq.cron_upsert('pcron_beat', '@every 1s', %s, '\\x7b7d'::bytea, p_now => %s)"
        assert conn.execute(upsert, (q, T0)).fetchone() == ("created",)
    stop = threading.Event()
    fired: list[tuple[int, int | None]] = []
    failures: list[BaseException] = []

    def scheduler() -> None:
        tick = T0
        try:
            while not stop.is_set():
                tick += 1000
                for _ in range(
                    5
                ):  # a tick not sent (a fire during the copy): again, as a scheduler's next pass
                    fired.append((tick, _fire(router, "pcron_beat", tick)))
                    if fired[-1][1] is not None:
                        break
        except BaseException as e:  # reported below
            failures.append(e)

    t = threading.Thread(target=scheduler)
    t.start()

    def fires(n: int) -> None:  # waits for n fires (generously: a loaded machine), not forever
        deadline = time.monotonic() + 120
        while len(fired) < n and not failures:
            assert time.monotonic() < deadline, f"{len(fired)} fires, not {n}"
            time.sleep(0.02)

    try:
        fires(20)
        moved = shard.move(router, q, target, partition=0)
        fires(len(fired) + 20)
    finally:
        stop.set()
        t.join(30)
    assert not failures, failures
    assert moved.rows["cron"] == 1
    on = [[r[0] for r in psycopg.connect(d).execute("SELECT queue FROM lonnymq.cron")] for d in shards]
    assert on[target] == [q] and all(on[i] == [] for i in range(4) if i != target), on
    with psycopg.connect(router, autocommit=True) as conn:
        assert conn.execute(upsert, (q, T0)).fetchone() == ("unchanged",)  # found where it moved
    sent = {tick: i for tick, i in fired if i is not None}
    assert len(sent) == len({tick for tick, _ in fired})  # every tick sent (within the grace)
    assert len(fired) - len(sent) <= 4  # not sent by a fire: at most during the copy, once
    assert {i % STRIDE for i in sent.values()} == {parts[0], target}
    with Client(router) as c:
        got = [m for _ in range(len(sent)) for m in c.take(q, 10)]
        assert c.take(q, 10) == []
    ticks = [m.headers["lonnymq_cron"]["tick"] for m in got if m.headers]
    assert sorted(ticks) == sorted(sent) and len(ticks) == len(got)
