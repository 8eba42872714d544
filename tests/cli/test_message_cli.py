"""``lonnymq msg get|cancel`` and ``lonnymq archive list``: the real command line in a
subprocess against this test's schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lonnymq import Client


def run(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LONNYMQ_DSN", "DATABASE_URL")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "lonnymq", *args, "--dsn", dsn, "--schema", schema],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok_json(proc: subprocess.CompletedProcess[str]) -> object:
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def failure(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def q(client: Client) -> Client:
    client.create_queue("q", archive=True)
    return client


def test_msg_get_by_id_and_key(dsn: str, schema: str, q: Client) -> None:
    sent = q.send("q", {"n": 1}, key="k", delay=3600)
    [by_id] = ok_json(run(dsn, schema, "msg", "get", "q", "--id", str(sent.id), "--json"))  # type: ignore[misc]
    [by_key] = ok_json(run(dsn, schema, "msg", "get", "q", "--key", "k", "--json"))  # type: ignore[misc]
    assert by_id == by_key
    assert (by_id["id"], by_id["status"], by_id["payload"], by_id["key"]) == (
        sent.id,
        "scheduled",
        {"n": 1},
        "k",
    )
    table = run(dsn, schema, "msg", "get", "q", "--key", "k")
    assert table.returncode == 0 and "scheduled" in table.stdout
    line = failure(run(dsn, schema, "msg", "get", "q", "--key", "gone"))
    assert "no live message with key 'gone'" in line
    assert "'nope'" in failure(run(dsn, schema, "msg", "get", "nope", "--id", "1"))
    usage = run(dsn, schema, "msg", "get", "q")
    assert usage.returncode == 2 and "one of the arguments --id --key is required" in usage.stderr


def test_msg_cancel_and_archive_list(dsn: str, schema: str, q: Client) -> None:
    a, b, _ = (q.send("q", x, key=x) for x in "abc")
    [m] = q.take("q")  # a is leased: cancelling it fences its holder
    out = ok_json(
        run(dsn, schema, "msg", "cancel", "q", "--id", str(a.id), "--id", str(b.id), "--archive", "--json")
    )
    assert out == {"queue": "q", "cancelled": [a.id, b.id]}
    assert ok_json(run(dsn, schema, "msg", "cancel", "q", "--key", "c", "--json")) == {
        "queue": "q",
        "cancelled": ["c"],
    }
    again = run(dsn, schema, "msg", "cancel", "q", "--key", "c")
    assert again.returncode == 1 and "none was live" in again.stdout
    assert q.ack([m]) == set()

    rows = ok_json(run(dsn, schema, "archive", "list", "q", "--json"))
    assert [(r["id"], r["status"], r["payload"]) for r in rows] == [
        (a.id, "cancelled", "a"),
        (b.id, "cancelled", "b"),
    ]  # type: ignore[union-attr]
    page = ok_json(
        run(dsn, schema, "archive", "list", "q", "--limit", "1", "--after-id", str(a.id), "--json")
    )
    assert [r["id"] for r in page] == [b.id]  # type: ignore[union-attr]
    assert ok_json(
        run(dsn, schema, "archive", "list", "q", "--since", "1h", "--status", "cancelled", "--json")
    )
    assert ok_json(run(dsn, schema, "archive", "list", "q", "--until", "2000-01-01T00:00:00", "--json")) == []
    assert (
        ok_json(run(dsn, schema, "archive", "list", "q", "--since", "0", "--status", "dead", "--json")) == []
    )
    table = run(dsn, schema, "archive", "list", "q")
    assert table.returncode == 0 and "cancelled" in table.stdout
    assert "--since 'yesterday'" in failure(
        run(dsn, schema, "archive", "list", "q", "--since", "yesterday"), 2
    )
    assert "--limit" in failure(run(dsn, schema, "archive", "list", "q", "--limit", "0"), 2)
    assert "nope" in failure(run(dsn, schema, "archive", "list", "nope"))
