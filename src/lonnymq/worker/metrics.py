"""Worker metrics in the Prometheus text exposition format (version 0.0.4), stdlib only.

The runtime updates counters and histograms on its event loop; a scrape renders them together
with gauges collected at scrape time (queue depths from ``AsyncClient.metrics()``). The HTTP
endpoint is a ``ThreadingHTTPServer`` on a daemon thread serving ``GET /metrics``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

__all__ = ["Counter", "Gauge", "Histogram", "MetricsServer", "Registry"]

_log = logging.getLogger("lonnymq.worker")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
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

Labels = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


_M = TypeVar("_M", bound=_Metric)


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0)

    def total(self, **match: str) -> float:
        """The sum over every label set that has the given label values."""
        idx = [(self.labelnames.index(k), v) for k, v in match.items()]
        with self._lock:
            return sum(v for k, v in self._values.items() if all(k[i] == x for i, x in idx))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Gauge(_Metric):
    """A value read at scrape time from ``collect``, which returns (label values, value) pairs."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[Labels, float]]] | None = None,
    ) -> None:
        super().__init__(name, help, labelnames)
        self.collect = collect
        self.samples: list[tuple[Labels, float]] = []

    def render(self) -> list[str]:
        samples = list(self.collect()) if self.collect is not None else self.samples
        return [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in sorted(samples)]


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count, per label set."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help, labelnames)
        self.buckets = tuple(sorted(buckets))
        self._data: dict[Labels, list[float]] = {}  # per-bucket counts..., +Inf count, sum

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            data = self._data.get(key)
            if data is None:
                data = self._data[key] = [0.0] * (len(self.buckets) + 2)
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    data[i] += 1
                    break
            else:
                data[len(self.buckets)] += 1
            data[-1] += value

    def count(self, **labels: str) -> int:
        with self._lock:
            data = self._data.get(self._key(labels))
            return 0 if data is None else int(sum(data[:-1]))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._data.items())
        lines = []
        for key, data in items:
            cumulative = 0.0
            for bound, n in zip((*self.buckets, math.inf), data[:-1], strict=True):
                cumulative += n
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {_number(cumulative)}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(data[-1])}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {_number(cumulative)}")
        return lines


class Registry:
    """The metrics of one worker, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        #: Called before rendering (e.g. to refresh gauges); may raise to fail the scrape.
        self.before_render: Callable[[], None] | None = None

    def register(self, metric: _M) -> _M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help, labelnames))

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), **kw: Sequence[float]
    ) -> Histogram:
        return self.register(Histogram(name, help, labelnames, **kw))

    def gauge(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        collect: Callable[[], Iterable[tuple[Labels, float]]] | None = None,
    ) -> Gauge:
        return self.register(Gauge(name, help, labelnames, collect))

    def render(self) -> str:
        if self.before_render is not None:
            self.before_render()
        lines: list[str] = []
        for metric in self._metrics.values():
            body = metric.render()
            if body:
                lines += metric.header() + body
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``registry.render()`` at ``http://host:port/metrics`` from a daemon thread."""

    def __init__(self, registry: Registry, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                try:
                    body = registry.render().encode()
                except Exception as e:
                    _log.warning("metrics scrape failed: %s", e)
                    self.send_error(503, explain=str(e))
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes are not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lonnymq-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/metrics"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
