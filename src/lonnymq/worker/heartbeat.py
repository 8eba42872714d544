"""Heartbeats: extend the leases of the messages whose handlers run, every third of the shortest
lease; a lease found taken by another consumer is marked lost (its late result is not applied).
After an outage the leases are extended as soon as the database is back."""

from __future__ import annotations

from typing import Any

from .outage import Outage
from .state import Context, Held, QueueState, key, log, sleep


async def heartbeat(ctx: Context, outage: Outage) -> None:
    interval = min(q.lease_ms for q in ctx.queues.values()) / 3000
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
