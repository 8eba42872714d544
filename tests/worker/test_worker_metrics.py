"""The worker's Prometheus endpoint: the text format, and values that match the database and
what the handlers did."""

from __future__ import annotations

import asyncio
import math
import re
import urllib.error
import urllib.request

import pytest

from lonnymq import Client
from lonnymq.worker import App, Backoff, Worker
from lonnymq.worker.metrics import Registry
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
            assert kind in ("counter", "gauge", "histogram") and name in helped and name not in types
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


def test_exposition_format_and_escaping() -> None:
    r = Registry()
    c = r.counter("x_total", "A counter.", ["queue"])
    c.inc(queue='we"ird\\q\nx')
    c.inc(2, queue="a")
    h = r.histogram("lat_seconds", "A histogram.", ["queue"], buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, queue="a")
    r.gauge("g", "A gauge.", collect=lambda: [((), 1.5)])
    text = r.render()
    samples, types = parse(text)
    assert types == {"x_total": "counter", "lat_seconds": "histogram", "g": "gauge"}
    assert samples[("x_total", frozenset({("queue", 'we\\"ird\\\\q\\nx')}))] == 1
    assert samples[("x_total", frozenset({("queue", "a")}))] == 2
    buckets = [
        samples[("lat_seconds_bucket", frozenset({("queue", "a"), ("le", le)}))]
        for le in ("0.1", "1", "+Inf")
    ]
    assert buckets == [1, 3, 4]
    assert samples[("lat_seconds_count", frozenset({("queue", "a")}))] == 4
    assert samples[("lat_seconds_sum", frozenset({("queue", "a")}))] == pytest.approx(4.05)
    assert samples[("g", frozenset())] == 1.5
    with pytest.raises(ValueError):
        c.inc(other="x")


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", ""


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
    # The endpoint goes away with the worker.
    with pytest.raises(OSError):
        urllib.request.urlopen(str(scraped["url"]), timeout=2)
    assert w.m_messages.total() == 21
