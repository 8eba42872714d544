"""The worker's Prometheus endpoint: the text format, and values that match the database and
what the handlers did."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable

import pytest
from prometheus_client import REGISTRY, generate_latest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lonnymq import Client
from lonnymq.worker import App, Backoff, Worker, meters
from lonnymq.worker.meters import total
from worker_helpers import eventually, with_worker

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(?:,|$)')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Parse an exposition strictly enough to catch format errors: every sample belongs to a
    family announced by HELP and TYPE lines, labels are well quoted, values are numbers."""
    samples: Samples = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split(" ")[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram") and name in helped and name not in types, line
            types[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match, line
        name, labels_text, value = match.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, line
        labels: list[tuple[str, str]] = []
        if labels_text:
            pos = 0
            while pos < len(labels_text):
                lm = _LABEL.match(labels_text, pos)
                assert lm, line
                labels.append((lm.group(1), lm.group(2)))
                pos = lm.end()
        samples[(name, frozenset(labels))] = float(value)
    return samples, types


def test_each_worker_has_its_own_registry(dsn: str, schema: str) -> None:
    app = App()
    app.register(lambda job: None, "jobs")
    a, b = Worker(app, dsn, schema=schema), Worker(app, dsn, schema=schema)  # no collision
    odd = 'we"ird\\k\nx'
    a.m_messages.labels(queue="jobs", kind=odd, outcome="acked").inc(2)
    assert total(a.m_messages, outcome="acked") == 2 and total(b.m_messages) == 0
    assert a.metrics is not b.metrics
    assert not [m for m in REGISTRY.collect() if m.name.startswith("lonnymq")]  # not the global one
    samples, types = parse(generate_latest(a.metrics).decode())
    assert types["lonnymq_worker_messages_total"] == "counter"
    key = frozenset({("queue", "jobs"), ("kind", 'we\\"ird\\\\k\\nx'), ("outcome", "acked")})
    assert samples[("lonnymq_worker_messages_total", key)] == 2
    # Not started: the queue counts are left out, not made up, and the worker is not ready.
    assert "lonnymq_queue_messages{" not in generate_latest(a.metrics).decode()
    assert a.meters.readyz() == (False, "the worker is starting")
    assert a.meters.healthz()[0] is False


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"] or "", e.read().decode()


def test_endpoint_serves_real_values(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", list(range(20)))
    for _ in range(3):
        client.send("jobs", "later", delay=3600)
    app = App()
    done: list[int] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        if job.payload == 7 and job.attempt == 1:
            raise RuntimeError("once")
        done.append(job.payload)

    scraped: dict[str, object] = {}

    async def scenario(w: Worker) -> None:
        assert w.metrics_url is not None
        await eventually(lambda: len(done) == 20)
        # Acks are batched: wait until the database has them before comparing.
        await eventually(lambda: asyncio.to_thread(lambda: client.metrics("jobs").leased == 0))
        await asyncio.sleep(1.1)  # past the queue-metrics cache
        scraped["main"] = await asyncio.to_thread(_get, w.metrics_url)
        scraped["db"] = await asyncio.to_thread(client.metrics, "jobs")
        scraped["404"] = await asyncio.to_thread(_get, w.metrics_url.replace("/metrics", "/nope"))
        scraped["healthz"] = await asyncio.to_thread(_get, w.metrics_url.replace("/metrics", "/healthz"))
        scraped["readyz"] = await asyncio.to_thread(_get, w.metrics_url.replace("/metrics", "/readyz"))
        scraped["url"] = w.metrics_url

    app.configure_queue("jobs", retry=Backoff(base=0))
    w = with_worker(app, dsn, schema, scenario, metrics_port=0)
    status, ctype, text = scraped["main"]  # type: ignore[misc]
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    samples, types = parse(text)

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    db = scraped["db"]
    assert value("lonnymq_queue_messages", queue="jobs", state="scheduled") == db.scheduled == 3  # type: ignore[attr-defined]
    assert value("lonnymq_queue_messages", queue="jobs", state="ready") == db.ready == 0  # type: ignore[attr-defined]
    assert value("lonnymq_queue_messages", queue="jobs", state="leased") == 0
    assert value("lonnymq_queue_messages", queue="jobs", state="dead") == 0
    assert value("lonnymq_queue_depth", queue="jobs") == 3
    assert value("lonnymq_worker_messages_total", queue="jobs", kind="", outcome="acked") == 20
    assert value("lonnymq_worker_messages_total", queue="jobs", kind="", outcome="retried") == 1
    assert value("lonnymq_worker_handler_duration_seconds_count", queue="jobs", kind="") == 21
    assert value("lonnymq_worker_pickup_latency_seconds_count", queue="jobs") == 20
    assert value("lonnymq_worker_fetched_messages_total", queue="jobs") == 21
    assert value("lonnymq_worker_concurrency") == 8
    assert value("lonnymq_worker_in_flight") == 0
    assert types["lonnymq_worker_handler_duration_seconds"] == "histogram"
    cumulative = [
        v for (n, labels), v in samples.items() if n == "lonnymq_worker_handler_duration_seconds_bucket"
    ]
    les = sorted(
        (float(dict(labels)["le"].replace("+Inf", "inf")), v)
        for (n, labels), v in samples.items()
        if n == "lonnymq_worker_handler_duration_seconds_bucket"
    )
    assert [v for _, v in les] == sorted(cumulative) and math.isinf(les[-1][0]) and les[-1][1] == 21
    assert scraped["404"][0] == 404  # type: ignore[index]
    assert scraped["healthz"][0::2] == (200, "ok\n")  # type: ignore[index]
    assert scraped["readyz"][0::2] == (200, "ok\n")  # type: ignore[index]
    assert value("lonnymq_worker_ready") == 1
    assert str(scraped["url"]).startswith("http://127.0.0.1:")  # this host only, by default
    # The endpoint goes away with the worker.
    with pytest.raises(OSError):
        urllib.request.urlopen(str(scraped["url"]), timeout=2)
    assert total(w.m_messages) == 21


class Proxy:
    """A TCP relay to the test database that the test can cut (a network outage: connections
    dropped, new ones refused) and restore."""

    def __init__(self, dsn: str) -> None:
        info = conninfo_to_dict(dsn)
        host, port = str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)
        self.upstream: tuple[int, object] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=self.listener.getsockname()[1])
        self.down = False
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            upstream = socket.socket(self.upstream[0], socket.SOCK_STREAM)
            upstream.connect(self.upstream[1])
            self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.down = True
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.open.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.mark.slow  # the outage lasts until the pool gives up waiting for a connection (30 s)
def test_readiness_follows_the_database(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    proxy = Proxy(dsn)
    app = App()
    done: list[object] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        done.append(job.payload)

    seen: dict[str, object] = {}

    async def probe(path: str) -> tuple[int, str]:
        status, _, body = await asyncio.to_thread(_get, str(seen["base"]) + path)
        return status, body

    async def scenario(w: Worker) -> None:
        assert w.metrics_url is not None
        seen["base"] = w.metrics_url.removesuffix("/metrics")
        await eventually(lambda: probe("/readyz"), what="ready")  # any answer
        assert await probe("/readyz") == (200, "ok\n") and await probe("/healthz") == (200, "ok\n")
        proxy.cut()
        await eventually(lambda: _status(probe("/readyz"), 503), 60, "not ready during the outage")
        status, body = await probe("/readyz")
        assert body.startswith("database unavailable")
        assert await probe("/healthz") == (200, "ok\n")  # alive: the worker keeps retrying
        status, _, text = await asyncio.to_thread(_get, str(w.metrics_url))
        samples, _ = parse(text)
        assert status == 200 and samples[("lonnymq_worker_ready", frozenset())] == 0
        assert not [k for k in samples if k[0] == "lonnymq_queue_depth"]  # left out, not stale
        proxy.down = False
        await eventually(lambda: _status(probe("/readyz"), 200), 90, "ready again")
        await asyncio.to_thread(client.send, "jobs", "after")
        await eventually(lambda: "after" in done, what="processing again")

    try:
        w = with_worker(app, proxy.dsn, schema, scenario, metrics_port=0, poll_interval=0.2, listen=False)
    finally:
        proxy.close()
    assert w.meters.readyz() == (False, "the worker is stopped")


async def _status(call: Awaitable[tuple[int, str]], expected: int) -> bool:
    return (await call)[0] == expected


def test_liveness_notices_a_blocked_event_loop(
    dsn: str, schema: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meters, "HEALTH_TIMEOUT", 0.3)
    client.create_queue("jobs")
    app = App()
    done: list[object] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        time.sleep(1.5)  # blocks the worker's event loop (a bug the probe is there to catch)
        done.append(job.payload)

    statuses: list[int] = []

    def recovered() -> bool:  # a 200 after the last 503
        return 503 in statuses and 200 in statuses[len(statuses) - statuses[::-1].index(503) :]

    async def scenario(w: Worker) -> None:
        healthz = str(w.metrics_url).replace("/metrics", "/healthz")
        stop = threading.Event()

        def poll() -> None:  # from a thread of its own: the test's loop is the blocked one
            while not stop.is_set():
                statuses.append(_get(healthz)[0])
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            # Healthy first (on a loaded machine the loop may miss the 0.3 s while starting up).
            await eventually(lambda: 200 in statuses, what="a healthy probe")
            await asyncio.to_thread(client.send, "jobs", "block")
            await eventually(lambda: done)
            await eventually(recovered, what="a healthy probe after the blocked loop")
        finally:
            stop.set()
            await asyncio.to_thread(poller.join)

    with_worker(app, dsn, schema, scenario, metrics_port=0)
    assert 503 in statuses[statuses.index(200) :]  # blocked loop noticed, after being healthy
    assert recovered()
