"""Every client unchanged on the router's DSN: the sync and async clients, the worker and the
CLI; their wake-ups by NOTIFY from the shards; and the calls whose promise is the caller's
transaction refused (RouterTransaction)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest
from shard_helpers import FOLLOW, PATIENCE, WAKE_LAG, home, waiter_follows, waiters

from lonnymq import AsyncClient, Client, Envelope, errors, shard
from lonnymq.cli import main
from lonnymq.client.direct import key_partition
from lonnymq.worker import App, Worker
from worker_helpers import eventually, until, with_worker

pytestmark = [pytest.mark.once, pytest.mark.slow]


def queues_on_both_shards(router_dsn: str, prefix: str) -> list[str]:
    """Two queue names, the first held by shard 0, the second by shard 1."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < 2:
        name = f"{prefix}_{i}"
        found.setdefault(home(router_dsn, name), name)
        i += 1
    return [found[0], found[1]]


def test_sync_client_through_the_router(sharded) -> None:  # type: ignore[no-untyped-def]
    with Client(sharded.dsn) as c:
        assert c.is_router()
        for q in queues_on_both_shards(sharded.dsn, "sync"):
            c.create_queue(q, max_attempts=1)
            first = c.send(q, {"n": 0}, key="k0")
            batch = c.send_batch(q, [Envelope({"n": i}, key=f"k{i}") for i in range(1, 4)])
            assert first.outcome == "created" and [r.outcome for r in batch] == ["created"] * 3
            assert c.send(q, {"n": 0}, key="k0").outcome != "created"  # de-duplicated on the shard
            assert [m.payload["n"] for m in c.peek(q)] == [0, 1, 2, 3]
            assert c.get(q, key="k2") is not None
            assert c.cancel(q, key="k3") is True
            got = c.take(q, 2)
            assert [m.payload["n"] for m in got] == [0, 1]
            assert c.ack(got[0]) == {got[0].id}
            assert set(c.extend(got[1])) == {got[1].id}
            assert c.nack(got[1], error="boom") == {got[1].id: "dead"}  # max_attempts=1
            assert [d.last_error for d in c.dead_letters(q)] == ["boom"]
            assert c.requeue_dead(q) == 1
            m = c.metrics(q)
            assert (m.ready, m.leased, m.dead) == (2, 0, 0)
            assert [x.payload["n"] for x in c.receive(q, 5, timeout=5)] == [2, 1]
            c.purge_queue(q)
            assert c.drop_queue(q) is True
        assert not {"sync_0", "sync_1"} & {q.name for q in c.list_queues()}


def _key_on(parts: list[int], shard_index: int, prefix: str) -> str:
    """A key whose partition of a queue with partitions ``parts`` is on shard ``shard_index``."""
    return next(
        f"{prefix}{i}" for i in range(100) if parts[key_partition(f"{prefix}{i}", len(parts))] == shard_index
    )


def _wake_cases(router: str, tag: str) -> list[tuple[str, str | None]]:
    """(queue, key) to send to: a plain queue on each shard, and each partition of a queue
    partitioned over both shards (created here)."""
    plain = queues_on_both_shards(router, f"wake_{tag}")
    part = f"wake_{tag}_p"
    with Client(router) as c:
        for q in plain:
            c.create_queue(q)
        c.create_queue(part, partitions=2)
    parts = shard.status(router).partitioned[part]
    return [
        (plain[0], None),
        (plain[1], None),
        (part, _key_on(parts, 0, "k")),
        (part, _key_on(parts, 1, "k")),
    ]


def _waiters(shard_dsn: str) -> list[int]:
    """The sessions of a shard registered as waiters on some queue (holding a wait lock)."""
    return sorted(waiters(shard_dsn))


def _receive_a_late_send(c: Client, producer: Client, q: str, key: str | None = None) -> float:
    """receive() on ``c`` (poll=30: the fallback poll cannot be what finds the message) while
    ``producer`` sends to ``q`` 0.2 s later; returns the seconds from the send's return to the
    receive() returning it (negative: woken by the commit, before send() returned)."""
    sent: list[float] = []

    def later() -> None:
        time.sleep(0.2)
        producer.send(q, "late", key=key)
        sent.append(time.monotonic())

    t = threading.Thread(target=later)
    t.start()
    got = c.receive(q, timeout=PATIENCE, poll=30)
    woke = time.monotonic()
    t.join()
    assert [m.payload for m in got] == ["late"], (q, key)
    c.ack(got)
    return woke - sent[0]


@pytest.mark.parametrize("direct", [False, True], ids=["router", "direct"])
def test_receive_wakes_for_a_send_on_the_queues_shard(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """A waiting receive() listens on the shard(s) holding its queue, where sends notify: a send
    through the router wakes it at once, for a queue on either shard and for either partition
    of a partitioned queue."""
    with Client(sharded.dsn, direct=direct) as c, Client(sharded.dsn) as producer:
        lags = [
            _receive_a_late_send(c, producer, q, key)
            for q, key in _wake_cases(sharded.dsn, f"r{int(direct)}")
        ]
    assert max(lags) < WAKE_LAG, lags


def test_receive_follows_a_moved_queue(sharded) -> None:  # type: ignore[no-untyped-def]
    """After its queue moved to the other shard, a receive() of the same client (whose map still
    names the old shard) registers on the new shard and wakes for the queue's sends there."""
    q = queues_on_both_shards(sharded.dsn, "wake_mv")[0]
    with Client(sharded.dsn) as c:
        c.create_queue(q)
        assert c.receive(q, timeout=0.1, poll=30) == []  # listened on shard 0 (the map read)
        shard.move(sharded.dsn, q, 1)
        assert _receive_a_late_send(c, c, q) < WAKE_LAG


@pytest.mark.parametrize("direct", [False, True], ids=["router", "direct"])
def test_a_waiting_receive_follows_a_move_at_once(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """A receive() already waiting on its queue's shard when the queue moves (poll=30, its map
    read just before) is told by the move (a notification on the old shard): it registers on
    the new shard at once and wakes for a send there within a second, not at its next look at
    the map (MAP_TTL, 10 s) nor at its poll."""
    q = queues_on_both_shards(sharded.dsn, f"wake_mvnow{int(direct)}")[0]
    with Client(sharded.dsn) as admin:
        admin.create_queue(q)
    with Client(sharded.dsn, direct=direct) as c, Client(sharded.shard_dsns[1]) as on_target:
        got, lag = waiter_follows(
            c,
            q,
            *sharded.shard_dsns,
            lambda: shard.move(sharded.dsn, q, 1),
            lambda: on_target.send(q, "after the move"),  # a send on the new shard itself
        )
    assert got == ["after the move"]
    assert lag < WAKE_LAG, lag


def test_receive_wakes_while_a_partitions_shard_is_down(sharded) -> None:  # type: ignore[no-untyped-def]
    """With one partition's shard stopped, receive() listens on the other (a shard that cannot
    be reached is left out, neither an error nor a hang) and wakes for its sends."""
    (_, _, (q, up_key), _) = _wake_cases(sharded.dsn, "down")
    sharded.shards[1].stop()
    try:
        with Client(sharded.dsn) as c:
            assert _receive_a_late_send(c, c, q, up_key) < WAKE_LAG
    finally:
        sharded.shards[1].start()


def test_async_client_through_the_router(sharded) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        async with AsyncClient(sharded.dsn) as c:
            queues = queues_on_both_shards(sharded.dsn, "aio")
            for q in queues:
                await c.create_queue(q)
                await c.send_batch(q, ["a", "b"])
                got = await c.take(q, 5)
                assert [m.payload for m in got] == ["a", "b"]
                assert await c.ack(got) == {m.id for m in got}
                assert await c.receive(q, timeout=0.2, poll=0.1) == []
            names = {q.name for q in await c.list_queues()}
            assert set(queues) <= names

    asyncio.run(scenario())


def test_worker_through_the_router(sharded) -> None:  # type: ignore[no-untyped-def]
    queues = queues_on_both_shards(sharded.dsn, "jobs")
    with Client(sharded.dsn) as c:
        for q in queues:
            c.create_queue(q)
            c.send_batch(q, [{"q": q, "i": i} for i in range(20)])
    app = App()
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    for q in queues:

        @app.handler(q)
        def work(job):  # type: ignore[no-untyped-def]
            if job.payload["i"] == 3 and job.attempt == 1:
                raise RuntimeError("once")  # retried: nack through the router
            with lock:
                seen.append((job.payload["q"], job.payload["i"]))

    with_worker(app, sharded.dsn, "lonnymq", until(lambda: len(seen) == 40), poll_interval=0.2)
    assert sorted(seen) == sorted((q, i) for q in queues for i in range(20))
    with Client(sharded.dsn) as c:
        for q in queues:
            m = c.metrics(q)
            assert (m.ready, m.leased, m.scheduled) == (0, 0, 0)


@pytest.mark.parametrize("direct", [False, True], ids=["router", "direct"])
def test_worker_wakes_for_a_send_on_the_queues_shard(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """The worker's listener listens on the shards of its queues (one connection per shard): a
    send through the router wakes it at once (poll_interval=30), also after its connection to
    a shard was cut (it connects and registers again)."""
    cases = _wake_cases(sharded.dsn, f"w{int(direct)}")
    app = App()
    handled: dict[str, float] = {}
    for q in dict.fromkeys(q for q, _ in cases):

        @app.handler(q)
        async def work(job):  # type: ignore[no-untyped-def]
            handled[job.payload] = time.monotonic()

    lags = []

    async def main() -> None:
        async with AsyncClient(sharded.dsn, direct=direct) as client, AsyncClient(sharded.dsn) as producer:
            w = Worker(app, client, poll_interval=30, concurrency=4)
            await w.start()
            try:
                await eventually(lambda: len(_waiters(sharded.shard_dsns[1])) == 1, PATIENCE, "registered")
                for n, (q, key) in enumerate(cases):
                    if n == 2:  # cut the listener's connection to shard 1
                        [pid] = _waiters(sharded.shard_dsns[1])
                        with psycopg.connect(sharded.shard_dsns[1], autocommit=True) as conn:
                            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                        await eventually(lambda: len(_waiters(sharded.shard_dsns[1])) == 1, FOLLOW, "again")
                    tag = f"{q}/{key}"
                    await producer.send(q, tag, key=key)
                    sent = time.monotonic()
                    await eventually(lambda tag=tag: tag in handled, PATIENCE, f"{tag} handled")  # type: ignore[misc]
                    lags.append(handled[tag] - sent)
            finally:
                await w.stop()

    asyncio.run(main())
    assert max(lags) < WAKE_LAG, lags


def test_a_waiting_worker_follows_a_move_at_once(sharded) -> None:  # type: ignore[no-untyped-def]
    """The worker's listener (asyncio, poll_interval=30) registered on its queue's shard follows
    the queue when it moves (the move's notification on the old shard): a send on the new shard
    is handled within a second."""
    q = queues_on_both_shards(sharded.dsn, "wake_wmv")[0]
    app = App()
    handled: dict[str, float] = {}

    @app.handler(q)
    async def work(job):  # type: ignore[no-untyped-def]
        handled[job.payload] = time.monotonic()

    lags = []

    async def main() -> None:
        async with AsyncClient(sharded.dsn) as client, AsyncClient(sharded.shard_dsns[1]) as on_target:
            await client.create_queue(q)
            before = [waiters(d) for d in sharded.shard_dsns]
            w = Worker(app, client, poll_interval=30, concurrency=4)
            await w.start()
            try:
                await eventually(lambda: bool(waiters(sharded.shard_dsns[0]) - before[0]), PATIENCE, "on 0")
                await asyncio.to_thread(shard.move, sharded.dsn, q, 1)
                await eventually(lambda: bool(waiters(sharded.shard_dsns[1]) - before[1]), FOLLOW, "on 1")
                await on_target.send(q, "moved")
                sent = time.monotonic()
                await eventually(lambda: "moved" in handled, PATIENCE, "handled")
                lags.append(handled["moved"] - sent)
            finally:
                await w.stop()

    asyncio.run(main())
    assert lags[0] < WAKE_LAG, lags


def test_cli_through_the_router(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    dsn = ["--dsn", sharded.dsn]
    assert main(["queue", "create", "clirouted", *dsn]) == 0
    assert main(["send", "clirouted", "1", "2", "3", *dsn]) == 0
    capsys.readouterr()
    assert main(["take", "clirouted", "-n", "2", "--json", *dsn]) == 0
    taken = json.loads(capsys.readouterr().out)
    assert [m["payload"] for m in taken] == [1, 2]
    assert main(["ack", "clirouted", f"{taken[0]['id']}:{taken[0]['token']}", *dsn]) == 0
    assert main(["nack", "clirouted", f"{taken[1]['id']}:{taken[1]['token']}", *dsn]) == 0
    capsys.readouterr()
    assert main(["queue", "list", "--json", *dsn]) == 0
    assert "clirouted" in {q["name"] for q in json.loads(capsys.readouterr().out)}
    assert main(["queue", "stats", "clirouted", "--json", *dsn]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ready"] == 2


def test_caller_transactions_are_refused_on_the_router(sharded) -> None:  # type: ignore[no-untyped-def]
    with Client(sharded.dsn) as c:
        c.create_queue("txq")
        c.send("txq", "x")
        with pytest.raises(errors.RouterTransaction, match="shard router"):
            c.take_tx("txq")
        with psycopg.connect(sharded.dsn) as conn:  # not autocommit: the call would join it
            with pytest.raises(errors.RouterTransaction):
                c.send("txq", "y", conn=conn)
            conn.rollback()
        with psycopg.connect(sharded.dsn, autocommit=True) as conn:
            with conn.transaction(), pytest.raises(errors.RouterTransaction):
                c.take_tx("txq", conn=conn)
            # Autocommit, no transaction open: the call is its own transaction, as always.
            assert c.send("txq", "z", conn=conn).outcome == "created"
        assert [m.payload for m in c.peek("txq")] == ["x", "z"]


def test_take_tx_on_a_shard_directly_is_not_refused(sharded) -> None:  # type: ignore[no-untyped-def]
    q = queues_on_both_shards(sharded.dsn, "direct")[0]
    with Client(sharded.dsn) as routed:
        routed.create_queue(q)
        routed.send(q, "x")
    with Client(sharded.shard_dsns[0]) as c, psycopg.connect(sharded.shard_dsns[0]) as conn:
        assert not c.is_router()
        got = c.take_tx(q, conn=conn)
        assert [m.payload for m in got] == ["x"]
        conn.rollback()  # back, untouched
        assert [m.payload for m in c.peek(q)] == ["x"]


def test_a_dead_letter_queue_on_another_shard_is_refused(sharded) -> None:  # type: ignore[no-untyped-def]
    here, there = queues_on_both_shards(sharded.dsn, "dlq")
    with Client(sharded.dsn) as c:
        c.create_queue(there)
        with pytest.raises(errors.QueueNotFound):
            c.create_queue(here, dead_letter_queue=there)
