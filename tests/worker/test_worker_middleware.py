"""Around each handler call: the app's middleware (sync and async handlers, order, exceptions,
an OpenTelemetry span), failures logged with their traceback, and JSON log lines."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from lonnymq import Client, Envelope
from lonnymq.worker import App, Backoff, Job, Retry
from lonnymq.worker.logs import JsonFormatter
from worker_helpers import until, with_worker


def test_middleware_wraps_sync_and_async_handlers(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch(
        "jobs", [Envelope("s", kind="sync"), Envelope("a", kind="async"), Envelope("x", kind="fail")]
    )
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def record(*event: Any) -> None:
        with lock:
            events.append(event)

    @contextlib.contextmanager
    def outer(job: Job) -> Iterator[None]:
        record("outer in", job.payload, threading.current_thread().name.startswith("lonnymq-handler"))
        try:
            yield
        except Exception as e:
            record("outer saw", job.payload, type(e).__name__)
            raise
        record("outer out", job.payload)

    app = App(middleware=[outer], retry=Backoff(base=0))

    @app.use
    def inner(job: Job) -> Any:
        if job.kind == "async":

            @contextlib.asynccontextmanager
            async def around() -> AsyncIterator[None]:
                record("inner async in", job.payload)
                yield
                record("inner async out", job.payload)

            return around()
        return contextlib.nullcontext()

    @app.handler("jobs", kind="sync")
    def sync_handler(job: Job) -> None:
        record("sync handler", job.payload)

    @app.handler("jobs", kind="async")
    async def async_handler(job: Job) -> None:
        record("async handler", job.payload)

    @app.handler("jobs", kind="fail", max_attempts=1)
    def failing(job: Job) -> None:
        raise Retry("no luck")

    with_worker(
        app, dsn, schema, until(lambda: len([e for e in events if e[0] in ("outer out", "outer saw")]) == 3)
    )
    by_payload = {p: [e for e in events if e[1] == p] for p in "sax"}
    assert by_payload["s"] == [("outer in", "s", True), ("sync handler", "s"), ("outer out", "s")]
    assert by_payload["a"] == [
        ("outer in", "a", False),  # the async handler's task, on the event loop
        ("inner async in", "a"),
        ("async handler", "a"),
        ("inner async out", "a"),
        ("outer out", "a"),
    ]
    assert by_payload["x"] == [("outer in", "x", True), ("outer saw", "x", "Retry")]
    assert client.dead_letters("jobs")[0].kind == "fail"  # the middleware did not swallow it


def test_a_middleware_failure_fails_the_attempt(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", "m")
    app = App(middleware=[lambda job: "not a context manager"])  # type: ignore[list-item]  # the bug under test
    ran: list[str] = []
    app.register(lambda job: ran.append("ran"), "jobs")
    with_worker(app, dsn, schema, until(lambda: client.dead_letters("jobs")))
    assert ran == [] and "not a context manager" in (client.dead_letters("jobs")[0].last_error or "")


def test_handler_failures_are_logged_with_their_traceback(
    dsn: str, schema: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send_batch("jobs", ["boom", "retry"])
    app = App()

    @app.handler("jobs")
    def work(job: Job) -> None:
        if job.payload == "retry":
            raise Retry("asked for")
        raise ValueError("kaboom in the handler")

    with caplog.at_level(logging.INFO, "lonnymq.worker"):
        with_worker(app, dsn, schema, until(lambda: len(client.dead_letters("jobs")) == 2))
    failed = {
        r.getMessage().rsplit(": ", 1)[1]: r for r in caplog.records if "attempt 1 failed" in r.getMessage()
    }
    boom = failed["ValueError('kaboom in the handler')"]
    assert boom.levelno == logging.WARNING and boom.exc_info is not None
    text = logging.Formatter().format(boom)
    assert "Traceback (most recent call last)" in text and 'raise ValueError("kaboom in the handler")' in text
    asked = failed["Retry('asked for')"]
    assert asked.levelno == logging.INFO and asked.exc_info is None  # asked for: one line


def test_json_log_lines() -> None:
    logger = logging.getLogger("lonnymq.test.json")
    try:
        raise KeyError("missing")
    except KeyError:
        extra = {"queue": "q", "obj": object()}
        record = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "job %s failed", ("q#1",), sys.exc_info(), extra=extra
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert (
        out["level"] == "ERROR"
        and out["logger"] == "lonnymq.test.json"
        and out["message"] == "job q#1 failed"
    )
    assert out["time"].endswith("+00:00") and out["queue"] == "q" and out["obj"].startswith("<object")
    assert out["exception"].startswith("Traceback") and "KeyError: 'missing'" in out["exception"]


def test_opentelemetry_span_per_handler_call(dsn: str, schema: str, client: Client) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lonnymq-test")

    # The docs/worker.md example.
    def tracing(job: Job) -> Any:
        return tracer.start_as_current_span(
            f"{job.queue} process",
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "lonnymq",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "lonnymq.attempt": job.attempt,
            },
        )

    client.create_queue("jobs", max_attempts=1)
    client.send_batch("jobs", ["ok", "bad"])
    app = App(middleware=[tracing])
    inside: dict[str, int] = {}

    @app.handler("jobs")
    async def work(job: Job) -> None:
        inside[job.payload] = trace.get_current_span().get_span_context().span_id
        if job.payload == "bad":
            raise RuntimeError("bad payload")

    with_worker(app, dsn, schema, until(lambda: len(exporter.get_finished_spans()) == 2))
    spans = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}  # type: ignore[index]
    ids = {m.payload: str(m.id) for m in client.dead_letters("jobs")}
    bad = spans[ids["bad"]]
    ok = next(s for k, s in spans.items() if k != ids["bad"])
    assert ok.name == "jobs process" and ok.kind == trace.SpanKind.CONSUMER
    assert (
        ok.status.status_code == trace.StatusCode.UNSET and bad.status.status_code == trace.StatusCode.ERROR
    )
    assert bad.events[0].name == "exception" and "bad payload" in str(bad.events[0].attributes)
    assert {inside["ok"], inside["bad"]} == {
        ok.context.span_id,
        bad.context.span_id,
    }  # current in the handler


APP_MODULE = """
from lonnymq.worker import App

app = App()


@app.handler("jobs")
def work(job):
    raise ValueError("kaboom " + job.payload)
"""


def test_cli_worker_logs_json_lines_with_the_traceback(
    dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", "x1")
    (tmp_path / "json_app.py").write_text(APP_MODULE)
    cmd = [sys.executable, "-m", "lonnymq", "worker", "json_app:app", "--log-format", "json"]
    proc = subprocess.Popen(
        [*cmd, "--dsn", dsn, "--schema", schema, "--poll-interval", "0.2"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A worker process starting on a loaded machine (CI: load 6-12) may take many seconds.
        deadline = time.monotonic() + 120
        while not client.dead_letters("jobs") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    failed = next(r for r in lines if "attempt 1 failed" in r["message"])
    assert failed["level"] == "WARNING" and failed["logger"] == "lonnymq.worker"
    assert 'raise ValueError("kaboom " + job.payload)' in failed["exception"]
    assert any("started" in r["message"] for r in lines) and any("stopped" in r["message"] for r in lines)
