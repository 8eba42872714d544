"""A worker started while its database cannot be reached yet: a restart, a failover, or the
database's container starting beside the worker's (``docker compose up``). The worker waits for
it (``startup_timeout``, ``--startup-timeout``, default 60 s), logging each try, then runs; it
gave up at once before, so a worker started during a restart was gone for good (CI's restart run,
tests/faults/test_restart_run.py, lost every message that way on a loaded machine: the worker's
start-up took longer than the 8 s before the first restart). Errors that waiting cannot mend
(authentication, an unknown role) still fail at once, in one line.

Runs on throwaway PostgreSQL 15 clusters (tools/pgcluster.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import SETTINGS, Recorder, pgcluster, require_pg15

from lonnymq import Client
from lonnymq.worker import Worker
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow, pytest.mark.timeout(240)]

APP = """\
import os
from lonnymq.worker import App, Job

app = App()


@app.handler("q")
async def record(job: Job) -> None:
    with open(os.environ["RUNS"], "a") as f:
        f.write(f"{job.message.id}\\n")
"""


@contextlib.contextmanager
def _cluster_with_queue() -> Iterator[pgcluster.Cluster]:
    """A throwaway cluster with lonnymq installed and a queue "q"."""
    with pgcluster.temporary_cluster(SETTINGS, install=False) as cluster:
        with Client(cluster.dsn) as c:
            c.migrate()
            c.create_queue("q")
        yield cluster


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 120
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) before {what}: {path.read_text()}"
        assert time.monotonic() < deadline, f"no {what} in 120 s: {path.read_text()}"
        time.sleep(0.05)


def test_the_worker_command_waits_for_a_database_that_is_not_up_yet(tmp_path: Path) -> None:
    require_pg15()
    (tmp_path / "startapp.py").write_text(APP)
    log, runs = tmp_path / "worker.log", tmp_path / "runs.txt"
    with _cluster_with_queue() as cluster:
        cluster.stop("fast")
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lonnymq", "worker", "startapp:app", "--dsn", cluster.dsn],
                cwd=tmp_path,
                env={**os.environ, "RUNS": str(runs)},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        try:
            _wait_for(log, "starting: database unavailable", proc, "a line saying it waits")
            cluster.start()
            _wait_for(log, "started: queues ['q']", proc, "the start")
            with Client(cluster.dsn) as c:
                sent = c.send("q", {"n": 1}).id
            _wait_for(runs, f"{sent}\n", proc, "the handler's run")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text


def test_a_stop_while_the_worker_waits_ends_it_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    require_pg15()
    caplog.set_level(logging.INFO, logger="lonnymq.worker")
    with _cluster_with_queue() as cluster:
        cluster.stop("fast")

        async def main() -> None:
            w = Worker(Recorder().app(), cluster.dsn, startup_timeout=600)
            run = asyncio.ensure_future(w.run())
            await eventually(
                lambda: any("starting: database unavailable" in r.getMessage() for r in caplog.records),
                120,
                "a line saying it waits",
            )
            await w.stop()
            await asyncio.wait_for(run, 60)  # returns: nothing had started, nothing failed

        asyncio.run(main())
    assert any("stopped before it started" in r.getMessage() for r in caplog.records)


def test_startup_timeout_zero_and_a_refusal_fail_at_once(tmp_path: Path) -> None:
    require_pg15()
    (tmp_path / "startapp.py").write_text(APP)
    with _cluster_with_queue() as cluster:
        nobody = cluster.dsn.replace("postgres@", "nobody@")
        assert nobody != cluster.dsn
        refused = subprocess.run(
            [sys.executable, "-m", "lonnymq", "worker", "startapp:app", "--dsn", nobody],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        cluster.stop("fast")
        down = subprocess.run(
            [
                sys.executable,
                "-m",
                "lonnymq",
                "worker",
                "startapp:app",
                "--dsn",
                cluster.dsn,
                *("--startup-timeout", "0"),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    # A role the server does not know: no waiting, no log line, one line and exit 1.
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()], refused.stderr
    assert refused.stderr.startswith("lonnymq: cannot connect to nobody@") and "nobody" in refused.stderr
    # --startup-timeout 0: the old behaviour, at once.
    assert down.returncode == 1, down.stderr
    assert down.stderr.strip().splitlines()[-1].startswith("lonnymq: cannot connect to "), down.stderr
    assert "starting: database unavailable" not in down.stderr
