"""Acceptance: the real ``python -m lonnymq worker`` in subprocesses against a real PostgreSQL,
stopped with SIGTERM or killed with SIGKILL mid-load; outcomes are read from the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lonnymq import Client

HERE = Path(__file__).resolve().parent
N = 2000

pytestmark = pytest.mark.slow


class Workers:
    """Worker subprocesses, each logging to its own file, all stopped at the end."""

    def __init__(self, dsn: str, schema: str, logs: Path) -> None:
        self.dsn, self.schema, self.logs = dsn, schema, logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, spec: str, *args: str, sleep: float = 0.01) -> subprocess.Popen[bytes]:
        # Each worker's sessions (its own and its handlers') carry its name: see gone().
        dsn = make_conninfo(self.dsn, application_name=self.name(len(self.procs)))
        env = {
            **os.environ,
            "ACCEPT_DSN": dsn,
            "ACCEPT_SCHEMA": self.schema,
            "ACCEPT_SLEEP": str(sleep),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        log = open(self.logs / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lonnymq",
                "worker",
                spec,
                "--dsn",
                dsn,
                "--schema",
                self.schema,
                "--poll-interval",
                "1",
                *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def name(index: int) -> str:
        return f"accept-worker-{index}"

    def gone(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        """Until the server has ended the sessions of a killed worker: a statement it had sent
        (an ack) runs to its end, and may commit, after the process is gone."""
        name = self.name(self.procs.index(proc))
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone():
                assert time.monotonic() < deadline, f"the sessions of {name} outlived it by {timeout} s"
                time.sleep(0.05)

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker-{self.procs.index(proc)}.log").read_text(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"worker did not stop on SIGTERM:\n{self.log(proc)}") from None

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def workers(dsn: str, schema: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(dsn, schema, tmp_path)
    yield w
    w.cleanup()


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[Callable[..., list[Any]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.results (n int NOT NULL, msg_id bigint NOT NULL, pid int NOT NULL,"
                " phase text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema))
        )

        def query(text: str, *params: Any) -> list[Any]:
            return conn.execute(sql.SQL(text).format(s=sql.Identifier(schema)), params).fetchall()  # type: ignore[arg-type]

        yield query


def wait_for(
    cond: Callable[[], bool], timeout: float, what: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, f"a worker exited early ({p.returncode}) while waiting for {what}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def done_count(db: Callable[..., list[Any]]) -> int:
    return int(db("SELECT count(DISTINCT n) FROM {s}.results WHERE phase = 'done'")[0][0])


def started_by(db: Callable[..., list[Any]], pid: int) -> int:
    return int(db("SELECT count(*) FROM {s}.results WHERE phase = 'start' AND pid = %s", pid)[0][0])


def test_sigterm_mid_load_finishes_in_flight_and_loses_nothing(
    client: Client, workers: Workers, db: Callable[..., list[Any]]
) -> None:
    client.create_queue("work", lease=10)
    for start in range(0, N, 500):
        client.send_batch("work", list(range(start, start + 500)))
    a = workers.spawn("accept_app:app", "--concurrency", "8", "--shutdown-timeout", "30", sleep=0.02)
    b = workers.spawn("accept_app:app", "--concurrency", "8", "--shutdown-timeout", "30", sleep=0.02)
    wait_for(lambda: done_count(db) >= N // 4, 120, "a quarter of the messages", [a, b])

    assert workers.stop(a) == 0, workers.log(a)
    started = {r[0] for r in db("SELECT msg_id FROM {s}.results WHERE pid = %s AND phase = 'start'", a.pid)}
    finished = {r[0] for r in db("SELECT msg_id FROM {s}.results WHERE pid = %s AND phase = 'done'", a.pid)}
    assert started and started == finished  # everything A had begun, it finished before exiting
    assert done_count(db) < N, "the load was over before the SIGTERM: nothing was tested"
    wait_for(lambda: done_count(db) == N, 120, "B to drain the queue", [b])
    assert workers.stop(b) == 0, workers.log(b)

    per_n = Counter(r[0] for r in db("SELECT n FROM {s}.results WHERE phase = 'done'"))
    assert set(per_n) == set(range(N))
    assert max(per_n.values()) == 1  # a graceful stop processes nothing twice
    m = client.metrics("work")
    assert (m.ready, m.scheduled, m.leased, m.dead) == (0, 0, 0, 0)
    assert "stopping" in workers.log(a) and "stopped" in workers.log(a)


def test_kill_9_mid_load_processes_everything_at_least_once(
    client: Client, workers: Workers, db: Callable[..., list[Any]], schema: str
) -> None:
    # 5 s leases, heartbeats every ~1.7 s: B's own leases must not lapse on a loaded CI machine
    # (a lapse would make a duplicate of a message A never held).
    client.create_queue("work", lease=5)
    for start in range(0, N, 500):
        client.send_batch("work", list(range(start, start + 500)))
    a = workers.spawn("accept_app:app", "--concurrency", "8", sleep=0.05)
    b = workers.spawn("accept_app:app", "--concurrency", "8", sleep=0.05)
    # Kill A mid-load, once both are processing: on a loaded machine one worker can start
    # seconds after the other, and a kill before A has taken anything would test nothing.
    wait_for(
        lambda: min(started_by(db, a.pid), started_by(db, b.pid)) >= 20 and done_count(db) >= N // 8,
        120,
        "both workers to be processing",
        [a, b],
    )

    a.kill()
    a.wait()
    workers.gone(a)
    # What was in flight at the kill: leased now (A's leases live on until they expire).
    in_flight = {
        json.loads(bytes(r[0]))
        for r in db(
            "SELECT m.payload FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
            " WHERE q.name = 'work' AND m.leased"
        )
    }
    by_a = {r[0] for r in db("SELECT n FROM {s}.results WHERE pid = %s AND phase = 'start'", a.pid)}
    assert done_count(db) < N, "the load was over before the kill: nothing was tested"
    wait_for(lambda: done_count(db) == N, 180, "B to process everything", [b])
    assert workers.stop(b) == 0, workers.log(b)

    per_n = Counter(r[0] for r in db("SELECT n FROM {s}.results WHERE phase = 'done'"))
    assert set(per_n) == set(range(N))  # nothing lost
    duplicates = {n for n, k in per_n.items() if k > 1}
    assert duplicates <= in_flight & by_a, duplicates - (in_flight & by_a)
    m = client.metrics("work")
    assert (m.ready, m.scheduled, m.leased, m.dead) == (0, 0, 0, 0)
    # A's orphaned messages came back only after their lease (attempt 2 for those A had).
    orphans = in_flight & by_a
    assert orphans, "A held no message when it was killed: nothing was tested"
    again = {
        r[0]
        for r in db(
            "SELECT DISTINCT r.n FROM {s}.results r WHERE r.phase = 'start' AND r.pid = %s AND r.n = ANY(%s)",
            b.pid,
            sorted(orphans),
        )
    }
    history = db(
        "SELECT n, pid, phase, at FROM {s}.results WHERE n = ANY(%s) ORDER BY n, at", sorted(orphans - again)
    )
    assert again == orphans, (a.pid, b.pid, history)


def test_cron_fires_once_per_tick_with_three_workers(
    client: Client, workers: Workers, db: Callable[..., list[Any]]
) -> None:
    client.create_queue("ticks", archive=True)
    procs = [workers.spawn("accept_app:cron_app", "--concurrency", "2") for _ in range(3)]

    def ticks() -> list[tuple[int, int]]:
        return db(
            "SELECT (headers->'lonnymq_cron'->>'tick')::bigint AS tick, count(*) FROM ("
            "  SELECT a.headers FROM {s}.archive a JOIN {s}.queue q ON q.id = a.queue_id WHERE q.name = 'ticks'"
            "  UNION ALL"
            "  SELECT m.headers FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id WHERE q.name = 'ticks'"
            ") x GROUP BY 1 ORDER BY 1"
        )

    wait_for(lambda: len(ticks()) >= 6, 120, "six ticks", procs)  # three processes to start first
    for p in procs:
        assert workers.stop(p) == 0, workers.log(p)
    rows = ticks()
    assert all(count == 1 for _, count in rows), rows
    values = [t for t, _ in rows]
    assert values == list(range(values[0], values[-1] + 1000, 1000))  # no tick missed
    assert all("started" in workers.log(p) for p in procs)
    # Every tick was handled, but one the last worker's scheduler sent as that worker stopped
    # fetching (it waits, ready, for the next worker to start: workers stop one at a time).
    m = client.metrics("ticks")
    assert m.leased == 0 and m.ready <= 1, m
    if m.ready:
        [msg] = client.peek("ticks", 10)
        assert msg.headers is not None and int(msg.headers["lonnymq_cron"]["tick"]) == values[-1], msg
