"""The periodic-message scheduler: store the app's schedules at start, then send every due tick.

Every worker with ``cron=True`` runs it; ``cron_fire`` deduplicates per (schedule, tick) in the
database, so each tick is sent once however many workers run. The schedule expressions
themselves are parsed and evaluated by :mod:`.schedule` (pure, also used by the CLI).
"""

from __future__ import annotations

import random
from time import monotonic

from .. import errors
from .schedule import Schedule, parse_schedule
from .state import Context, log, retrying, sleep

#: The scheduler re-reads the schedules at least this often (picks up ``lonnymq cron add``).
CRON_RELOAD = 10.0


class Scheduler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._parsed: dict[str, Schedule | None] = {}

    async def install(self) -> None:
        """Store (insert or update) the app's periodic messages."""
        ctx = self.ctx
        for p in ctx.app.schedules.values():
            op = ctx.ops.cron_upsert(
                p.name,
                p.schedule.text,
                p.queue,
                p.payload,
                kind=p.kind,
                headers=p.headers,
                priority=p.priority,
                misfire_grace=p.misfire_grace,
            )
            outcome: str = await ctx.client.run(op)
            log.debug("periodic message %s: %s", p.name, outcome)

    def _schedule(self, text: str) -> Schedule | None:
        if text not in self._parsed:
            try:
                self._parsed[text] = parse_schedule(text)
            except errors.InvalidArgument as e:
                log.error("ignoring a periodic message with a bad schedule: %s", e)
                self._parsed[text] = None
        return self._parsed[text]

    async def run(self) -> None:
        ctx = self.ctx
        backoff: dict[str, float] = {}
        delay = 0.1
        while not ctx.stop_fetch.is_set():
            wait, delay = await retrying(
                "scheduler", lambda: self.once(backoff), delay, ctx.stop_fetch, ctx.meters.database
            )
            if wait is not None:
                await sleep(wait, ctx.stop_fetch)

    async def once(self, backoff: dict[str, float]) -> float:
        """Send every due tick of every schedule; return the seconds until the next tick."""
        ctx = self.ctx
        client, ops = ctx.client, ctx.ops
        rows = await client.run(ops.cron_list())
        now_ms = rows[0].db_now_ms if rows else await client.run(ops.now_ms())
        wake_ms = now_ms + round(CRON_RELOAD * 1000)
        for row in rows:
            sched = self._schedule(row.schedule)
            if sched is None or not row.enabled:
                continue
            if backoff.get(row.name, 0) <= monotonic():
                after = max(row.last_tick_ms, now_ms - row.misfire_grace_ms - 1)
                for tick in sched.ticks(after, now_ms, limit=100):
                    if ctx.stop_fetch.is_set():
                        return 0
                    try:
                        sent = await client.run(ops.cron_fire(row.name, tick))
                    except (errors.QueueNotFound, errors.InvalidArgument, errors.PayloadTooLarge) as e:
                        # A bad schedule must not stop the worker (nor the other schedules).
                        ctx.meters.cron_errors.labels(schedule=row.name).inc()
                        log.error("periodic message %s: %s", row.name, e)
                        backoff[row.name] = monotonic() + CRON_RELOAD
                        break
                    if sent is not None:
                        ctx.meters.cron.labels(schedule=row.name).inc()
                        log.debug("periodic message %s: tick %d sent as %d", row.name, tick, sent)
            nxt = sched.next_after(now_ms)
            if nxt is not None:
                wake_ms = min(wake_ms, nxt)
        # Workers wake together at a tick; a little jitter spreads their (deduplicated) calls.
        return (wake_ms - now_ms) / 1000 + random.uniform(0.001, 0.02)
