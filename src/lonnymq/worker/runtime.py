"""The worker: a facade over the parts that lease messages and run their handlers.

One event loop runs everything (each part in its own module):

* :mod:`.loop`: the fetch loop (at most as many messages as free slots, acks riding on the
  next fetch) and the NOTIFY listener that wakes it;
* :mod:`.execute`: one task per handler, async ones on the loop, sync ones on a thread pool;
* :mod:`.settle`: outcomes (ack, retry with backoff, defer, dead letter with the traceback)
  settled in batches;
* :mod:`.heartbeat`: lease extension while handlers run;
* :mod:`.cron`: the periodic-message scheduler; :mod:`.meters`: the Prometheus metrics.

Guarantees: at least once (acknowledged only after the handler returned); leases kept alive by
heartbeats, a lost lease detected and its late result not applied; shutdown in two phases
(stop fetching and let handlers finish within ``shutdown_timeout``, then cancel the rest and
release their leases). If one of the worker's own tasks fails (other than by a connection
error, which is retried with backoff), the worker stops and :meth:`Worker.wait` raises
:class:`WorkerError`. See docs/worker.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import psycopg

from .. import errors
from ..client.aio import AsyncClient
from ..client.config import unavailable
from ..client.ops import to_ms
from ..migrations import DEFAULT_SCHEMA
from .app import App
from .cron import Scheduler
from .execute import Runner
from .heartbeat import heartbeat
from .loop import Fetcher, listen
from .meters import WorkerMeters
from .ops import worker_ops
from .outage import Outage
from .settle import Settler
from .state import APPLICATION_NAME, Context, log, own_client, probe, sleep

__all__ = ["APPLICATION_NAME", "Worker", "WorkerError"]

#: Bound on the final settle at shutdown when the database does not answer.
FINAL_FLUSH_TIMEOUT = 15.0


class WorkerError(errors.LonnyMQError):
    """The worker stopped because one of its own tasks failed; the cause is chained."""


class Worker:
    """Runs the handlers of an :class:`App` against one LonnyMQ schema.

    ``client``: an :class:`AsyncClient`, a conninfo string, or None for the conninfo ``Client()``
    uses (``$LONNYMQ_DSN``, ``$DATABASE_URL``, libpq's defaults). ``queues``: the queues to serve (default: every queue with a handler).
    ``concurrency``: handlers running at once (and the size of the sync thread pool).
    ``batch_size``: most messages fetched per round trip (default: ``concurrency``).
    ``lease``: seconds each lease lasts between heartbeats (default: each queue's own).
    ``poll_interval``: seconds between fetches when no NOTIFY arrives (jittered by ±10%).
    ``ack_interval``: seconds an acknowledgement may wait to be batched with others.
    ``fetch_cooldown``: seconds the fetcher may wait, when fewer than half a batch of slots are
    free, for more handlers to finish so it fetches for them in the same round trip.
    ``shutdown_timeout``: seconds in-flight handlers get to finish on :meth:`stop`.
    ``startup_timeout``: seconds :meth:`start` waits for a database that cannot be reached (a
    restart, a failover, a server still starting), trying again with backoff and logging each
    try; other errors (authentication, an unknown database, a missing schema) raise at once.
    ``metrics_port``: serve Prometheus metrics on that port (0: any free port) at ``/metrics``,
    with the probes ``/healthz`` (the event loop answers) and ``/readyz`` (running, and the
    database answers); ``metrics_host``: the address it binds (default 127.0.0.1: this host only).
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
        startup_timeout: float = 60.0,
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
        self.shutdown_timeout = shutdown_timeout
        if (
            not isinstance(startup_timeout, (int, float))
            or isinstance(startup_timeout, bool)
            or startup_timeout < 0
        ):
            raise errors.InvalidArgument(
                f"startup_timeout must be a number of seconds >= 0, got {startup_timeout!r}"
            )
        self.startup_timeout = float(startup_timeout)
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.cron_enabled = cron
        self.listen = listen
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._owns_client = not isinstance(client, AsyncClient)
        self.client = client if isinstance(client, AsyncClient) else own_client(client, schema)
        self.schema = self.client.schema
        self.ops = worker_ops(self.schema)
        served = list(queues) if queues else app.queues
        missing = [q for q in served if q not in app.queues]
        if missing:
            raise errors.InvalidArgument(f"no handler is registered for queue(s) {missing}")
        if not served and not (cron and app.schedules):
            raise errors.InvalidArgument("the app has no handlers (and no periodic messages)")
        self.queue_names = served

        self.meters = WorkerMeters(self.client, served, lambda: self.ctx.running, concurrency)
        #: This worker's own prometheus_client CollectorRegistry.
        self.metrics = self.meters.registry
        self.ctx = Context(
            app,
            self.client,
            self.ops,
            self.meters,
            concurrency=concurrency,
            batch_size=self.batch_size,
            poll_interval=poll_interval,
            ack_interval=ack_interval,
            fetch_cooldown=fetch_cooldown,
        )
        self._stopping = self.ctx.stopping  # what Job.stopping reads, from any thread
        self._outage = Outage(self.ctx)
        self._settler = Settler(self.ctx, self._outage)
        self._runner = Runner(self.ctx, self._settler)
        self._fetcher = Fetcher(self.ctx, self._runner, self._settler, self._outage)
        self._scheduler = Scheduler(self.ctx)
        # The metrics under their historical names (tests and dashboards read them).
        m = self.meters
        self.m_messages, self.m_handler, self.m_pickup = m.messages, m.handler, m.pickup
        self.m_fetches, self.m_fetched, self.m_lost = m.fetches, m.fetched, m.lost
        self.m_cron, self.m_cron_errors = m.cron, m.cron_errors

        self._side: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hard = asyncio.Event()
        self._done = asyncio.Event()
        self._started = False
        self._give_up_start = asyncio.Event()  # set by a stop requested while start() waits
        self._shutdown_task: asyncio.Task[None] | None = None
        self._crash: BaseException | None = None
        self._crash_where = ""

    async def refresh_queue_metrics(self, max_age: float = 1.0) -> None:
        """Read every served queue's counts from the database (cached for ``max_age`` s)."""
        await self.meters.refresh(max_age)

    async def metrics_text(self) -> str:
        """The Prometheus exposition of this worker's metrics (for use on the worker's loop)."""
        return await self.meters.text()

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` while the endpoint is served, else None."""
        return self.meters.server.url if self.meters.server else None

    @property
    def in_flight(self) -> int:
        return self.ctx.running

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the schema and queues, store the app's periodic messages, start fetching.
        Returns once the worker runs; raises (and starts nothing) if it cannot."""
        if self._started:
            raise errors.InvalidArgument("a worker can be started once")
        self._started = True
        self._loop = asyncio.get_running_loop()
        ctx = self.ctx
        # The endpoint is up while the worker starts: /healthz answers, /readyz says "starting".
        self.meters.start(self.metrics_host, self.metrics_port)
        started = False
        try:
            started = await self._open(time.monotonic() + self.startup_timeout)
        finally:
            if not started:
                self.meters.stop()
                if self._owns_client:
                    await self.client.close()
                self._done.set()
        if not started:
            log.info("worker %s stopped before it started", self.name)
            return
        self.meters.database(None)
        self._runner.open()
        if ctx.queues:
            self._spawn_side("producer", self._fetcher.run())
            self._spawn_side("settler", self._settler.run())
            self._spawn_side("heartbeat", heartbeat(ctx, self._outage))
            if self.listen and self.client.conninfo is not None:
                self._spawn_side("listener", listen(ctx, self._outage))
        if self.cron_enabled:
            self._spawn_side("scheduler", self._scheduler.run())
        self.meters.phase = "running"
        log.info(
            "worker %s started: queues %s, concurrency %d", self.name, self.queue_names, self.concurrency
        )

    async def _open(self, deadline: float) -> bool:
        """Open the client, check the schema and queues, store the periodic messages. While the
        database cannot be reached (a restart, a failover, a server still starting: config.UNAVAILABLE)
        this waits and tries again until ``deadline``, logging each try; any other error raises
        at once. Returns False if a stop was requested meanwhile."""
        delay = 0.5
        while True:
            try:
                if self._owns_client and self.client.conninfo is not None:
                    # One connection first, within this deadline: the client's open() would
                    # wait its own connect timeout (30 s by default) for the pool's first one.
                    await probe(self.client.conninfo, deadline - time.monotonic())
                await self.client.open()
                await self._fetcher.prepare(self.queue_names, self.lease_ms)
                await self._scheduler.install()
                return True
            except psycopg.Error as e:
                left = deadline - time.monotonic()
                if not unavailable(e) or left <= 0:
                    raise
                wait = min(delay, left)
                self.meters.database(e)
                log.warning(
                    "worker %s starting: database unavailable (%s); retrying in %.1fs (giving up in %.1fs)",
                    self.name,
                    " ".join(str(e).split()),
                    wait,
                    left,
                )
                await sleep(wait, self._give_up_start)
                if self._give_up_start.is_set():
                    return False
                delay = min(delay * 2, 5.0)

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
        if self.meters.phase == "starting":  # start() waits for the database: it gives up
            self._give_up_start.set()
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

    async def _shutdown(self) -> None:
        ctx = self.ctx
        try:
            self.meters.phase = "stopping"
            log.info("worker %s stopping: %d handler(s) running", self.name, ctx.running)
            ctx.stopping.set()
            ctx.stop_fetch.set()
            ctx.wake.set()
            await self._join("producer", "scheduler")
            # Phase 1: let running handlers finish (heartbeats keep their leases).
            if not self._hard.is_set():
                await self._runner.wait_running(self.shutdown_timeout, self._hard)
            # Phase 2: cancel what still runs; its lease is released (see execute.Runner).
            await self._runner.cancel_running(self.shutdown_timeout)
            self._settler.requeue_running()
            ctx.stop_side.set()
            ctx.settle_wake.set()
            await self._join("settler")
            await self._settler.final_flush(FINAL_FLUSH_TIMEOUT)
            await self._join("heartbeat")
            listener = self._side.get("listener")
            if listener is not None:
                listener.cancel()
                await asyncio.wait([listener])
        finally:
            await self._outage.close()
            self.meters.stop()
            self._runner.close()
            if self._owns_client:
                with contextlib.suppress(Exception):
                    await self.client.close()
            log.info("worker %s stopped", self.name)
            self._done.set()

    async def _join(self, *names: str) -> None:
        tasks = [self._side[n] for n in names if n in self._side]
        if tasks:
            await asyncio.wait(tasks)

    # -- side-task monitoring: a task that dies stops the worker, loudly ---------------------

    def _spawn_side(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"lonnymq-{name}")
        self._side[name] = task
        task.add_done_callback(lambda t: self._side_done(name, t))

    def _side_done(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and not self.ctx.stop_fetch.is_set():
            exc = RuntimeError(f"{name} returned while the worker was running")
        if exc is None:
            return
        if self._crash is None:
            self._crash, self._crash_where = exc, name
        log.critical("worker task %s failed, stopping the worker", name, exc_info=exc)
        self.request_stop()
