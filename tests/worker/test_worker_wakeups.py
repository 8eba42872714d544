"""The worker as a waiter (issue 12 item 1): it registers for a queue while it has free slots
and nothing to fetch (so sends notify), unregisters while every slot is busy (so sends do not
pay for NOTIFY), and loses no wake-up under concurrent producers."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
from psycopg import sql

from lonnymq import Client
from lonnymq.worker import App, Worker
from worker_helpers import eventually, waiters, with_worker

# Only a NOTIFY (or the trailing fetch after registering) can wake the worker in time: the bounds
# below are a fraction of it, long enough for a loaded CI machine.
POLL = 120.0


def _notified(dsn: str, schema: str, send: Client, queue: str) -> list[str]:
    """The notifications a send to ``queue`` makes, seen by a plain LISTEN connection."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        send.send(queue, "x")
        return [n.payload for n in c.notifies(timeout=0.5)]


def test_worker_waits_only_while_idle(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    app = App()
    release = threading.Event()
    started: list[int] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        started.append(job.id)
        release.wait(120)

    def waiting() -> int:
        return waiters(dsn, schema, "jobs")

    async def scenario(w: Worker) -> None:
        # Conditions, not sleeps: a loaded machine can take longer than any fixed pause to
        # register or unregister (CI: load 6-12).
        await eventually(lambda: asyncio.to_thread(waiting), what="idle: registered as a waiter")
        assert await asyncio.to_thread(_notified, dsn, schema, client, "jobs") == ["jobs"]
        await eventually(lambda: started, what="that send's fetch")  # it filled the only slot
        await eventually(lambda: asyncio.to_thread(lambda: waiting() == 0), what="busy: unregistered")
        assert await asyncio.to_thread(_notified, dsn, schema, client, "jobs") == []  # busy
        release.set()
        await eventually(lambda: len(started) == 2, what="the message sent while busy")
        await eventually(lambda: asyncio.to_thread(waiting), what="idle again: registered again")
        assert await asyncio.to_thread(_notified, dsn, schema, client, "jobs") == ["jobs"]
        await eventually(lambda: len(started) == 3, what="the third message")

    with_worker(app, dsn, schema, scenario, poll_interval=POLL, concurrency=1)


def test_worker_loses_no_wakeup_under_concurrency(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    app = App()
    lat: list[float] = []
    producers, rounds = 3, 20

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        lat.append(time.time() - float(job.payload))

    def burst(i: int) -> None:
        threads = [
            threading.Thread(target=lambda: client.send("jobs", str(time.time()))) for _ in range(producers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    async def scenario(w: Worker) -> None:
        for i in range(rounds):
            await asyncio.sleep(0.03 + 0.02 * (i % 4))  # idle (or about to be) again
            await asyncio.to_thread(burst, i)
        await eventually(lambda: len(lat) == producers * rounds)
        # A lost wake-up waits for the poll (108-132 s); a loaded machine may take seconds.
        assert max(lat) < 30, sorted(lat)[-5:]

    with_worker(app, dsn, schema, scenario, poll_interval=POLL, concurrency=2)


def test_worker_waits_for_a_send_in_flight_when_it_registers(dsn: str, schema: str, client: Client) -> None:
    """A send whose transaction is open while the worker registers never notifies; the worker
    fetches once it has committed."""
    client.create_queue("jobs")
    app = App()
    got: list[float] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        got.append(time.monotonic())

    with psycopg.connect(dsn) as tx:
        client.send("jobs", "x", conn=tx)

        async def scenario(w: Worker) -> None:
            await eventually(lambda: asyncio.to_thread(waiters, dsn, schema, "jobs"), what="registered")
            assert not got  # the send still pending
            await asyncio.to_thread(tx.commit)
            committed = time.monotonic()
            await eventually(lambda: got)
            assert got[0] - committed < 30  # not the poll's 108-132 s

        with_worker(app, dsn, schema, scenario, poll_interval=POLL)
