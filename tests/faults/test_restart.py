"""PostgreSQL restarts (immediate mode: a crash, then recovery from WAL) under a running worker
and a producer with the default client settings (issue 18, items 4 and 5).

* The worker keeps running through the outage, logs one line when it starts and one when it
  ends (not one per call), processes every committed message, and processes an acknowledged
  message again never (only deliveries in flight at the crash may run twice).
* The producer sees no error but, at most, ConnectionLost for a send cut off in flight (it may
  have committed): sends that never reached the server are retried by the client. Each send
  that returned is in the queue (checked by id).

Runs on throwaway PostgreSQL 15 clusters (tools/pgcluster.py); the figures are printed (-s).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from cluster_helpers import SETTINGS, Producer, Recorder, outage_lines, pgcluster, recovery_gaps, require_pg15

from lonnymq import Client
from lonnymq.worker import Worker
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow, pytest.mark.timeout(240)]


def test_worker_rides_out_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    require_pg15()
    caplog.set_level(logging.INFO, logger="lonnymq.worker")
    with pgcluster.temporary_cluster(SETTINGS, install=False) as cluster:
        with Client(cluster.dsn) as c:
            c.migrate()
            c.create_queue("q", lease=5)
        rec = Recorder(seconds=0.3)
        producer = Producer(cluster.dsn, rate=40)

        async def main() -> tuple[Worker, float, float]:
            w = Worker(rec.app(), cluster.dsn, concurrency=4, poll_interval=1.0)
            await w.start()
            try:
                producer.start()
                await asyncio.sleep(8)  # more than Recorder.resurrected's margin before the outage
                down = time.monotonic()
                await asyncio.to_thread(cluster.stop, "immediate")
                await asyncio.sleep(2)  # handlers still running finish meanwhile
                await asyncio.to_thread(cluster.start)
                up = time.monotonic()
                await asyncio.sleep(4)
                await asyncio.to_thread(producer.finish)
                assert not w._done.is_set(), "the worker stopped"
                await eventually(lambda: producer.ids <= rec.ids(), 60, "every committed message processed")
            finally:
                await w.stop()
            await w.wait()  # raises if one of its tasks failed
            return w, down, up

        _, down, up = asyncio.run(main())

    assert producer.errors == []
    after = [d for d in rec.done if d[2] > up]
    assert after, "nothing processed after the restart"
    assert rec.resurrected(down) == [], "an acknowledged message was processed again"
    assert len(rec.twice()) <= 4 + 4, "more messages ran twice than were in flight"  # concurrency + one batch
    down_lines, up_lines = outage_lines(caplog.records)
    assert (down_lines, up_lines) == (1, 1), [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
    ]
    print(
        f"\nworker through a restart: {len(producer.ids)} committed sends, {len(rec.done)} deliveries "
        f"processed ({len(after)} after the restart), {len(rec.twice())} ran twice (in flight at the crash), "
        f"producer ConnectionLost {producer.connection_lost}, first send {recovery_gaps(producer.sent_at, [(down, up)])}s "
        "after the server was back"
    )


def test_producer_through_repeated_restarts() -> None:
    require_pg15()
    restarts = 3
    with pgcluster.temporary_cluster(SETTINGS, install=False) as cluster:
        with Client(cluster.dsn) as c:
            c.migrate()
            c.create_queue("q")
        producer = Producer(cluster.dsn, rate=100)
        producer.start()
        outages: list[tuple[float, float]] = []
        time.sleep(3)
        for _ in range(restarts):
            t0 = time.monotonic()
            cluster.restart("immediate")
            outages.append((t0, time.monotonic()))
            time.sleep(6)
        producer.finish()
        with Client(cluster.dsn) as c:
            stored = {m.id for m in c.peek("q", 100_000)}

    gaps = recovery_gaps(producer.sent_at, outages)
    print(
        f"\nproducer at ~100 msg/s through {restarts} immediate restarts: {len(producer.ids)} sends committed, "
        f"{producer.connection_lost} ConnectionLost (cut off in flight), other errors {len(producer.errors)}; "
        f"seconds from each restart's end to the next committed send: {gaps}; restarts took "
        f"{[round(b - a, 2) for a, b in outages]}s"
    )
    assert producer.errors == [], producer.errors[:3]
    assert producer.ids <= stored, f"committed but missing: {sorted(producer.ids - stored)[:10]}"
    assert all(g < 5 for g in gaps), gaps
