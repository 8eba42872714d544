"""The worker's Prometheus metrics (``prometheus_client``, in a registry of its own so several
workers in one process do not collide): what its handlers, fetches and scheduler did, and the
depth of the queues it serves, read from the database when scraped (cached for a second). Also
the state its health probes report (see :mod:`.metrics`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterator, Sequence
from time import monotonic

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..client.aio import AsyncClient
from ..models import QueueMetrics
from .metrics import HEALTH_TIMEOUT, MetricsServer

__all__ = ["DEFAULT_BUCKETS", "WorkerMeters", "total"]

_log = logging.getLogger("lonnymq.worker")

#: Seconds; spans sub-millisecond handlers to multi-minute ones.
DEFAULT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
#: Seconds a scrape waits for the queue counts before leaving them out.
QUEUE_READ_TIMEOUT = 5.0


def total(counter: Counter, **match: str) -> float:
    """The sum of ``counter`` over every label set with the given label values."""
    return sum(
        s.value
        for family in counter.collect()
        for s in family.samples
        if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in match.items())
    )


class _Live(Collector):
    """The gauges read at scrape time: handlers running, and the served queues' counts."""

    def __init__(self, meters: WorkerMeters) -> None:
        self.meters = meters

    def collect(self) -> Iterator[Metric]:
        m = self.meters
        yield GaugeMetricFamily("lonnymq_worker_in_flight", "Handlers running now.", m.in_flight())
        yield GaugeMetricFamily(
            "lonnymq_worker_concurrency", "Handlers this worker runs at most at once.", m.concurrency
        )
        up = GaugeMetricFamily(
            "lonnymq_worker_ready", "1 while the worker runs and its last database call succeeded."
        )
        up.add_metric([], 1.0 if m.readyz()[0] else 0.0)
        yield up
        queues = m.queue_metrics if m.refresh_for_scrape() else {}
        depth = GaugeMetricFamily(
            "lonnymq_queue_depth", "Messages in the queue: ready + scheduled + leased.", labels=["queue"]
        )
        by_state = GaugeMetricFamily(
            "lonnymq_queue_messages",
            "Messages in the queue by state (exact up to 100000, then 100000).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "lonnymq_queue_oldest_ready_age_seconds",
            "How long the oldest ready message has waited.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "lonnymq_queue_paused", "1 while the queue is paused (hands out nothing).", labels=["queue"]
        )
        for q in queues.values():
            depth.add_metric([q.queue], float(q.ready + q.scheduled + q.leased))
            for state in ("ready", "scheduled", "leased", "dead"):
                by_state.add_metric([q.queue, state], float(getattr(q, state)))
            oldest.add_metric([q.queue], (q.oldest_ready_age_ms or 0) / 1000)
            paused.add_metric([q.queue], 1.0 if q.paused else 0.0)
        yield from (depth, by_state, oldest, paused)


class WorkerMeters:
    """The metrics of one worker in its own ``registry``, its probes, and their HTTP endpoint.

    ``phase`` (starting, running, stopping, stopped) and the outcome of the last database call
    (:meth:`database`) make the readiness probe."""

    def __init__(
        self, client: AsyncClient, queues: Sequence[str], in_flight: Callable[[], int], concurrency: int
    ) -> None:
        r = self.registry = CollectorRegistry()
        self.client = client
        self.queues = queues
        self.in_flight = in_flight
        self.concurrency = concurrency
        self.queue_metrics: dict[str, QueueMetrics] = {}
        self._queue_metrics_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None  # set while the worker runs
        self.server: MetricsServer | None = None
        self.phase = "starting"
        self.database_error: str | None = "not connected yet"
        self.messages = Counter(
            "lonnymq_worker_messages",
            "Deliveries finished by this worker's handlers, by outcome: acked, retried, deferred,"
            " dead, released (given back at shutdown).",
            ["queue", "kind", "outcome"],
            registry=r,
        )
        self.handler = Histogram(
            "lonnymq_worker_handler_duration_seconds",
            "Handler run time.",
            ["queue", "kind"],
            registry=r,
            buckets=DEFAULT_BUCKETS,
        )
        self.pickup = Histogram(
            "lonnymq_worker_pickup_latency_seconds",
            "Seconds from when a message was due to its first delivery to this worker.",
            ["queue"],
            registry=r,
            buckets=DEFAULT_BUCKETS,
        )
        self.fetches = Counter(
            "lonnymq_worker_fetches", "Fetch round trips (take calls) of this worker.", ["queue"], registry=r
        )
        self.fetched = Counter(
            "lonnymq_worker_fetched_messages", "Messages leased by this worker.", ["queue"], registry=r
        )
        self.lost = Counter(
            "lonnymq_worker_leases_lost",
            "Leases this worker lost before settling (the message may run twice).",
            ["queue"],
            registry=r,
        )
        self.cron = Counter(
            "lonnymq_cron_sent",
            "Periodic messages sent by this worker's scheduler.",
            ["schedule"],
            registry=r,
        )
        self.cron_errors = Counter(
            "lonnymq_cron_errors", "Periodic messages that could not be sent.", ["schedule"], registry=r
        )
        r.register(_Live(self))

    # -- probes ---------------------------------------------------------------------------------

    def database(self, error: BaseException | None) -> None:
        """Record the outcome of a database call of the worker's loops (None: it succeeded)."""
        self.database_error = None if error is None else f"database unavailable: {error}".splitlines()[0]

    def healthz(self) -> tuple[bool, str]:
        """Alive: the worker's event loop runs a callback within HEALTH_TIMEOUT seconds."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False, f"the worker is {self.phase}"
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(HEALTH_TIMEOUT)
        except concurrent.futures.TimeoutError:
            return False, f"the event loop did not answer within {HEALTH_TIMEOUT:g}s"
        return True, "ok"

    def readyz(self) -> tuple[bool, str]:
        """Ready: running (not starting or stopping) and the last database call succeeded."""
        if self.phase != "running":
            return False, f"the worker is {self.phase}"
        if self.database_error is not None:
            return False, self.database_error
        return True, "ok"

    # -- queue gauges ---------------------------------------------------------------------------

    async def refresh(self, max_age: float = 1.0) -> None:
        """Read the queues' counts from the database, unless the last read is under ``max_age`` s old."""
        if monotonic() - self._queue_metrics_at < max_age:
            return
        fresh = {}
        for name in self.queues:
            fresh[name] = await self.client.metrics(name)
        self.queue_metrics = fresh
        self._queue_metrics_at = monotonic()

    def refresh_for_scrape(self) -> bool:
        """Refresh the queue counts for a scrape from another thread; False (and the scrape leaves
        them out rather than show stale numbers) if they cannot be read. On the worker's own loop
        (:meth:`text`) the caller refreshed them already."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return True
        try:
            asyncio.run_coroutine_threadsafe(self.refresh(), loop).result(QUEUE_READ_TIMEOUT)
        except Exception as e:
            _log.warning("metrics scrape: queue counts left out: %r", e)
            return False
        return True

    async def text(self) -> str:
        """The Prometheus text exposition (for use on the worker's loop)."""
        await self.refresh()
        return generate_latest(self.registry).decode()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, host: str, port: int | None) -> None:
        """The worker starts (on this loop): serve the metrics and probes on ``port`` unless it
        is None."""
        self._loop = asyncio.get_running_loop()
        if port is not None:
            probes = {"/healthz": self.healthz, "/readyz": self.readyz}
            self.server = MetricsServer(self.registry, host, port, probes)
            self.server.start()
            _log.info("metrics at %s (probes: /healthz, /readyz)", self.server.url)

    def stop(self) -> None:
        self.phase = "stopped"
        self._loop = None
        if self.server is not None:
            self.server.stop()
