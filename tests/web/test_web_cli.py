"""`lonnymq web` as users run it: a subprocess serving the dashboard, stopped with SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from lonnymq import Client

# Servers of their own in subprocesses; the SQL they drive is covered by test_web_api.py.
pytestmark = pytest.mark.once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _lonnymq_web(
    *args: str, env: dict[str, str] | None = None, base: str = ""
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    for attempt in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "lonnymq", "web", "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120  # a web process starting on a loaded CI machine
        last: object = None
        while True:
            try:
                last = httpx.get(f"{url}{base}/healthz", timeout=10)
                if last.status_code == 200:
                    break
                last = last.text
            except httpx.TransportError as e:
                last = e
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.communicate(timeout=10)
                # Another process bound the free port between _free_port() and the server's bind.
                if "address already in use" in out[1] and attempt < 4:
                    break
                raise AssertionError(f"lonnymq web did not start ({last!r}): {out}")
            time.sleep(0.1)
        if proc.returncode is None:
            break
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_lonnymq_web_serves_and_stops(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x")
    env = {"LONNYMQ_WEB_TOKEN": ""}
    with _lonnymq_web("--dsn", dsn, "--schema", schema, env=env) as (url, proc):
        assert [q["name"] for q in httpx.get(f"{url}/api/queues").json()["queues"]] == ["jobs"]
        assert httpx.post(f"{url}/api/queues/jobs/purge", json={"confirm": "jobs"}).status_code == 403
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # No token configured: one was made up and printed; it works on the API.
    (line,) = [x for x in err.splitlines() if "this run's token" in x]
    token = line.rsplit(" ", 1)[1]
    with _lonnymq_web(
        "--dsn", dsn, "--schema", schema, "--base-path", "/mq", env={"LONNYMQ_WEB_TOKEN": token}, base="/mq"
    ) as (
        url,
        _,
    ):
        r = httpx.post(
            f"{url}/mq/api/queues/jobs/purge",
            json={"confirm": "jobs"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
    assert client.metrics("jobs").ready == 0


def test_lonnymq_web_read_only(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    with _lonnymq_web("--dsn", dsn, "--schema", schema, "--read-only", env={"LONNYMQ_WEB_TOKEN": "t"}) as (
        url,
        proc,
    ):
        assert "read-only" in httpx.get(f"{url}/queues/jobs").text
        r = httpx.post(
            f"{url}/api/queues/jobs/purge", json={"confirm": "jobs"}, headers={"Authorization": "Bearer t"}
        )
        assert r.status_code == 403
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert "read-only dashboard at http://127.0.0.1:" in err


def test_lonnymq_web_errors_in_one_line(dsn: str) -> None:
    # The web extra missing (uvicorn hidden from imports).
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'uvicorn':\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from lonnymq.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "web", "--dsn", dsn], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "lonnymq: the dashboard needs the web extra (uvicorn is missing): pip install 'lonnymq[web]'"
    ]
    # A server that cannot be reached: one line, before serving anything.
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "lonnymq",
            "web",
            "--dsn",
            "postgresql://nobody@127.0.0.1:1/x",
            "--connect-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert len(bad.stderr.strip().splitlines()) == 1 and "cannot connect to" in bad.stderr
