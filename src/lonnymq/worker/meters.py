"""The worker's Prometheus metrics: what its handlers, fetches and scheduler did, and the depth
of the queues it serves (read from the database when scraped, cached for a second)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from time import monotonic

from ..client.aio import AsyncClient
from ..models import QueueMetrics
from .metrics import MetricsServer, Registry

_log = logging.getLogger("lonnymq.worker")


class WorkerMeters:
    """The metrics of one worker, registered in ``registry``, and their HTTP endpoint."""

    def __init__(
        self,
        registry: Registry,
        client: AsyncClient,
        queues: Sequence[str],
        in_flight: Callable[[], int],
        concurrency: int,
    ) -> None:
        r = self.registry = registry
        self.client = client
        self.queues = queues
        self.queue_metrics: dict[str, QueueMetrics] = {}
        self._queue_metrics_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None  # set while the worker runs
        self.server: MetricsServer | None = None
        r.before_render = self._refresh_from_thread
        self.messages = r.counter(
            "lonnymq_worker_messages_total",
            "Deliveries finished by this worker's handlers, by outcome: acked, retried, deferred,"
            " dead, released (given back at shutdown).",
            ["queue", "kind", "outcome"],
        )
        self.handler = r.histogram(
            "lonnymq_worker_handler_duration_seconds", "Handler run time.", ["queue", "kind"]
        )
        self.pickup = r.histogram(
            "lonnymq_worker_pickup_latency_seconds",
            "Seconds from when a message was due to its first delivery to this worker.",
            ["queue"],
        )
        self.fetches = r.counter(
            "lonnymq_worker_fetches_total", "Fetch round trips (take calls) of this worker.", ["queue"]
        )
        self.fetched = r.counter(
            "lonnymq_worker_fetched_messages_total", "Messages leased by this worker.", ["queue"]
        )
        self.lost = r.counter(
            "lonnymq_worker_leases_lost_total",
            "Leases this worker lost before settling (the message may run twice).",
            ["queue"],
        )
        self.cron = r.counter(
            "lonnymq_cron_sent_total", "Periodic messages sent by this worker's scheduler.", ["schedule"]
        )
        self.cron_errors = r.counter(
            "lonnymq_cron_errors_total", "Periodic messages that could not be sent.", ["schedule"]
        )
        r.gauge(
            "lonnymq_worker_in_flight", "Handlers running now.", collect=lambda: [((), float(in_flight()))]
        )
        r.gauge(
            "lonnymq_worker_concurrency",
            "Handlers this worker runs at most at once.",
            collect=lambda: [((), float(concurrency))],
        )
        r.gauge(
            "lonnymq_queue_depth",
            "Messages in the queue: ready + scheduled + leased.",
            ["queue"],
            collect=lambda: [
                ((q.queue,), float(q.ready + q.scheduled + q.leased)) for q in self.queue_metrics.values()
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
                ((q.queue,), (q.oldest_ready_age_ms or 0) / 1000) for q in self.queue_metrics.values()
            ],
        )

    def _queue_samples(self) -> Iterable[tuple[tuple[str, ...], float]]:
        for q in self.queue_metrics.values():
            for state in ("ready", "scheduled", "leased", "dead"):
                yield (q.queue, state), float(getattr(q, state))

    async def refresh(self, max_age: float = 1.0) -> None:
        """Read the queues' counts from the database, unless the last read is under ``max_age`` s old."""
        if monotonic() - self._queue_metrics_at < max_age:
            return
        fresh = {}
        for name in self.queues:
            fresh[name] = await self.client.metrics(name)
        self.queue_metrics = fresh
        self._queue_metrics_at = monotonic()

    def _refresh_from_thread(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the worker is not running")
        asyncio.run_coroutine_threadsafe(self.refresh(), loop).result(timeout=10)

    async def text(self) -> str:
        """The Prometheus exposition (for use on the worker's loop)."""
        await self.refresh()
        hook, self.registry.before_render = self.registry.before_render, None
        try:
            return self.registry.render()
        finally:
            self.registry.before_render = hook

    def start(self, host: str, port: int | None) -> None:
        """The worker runs (on this loop): serve the metrics on ``port`` unless it is None."""
        self._loop = asyncio.get_running_loop()
        if port is not None:
            self.server = MetricsServer(self.registry, host, port)
            self.server.start()
            _log.info("metrics at %s", self.server.url)

    def stop(self) -> None:
        self._loop = None
        if self.server is not None:
            self.server.stop()
