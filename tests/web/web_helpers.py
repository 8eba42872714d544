"""Serving the dashboard for tests: a real uvicorn on a free port, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from lonnymq import Client
from lonnymq.worker.ops import worker_ops


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (any free port) until the block ends; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


def add_schedule(client: Client, name: str, queue: str) -> None:
    """A periodic message schedule, as `lonnymq cron add` declares one."""
    client.run(worker_ops(client.schema).cron_upsert(name, "@every 60s", queue, {"job": name}, source="cli"))


def beat(client: Client, worker_id: str, queues: list[str]) -> None:
    """Register a worker, as its heartbeat does."""
    client.run(worker_ops(client.schema).worker_beat(worker_id, "host-a", 4242, queues, 8, 3, 60_000))
