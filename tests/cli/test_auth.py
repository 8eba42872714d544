"""The CLI on a server that asks for a password (scram-sha-256): a wrong or missing password is
one line on stderr, exit status 1, within 5 seconds, and the password is never echoed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster  # tools/ is not a package: found through sys.path above

from auth_helpers import scram_cluster

PASSWORD = "s3cret-Horse-battery"
WRONG = "wr0ng-Staple-guess"

pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def cluster() -> Iterator[pgcluster.Cluster]:
    with scram_cluster(PASSWORD) as c:
        yield c


def _lonnymq(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the CLI with nothing configured but ``env``; its result and how long it took."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LONNYMQ_", "DATABASE_URL"))}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "lonnymq", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, time.monotonic() - t0


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _url(cluster: pgcluster.Cluster, password: str | None) -> str:
    secret = f":{password}" if password is not None else ""
    return f"postgresql://alice{secret}@127.0.0.1:{cluster.port}/{pgcluster.DATABASE}"


@pytest.mark.parametrize("where", ["--dsn", "LONNYMQ_DSN", "DATABASE_URL", "PGPASSWORD"])
def test_wrong_password_is_one_line_without_the_password(cluster: pgcluster.Cluster, where: str) -> None:
    if where == "--dsn":
        proc, took = _lonnymq("queue", "list", "--dsn", _url(cluster, WRONG))
    elif where == "PGPASSWORD":
        proc, took = _lonnymq("queue", "list", "--dsn", _url(cluster, None), PGPASSWORD=WRONG)
    else:
        proc, took = _lonnymq("queue", "list", **{where: _url(cluster, WRONG)})
    line = _one_line(proc)
    assert took < 20  # no retry, no wait (room for a slow interpreter start under load)
    assert line.startswith(f"lonnymq: cannot connect to alice@127.0.0.1:{cluster.port}/test:"), line
    assert 'password authentication failed for user "alice"' in line
    assert WRONG not in proc.stderr + proc.stdout


def test_missing_password_is_one_line(cluster: pgcluster.Cluster) -> None:
    proc, took = _lonnymq("queue", "list", "--dsn", _url(cluster, None))
    line = _one_line(proc)
    assert took < 20  # no retry, no wait (room for a slow interpreter start under load)
    assert "alice@127.0.0.1" in line and "no password supplied" in line


def test_worker_command_with_a_wrong_password(cluster: pgcluster.Cluster, tmp_path: Path) -> None:
    (tmp_path / "auth_app.py").write_text(
        "from lonnymq.worker import App\napp = App()\napp.register(lambda job: None, 'q')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "lonnymq", "worker", "auth_app:app", "--dsn", _url(cluster, WRONG)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = _one_line(proc)
    assert 'password authentication failed for user "alice"' in line
    assert WRONG not in proc.stderr


def test_right_password_gets_past_authentication(cluster: pgcluster.Cluster) -> None:
    # The same role with its password connects: the next thing it hears is about the schema.
    proc, _ = _lonnymq("queue", "list", "--dsn", _url(cluster, PASSWORD))
    line = _one_line(proc)
    assert "not installed" in line and "lonnymq migrate" in line
    assert PASSWORD not in proc.stderr
