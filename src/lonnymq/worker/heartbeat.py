"""Heartbeats: extend the leases of the messages whose handlers run, every third of the shortest
lease; a lease found taken by another consumer is marked lost (its late result is not applied).
After an outage the leases are extended as soon as the database is back.

Each heartbeat also registers the worker in the worker registry (``worker_beat``, sql/stats.sql:
host, pid, queues, concurrency, handlers in flight), which the dashboard lists; the entry
expires by itself a few heartbeats after the last one, and is removed when the heartbeat stops.
The registry is informative: failing to write it is logged, never fatal."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from typing import Any

import psycopg

from .outage import Outage
from .state import Context, Held, QueueState, key, log, sleep


class Registry:
    """This worker's entry in the worker registry."""

    def __init__(self, ctx: Context, interval: float) -> None:
        self.ctx = ctx
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        # Three missed heartbeats (and 10 s of slack) before the entry counts as stale.
        self.ttl_ms = int(interval * 3000) + 10_000
        self.failed = False

    async def beat(self) -> None:
        ctx = self.ctx
        op = ctx.ops.worker_beat(
            self.id, self.host, self.pid, sorted(ctx.queues), ctx.concurrency, ctx.running, self.ttl_ms
        )
        try:
            await ctx.client.run(op, retry=False)
        except (psycopg.Error, OSError) as e:
            if not self.failed:  # once, not every heartbeat of an outage
                log.warning("worker registry: %s (the dashboard will not list this worker)", e)
            self.failed = True
        else:
            self.failed = False

    async def leave(self) -> None:
        try:
            await asyncio.wait_for(self.ctx.client.run(self.ctx.ops.worker_leave(self.id), retry=False), 5)
        except (psycopg.Error, OSError, TimeoutError) as e:
            log.debug("worker registry: leaving failed (%s); the entry expires by itself", e)


async def heartbeat(ctx: Context, outage: Outage) -> None:
    interval = min(q.lease_ms for q in ctx.queues.values()) / 3000
    registry = Registry(ctx, interval)
    await registry.beat()
    try:
        await _extend_leases(ctx, outage, interval, registry)
    finally:
        if not ctx.cancelling:
            await registry.leave()


async def _extend_leases(ctx: Context, outage: Outage, interval: float, registry: Registry) -> None:
    missed = False
    while not ctx.stop_side.is_set():
        if not missed:
            await sleep(interval, ctx.stop_side)
        if ctx.stop_side.is_set():
            return
        missed = False
        for q in ctx.queues.values():
            live: list[Held] = []

            async def extend(q: QueueState = q, live: list[Held] = live) -> dict[int, Any]:
                # Chosen when the call is made: an outage may have been waited out meanwhile.
                live[:] = [h for h in q.held.values() if h.state != "settling" and not h.lost]
                if not live:
                    return {}
                op = ctx.client.ops.extend([h.message for h in live], lease=q.lease_ms / 1000)
                return await ctx.client.run(op, retry=False)

            ok, extended = await outage.call(f"heartbeat {q.name}", extend, ctx.stop_side)
            if not ok or extended is None:
                missed = True  # again at once (once the database is back), not a period later
                continue
            for h in live:
                # Settled meanwhile (acked by a fetch) is fine; still held and not extended
                # means another consumer has taken the message.
                if h.message.id not in extended and h.state != "settling" and key(h.message) in q.held:
                    h.lost = True
                    ctx.meters.lost.labels(queue=q.name).inc()
                    log.warning(
                        "%s#%d: lease lost while its handler runs (it may run twice)", q.name, h.message.id
                    )
        if not missed:
            await registry.beat()
