"""The benchmark suite (benchmarks/, not part of the package) works end to end:
``python benchmarks/bench.py --quick`` against the test server, every system and workload, then the results file is checked for completeness and for
the harness's own accounting (messages counted by the workers + messages left = backlog).
No timing is asserted: numbers from a shared test machine mean nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# The scripts run with benchmarks/ as their first sys.path entry; the test imports the same way.
sys.path.insert(0, str(BENCHMARKS))

from lonnymq_bench.systems import PRODUCERS_ONLY, REGISTRY  # noqa: E402 - needs the path above

pytestmark = [pytest.mark.once, pytest.mark.slow]


@pytest.mark.parametrize(
    "script",
    [
        "bench.py",
        "micro.py",
        "channels_bench.py",
        "worker_throughput.py",
        "spark_enqueue.py",
        "spark_jdbc.py",
        "spark_write_commit.py",
        "spark_route.py",
        "held_snapshot.py",
        "producers.py",
        "pgmq_facade.py",
        "consume_cpu.py",
    ],
)
def test_scripts_start(script: str) -> None:
    # Each script imports what it needs from lonnymq and lonnymq_bench, then parses its options.
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--dsn" in proc.stdout
    if script == "bench.py":
        assert "--quick" in proc.stdout and "--churn-minutes" in proc.stdout


def test_quick_run_covers_every_system_and_workload(dsn: str, tmp_path: Path) -> None:
    pytest.importorskip("pgmq")
    pytest.importorskip("pgqueuer")
    pytest.importorskip("asyncpg")
    prefix = f"smoke_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench.py"),
            "--quick",
            "--dsn",
            dsn,
            "--out",
            str(tmp_path),
            "--db-prefix",
            prefix,
            "--procs",
            "2",
            "--churn-minutes",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Targets" in proc.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    systems = set(REGISTRY)

    assert doc["meta"]["server"]["synchronous_commit"]
    assert set(doc["meta"]["versions"]) == systems
    by = {(r["workload"], r["kind"], r["system"]) for r in doc["throughput"]}
    for kind in ("one", "batch"):
        assert {s for w, k, s in by if (w, k) == ("send", kind)} == {"lonnymq", "pgmq", "pgqueuer", "seed"}
    assert {s for w, k, s in by if (w, k) == ("drain", "one")} == systems
    assert {s for w, k, s in by if (w, k) == ("drain", "batch")} == {
        "lonnymq",
        "pgmq",
        "pgqueuer",
        "floor",
        "leasefloor",
    }
    for r in doc["throughput"]:
        assert r["n"] > 0 and r["rate"] > 0, r
        if r["workload"] == "drain":
            # The workers' counts and the rows left add up to the backlog: nothing was lost or
            # counted twice, for every system.
            assert r["accounted"], r

    pickups = {(r["system"], r["variant"]): r for r in doc["latency"]}
    assert {s for s, _ in pickups} == {"lonnymq", "pgmq", "pgqueuer", "seed"}
    for r in pickups.values():
        assert r["received"] == r["sent"] > 0, r

    flat = {r["system"]: r for r in doc["flat"]}
    assert set(flat) == {"lonnymq", "pgmq"}
    for r in flat.values():
        assert r["empty_rows"] == 0
        assert r["loaded_rows"] == r["future"] + r["leased"]

    churn = {r["system"]: r for r in doc["churn"]}
    assert set(churn) == {"lonnymq", "pgmq", "pgqueuer", "floor"}
    for r in churn.values():
        assert r["timeline"] and any("dead_tuples" in p for p in r["timeline"])
        assert sum(p["consumed_per_s"] for p in r["timeline"]) > 0

    names = " ".join(t["target"] for t in doc["targets"])
    for part in (
        "/ floor",
        "/ lease floor",
        "/ PgQueuer",
        "/ bare seed",
        "/ pgmq send_batch",
        "pickup latency p99",
    ):
        assert part in names
    assert all(t["value"] is not None for t in doc["targets"])
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "chart.png").stat().st_size > 10_000


def test_held_snapshot_quick(dsn: str, tmp_path: Path) -> None:
    # benchmarks/held_snapshot.py --quick: every system reports its intervals, the snapshot
    # held back vacuum (dead tuples appear), and what was consumed was sent.
    pytest.importorskip("pgmq")
    pytest.importorskip("pgqueuer")
    out = tmp_path / "held.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "held_snapshot.py"),
            "--quick",
            "--minutes",
            "0.1",
            "--interval",
            "3",
            "--dsn",
            dsn,
            "--db-prefix",
            f"held_{uuid.uuid4().hex[:8]}",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {r["system"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"lonnymq", "pgmq", "pgqueuer"}
    for r in runs.values():
        rows = r["timeline"]
        assert len(rows) == 2 and all("bytes" in row for row in rows), r
        # Rates are rounded per interval: what was taken can exceed what was sent by that rounding.
        sent = sum(row["sent_per_s"] for row in rows)
        assert 0 < sum(row["consumed_per_s"] for row in rows) <= sent + 1
    assert runs["lonnymq"]["timeline"][-1]["dead_tuples"] > 0


def test_producers_quick(dsn: str, tmp_path: Path) -> None:
    # benchmarks/producers.py --quick: every system has a rate for each workload it takes part
    # in, at each producer count, the drains account for their backlog, every idle consumer got
    # every message, and every ratio of the targets table has a value (the API floors' too).
    pytest.importorskip("pgmq")
    pytest.importorskip("pgqueuer")
    pytest.importorskip("asyncpg")
    out = tmp_path / "producers.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "producers.py"),
            "--quick",
            "--dsn",
            dsn,
            "--db-prefix",
            # Named after the test's database (the run's own, see conftest.py's dsn), so that the
            # scratch databases say whose they are.
            re.sub(r"[^a-z0-9_]", "_", (conninfo_to_dict(dsn).get("dbname") or "prod").lower())[:24]
            + f"_{uuid.uuid4().hex[:8]}",
            "--backlog-batch",
            "3000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "reproduce: python benchmarks/producers.py --quick" in proc.stdout
    doc = json.loads(out.read_text())
    assert set(doc["meta"]["versions"]) == set(REGISTRY) | set(PRODUCERS_ONLY)
    assert doc["meta"]["config"]["producers"] == [1, 2]
    assert doc["meta"]["config"]["backlog_batch"] == 3000  # --backlog-batch over --quick's 2,000
    got: dict[tuple[str, str, int], set[str]] = {}
    for r in doc["throughput"]:
        assert r["n"] > 0 and r["rate"] > 0, r
        assert r.get("accounted", True), r
        got.setdefault((r["workload"], r["kind"], r["procs"]), set()).add(r["system"])
    sends = {"lonnymq", "pgmq", "pgqueuer", "seed"}
    lease_floors = {"leasefloor", "leasememfloor", "leasestorefloor", "apileasefloor", "guaranteefloor"}
    assert got == {
        ("send", "one", 1): sends | {"floor", "sendfloor", "apisendfloor"},
        ("send", "one", 2): sends | {"floor", "sendfloor", "apisendfloor"},
        ("send", "batch", 2): sends,
        ("pop", "one", 2): {"lonnymq", "pgmq", "seed", "popfloor", "apipopfloor", "apipopfloor2", "floor"},
        ("drain", "one", 2): {"lonnymq", "pgmq", "pgqueuer"} | lease_floors,
        ("drain", "batch", 2): {"lonnymq", "pgmq", "pgqueuer", "floor"} | lease_floors,
    }
    pickups = {r["system"]: r for r in doc["latency"]}
    assert set(pickups) == {"lonnymq", "pgmq", "pgqueuer", "seed"}
    for r in pickups.values():
        assert r["received"] == r["sent"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0, r
    names = [t["target"] for t in doc["targets"]]
    for part in (
        "send, 1 producer (serial) / pgmq",
        "send, 2 producers / bare seed INSERT",
        "send, 2 producers / commit floor",
        "send, 1 producer (serial) / send floor",
        "send, 2 producers / API send floor",
        "send_batch(1000) / pgmq send_batch",
        "pop / seed's delete-on-dequeue",
        "pop / pop floor",
        "pop / API pop floor (P=",
        "pop / API pop floor, 2 generations",
        "drain at batch 1 / lease floor",
        "drain at batch 100 / lease floor",
        "drain at batch 1 / lease floor + ack's memory",
        "drain at batch 100 / lease floor + ack's memory",
        "drain at batch 1 / lease floor on LonnyMQ's tables",
        "drain at batch 100 / lease floor on LonnyMQ's tables",
        "drain at batch 1 / API lease floor",
        "drain at batch 100 / API lease floor",
        "idle pickup p99 (ms)",
    ):
        assert any(n.startswith(part) for n in names), (part, names)
    assert all(t["value"] is not None and t["value"] > 0 for t in doc["targets"]), doc["targets"]


def test_pgmq_facade_quick(dsn: str, tmp_path: Path) -> None:
    # benchmarks/pgmq_facade.py --quick: each operation ran through the facade, the native
    # functions and pgmq itself, and both ratios are there.
    pytest.importorskip("pgmq")
    out = tmp_path / "facade.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "pgmq_facade.py"),
            "--quick",
            "--dsn",
            dsn,
            "--db-prefix",
            f"facade_{uuid.uuid4().hex[:8]}",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["op"]: r for r in json.loads(out.read_text())["summary"]}
    assert set(rows) == {"send", "read+delete", "pop", "batch send"}
    for r in rows.values():
        assert all(r[side] > 0 for side in ("facade", "native", "pgmq")), r
        assert r["facade/native"] > 0 and r["facade/pgmq"] > 0, r
