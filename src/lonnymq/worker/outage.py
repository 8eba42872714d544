"""Riding out database outages (a PostgreSQL restart, a failover, a network cut).

The first of the worker's tasks whose call finds the database gone declares an outage: one
warning line, and one probe task that reconnects with backoff and jitter. Meanwhile the tasks do
not retry on their own: the fetch loop stops fetching, the heartbeat and the settler wait, and
the handlers already running go on and queue their outcomes. When the probe gets through: one
line saying how long it lasted, every queue is fetched again (notifications were missed), the
leases still held are extended and the queued outcomes settled. Settles are fenced by the lease
token, so an outcome whose lease ran out meanwhile is not applied (the settler logs it).

A call is made without the client's own retries (``run(..., retry=False)``), so the worker
notices at once and says so once, rather than each call waiting out the client's deadline.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from .. import errors
from .state import Context, log, sleep

T = TypeVar("T")

#: Errors that mean the database is out of reach: a call cut off by a lost connection, no
#: connection to be had, a LISTEN connection that could not be opened.
OUTAGE = (errors.ConnectionLost, PoolTimeout)
#: Errors worth a retry that are not an outage (the database answered): a serialization failure
#: or deadlock, a query cancelled, a lock timeout.
PASSING = (psycopg.OperationalError, psycopg.errors.TransactionRollback)

#: Backoff of the probe: first wait, longest wait (each jittered down by up to half).
PROBE_FIRST, PROBE_MAX = 0.1, 5.0


class Outage:
    """Whether the database is reachable, as the worker's tasks see it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.up = asyncio.Event()
        self.up.set()
        self.outages = 0  # how many so far
        self.since = 0.0  # monotonic start of the current one
        self._probe: asyncio.Task[None] | None = None

    @property
    def down(self) -> bool:
        return not self.up.is_set()

    def lost(self, what: str, e: BaseException) -> None:
        """``what`` found the database gone: declare an outage, unless one is under way."""
        if self.down:
            return
        self.up.clear()
        self.outages += 1
        self.since = monotonic()
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        log.warning(
            "database unavailable (%s: %s): fetching paused, reconnecting; running handlers carry on",
            what,
            first,
        )
        self._probe = asyncio.ensure_future(self._reconnect())
        self._probe.set_name("lonnymq-reconnect")

    async def wait_up(self, until: asyncio.Event) -> bool:
        """Wait until the database is back (True) or ``until`` is set (False)."""
        if self.up.is_set():
            return True
        if until.is_set():
            return False
        up, stop = asyncio.ensure_future(self.up.wait()), asyncio.ensure_future(until.wait())
        try:
            await asyncio.wait([up, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            stop.cancel()
        return self.up.is_set()

    async def call(
        self, what: str, fn: Callable[[], Awaitable[T]], until: asyncio.Event
    ) -> tuple[bool, T | None]:
        """Run ``fn`` once the database is reachable: (True, its result), or (False, None) if it
        failed on an outage or a passing error (logged; the caller tries again later), or if
        ``until`` was set first. Other errors propagate."""
        if not await self.wait_up(until):
            return False, None
        started = getattr(self.ctx.meters, "call_started", None)  # the readiness probe, if any
        call_id = started() if started is not None else None
        try:
            result = await fn()
        except OUTAGE as e:
            self._report(e, call_id)
            self.lost(what, e)
            return False, None
        except PASSING as e:
            self._report(e, call_id)
            log.warning("%s: %s; retrying", what, str(e).strip() or type(e).__name__)
            await sleep(random.uniform(0.05, 0.2), until)
            return False, None
        except BaseException:
            self._report(None, call_id)  # the database answered (with an error)
            raise
        self._report(None, call_id)
        return True, result

    async def _reconnect(self) -> None:
        ctx = self.ctx
        delay = PROBE_FIRST
        while True:
            try:
                await ctx.client.run(ctx.ops.installed_version(), retry=False)
                break
            except psycopg.OperationalError:
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, PROBE_MAX)
        log.warning("database reachable again after %.1fs: fetching resumed", monotonic() - self.since)
        self._report(None)
        self.up.set()
        for q in ctx.queues.values():
            q.hint = True  # notifications were lost with the connection
        ctx.wake.set()
        ctx.settle_wake.set()

    def _report(self, e: BaseException | None, call_id: object = None) -> None:
        """Tell the readiness probe whether the database answered (through the hooks the
        worker's meters offer, which are looked up so either side can change alone)."""
        m = self.ctx.meters
        ended = getattr(m, "call_ended", None)
        if ended is not None and call_id is not None:
            ended(call_id, e)
        elif (database := getattr(m, "database", None)) is not None:
            database(e)

    async def close(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            await asyncio.wait([self._probe])
