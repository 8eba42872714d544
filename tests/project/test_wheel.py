"""The package as users get it: the wheel, installed without extras into a clean virtualenv,
imports, runs its CLI and does a send/take/ack round trip against the test database (CI runs
this through pytest). The extras' heavy packages stay out of the base install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]

SMOKE = """
import json, sys
import lonnymq, lonnymq.worker
from lonnymq import Client
from datetime import datetime, timezone

dsn, schema = sys.argv[1], sys.argv[2]
with Client(dsn, schema=schema) as c:
    c.migrate()
    c.create_queue("smoke")
    c.send("smoke", {"hello": "wheel", "at": datetime(2024, 1, 1, tzinfo=timezone.utc)})
    [m] = c.take("smoke", 1)
    acked = c.ack([m])
    left = c.metrics("smoke")
print(json.dumps({
    "file": lonnymq.__file__,
    "payload": m.payload,
    "acked": sorted(acked),
    "id": m.id,
    "left": left.ready + left.leased + left.scheduled,
    "schedule": lonnymq.worker.parse_schedule("30 2 * * *", "Europe/Paris").text,
}))
"""

pytestmark = pytest.mark.once


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv_and_works(dsn: str, tmp_path: Path) -> None:
    # Build from a copy of what a clone holds, so nothing stray in the work tree gets in.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, source, cwd=tmp_path)
    (wheel,) = dist.glob("lonnymq-*.whl")

    # A venv without pip of its own (ensurepip cost 6 s of CPU): this pip installs into it
    # (--python), resolving the wheel's dependencies for that interpreter as its own pip would.
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", py)
    _run(*pip, "install", "-q", wheel, cwd=tmp_path)
    installed = {
        p["name"].lower().replace("_", "-")
        for p in json.loads(_run(*pip, "list", "--format", "json", cwd=tmp_path))
    }
    assert {"psycopg", "psycopg-binary", "psycopg-pool", "prometheus-client", "cronsim"} <= installed
    assert not installed & {"pgserver", "pyspark", "matplotlib", "opentelemetry-api", "orjson"}

    usage = _run(venv / "bin" / "lonnymq", "--help", cwd=tmp_path)
    assert "worker" in usage and "migrate" in usage

    schema = f"wheel_{uuid.uuid4().hex[:10]}"
    try:
        out = json.loads(_run(py, "-c", SMOKE, dsn, schema, cwd=tmp_path))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    assert out["file"].startswith(str(venv))  # the installed package, not the work tree
    assert out["payload"] == {"hello": "wheel", "at": "2024-01-01T00:00:00+00:00"}
    assert out["acked"] == [out["id"]] and out["left"] == 0
    assert out["schedule"] == "CRON_TZ=Europe/Paris 30 2 * * *"
