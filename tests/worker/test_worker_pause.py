"""A worker serving a paused queue (queue_pause, migration 0011) keeps running and idles: it
fetches nothing, its handlers in flight settle as usual, and the resume wakes it at once (a
NOTIFY, not its poll). Its metrics say the queue is paused."""

from __future__ import annotations

import asyncio
import threading
from time import monotonic

from lonnymq import Client
from lonnymq.worker import App, Worker
from worker_helpers import eventually, with_worker

POLL = 180.0  # only the resume's wake-up can make the worker fetch in time (the bound below)


def test_worker_idles_while_paused_and_wakes_on_resume(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    app = App()
    release = threading.Event()
    done: list[int] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        if job.payload == 1:
            release.wait(180)
        done.append(job.payload)

    async def scenario(w: Worker) -> None:
        await asyncio.to_thread(client.send, "jobs", 1)
        await eventually(lambda: w.in_flight == 1, what="message 1 in flight")
        await asyncio.to_thread(client.pause_queue, "jobs")
        await asyncio.to_thread(client.send_batch, "jobs", [2, 3])
        release.set()  # the message taken before the pause is acked while paused
        await eventually(lambda: done == [1], what="message 1 done")
        await eventually(
            lambda: asyncio.to_thread(lambda: client.metrics("jobs").leased == 0), what="its ack"
        )
        await asyncio.sleep(1.5)
        assert done == [1] and w.in_flight == 0  # idle, still running
        await w.refresh_queue_metrics(0)
        assert 'lonnymq_queue_paused{queue="jobs"} 1.0' in await w.metrics_text()
        resumed = monotonic()
        await asyncio.to_thread(client.resume_queue, "jobs")
        await eventually(lambda: sorted(done) == [1, 2, 3], what="2 and 3 after the resume")
        assert monotonic() - resumed < 60  # woken by the resume, not the poll (162-198 s)
        await w.refresh_queue_metrics(0)
        assert 'lonnymq_queue_paused{queue="jobs"} 0.0' in await w.metrics_text()

    with_worker(app, dsn, schema, scenario, poll_interval=POLL, concurrency=4)
    assert client.metrics("jobs").ready == 0
