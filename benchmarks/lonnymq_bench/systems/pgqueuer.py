"""PgQueuer (PyPI), schema from its own installer plus its documented ``optimize_autovacuum()``.

Consumers run PgQueuer's own consumer loop (``QueueManager.run``, what ``pgq run`` supervises)
under uvloop on a direct asyncpg connection, the driver its documentation recommends; the job is
a no-op. A job counts as done when PgQueuer has flushed its completion (the loop flushes its
buffers before ``run`` returns). Producers use ``Queries.enqueue`` on asyncpg as well.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import psycopg

from ..harness import Ctx, asyncpg_kwargs, payload
from .base import System, Variant

ENTRYPOINT = "bench"


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _body(i: int) -> bytes:
    return json.dumps(payload(i), separators=(",", ":")).encode()


class _Session:
    """An event loop and one asyncpg connection with PgQueuer's Queries on it."""

    def __init__(self, dsn: str) -> None:
        import asyncpg  # type: ignore[import-untyped]
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.loop = _loop()
        self.conn = self.run(asyncpg.connect(**asyncpg_kwargs(dsn)))
        self.queries = Queries(AsyncpgDriver(self.conn))

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if not self.conn.is_closed():
            self.run(self.conn.close())
        self.loop.close()


def _send(size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        s = _Session(dsn)
        msgs = [payload(i) for i in range(1000)]

        async def go() -> int:
            n = 0
            while not ctx.expired():
                if size == 1:
                    await s.queries.enqueue(
                        ENTRYPOINT, json.dumps(msgs[n % 1000], separators=(",", ":")).encode()
                    )
                else:
                    bodies: list[bytes | None] = [
                        json.dumps(m, separators=(",", ":")).encode() for m in msgs[:size]
                    ]
                    await s.queries.enqueue([ENTRYPOINT] * size, bodies, [0] * size)
                n += size
            return n

        def work() -> int:
            try:
                return int(s.run(go()))
            finally:
                s.close()

        return work

    return factory


def _consume(
    dsn: str,
    ctx: Ctx,
    batch_size: int,
    drain: bool,
    on_job: Callable[[Any], None],
    until: Callable[[], bool],
) -> Callable[[], None]:
    """Prepare a QueueManager on its own connection; the returned callable runs its loop until
    ``until()`` (checked every 10 ms) or, in drain mode, until the queue is empty."""
    from pgqueuer.qm import QueueManager
    from pgqueuer.types import QueueExecutionMode

    s = _Session(dsn)
    qm = QueueManager(s.queries)

    @qm.entrypoint(ENTRYPOINT)
    async def bench(job: Any) -> None:
        on_job(job)

    async def stopper() -> None:
        while not until():
            await asyncio.sleep(0.01)
        qm.shutdown.set()

    async def go() -> None:
        task = asyncio.create_task(stopper())
        try:
            await qm.run(
                batch_size=batch_size,
                mode=QueueExecutionMode.drain if drain else QueueExecutionMode.continuous,
                dequeue_timeout=timedelta(seconds=30),
            )
        finally:
            task.cancel()

    def work() -> None:
        try:
            s.run(go())
        finally:
            s.close()

    return work


def _drain(batch_size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        done = [0]

        def on_job(job: Any) -> None:
            done[0] += 1

        run = _consume(dsn, ctx, batch_size, True, on_job, ctx.expired)

        def work() -> int:
            run()
            return done[0]

        return work

    return factory


def _pickup(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[int, float]]]:
    seen: list[tuple[int, float]] = []
    run = _consume(dsn, ctx, 10, False, lambda job: seen.append((int(job.id), time.time())), ctx.expired)

    def work() -> list[tuple[int, float]]:
        run()
        return seen

    return work


def _churn(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[float, int, float]]]:
    buckets: dict[float, int] = {}

    def on_job(job: Any) -> None:
        t = math.floor(time.time() * 2) / 2  # half-second buckets: PgQueuer has no take calls
        buckets[t] = buckets.get(t, 0) + 1

    run = _consume(dsn, ctx, 100, False, on_job, ctx.stop.is_set)

    def work() -> list[tuple[float, int, float]]:
        run()
        return [(t + 0.5, n, math.nan) for t, n in sorted(buckets.items())]

    return work


class PgQueuer(System):
    name = "pgqueuer"
    label = "PgQueuer"
    requires = ("pgqueuer", "asyncpg")
    tables = ("public.pgqueuer", "public.pgqueuer_log", "public.pgqueuer_statistics")

    def install(self, dsn: str) -> dict[str, Any]:
        from importlib.metadata import version

        s = _Session(dsn)
        try:
            s.run(s.queries.install())
            s.run(s.queries.optimize_autovacuum())
        finally:
            s.close()
        return {"version": f"pgqueuer {version('pgqueuer')}, asyncpg {version('asyncpg')}"}

    def clear(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def preload(self, dsn: str, n: int) -> None:
        s = _Session(dsn)
        try:
            for start in range(0, n, 1000):
                k = min(1000, n - start)
                s.run(
                    s.queries.enqueue([ENTRYPOINT] * k, [_body(i) for i in range(start, start + k)], [0] * k)
                )
        finally:
            s.close()

    def remaining(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute("SELECT count(*) FROM pgqueuer").fetchone()
            return int(row[0]) if row else 0

    def sends(self) -> list[Variant]:
        return [
            Variant(self.name, "enqueue()", "one", _send(1)),
            Variant(self.name, "enqueue(lists of 1000)", "batch", _send(1000)),
        ]

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "QueueManager batch_size=1",
                "one",
                _drain(1),
                note="its own consumer loop, asyncpg",
            ),
            Variant(
                self.name, "QueueManager batch_size=10", "batch", _drain(10), note="its default batch size"
            ),
            Variant(
                self.name,
                "QueueManager batch_size=100",
                "batch",
                _drain(100),
                note="same batch size as the others",
            ),
        ]

    def pickups(self) -> list[Variant]:
        return [Variant(self.name, "QueueManager (NOTIFY)", "notify", _pickup)]

    def producer(self, dsn: str) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
        s = _Session(dsn)

        def send(p: dict[str, Any]) -> Any:
            ids = s.run(s.queries.enqueue(ENTRYPOINT, json.dumps(p, separators=(",", ":")).encode()))
            return int(ids[0])

        return send, s.close

    def batch_sender(self, dsn: str) -> tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]:
        s = _Session(dsn)

        def send(ps: list[dict[str, Any]]) -> Any:
            bodies: list[bytes | None] = [json.dumps(p, separators=(",", ":")).encode() for p in ps]
            return s.run(s.queries.enqueue([ENTRYPOINT] * len(ps), bodies, [0] * len(ps)))

        return send, s.close

    def churn(self) -> Variant:
        return Variant(self.name, "QueueManager batch_size=100", "batch", _churn)
