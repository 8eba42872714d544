"""Helpers of the worker tests: run a Worker on an event loop next to a test scenario."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any

import psycopg
from psycopg import sql

from lonnymq.worker import App, Worker

#: How long a test waits for something that must happen, by default: generous, as CI runs the
#: suite in two passes at once on a shared 2-core machine (load 6-12, single tests 60-120 s);
#: waiting longer only costs time when the test fails anyway.
PATIENCE = 90.0


async def eventually(cond: Callable[[], Any], timeout: float = PATIENCE, what: str = "condition") -> None:
    """Wait until ``cond()`` (sync, or returning an awaitable) is true."""
    deadline = monotonic() + timeout
    while True:
        value = cond()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def with_worker(
    app: App,
    dsn: str,
    schema: str,
    scenario: Callable[[Worker], Awaitable[None]],
    **options: Any,
) -> Worker:
    """Start a worker, run ``scenario(worker)`` on the same loop, then stop the worker
    gracefully (unless the scenario did) and return it for inspection."""
    options.setdefault("poll_interval", 1.0)

    async def main() -> Worker:
        w = Worker(app, dsn, schema=schema, **options)
        await w.start()
        try:
            await scenario(w)
        finally:
            await w.stop()
        return w

    return asyncio.run(main())


def until(
    cond: Callable[[], Any], timeout: float = PATIENCE, what: str = "condition"
) -> Callable[[Worker], Awaitable[None]]:
    """A scenario that only waits for ``cond``."""

    async def scenario(w: Worker) -> None:
        await eventually(cond, timeout, what)

    return scenario


def waiters(dsn: str, schema: str, queue: str) -> int:
    """How many sessions are registered as waiters on ``queue`` (hold its wait lock, sql/wait.sql):
    once one is, every send to the queue notifies. Tests wait for this instead of sleeping."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(DISTINCT l.pid) FROM pg_locks l, {s}._wait_keys(({s}._queue(%s)).id) k"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND l.classid = k.k_wait::oid AND l.objid = k.k_queue::oid AND l.objsubid = 2"
            ).format(s=sql.Identifier(schema)),
            [queue],
        ).fetchone()
    assert row is not None
    return int(row[0])
