"""Shared parts of the tests that restart or fail over a real PostgreSQL: throwaway Debian
PostgreSQL 15 clusters (tools/pgcluster.py), a producer thread with the default client settings,
and a handler that records every delivery it processed."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lonnymq import Client, errors
from lonnymq.worker import App, Job

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster

#: Durable commits (a crash loses nothing committed), no plpgsql_check needed.
SETTINGS = {"shared_preload_libraries": "''", "synchronous_commit": "on"}


def require_pg15() -> None:
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")


class Producer(threading.Thread):
    """Sends ``{"n": i}`` at about ``rate`` per second with a default Client until stopped.
    A send that raises ConnectionLost (it may have committed) is counted, not retried; any
    other error is kept in ``errors``."""

    def __init__(self, dsn: str, rate: float, queue: str = "q") -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.queue = dsn, rate, queue
        self.stop = threading.Event()
        self.ids: set[int] = set()  # committed (the send returned)
        self.sent_at: list[float] = []  # monotonic time of each committed send
        self.connection_lost = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        with Client(self.dsn) as c:
            n = 0
            while not self.stop.is_set():
                try:
                    r = c.send(self.queue, {"n": n})
                    assert r.id is not None
                    self.ids.add(r.id)
                    self.sent_at.append(time.monotonic())
                except errors.ConnectionLost:
                    self.connection_lost += 1
                except Exception as e:
                    self.errors.append(e)
                n += 1
                time.sleep(1 / self.rate)

    def finish(self) -> None:
        self.stop.set()
        self.join(120)
        assert not self.is_alive()


def recovery_gaps(sent_at: list[float], outages: list[tuple[float, float]]) -> list[float]:
    """Seconds from each outage's end (server accepting again) to the next committed send."""
    return [round(min((t for t in sent_at if t >= end), default=float("inf")) - end, 2) for _, end in outages]


@dataclass
class Recorder:
    """A handler recording (id, token, started, finished) of each delivery it processed."""

    seconds: float = 0.2
    done: list[tuple[int, int, float, float]] = field(default_factory=list)

    async def handle(self, job: Job) -> None:
        started = time.monotonic()
        await asyncio.sleep(self.seconds)
        self.done.append((job.message.id, job.message.token, started, time.monotonic()))

    def app(self, queue: str = "q") -> App:
        app = App()
        app.register(self.handle, queue)
        return app

    def ids(self) -> set[int]:
        return {i for i, _, _, _ in self.done}

    def twice(self) -> dict[int, list[tuple[int, int, float, float]]]:
        counts = Counter(i for i, _, _, _ in self.done)
        return {i: [d for d in self.done if d[0] == i] for i, n in counts.items() if n > 1}

    def resurrected(self, outage_start: float, margin: float = 3.0) -> list[int]:
        """Ids processed again although an earlier delivery finished ``margin`` seconds before the
        outage (its ack, batched within 50 ms, had committed by then: 3 s leave a loaded CI
        machine's event loop room to lag; the tests run 8 s of traffic before the outage)."""
        return [
            i
            for i, ds in self.twice().items()
            if min(finished for _, _, _, finished in ds) < outage_start - margin
        ]


def outage_lines(records: list[Any]) -> tuple[int, int]:
    """How many "database unavailable" and "reachable again" lines the worker logged."""
    down = sum("database unavailable" in r.getMessage() for r in records if r.name == "lonnymq.worker")
    up = sum("reachable again" in r.getMessage() for r in records if r.name == "lonnymq.worker")
    return down, up
