"""The worker runtime: an asyncio core that leases messages and runs their handlers.

One event loop runs everything: a producer that fetches at most as many messages as there are
free slots, the handlers (async ones on the loop, sync ones on a thread pool of ``concurrency``
threads), and side tasks: the NOTIFY listener, the heartbeat that extends leases, the settler
that acknowledges in batches, the periodic-message scheduler and the metrics endpoint.

Delivery guarantees:

* at least once: a message is acknowledged only after its handler returned; a worker that dies
  leaves its messages leased until the lease ends, then anyone takes them again;
* a handler runs with its lease kept alive by heartbeats; a lease lost anyway (the worker was
  stalled longer than the lease) is detected, counted, and the late result is not applied;
* shutdown in two phases: stop fetching and let handlers finish within ``shutdown_timeout``,
  then cancel what still runs and release its leases so others take those messages at once.

If one of the worker's own tasks fails (a bug, or the database rejecting a call other than by a
connection error), the worker stops gracefully and :meth:`Worker.wait` raises
:class:`WorkerError`; connection errors are retried with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue as queue_mod
import random
import socket
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import monotonic, perf_counter
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .. import errors
from ..client.aio import AsyncClient
from ..client.ops import encode_state, to_ms
from ..migrations import DEFAULT_SCHEMA
from ..models import Message, QueueMetrics
from ._sql import WORKER_MIGRATION, worker_ops
from .app import App, Defer, GiveUp, Handler, Job, Retry
from .metrics import MetricsServer, Registry
from .schedule import Schedule, parse_schedule

__all__ = ["Worker", "WorkerError"]

_log = logging.getLogger("lonnymq.worker")

T = TypeVar("T")

#: Shortest wait before fetching again when messages are ready but held by other consumers.
_MIN_WAIT = 0.05
#: The scheduler re-reads the schedules at least this often (picks up ``lonnymq cron add``).
_CRON_RELOAD = 10.0
#: Errors stored with a dead or retried message keep at most this many characters (the tail).
_MAX_ERROR = 16_000
#: Bound on the final settle at shutdown when the database does not answer.
_FINAL_FLUSH_TIMEOUT = 15.0


#: Errors worth retrying: the connection or server went away, or the transaction lost a race.
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.TransactionRollback)
#: application_name of the worker's connections (pg_stat_activity shows who is who).
APPLICATION_NAME = "lonnymq-worker"


class WorkerError(errors.LonnyMQError):
    """The worker stopped because one of its own tasks failed; the cause is chained."""


def error_text(exc: BaseException) -> str:
    """The error stored with a failed message: the formatted traceback, truncated at the head."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    if len(text) > _MAX_ERROR:
        text = "...(truncated)\n" + text[-_MAX_ERROR:]
    return text


class _ThreadPool(concurrent.futures.Executor):
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


@dataclass(eq=False)
class _Held:
    """A delivery this worker holds a lease on, until its settle call completed."""

    message: Message
    state: str = "running"  # running -> done (settle queued) -> settling (settle in flight)
    lost: bool = False


@dataclass(eq=False)
class _Queue:
    name: str
    lease_ms: int
    max_attempts: int
    hint: bool = True  # it may have ready messages: fetch before sleeping
    wake_at: float = 0.0  # monotonic time of the next fetch when there is no hint
    held: dict[tuple[int, int], _Held] = field(default_factory=dict)
    acks: list[_Held] = field(default_factory=list)
    retries: list[tuple[_Held, int, str]] = field(default_factory=list)
    defers: list[tuple[_Held, int, Any]] = field(default_factory=list)
    dead: list[tuple[_Held, str]] = field(default_factory=list)

    def has_settles(self) -> bool:
        return bool(self.acks or self.retries or self.defers or self.dead)


def _key(m: Message) -> tuple[int, int]:
    return (m.id, m.token)


class Worker:
    """Runs the handlers of an :class:`App` against one LonnyMQ schema.

    ``client``: an :class:`AsyncClient`, a conninfo string, or None for ``$LONNYMQ_DSN`` / the
    embedded server. ``queues``: the queues to serve (default: every queue with a handler).
    ``concurrency``: handlers running at once (and the size of the sync thread pool).
    ``batch_size``: most messages fetched per round trip (default: ``concurrency``).
    ``lease``: seconds each lease lasts between heartbeats (default: each queue's own).
    ``poll_interval``: seconds between fetches when no NOTIFY arrives (jittered by ±10%).
    ``ack_interval``: seconds an acknowledgement may wait to be batched with others.
    ``fetch_cooldown``: seconds the fetcher may wait, when fewer than half a batch of slots are
    free, for more handlers to finish so it fetches for them in the same round trip.
    ``shutdown_timeout``: seconds in-flight handlers get to finish on :meth:`stop`.
    ``metrics_port``: serve Prometheus metrics on that port (0: any free port).
    ``cron``: run the periodic-message scheduler. ``listen``: wake on NOTIFY.

    Use it from asyncio with :meth:`run` (or :meth:`start` / :meth:`stop`); it never installs
    signal handlers (the ``lonnymq worker`` command does).
    """

    def __init__(
        self,
        app: App,
        client: AsyncClient | str | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        queues: Sequence[str] | None = None,
        concurrency: int = 8,
        batch_size: int | None = None,
        lease: float | None = None,
        poll_interval: float = 5.0,
        ack_interval: float = 0.05,
        fetch_cooldown: float = 0.002,
        shutdown_timeout: float = 30.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        cron: bool = True,
        listen: bool = True,
    ) -> None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise errors.InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.batch_size = min(batch_size or concurrency, 1000)
        self.lease_ms = to_ms(lease, "lease", positive=True)
        self.poll_interval = poll_interval
        self.ack_interval = ack_interval
        self.fetch_cooldown = fetch_cooldown
        self.shutdown_timeout = shutdown_timeout
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.cron_enabled = cron
        self.listen = listen
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        if isinstance(client, AsyncClient):
            self.client = client
            self._owns_client = False
        else:
            if client is None:
                from ..embedded import resolve_dsn

                client = resolve_dsn()
            if "application_name" not in conninfo_to_dict(client):
                client = make_conninfo(client, application_name=APPLICATION_NAME)
            self.client = AsyncClient(client, schema=schema, pool_size=5)
            self._owns_client = True
        self.schema = self.client.schema
        self.ops = worker_ops(self.schema)
        served = list(queues) if queues else app.queues
        missing = [q for q in served if q not in app.queues]
        if missing:
            raise errors.InvalidArgument(f"no handler is registered for queue(s) {missing}")
        if not served and not (cron and app.schedules):
            raise errors.InvalidArgument("the app has no handlers (and no periodic messages)")
        self.queue_names = served

        self._queues: dict[str, _Queue] = {}
        self._jobs: set[asyncio.Task[None]] = set()
        self._side: dict[str, asyncio.Task[None]] = {}
        self._running = 0
        self._executor: _ThreadPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._settle_wake = asyncio.Event()
        self._stop_fetch = asyncio.Event()  # producer, scheduler: stop now
        self._stop_side = asyncio.Event()  # settler, heartbeat: stop after the final flush
        self._hard = asyncio.Event()
        self._done = asyncio.Event()
        self._stopping = threading.Event()  # what Job.stopping reads, from any thread
        self._cancelling = False
        self._started = False
        self._shutdown_task: asyncio.Task[None] | None = None
        self._crash: BaseException | None = None
        self._crash_where = ""
        self._schedules: dict[str, Schedule | None] = {}
        self._queue_metrics: dict[str, QueueMetrics] = {}
        self._queue_metrics_at = 0.0
        self._metrics_server: MetricsServer | None = None
        self.metrics = Registry()
        self._setup_metrics()

    # -- metrics ---------------------------------------------------------------------------

    def _setup_metrics(self) -> None:
        r = self.metrics
        self.m_messages = r.counter(
            "lonnymq_worker_messages_total",
            "Deliveries finished by this worker's handlers, by outcome: acked, retried, deferred,"
            " dead, released (given back at shutdown).",
            ["queue", "kind", "outcome"],
        )
        self.m_handler = r.histogram(
            "lonnymq_worker_handler_duration_seconds", "Handler run time.", ["queue", "kind"]
        )
        self.m_pickup = r.histogram(
            "lonnymq_worker_pickup_latency_seconds",
            "Seconds from when a message was due to its first delivery to this worker.",
            ["queue"],
        )
        self.m_fetches = r.counter(
            "lonnymq_worker_fetches_total", "Fetch round trips (take calls) of this worker.", ["queue"]
        )
        self.m_fetched = r.counter(
            "lonnymq_worker_fetched_messages_total", "Messages leased by this worker.", ["queue"]
        )
        self.m_lost = r.counter(
            "lonnymq_worker_leases_lost_total",
            "Leases this worker lost before settling (the message may run twice).",
            ["queue"],
        )
        self.m_cron = r.counter(
            "lonnymq_cron_sent_total", "Periodic messages sent by this worker's scheduler.", ["schedule"]
        )
        self.m_cron_errors = r.counter(
            "lonnymq_cron_errors_total", "Periodic messages that could not be sent.", ["schedule"]
        )
        r.gauge(
            "lonnymq_worker_in_flight", "Handlers running now.", collect=lambda: [((), float(self._running))]
        )
        r.gauge(
            "lonnymq_worker_concurrency",
            "Handlers this worker runs at most at once.",
            collect=lambda: [((), float(self.concurrency))],
        )
        r.gauge(
            "lonnymq_queue_depth",
            "Messages in the queue: ready + scheduled + leased.",
            ["queue"],
            collect=lambda: [
                ((q.queue,), float(q.ready + q.scheduled + q.leased)) for q in self._queue_metrics.values()
            ],
        )
        r.gauge(
            "lonnymq_queue_messages",
            "Messages in the queue by state (exact up to 100000, then 100000).",
            ["queue", "state"],
            collect=self._queue_samples,
        )
        r.gauge(
            "lonnymq_queue_oldest_ready_age_seconds",
            "How long the oldest ready message has waited.",
            ["queue"],
            collect=lambda: [
                ((q.queue,), (q.oldest_ready_age_ms or 0) / 1000) for q in self._queue_metrics.values()
            ],
        )
        r.before_render = self._refresh_from_thread

    def _queue_samples(self) -> Iterable[tuple[tuple[str, ...], float]]:
        for q in self._queue_metrics.values():
            for state in ("ready", "scheduled", "leased", "dead"):
                yield (q.queue, state), float(getattr(q, state))

    async def refresh_queue_metrics(self, max_age: float = 1.0) -> None:
        """Read every served queue's counts from the database (cached for ``max_age`` s)."""
        if monotonic() - self._queue_metrics_at < max_age:
            return
        fresh = {}
        for name in self.queue_names:
            fresh[name] = await self.client.metrics(name)
        self._queue_metrics = fresh
        self._queue_metrics_at = monotonic()

    def _refresh_from_thread(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or self._done.is_set():
            raise RuntimeError("the worker is not running")
        asyncio.run_coroutine_threadsafe(self.refresh_queue_metrics(), loop).result(timeout=10)

    async def metrics_text(self) -> str:
        """The Prometheus exposition of this worker's metrics (for use on the worker's loop)."""
        await self.refresh_queue_metrics()
        hook, self.metrics.before_render = self.metrics.before_render, None
        try:
            return self.metrics.render()
        finally:
            self.metrics.before_render = hook

    @property
    def metrics_url(self) -> str | None:
        return self._metrics_server.url if self._metrics_server else None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the schema and queues, store the app's periodic messages, start fetching.
        Returns once the worker runs; raises (and starts nothing) if it cannot."""
        if self._started:
            raise errors.InvalidArgument("a worker can be started once")
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            await self.client.open()
            version = await self.client.run(self.ops.installed_version())
            if version < WORKER_MIGRATION:
                raise errors.NotInstalled(
                    f"schema {self.schema!r} lacks migration {WORKER_MIGRATION:04d} (worker): run lonnymq migrate"
                )
            infos = await self.client.run(self.ops.worker_queues(self.queue_names))
            for name in self.queue_names:
                if name not in infos:
                    raise errors.QueueNotFound(f"queue {name!r} does not exist (create it first)")
                lease_ms, max_attempts = infos[name]
                self._queues[name] = _Queue(name, self.lease_ms or lease_ms, max_attempts)
            for p in self.app.schedules.values():
                body = p.payload
                outcome = await self.client.run(
                    self.ops.cron_upsert(
                        p.name,
                        p.schedule.text,
                        p.queue,
                        body,
                        kind=p.kind,
                        headers=p.headers,
                        priority=p.priority,
                        misfire_grace=p.misfire_grace,
                    )
                )
                _log.debug("periodic message %s: %s", p.name, outcome)
        except BaseException:
            if self._owns_client:
                await self.client.close()
            self._done.set()
            raise
        if any(not h.is_async for h in self.app.handlers.values()):
            self._executor = _ThreadPool(self.concurrency)
        if self.metrics_port is not None:
            self._metrics_server = MetricsServer(self.metrics, self.metrics_host, self.metrics_port)
            self._metrics_server.start()
            _log.info("metrics at %s", self._metrics_server.url)
        if self._queues:
            self._spawn_side("producer", self._produce())
            self._spawn_side("settler", self._settler())
            self._spawn_side("heartbeat", self._heartbeat())
            if self.listen and self.client.conninfo is not None:
                self._spawn_side("listener", self._listener())
        if self.cron_enabled:
            self._spawn_side("scheduler", self._scheduler())
        _log.info(
            "worker %s started: queues %s, concurrency %d", self.name, self.queue_names, self.concurrency
        )

    async def wait(self) -> None:
        """Wait until the worker has stopped; raises WorkerError if it stopped because one of its
        tasks failed."""
        await self._done.wait()
        if self._crash is not None:
            raise WorkerError(f"worker task {self._crash_where!r} failed: {self._crash!r}") from self._crash

    async def run(self) -> None:
        """Start, run until :meth:`stop` (or a failure), and shut down gracefully. If the task
        running this is cancelled, the worker shuts down gracefully before re-raising."""
        await self.start()
        try:
            await self.wait()
        finally:
            if not self._done.is_set():
                self.request_stop()
                assert self._shutdown_task is not None
                await asyncio.shield(self._shutdown_task)

    async def stop(self, *, hard: bool = False) -> None:
        """Shut down: stop fetching, let running handlers finish within ``shutdown_timeout``
        (``hard``: do not wait), then cancel the rest, release their leases, settle everything.
        Returns when done; does not raise the failure of a crashed worker (see :meth:`wait`)."""
        self.request_stop(hard=hard)
        await self._done.wait()

    def request_stop(self, *, hard: bool = False) -> None:
        """Begin the shutdown without waiting (call on the worker's loop; from another thread or a
        signal handler use :meth:`stop_threadsafe`). A second request with ``hard`` skips the wait
        for running handlers."""
        if not self._started or self._done.is_set():
            self._done.set()
            return
        if hard:
            self._hard.set()
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.get_running_loop().create_task(
                self._shutdown(), name="lonnymq-shutdown"
            )

    def stop_threadsafe(self, *, hard: bool = False) -> None:
        """:meth:`request_stop` from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: self.request_stop(hard=hard))

    @property
    def in_flight(self) -> int:
        return self._running

    async def _shutdown(self) -> None:
        try:
            _log.info("worker %s stopping: %d handler(s) running", self.name, self._running)
            self._stopping.set()
            self._stop_fetch.set()
            self._wake.set()
            await self._join("producer", "scheduler")
            # Phase 1: let running handlers finish (heartbeats keep their leases).
            jobs = set(self._jobs)
            if jobs and not self._hard.is_set():
                hard = asyncio.ensure_future(self._hard.wait())
                try:
                    await self._wait_jobs(jobs, hard)
                finally:
                    hard.cancel()
            # Phase 2: cancel what still runs; its lease is released (see _execute).
            pending = [t for t in self._jobs if not t.done()]
            if pending:
                _log.warning(
                    "cancelling %d handler(s) still running after %.1fs", len(pending), self.shutdown_timeout
                )
                self._cancelling = True
                for t in pending:
                    t.cancel()
                await asyncio.wait(pending, timeout=5)
            for q in self._queues.values():  # async handlers that refused to stop
                for h in list(q.held.values()):
                    if h.state == "running":
                        h.state = "done"
                        q.defers.append((h, 0, None))
            self._stop_side.set()
            self._settle_wake.set()
            await self._join("settler")
            try:
                await asyncio.wait_for(self._flush_all(), _FINAL_FLUSH_TIMEOUT)
            except Exception as e:  # the leases will expire and others take the messages
                _log.error("final settle failed (messages come back when their leases end): %r", e)
            await self._join("heartbeat")
            listener = self._side.get("listener")
            if listener is not None:
                listener.cancel()
                await asyncio.wait([listener])
        finally:
            if self._metrics_server is not None:
                self._metrics_server.stop()
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            if self._owns_client:
                with contextlib.suppress(Exception):
                    await self.client.close()
            _log.info("worker %s stopped", self.name)
            self._done.set()

    async def _wait_jobs(self, jobs: set[asyncio.Task[None]], hard: asyncio.Future[Any]) -> None:
        everything = asyncio.ensure_future(asyncio.wait(jobs))
        try:
            await asyncio.wait(
                [everything, hard], timeout=self.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            everything.cancel()

    async def _join(self, *names: str) -> None:
        tasks = [self._side[n] for n in names if n in self._side]
        if tasks:
            await asyncio.wait(tasks)

    def _spawn_side(self, name: str, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"lonnymq-{name}")
        self._side[name] = task
        task.add_done_callback(lambda t: self._side_done(name, t))

    def _side_done(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and not self._stop_fetch.is_set():
            exc = RuntimeError(f"{name} returned while the worker was running")
        if exc is None:
            return
        if self._crash is None:
            self._crash, self._crash_where = exc, name
        _log.critical("worker task %s failed, stopping the worker", name, exc_info=exc)
        self.request_stop()

    async def _retrying(
        self, what: str, call: Callable[[], Awaitable[T]], delay: float, until: asyncio.Event
    ) -> tuple[T | None, float]:
        """Run ``call``. On a connection error log it, sleep ``delay`` (less if ``until`` is set)
        and return None with the next, doubled delay; other errors propagate."""
        try:
            return await call(), 0.1
        except _TRANSIENT as e:
            _log.warning("%s: database unavailable (%s); retrying in %.1fs", what, e, delay)
            await self._sleep(delay, until)
            return None, min(delay * 2, 5.0)

    @staticmethod
    async def _sleep(seconds: float, until: asyncio.Event) -> None:
        """Sleep up to ``seconds``, less if ``until`` is set."""
        if seconds <= 0 or until.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), seconds)

    # -- fetching --------------------------------------------------------------------------

    async def _produce(self) -> None:
        queues = list(self._queues.values())
        turn = 0
        delay = 0.1
        while not self._stop_fetch.is_set():
            self._wake.clear()
            free = self.concurrency - self._running
            now = monotonic()
            due = [q for q in queues if q.hint or q.wake_at <= now]
            if free <= 0 or not due:
                timeout = None if free <= 0 else max(min(q.wake_at for q in queues) - now, 0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            if self.fetch_cooldown and self._running and free * 2 < min(self.batch_size, self.concurrency):
                # Few slots free and more about to be: wait a moment to fetch them in one trip.
                await self._sleep(self.fetch_cooldown, self._stop_fetch)
            turn = (turn + 1) % len(queues)
            due = due[turn % len(due) :] + due[: turn % len(due)]  # take turns between queues
            for q in due:
                free = self.concurrency - self._running
                if free <= 0 or self._stop_fetch.is_set():
                    break
                ok, delay = await self._retrying(
                    f"fetch {q.name}", lambda q=q, free=free: self._fetch(q, free), delay, self._stop_fetch
                )
                if ok is None:
                    q.hint = True
                    break

    async def _fetch(self, q: _Queue, free: int) -> bool:
        n = min(free, self.batch_size)
        q.hint = False  # a NOTIFY arriving during the take sets it again
        acks = self._begin_settle(q.acks)
        q.acks.clear()
        try:
            messages = await self.client.take(
                q.name, n, lease=q.lease_ms / 1000, ack=[h.message for h in acks]
            )
        except BaseException:
            for h in acks:
                h.state = "done"
            q.acks[:0] = acks
            raise
        self._end_settle(q, acks)
        self.m_fetches.inc(queue=q.name)
        if acks:
            self._count_settled(q, acks, "acked")
        if messages:
            self.m_fetched.inc(len(messages), queue=q.name)
        for m in messages:
            self._start(q, m)
        if len(messages) == n:
            q.hint = True
        else:
            due_ms = await self.client.run(self.client.ops.next_ready_in(q.name))
            wait = self.poll_interval * random.uniform(0.9, 1.1)
            if due_ms is not None:
                wait = min(wait, max(due_ms / 1000, _MIN_WAIT))
            q.wake_at = monotonic() + wait
        return True

    def _start(self, q: _Queue, m: Message) -> None:
        held = _Held(m)
        q.held[_key(m)] = held
        self._running += 1
        if m.attempt == 1 and m.state is None and m.lease_until is not None:
            taken_at = m.lease_until - q.lease_ms  # the database clock at the take
            self.m_pickup.observe(max(taken_at - m.scheduled_at, 0) / 1000, queue=q.name)
        task = asyncio.ensure_future(self._execute(q, held))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    # -- running handlers ------------------------------------------------------------------

    async def _execute(self, q: _Queue, held: _Held) -> None:
        m = held.message
        handler = self.app.resolve(q.name, m.kind)
        kind = m.kind or ""
        started = perf_counter()
        outcome = "released"
        try:
            try:
                result = await self._call_handler(handler, m)
                if isinstance(result, Defer):
                    raise result
            except Defer as d:
                delay_ms = to_ms(d.delay, "Defer.delay") or 0
                encode_state(d.state)  # a state that cannot be saved fails the attempt here
                q.defers.append((held, delay_ms, d.state))
                outcome = "deferred"
            except GiveUp as e:
                q.dead.append((held, error_text(e)))
                outcome = "dead"
            except asyncio.CancelledError:
                if not self._cancelling:
                    raise  # caught below as a failure: only shutdown cancels handlers
                q.defers.append((held, 0, None))
                outcome = "released"
            else:
                q.acks.append(held)
                outcome = "acked"
        except BaseException as e:  # the handler failed
            limit = q.max_attempts
            if handler is not None and handler.max_attempts is not None:
                limit = min(limit, handler.max_attempts)
            if m.attempt >= limit:
                q.dead.append((held, error_text(e)))
                outcome = "dead"
            else:
                if isinstance(e, Retry) and e.delay is not None:
                    delay_ms = to_ms(e.delay, "Retry.delay") or 0
                else:
                    delay_ms = round(self.app.backoff(handler, q.name).delay(m.attempt) * 1000)
                q.retries.append((held, delay_ms, error_text(e)))
                outcome = "retried"
            log = _log.info if isinstance(e, Retry) else _log.warning
            log("%s#%d (%s) attempt %d failed (%s): %r", q.name, m.id, kind or "-", m.attempt, outcome, e)
        finally:
            held.state = "done"
            self._running -= 1
            self.m_handler.observe(perf_counter() - started, queue=q.name, kind=kind)
            if outcome != "acked":
                self.m_messages.inc(queue=q.name, kind=kind, outcome=outcome)
            self._wake.set()
            self._settle_wake.set()

    async def _call_handler(self, handler: Handler | None, m: Message) -> Any:
        if handler is None:
            raise LookupError(f"no handler for kind {m.kind!r} of queue {m.queue!r}")
        job = Job(m, self._stopping)
        if handler.is_async:
            coro = handler.fn(job)
            if handler.timeout is not None:
                return await asyncio.wait_for(coro, handler.timeout)
            return await coro
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, handler.fn, job)

    # -- settling --------------------------------------------------------------------------

    @staticmethod
    def _begin_settle(items: Sequence[_Held]) -> list[_Held]:
        for h in items:
            h.state = "settling"
        return list(items)

    @staticmethod
    def _end_settle(q: _Queue, items: Iterable[_Held]) -> None:
        for h in items:
            q.held.pop(_key(h.message), None)

    def _count_settled(self, q: _Queue, items: Iterable[_Held], outcome: str) -> None:
        for h in items:
            self.m_messages.inc(queue=q.name, kind=h.message.kind or "", outcome=outcome)

    def _lost(self, q: _Queue, items: Iterable[_Held], done: set[int] | dict[int, Any]) -> None:
        for h in items:
            if h.message.id not in done:
                self.m_lost.inc(queue=q.name)
                _log.warning(
                    "%s#%d: lease lost before it was settled (it may run again)", q.name, h.message.id
                )

    async def _settler(self) -> None:
        delay = 0.1
        while not self._stop_side.is_set():
            await self._settle_wake.wait()
            self._settle_wake.clear()
            # Give acknowledgements a moment to batch up (or ride along with the next fetch).
            await self._sleep(self.ack_interval, self._stop_side)
            _, delay = await self._retrying("settle", self._flush_all, delay, self._stop_side)

    async def _flush_all(self) -> None:
        for q in self._queues.values():
            if q.has_settles():
                await self._flush(q)

    async def _flush(self, q: _Queue) -> None:
        """Settle everything queued for ``q``: one call per kind of outcome. The buffers are
        only ever changed in place, so what a failed call puts back is never lost."""
        c, ops = self.client, self.ops
        if q.acks:
            acks = self._begin_settle(q.acks)
            q.acks.clear()
            await self._settle(q, acks, c.ack([h.message for h in acks]), q.acks, acks, count=True)
        if q.retries:
            retries = list(q.retries)
            q.retries.clear()
            batch = self._begin_settle([h for h, _, _ in retries])
            op = ops.nack(
                q.name,
                [h.message for h in batch],
                [d for _, d, _ in retries],
                [e for _, _, e in retries],
                None,
                count_attempt=True,
            )
            await self._settle(q, batch, c.run(op), q.retries, retries)
        if q.defers:
            defers = list(q.defers)
            q.defers.clear()
            batch = self._begin_settle([h for h, _, _ in defers])
            op = ops.nack(
                q.name,
                [h.message for h in batch],
                [d for _, d, _ in defers],
                None,
                [st for _, _, st in defers],
                count_attempt=False,
            )
            await self._settle(q, batch, c.run(op), q.defers, defers)
        if q.dead:
            dead = list(q.dead)
            q.dead.clear()
            batch = self._begin_settle([h for h, _ in dead])
            op = ops.give_up(q.name, [h.message for h in batch], [e for _, e in dead])
            await self._settle(q, batch, c.run(op), q.dead, dead)

    async def _settle(
        self,
        q: _Queue,
        batch: list[_Held],
        call: Awaitable[set[int] | dict[int, Any]],
        buffer: list[Any],
        items: list[Any],
        *,
        count: bool = False,
    ) -> None:
        try:
            done = await call
        except BaseException:
            for h in batch:
                h.state = "done"
            buffer[:0] = items
            raise
        self._end_settle(q, batch)
        self._lost(q, [h for h in batch if not h.lost], done)
        if count:  # other outcomes were counted when the handler finished
            self._count_settled(q, [h for h in batch if h.message.id in done], "acked")

    # -- heartbeats ------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = min(q.lease_ms for q in self._queues.values()) / 3000
        delay = 0.1
        while not self._stop_side.is_set():
            await self._sleep(interval, self._stop_side)
            if self._stop_side.is_set():
                return
            for q in self._queues.values():
                live = [h for h in q.held.values() if h.state != "settling" and not h.lost]
                if not live:
                    continue
                msgs = [h.message for h in live]
                extended, delay = await self._retrying(
                    f"heartbeat {q.name}",
                    lambda q=q, msgs=msgs: self.client.extend(msgs, lease=q.lease_ms / 1000),
                    delay,
                    self._stop_side,
                )
                if extended is None:
                    continue
                for h in live:
                    # Settled meanwhile (acked by a fetch) is fine; still held and not extended
                    # means another consumer has taken the message.
                    if h.message.id not in extended and h.state != "settling" and _key(h.message) in q.held:
                        h.lost = True
                        self.m_lost.inc(queue=q.name)
                        _log.warning(
                            "%s#%d: lease lost while its handler runs (it may run twice)",
                            q.name,
                            h.message.id,
                        )

    # -- NOTIFY ----------------------------------------------------------------------------

    async def _listener(self) -> None:
        assert self.client.conninfo is not None
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.client.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(self.client.ops.st.listen)
                    delay = 0.1
                    for q in self._queues.values():  # we may have missed notifications
                        q.hint = True
                    self._wake.set()
                    async for n in conn.notifies():
                        q = self._queues.get(n.payload)
                        if q is not None:
                            q.hint = True
                            self._wake.set()
            except _TRANSIENT as e:
                _log.warning("listener: connection lost (%s); polling until it is back", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- periodic messages -----------------------------------------------------------------

    def _schedule(self, text: str) -> Schedule | None:
        if text not in self._schedules:
            try:
                self._schedules[text] = parse_schedule(text)
            except errors.InvalidArgument as e:
                _log.error("ignoring a periodic message with a bad schedule: %s", e)
                self._schedules[text] = None
        return self._schedules[text]

    async def _scheduler(self) -> None:
        backoff: dict[str, float] = {}
        delay = 0.1
        while not self._stop_fetch.is_set():
            sleep, delay = await self._retrying(
                "scheduler", lambda: self._schedule_once(backoff), delay, self._stop_fetch
            )
            if sleep is not None:
                await self._sleep(sleep, self._stop_fetch)

    async def _schedule_once(self, backoff: dict[str, float]) -> float:
        """Send every due tick of every schedule; return the seconds until the next tick."""
        rows = await self.client.run(self.ops.cron_list())
        now_ms = rows[0].db_now_ms if rows else await self.client.run(self.ops.now_ms())
        wake_ms = now_ms + round(_CRON_RELOAD * 1000)
        for row in rows:
            sched = self._schedule(row.schedule)
            if sched is None or not row.enabled:
                continue
            if backoff.get(row.name, 0) <= monotonic():
                after = max(row.last_tick_ms, now_ms - row.misfire_grace_ms - 1)
                for tick in sched.ticks(after, now_ms, limit=100):
                    if self._stop_fetch.is_set():
                        return 0
                    try:
                        sent = await self.client.run(self.ops.cron_fire(row.name, tick))
                    except (errors.QueueNotFound, errors.InvalidArgument, errors.PayloadTooLarge) as e:
                        # A bad schedule must not stop the worker (nor the other schedules).
                        self.m_cron_errors.inc(schedule=row.name)
                        _log.error("periodic message %s: %s", row.name, e)
                        backoff[row.name] = monotonic() + _CRON_RELOAD
                        break
                    if sent is not None:
                        self.m_cron.inc(schedule=row.name)
                        _log.debug("periodic message %s: tick %d sent as %d", row.name, tick, sent)
            nxt = sched.next_after(now_ms)
            if nxt is not None:
                wake_ms = min(wake_ms, nxt)
        # Workers wake together at a tick; a little jitter spreads their (deduplicated) calls.
        return (wake_ms - now_ms) / 1000 + random.uniform(0.001, 0.02)
