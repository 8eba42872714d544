"""The fetch loop: lease only as many messages as there are free handler slots, and let the
acknowledgements waiting to be settled ride on the next fetch.

It sleeps until a slot frees up, a NOTIFY says a queue has messages (the listener task), or a
queue's wake time comes: :func:`lonnymq.client.wait.next_wait`, the poll jittered ±10% and
bounded by the next scheduled message's due time, the wait ``Client.receive()`` uses too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from functools import partial
from time import monotonic

from .. import errors
from ..client.wait import PENDING_WAIT, AsyncListener, ShardListener, next_wait
from .execute import Runner
from .ops import WORKER_MIGRATION
from .outage import OUTAGE, Outage
from .settle import Settler
from .state import TRANSIENT, Context, QueueState, sleep


class Fetcher:
    """The producer task: takes messages for free slots and hands them to the runner."""

    def __init__(self, ctx: Context, runner: Runner, settler: Settler, outage: Outage) -> None:
        self.ctx = ctx
        self.runner = runner
        self.settler = settler
        self.outage = outage

    async def prepare(self, names: Sequence[str], lease_ms: int | None) -> None:
        """Check that the schema has the worker's tables and that the queues exist; read each
        queue's lease (unless ``lease_ms`` overrides it) and attempt limit."""
        ctx = self.ctx
        version = await ctx.client.run(ctx.ops.installed_version())
        if version < WORKER_MIGRATION:
            raise errors.NotInstalled(
                f"schema {ctx.client.schema!r} lacks migration {WORKER_MIGRATION:04d} (worker):"
                " run lonnymq migrate"
            )
        infos = await ctx.client.run(ctx.ops.worker_queues(names))
        for name in names:
            if name not in infos:
                raise errors.QueueNotFound(f"queue {name!r} does not exist (create it first)")
            queue_lease_ms, max_attempts = infos[name]
            ctx.queues[name] = QueueState(name, lease_ms or queue_lease_ms, max_attempts)

    async def run(self) -> None:
        ctx = self.ctx
        queues = list(ctx.queues.values())
        turn = 0
        while not ctx.stop_fetch.is_set():
            ctx.wake.clear()
            free = ctx.concurrency - ctx.running
            now = monotonic()
            due = [q for q in queues if q.hint or q.wake_at <= now]
            if free <= 0 or not due:
                timeout = None if free <= 0 else max(min(q.wake_at for q in queues) - now, 0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.wake.wait(), timeout)
                continue
            if ctx.fetch_cooldown and ctx.running and free * 2 < min(ctx.batch_size, ctx.concurrency):
                # Few slots free and more about to be: wait a moment to fetch them in one trip.
                await sleep(ctx.fetch_cooldown, ctx.stop_fetch)
            turn = (turn + 1) % len(queues)
            due = due[turn % len(due) :] + due[: turn % len(due)]  # take turns between queues
            for q in due:
                free = ctx.concurrency - ctx.running
                if free <= 0 or ctx.stop_fetch.is_set():
                    break
                # During an outage this waits until the database is back: fetching stops.
                ok, _ = await self.outage.call(
                    f"fetch {q.name}", partial(self.fetch, q, free), ctx.stop_fetch
                )
                if not ok:
                    q.hint = True
                    break

    async def fetch(self, q: QueueState, free: int) -> bool:
        """One take of up to ``free`` messages of ``q``, acknowledging what waits to be acked."""
        ctx, settler = self.ctx, self.settler
        n = min(free, ctx.batch_size)
        q.hint = False  # a NOTIFY arriving during the take sets it again
        acks = settler.begin(q.acks)
        q.acks.clear()
        try:
            op = ctx.client.ops.take(q.name, n, lease=q.lease_ms / 1000, ack=[h.message for h in acks])
            messages = await ctx.client.run(op, retry=False)
        except BaseException:
            for h in acks:
                h.state = "done"
            q.acks[:0] = acks
            raise
        settler.end(q, acks)
        ctx.meters.fetches.labels(queue=q.name).inc()
        if acks:
            settler.count(q, acks, "acked")
        if messages:
            ctx.meters.fetched.labels(queue=q.name).inc(len(messages))
        for m in messages:
            self.runner.start(q, m)
        idle = len(messages) < n  # nothing more to fetch with slots free: wake me on a send
        if idle != q.idle:
            q.idle = idle
            ctx.listen_wake.set()
        if not idle:
            q.hint = True
        else:
            due_ms = await ctx.client.run(ctx.client.ops.next_ready_in(q.name), retry=False)
            q.wake_at = monotonic() + next_wait(ctx.poll_interval, due_ms)
        return True


async def listen(ctx: Context, outage: Outage) -> None:
    """The listener task: a NOTIFY for a served queue wakes the fetch loop for it. Sends notify
    only while someone waits on their queue, so the listener's connection registers as a waiter
    on each queue whose last fetch left slots free (``QueueState.idle``), then has it fetched
    once more (and again once the sends that missed the registration, if any, have committed),
    and unregisters it when a fetch fills every slot. A lost connection is an outage (see :mod:`.outage`): it is
    re-opened once the database is back, then with backoff; on every (re)connect all queues are
    fetched, since notifications may have been missed. Through a shard router the listener is
    the client's ``wait.ShardListener``: one connection per shard holding a served queue, where
    its sends notify; a shard it cannot reach is left out and tried again (those queues are
    fetched at ``poll_interval`` meanwhile), never an outage."""
    schema = ctx.client.schema
    delay = 0.1
    while True:
        await outage.wait_up(ctx.stop_side)
        try:
            # Through a shard router: a listener on the shards of the queues (wait.ShardListener).
            listener = await ctx.client.listener()
            try:
                delay = 0.1
                for q in ctx.queues.values():
                    q.hint = True
                ctx.wake.set()
                while True:
                    ctx.listen_wake.clear()
                    for q in ctx.queues.values():
                        if q.idle and not q.registered:
                            q.pending = await listener.register(schema, q.name)
                            q.registered = q.hint = True
                            ctx.wake.set()
                        elif q.registered and not q.idle:
                            await listener.unregister(schema, q.name)
                            q.registered, q.pending = False, []
                        elif q.pending:
                            # Sends that missed the registration: fetch again once committed.
                            q.pending = await listener.pending(schema, q.pending)
                            if not q.pending:
                                q.hint = True
                                ctx.wake.set()
                    timeout = PENDING_WAIT if any(q.pending for q in ctx.queues.values()) else None
                    for name in await _notified(listener, ctx.listen_wake, timeout):
                        notified = ctx.queues.get(name)
                        if notified is not None:
                            notified.hint = True
                            ctx.wake.set()
            finally:
                for q in ctx.queues.values():
                    q.registered, q.pending = False, []
                await listener.close()
        except (*OUTAGE, *TRANSIENT) as e:
            outage.lost("listener", e)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 5.0)


async def _notified(
    listener: AsyncListener | ShardListener, change: asyncio.Event, timeout: float | None
) -> list[str]:
    """Wait up to ``timeout`` seconds for notifications (their queue names) or ``change``
    (then: [])."""
    waiting = asyncio.ensure_future(listener.wait(timeout))
    changed = asyncio.ensure_future(change.wait())
    try:
        await asyncio.wait([waiting, changed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        changed.cancel()
        if not waiting.done():
            waiting.cancel()
            await asyncio.wait([waiting])  # the connection is free again once it has stopped
    if waiting.cancelled():
        return []
    return waiting.result()
