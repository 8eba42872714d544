"""The worker registers itself in the worker registry (sql/stats.sql) through its heartbeat:
listed with its host, pid, queues, concurrency and handlers in flight while it runs, gone once
it stops."""

from __future__ import annotations

import os
import socket
import threading

from lonnymq import Client
from lonnymq.worker import App, Worker
from worker_helpers import eventually, with_worker


def test_a_running_worker_is_listed_until_it_stops(dsn: str, schema: str, client: Client) -> None:
    # Heartbeats every 2 s: a 1.5 s lease (every half second) left a loaded CI machine 1 s of
    # slack for a heartbeat to land; a late one lost the lease, and its message ran again.
    client.create_queue("jobs", lease=6)
    client.create_queue("other")
    gate = threading.Event()
    app = App()

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        gate.wait(180)  # longer than the test waits for the listing: only the test opens it

    @app.handler("other")
    def nothing(job):  # type: ignore[no-untyped-def]
        pass

    seen = []

    async def scenario(w: Worker) -> None:
        client.send("jobs", 1)

        def busy() -> bool:
            rows = client.run(client.ops.worker_list())
            seen[:] = rows
            return bool(rows) and rows[0].in_flight == 1

        await eventually(busy, what="the worker listed with its handler in flight")
        gate.set()

    with_worker(app, dsn, schema, scenario, concurrency=3)
    [info] = seen
    assert (info.host, info.pid, info.queues, info.concurrency) == (
        socket.gethostname(),
        os.getpid(),
        ["jobs", "other"],
        3,
    )
    assert info.heartbeat_at >= info.started_at
    assert client.run(client.ops.worker_list()) == []  # a clean stop leaves the registry
