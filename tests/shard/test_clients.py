"""Every client unchanged on the router's DSN: the sync and async clients, the worker and the
CLI; and the calls whose promise is the caller's transaction refused (RouterTransaction)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest
from shard_helpers import home

from lonnymq import AsyncClient, Client, Envelope, errors
from lonnymq.cli import main
from lonnymq.worker import App
from worker_helpers import until, with_worker

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


def test_receive_wakes_for_a_send_through_the_router(sharded) -> None:  # type: ignore[no-untyped-def]
    """NOTIFY happens on the shard, where no one listens: receive() finds the message by its
    polling fallback (``poll``), not by a wake-up (docs/sharding.md)."""
    with Client(sharded.dsn) as c:
        c.create_queue("recv")

        def later() -> None:
            time.sleep(0.3)
            c.send("recv", "late")

        threading.Thread(target=later).start()
        t0 = time.monotonic()
        got = c.receive("recv", timeout=10, poll=0.5)
        assert [m.payload for m in got] == ["late"] and time.monotonic() - t0 < 5
        c.ack(got)


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
