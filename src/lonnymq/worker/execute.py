"""Running handlers: one task per delivery; async handlers run on the event loop (with their
timeout), sync ones on a pool of ``concurrency`` daemon threads. The outcome goes to the
:class:`~.settle.Settler`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue as queue_mod
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar

from ..models import Message
from .app import Defer, GiveUp, Handler, Job, Middleware
from .settle import Settler
from .state import Context, Held, QueueState, key, log

T = TypeVar("T")


class ThreadPool(concurrent.futures.Executor):
    """A fixed pool of daemon threads for sync handlers.

    Unlike ThreadPoolExecutor its threads do not block interpreter exit, so a process can end
    after the hard shutdown phase released the leases of handlers that would not stop."""

    def __init__(self, size: int, name: str = "lonnymq-handler") -> None:
        self._queue: queue_mod.SimpleQueue[Any] = queue_mod.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


class Runner:
    """Starts a task per leased message that runs its handler and queues the outcome."""

    def __init__(self, ctx: Context, settler: Settler) -> None:
        self.ctx = ctx
        self.settler = settler
        self.jobs: set[asyncio.Task[None]] = set()
        self.pool: ThreadPool | None = None

    def open(self) -> None:
        if any(not h.is_async for h in self.ctx.app.handlers.values()):
            self.pool = ThreadPool(self.ctx.concurrency)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)

    def start(self, q: QueueState, m: Message) -> None:
        held = Held(m)
        q.held[key(m)] = held
        self.ctx.running += 1
        if m.attempt == 1 and m.state is None and m.lease_until is not None:
            taken_at = m.lease_until - q.lease_ms  # the database clock at the take
            self.ctx.meters.pickup.labels(queue=q.name).observe(max(taken_at - m.scheduled_at, 0) / 1000)
        task = asyncio.ensure_future(self._execute(q, held))
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    async def _execute(self, q: QueueState, held: Held) -> None:
        ctx, settle = self.ctx, self.settler
        m = held.message
        handler = ctx.app.resolve(q.name, m.kind)
        kind = m.kind or ""
        started = perf_counter()
        outcome = "released"
        try:
            try:
                result = await self._call(handler, m)
                if isinstance(result, Defer):
                    raise result
            except Defer as d:
                outcome = settle.defer(q, held, d)  # a delay or state that cannot be saved fails it
            except GiveUp as e:
                outcome = settle.dead(q, held, e)
            except asyncio.CancelledError:
                if not ctx.cancelling:
                    raise  # caught below as a failure: only shutdown cancels handlers
                outcome = settle.release(q, held)
            else:
                outcome = settle.ack(q, held)
        except BaseException as e:  # the handler failed
            outcome = settle.failed(q, held, handler, e)
        finally:
            held.state = "done"
            ctx.running -= 1
            ctx.meters.handler.labels(queue=q.name, kind=kind).observe(perf_counter() - started)
            if outcome != "acked":  # acks are counted once settled
                ctx.meters.messages.labels(queue=q.name, kind=kind, outcome=outcome).inc()
            ctx.wake.set()
            ctx.settle_wake.set()

    async def _call(self, handler: Handler | None, m: Message) -> Any:
        if handler is None:
            raise LookupError(f"no handler for kind {m.kind!r} of queue {m.queue!r}")
        job = Job(m, self.ctx.stopping)
        middleware = self.ctx.app.middleware
        if handler.is_async:
            coro = _wrapped_async(handler, job, middleware) if middleware else handler.fn(job)
            if handler.timeout is not None:
                return await asyncio.wait_for(coro, handler.timeout)
            return await coro
        assert self.pool is not None
        call: Callable[[Job], Any] = handler.fn
        if middleware:
            call = functools.partial(_wrapped_sync, handler, middleware=middleware)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call, job)

    async def wait_running(self, timeout: float, hard: asyncio.Event) -> None:
        """Wait up to ``timeout`` s for the running handlers to finish, less if ``hard`` is set."""
        jobs = set(self.jobs)
        if not jobs:
            return
        everything = asyncio.ensure_future(asyncio.wait(jobs))
        hard_set = asyncio.ensure_future(hard.wait())
        try:
            await asyncio.wait([everything, hard_set], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            everything.cancel()
            hard_set.cancel()

    async def cancel_running(self, waited: float) -> None:
        """Cancel the handlers still running ``waited`` s into the shutdown: their messages are
        released. Waits a little (5 s) for them to stop."""
        pending = [t for t in self.jobs if not t.done()]
        if pending:
            log.warning("cancelling %d handler(s) still running after %.1fs", len(pending), waited)
            self.ctx.cancelling = True
            for t in pending:
                t.cancel()
            await asyncio.wait(pending, timeout=5)


def _wrapped_sync(handler: Handler, job: Job, middleware: list[Middleware]) -> Any:
    """A sync handler's call inside the app's middleware, in the handler's thread."""
    with contextlib.ExitStack() as stack:
        for mw in middleware:
            cm = mw(job)
            if not isinstance(cm, contextlib.AbstractContextManager):
                raise TypeError(f"middleware {mw!r} returned {cm!r}, not a context manager (sync handler)")
            stack.enter_context(cm)
        return handler.fn(job)


async def _wrapped_async(handler: Handler, job: Job, middleware: list[Middleware]) -> Any:
    """An async handler's call inside the app's middleware, in the handler's task."""
    async with contextlib.AsyncExitStack() as stack:
        for mw in middleware:
            cm = mw(job)
            if isinstance(cm, contextlib.AbstractAsyncContextManager):
                await stack.enter_async_context(cm)
            else:
                stack.enter_context(cm)
        return await handler.fn(job)
