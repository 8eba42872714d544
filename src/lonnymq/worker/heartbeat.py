"""Heartbeats: extend the leases of the messages whose handlers run, every third of the shortest
lease; a lease found taken by another consumer is marked lost (its late result is not applied)."""

from __future__ import annotations

from functools import partial

from .state import Context, key, log, retrying, sleep


async def heartbeat(ctx: Context) -> None:
    interval = min(q.lease_ms for q in ctx.queues.values()) / 3000
    delay = 0.1
    while not ctx.stop_side.is_set():
        await sleep(interval, ctx.stop_side)
        if ctx.stop_side.is_set():
            return
        for q in ctx.queues.values():
            live = [h for h in q.held.values() if h.state != "settling" and not h.lost]
            if not live:
                continue
            msgs = [h.message for h in live]
            lease = q.lease_ms / 1000
            extended, delay = await retrying(
                f"heartbeat {q.name}",
                partial(ctx.client.extend, msgs, lease=lease),
                delay,
                ctx.stop_side,
                ctx.meters.database,
            )
            if extended is None:
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
