"""Settling results: what a finished handler's outcome means for its message, and the batched
calls that tell the database.

An outcome is queued per queue (ack, retry with backoff, defer, dead letter with the traceback,
release at shutdown); the settler task flushes the queues in one call per kind of outcome, a
moment after the first result so that results batch up. Acknowledgements may also ride on the
next fetch (see :mod:`.loop`). A settle call that fails puts its items back, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

from .. import errors
from ..client.ops import encode_state, to_ms
from .app import Defer, Handler, Retry
from .outage import Outage
from .state import Context, Held, QueueState, key, log, sleep

#: Errors stored with a dead or retried message keep at most this many characters (the tail).
MAX_ERROR = 16_000


def error_text(exc: BaseException) -> str:
    """The error stored with a failed message: the formatted traceback, truncated at the head."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    if len(text) > MAX_ERROR:
        text = "...(truncated)\n" + text[-MAX_ERROR:]
    return text


class Settler:
    """Turns handler outcomes into queued settles, and runs the task that flushes them."""

    def __init__(self, ctx: Context, outage: Outage | None = None) -> None:
        self.ctx = ctx
        self.outage = outage or Outage(ctx)
        #: Deliveries whose settle call was cut off by a lost connection after it was sent: it
        #: may have been applied, so a stale token on the repeat is not news.
        self.uncertain: set[tuple[int, int]] = set()

    # -- outcomes: each queues the settle and returns the outcome's name ----------------------

    def ack(self, q: QueueState, held: Held) -> str:
        q.acks.append(held)
        return "acked"

    def defer(self, q: QueueState, held: Held, d: Defer) -> str:
        """Raises if the delay or the state cannot be stored (the attempt then fails)."""
        delay_ms = to_ms(d.delay, "Defer.delay") or 0
        encode_state(d.state)
        q.defers.append((held, delay_ms, d.state))
        return "deferred"

    def dead(self, q: QueueState, held: Held, e: BaseException) -> str:
        q.dead.append((held, error_text(e)))
        return "dead"

    def release(self, q: QueueState, held: Held) -> str:
        """Give the message back at once, attempt not counted (shutdown)."""
        q.defers.append((held, 0, None))
        return "released"

    def failed(self, q: QueueState, held: Held, handler: Handler | None, e: BaseException) -> str:
        """The handler raised: retry after the backoff (or ``Retry.delay``), or dead-letter the
        message if this was its last attempt."""
        m = held.message
        limit = q.max_attempts
        if handler is not None and handler.max_attempts is not None:
            limit = min(limit, handler.max_attempts)
        if m.attempt >= limit:
            outcome = self.dead(q, held, e)
        else:
            if isinstance(e, Retry) and e.delay is not None:
                delay_ms = to_ms(e.delay, "Retry.delay") or 0
            else:
                delay_ms = round(self.ctx.app.backoff(handler, q.name).delay(m.attempt) * 1000)
            q.retries.append((held, delay_ms, error_text(e)))
            outcome = "retried"
        # Retry is the handler asking for it: one line. Anything else is a failure worth its
        # traceback (the same text is stored with the message).
        asked = isinstance(e, Retry)
        (log.info if asked else log.warning)(
            "%s#%d (%s) attempt %d failed (%s): %r",
            q.name,
            m.id,
            m.kind or "-",
            m.attempt,
            outcome,
            e,
            exc_info=None if asked else e,
        )
        return outcome

    # -- bookkeeping of settle calls ----------------------------------------------------------

    @staticmethod
    def begin(items: Sequence[Held]) -> list[Held]:
        for h in items:
            h.state = "settling"
        return list(items)

    @staticmethod
    def end(q: QueueState, items: Iterable[Held]) -> None:
        for h in items:
            q.held.pop(key(h.message), None)

    def count(self, q: QueueState, items: Iterable[Held], outcome: str) -> None:
        for h in items:
            self.ctx.meters.messages.labels(queue=q.name, kind=h.message.kind or "", outcome=outcome).inc()

    def _lost(self, q: QueueState, items: Iterable[Held], done: set[int] | dict[int, Any]) -> None:
        for h in items:
            if key(h.message) in self.uncertain:
                self.uncertain.discard(key(h.message))
                if h.message.id not in done:
                    log.info(
                        "%s#%d: not settled again after the outage: the settle cut off by it was"
                        " applied, or the lease ran out meanwhile (then it may run again)",
                        q.name,
                        h.message.id,
                    )
                continue
            if h.message.id not in done:
                self.ctx.meters.lost.labels(queue=q.name).inc()
                log.warning(
                    "%s#%d: lease lost before it was settled, outcome dropped (it may run again)",
                    q.name,
                    h.message.id,
                )

    # -- the settler task ---------------------------------------------------------------------

    async def run(self) -> None:
        ctx = self.ctx
        while not ctx.stop_side.is_set():
            await ctx.settle_wake.wait()
            ctx.settle_wake.clear()
            # Give acknowledgements a moment to batch up (or ride along with the next fetch).
            await sleep(ctx.ack_interval, ctx.stop_side)
            ok, _ = await self.outage.call("settle", self.flush_all, ctx.stop_side)
            if not ok:
                ctx.settle_wake.set()  # what failed was put back: again once the database is back

    async def flush_all(self) -> None:
        for q in self.ctx.queues.values():
            if q.has_settles():
                await self.flush(q)

    async def flush(self, q: QueueState) -> None:
        """Settle everything queued for ``q``: one call per kind of outcome. The buffers are
        only ever changed in place, so what a failed call puts back is never lost."""
        c, ops = self.ctx.client, self.ctx.ops
        if q.acks:
            acks = self.begin(q.acks)
            q.acks.clear()
            call = c.run(c.ops.ack([h.message for h in acks]), retry=False)
            await self._settle(q, acks, call, q.acks, acks, count=True)
        if q.retries:
            retries = list(q.retries)
            q.retries.clear()
            batch = self.begin([h for h, _, _ in retries])
            op = ops.nack(
                q.name,
                [h.message for h in batch],
                [d for _, d, _ in retries],
                [e for _, _, e in retries],
                None,
                count_attempt=True,
            )
            await self._settle(q, batch, c.run(op, retry=False), q.retries, retries)
        if q.defers:
            defers = list(q.defers)
            q.defers.clear()
            batch = self.begin([h for h, _, _ in defers])
            op = ops.nack(
                q.name,
                [h.message for h in batch],
                [d for _, d, _ in defers],
                None,
                [st for _, _, st in defers],
                count_attempt=False,
            )
            await self._settle(q, batch, c.run(op, retry=False), q.defers, defers)
        if q.dead:
            dead = list(q.dead)
            q.dead.clear()
            batch = self.begin([h for h, _ in dead])
            gone = ops.give_up(q.name, [h.message for h in batch], [e for _, e in dead])
            await self._settle(q, batch, c.run(gone, retry=False), q.dead, dead)

    async def _settle(
        self,
        q: QueueState,
        batch: list[Held],
        call: Awaitable[set[int]] | Awaitable[dict[int, Any]],
        buffer: list[Any],
        items: list[Any],
        *,
        count: bool = False,
    ) -> None:
        try:
            done = await call
        except BaseException as e:
            if isinstance(e, errors.ConnectionLost) and e.may_have_committed:
                self.uncertain.update(key(h.message) for h in batch)
            for h in batch:
                h.state = "done"
            buffer[:0] = items
            raise
        self.end(q, batch)
        self._lost(q, [h for h in batch if not h.lost], done)
        if count:  # other outcomes were counted when the handler finished
            self.count(q, [h for h in batch if h.message.id in done], "acked")

    def requeue_running(self) -> None:
        """Release what is still marked running (async handlers that refused to stop)."""
        for q in self.ctx.queues.values():
            for h in list(q.held.values()):
                if h.state == "running":
                    h.state = "done"
                    self.release(q, h)

    async def final_flush(self, timeout: float) -> None:
        """The last settle at shutdown, bounded: if the database does not answer, the leases
        expire and others take the messages."""
        try:
            await asyncio.wait_for(self.flush_all(), timeout)
        except Exception as e:
            log.error("final settle failed (messages come back when their leases end): %r", e)
