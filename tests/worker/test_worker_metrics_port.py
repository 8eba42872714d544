"""``lonnymq worker --metrics-port P`` with P taken: one line naming the address and the option
to change (it said only "lonnymq: Address already in use")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lonnymq import Client, errors
from lonnymq.worker.metrics import MetricsServer

APP = """\
from lonnymq.worker import App, Job

app = App()


@app.handler("q")
async def noop(job: Job) -> None:
    pass
"""


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_in_use_is_one_line_naming_port_and_option(
    tmp_path: Path, dsn: str, schema: str, client: Client, taken: int
) -> None:
    client.create_queue("q")
    (tmp_path / "portapp.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LONNYMQ_", "DATABASE_URL"))}
    command = [sys.executable, "-m", "lonnymq", "worker", "portapp:app", *("--dsn", dsn, "--schema", schema)]
    command += ["--metrics-port", str(taken)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"lonnymq: cannot serve metrics on 127.0.0.1:{taken}: address already in use"
        " (choose another --metrics-port)"
    ), proc.stderr


def test_the_library_raises_a_typed_error(taken: int) -> None:
    from prometheus_client import CollectorRegistry

    with pytest.raises(errors.MetricsServerError) as got:
        MetricsServer(CollectorRegistry(), "127.0.0.1", taken, {})
    assert isinstance(got.value, OSError) and got.value.errno is not None
    assert f"127.0.0.1:{taken}" in str(got.value)
