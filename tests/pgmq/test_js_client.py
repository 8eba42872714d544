"""pgmq's JavaScript client, unchanged, against the facade (issue 13 item 4's second language):
``pgmq-js`` from npm (pinned in tests/pgmq/js/package.json), run by the machine's node on
tests/pgmq/js/client.cjs, which makes the calls a pgmq user's code makes (create, list, send,
send_batch, read, delete, archive, pop, metrics, metrics_all, purge) and prints each result.
Skipped when node or npm is absent, or when npm cannot install the client (no registry)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from lonnymq import Client

JS = Path(__file__).parent / "js"


@pytest.fixture(scope="module")
def js_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with client.cjs and pgmq-js installed by npm."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for pgmq's JavaScript client")
    where = tmp_path_factory.mktemp("pgmq-js")
    for name in ("package.json", "client.cjs"):
        shutil.copy(JS / name, where / name)
    try:
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=where,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"npm could not install pgmq-js: {getattr(e, 'stderr', '') or e}")
    return where


def test_official_javascript_client(js_client: Path, db_dsn: str, lq: Client) -> None:
    info = conninfo_to_dict(db_dsn)
    env = {
        **os.environ,
        "PGHOST": str(info.get("host", "localhost")),
        "PGPORT": str(info.get("port", "5432")),
        "PGDATABASE": str(info["dbname"]),
        "PGUSER": str(info.get("user", "postgres")),
        "PGPASSWORD": str(info.get("password", "")),
    }
    run = subprocess.run(
        ["node", "client.cjs", "jobs"], cwd=js_client, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    steps: dict[str, Any] = {}
    for line in run.stdout.splitlines():
        row = json.loads(line)
        steps[row["step"]] = row["result"]
    sent = steps["sent"]
    assert len(sent) == 5 and sent == sorted(sent)
    assert steps["list"] == ["jobs"]
    assert steps["read"] == {"msgId": sent[0], "readCount": 1, "message": {"n": 1}}
    assert (steps["delete"], steps["delete again"]) == (True, False)
    assert steps["read batch"] == sent[1:3]
    assert steps["archive"] is True
    assert steps["delete batch"] == [sent[2]]
    assert steps["pop"] == {"msgId": sent[3], "message": {"n": 4}}
    assert steps["read rest"] == [sent[4]]  # the last one, leased
    assert steps["metrics"] == {"queueName": "jobs", "queueLength": 1, "totalMessages": 5}
    assert steps["metrics all"] == ["jobs"]
    [late] = steps["archive batch"]
    assert late > sent[4]
    assert steps["after purge"] == 0
    # What it did, seen from LonnyMQ: the two archived messages are in the queue's archive as
    # cancelled (pgmq's archive), nothing is left, six were sent.
    archived = {(m.id, m.status) for m in lq.archived("jobs")}
    assert archived == {(sent[1], "cancelled"), (late, "cancelled")}
    metrics = lq.metrics("jobs")
    assert (metrics.ready, metrics.leased, metrics.scheduled, metrics.total_sent) == (0, 0, 0, 6)
