"""The worker's HTTP endpoint, for Prometheus and for orchestrators (Kubernetes probes, ...):

* ``GET /metrics``: the worker's own ``prometheus_client`` registry, in the format the scraper
  asks for (Prometheus text or OpenMetrics, gzip when accepted);
* ``GET /healthz``: 200 while the process is alive and the worker's event loop answers within
  :data:`HEALTH_TIMEOUT` seconds (a handler blocking the loop makes it 503): a liveness probe;
* ``GET /readyz``: 200 while the worker runs and its last database call succeeded; 503 while it
  starts or stops and during a database outage: a readiness probe.

The probes answer ``ok`` or the reason they fail, one line of text. The server runs on daemon
threads next to the worker's event loop and binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from ..errors import MetricsServerError

__all__ = ["HEALTH_TIMEOUT", "MetricsServer", "Probe"]

#: Seconds the event loop has to answer a liveness probe.
HEALTH_TIMEOUT = 5.0

#: A probe: (ok, one line saying why not, or "ok").
Probe = Callable[[], tuple[bool, str]]

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes and probes are not worth a log line each


class MetricsServer:
    """Serves ``registry`` at ``/metrics`` and each probe of ``probes`` at its path
    (``/healthz``, ``/readyz``) on ``host:port`` (port 0: any free port) from a daemon thread."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, probes: Mapping[str, Probe]
    ) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)  # type: ignore[no-any-return]  # untyped library
            probe = probes.get(path)
            if probe is None:
                start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"not found: try /metrics, /healthz or /readyz\n"]
            try:
                ok, why = probe()
            except Exception as e:  # a probe that breaks says so rather than hanging up
                ok, why = False, f"probe failed: {e!r}"
            body = (why + "\n").encode()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(
                status, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")]
            )
            return [body]

        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

            class Server(ThreadingWSGIServer):
                address_family = family

            self._server = make_server(host, port, app, server_class=Server, handler_class=_Quiet)
        except OSError as e:  # in use, not this host's address, a name that does not resolve
            reason = (e.strerror or str(e)).lower()
            error = MetricsServerError(f"cannot serve metrics on {host}:{port}: {reason}")
            error.errno = e.errno
            raise error from e
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="lonnymq-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def base_url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def url(self) -> str:
        return self.base_url + "/metrics"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
