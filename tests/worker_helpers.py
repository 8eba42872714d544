"""Helpers of the worker tests: run a Worker on an event loop next to a test scenario."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any

from lonnymq.worker import App, Worker


async def eventually(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
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
    cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition"
) -> Callable[[Worker], Awaitable[None]]:
    """A scenario that only waits for ``cond``."""

    async def scenario(w: Worker) -> None:
        await eventually(cond, timeout, what)

    return scenario
