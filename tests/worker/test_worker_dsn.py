"""Where a worker connects when no conninfo is given: exactly where ``Client()`` connects
(``$LONNYMQ_DSN``, ``$DATABASE_URL``, libpq's defaults and ``PG*`` variables), never a server it
starts; and ``lonnymq worker`` resolves like every other command."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from lonnymq import AsyncClient, Client
from lonnymq.worker import App, Worker
from lonnymq.worker.state import APPLICATION_NAME
from worker_helpers import eventually

_CONFIG = ("LONNYMQ_DSN", "DATABASE_URL", "LONNYMQ_CONNECT_TIMEOUT")
_PG_VARS = {
    "host": "PGHOST",
    "port": "PGPORT",
    "user": "PGUSER",
    "dbname": "PGDATABASE",
    "password": "PGPASSWORD",
}


def _unconfigured_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine where nothing is configured and no dev server runs."""
    env = {k: v for k, v in os.environ.items() if k not in _CONFIG and not k.startswith("PG")}
    env["LONNYMQ_DATA_DIR"] = str(tmp_path / "no-server" / "pgdata")
    return env


def _configure(how: str, dsn: str) -> dict[str, str]:
    if how == "PG*":
        return {_PG_VARS[k]: str(v) for k, v in conninfo_to_dict(dsn).items() if k in _PG_VARS}
    return {how: dsn}


@pytest.mark.parametrize("how", ["LONNYMQ_DSN", "DATABASE_URL", "PG*"])
def test_worker_without_conninfo_connects_where_client_does(
    how: str, dsn: str, schema: str, client: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in _unconfigured_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    for name in list(os.environ):
        if name in _CONFIG or name.startswith("PG"):
            monkeypatch.delenv(name)
    for name, value in _configure(how, dsn).items():
        monkeypatch.setenv(name, value)
    client.create_queue("jobs")
    client.send_batch("jobs", [1, 2, 3])
    app = App()
    seen: list[int] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        seen.append(job.payload)

    reference = AsyncClient()  # not opened: only its conninfo is read
    w = Worker(app, schema=schema)
    assert w.client.conninfo is not None and reference.conninfo is not None
    mine = conninfo_to_dict(w.client.conninfo)
    assert mine.pop("application_name") == APPLICATION_NAME
    assert mine == conninfo_to_dict(reference.conninfo)

    async def serve() -> None:
        await w.start()
        try:
            await eventually(lambda: len(seen) == 3)
        finally:
            await w.stop()

    asyncio.run(serve())
    assert sorted(seen) == [1, 2, 3]
    assert client.metrics("jobs").ready == 0
    assert not (tmp_path / "no-server").exists()  # no server was started or initialised


def _write_app(directory: Path, module: str, queue: str) -> None:
    # The handler records the payload, then asks its own process to shut down gracefully.
    (directory / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import os, signal
            from pathlib import Path
            from lonnymq.worker import App

            app = App()

            @app.handler({queue!r})
            async def work(job):
                Path({str(directory / "seen")!r}).write_text(str(job.payload))
                os.kill(os.getpid(), signal.SIGTERM)
            """
        )
    )


def test_worker_command_with_database_url_only(dsn: str, schema: str, client: Client, tmp_path: Path) -> None:
    client.create_queue("jobs")
    client.send("jobs", 42)
    _write_app(tmp_path, "dsn_app", "jobs")
    env = _unconfigured_env(tmp_path) | {"DATABASE_URL": dsn}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lonnymq",
            "worker",
            "dsn_app:app",
            "--schema",
            schema,
            "--poll-interval",
            "1",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "seen").read_text() == "42"
    assert "development server" not in proc.stderr
    assert client.metrics("jobs").ready == 0
    assert not (tmp_path / "no-server").exists()


def test_worker_command_with_nothing_configured_says_what_to_set(tmp_path: Path) -> None:
    _write_app(tmp_path, "unconfigured_app", "jobs")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "lonnymq", "worker", "unconfigured_app:app"],
        env=_unconfigured_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # It says so at once rather than waiting out the client's 30 s connection deadline (the bound
    # leaves room for a slow interpreter start on a loaded machine).
    assert time.monotonic() - t0 < 25
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "LONNYMQ_DSN" in lines[0] and "lonnymq server start" in lines[0], lines
    assert not (tmp_path / "no-server").exists()


def test_worker_with_nothing_configured_uses_libpq_defaults_not_a_dev_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Like Client(): libpq's defaults (the local socket, as psql), not the development server
    # and not "nothing configured" (that advice is the CLI's).
    for name in list(os.environ):
        if name in _CONFIG or name.startswith("PG"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LONNYMQ_DATA_DIR", str(tmp_path / "no-server" / "pgdata"))
    app = App()
    app.handler("jobs")(lambda job: None)
    w = Worker(app)
    assert w.client.conninfo is not None
    assert conninfo_to_dict(w.client.conninfo) == {"application_name": APPLICATION_NAME}
    assert AsyncClient().conninfo == ""
    assert not (tmp_path / "no-server").exists()
