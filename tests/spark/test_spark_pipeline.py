"""The reference pipeline (examples/spark_pipeline/, not part of the package) end to end on a
small dataset: events -> Spark bulk enqueue -> worker processes with injected failures -> Spark
report from the archive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_fixtures import spark_session  # noqa: F401 - provides the `spark` fixture

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline"
# run.py runs with its own directory first on sys.path; the test imports the modules the same way.
sys.path.insert(0, str(EXAMPLE))

pytestmark = [
    pytest.mark.once,
    pytest.mark.spark,
    pytest.mark.slow,
    # On test_spark.py's process and SparkSession: a JVM of its own cost 13-18 s of CPU to start
    # (docs/testing.md), and test_spark's group was still shorter than test_spark_streaming's.
    pytest.mark.xdist_group("test_spark"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def test_pipeline_report_matches_what_happened(spark: Any, dsn: str, tmp_path: Path) -> None:
    from pipeline import fate, run

    n = 2000  # the first 2,000 ids include 64 transient failures and 1 poison message
    schema = "t_pipeline_test"
    summary = run(dsn, schema, tmp_path, events=n, workers=1, concurrency=50, spark=spark, say=lambda _: None)
    # The workers' fate of each event is deterministic: the report must count exactly it.
    fates = [fate(f"evt-{i:010d}") for i in range(n)]
    assert summary["messages"] == n
    assert summary["dead"] == fates.count("poison")
    assert summary["retried"] == fates.count("transient")
    assert summary["acked"] == n - fates.count("poison")
    assert summary["dead_letter_rate"] == pytest.approx(fates.count("poison") / n, abs=1e-5)

    rep = tmp_path / "report"
    for name in (
        "throughput",
        "latency_by_priority",
        "latency_by_channel",
        "latency_by_channel_standard",
        "latency_distribution",
        "outcomes_by_kind",
        "outcomes_by_channel",
        "overall",
    ):
        assert pq.read_table(rep / f"{name}.parquet").num_rows > 0, name
    for png in (
        "throughput.png",
        "pickup_distribution.png",
        "latency_priority.png",
        "latency_channel.png",
        "outcomes.png",
    ):
        assert (rep / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (rep / "index.html").read_text()
    assert "Pickup latency by priority" in page
    # The page states the run's parameters and defines its metrics (pickup wait apart from handler time).
    assert "Run parameters" in page and "handlers at once per worker" in page
    assert "includes the backlog wait" in page and "handler time (handler_*_ms)" in page
    saved = json.loads((rep / "summary.json").read_text())
    assert saved["events"] == n and saved["parameters"]["worker processes"] == 1
    assert 0 <= summary["handler_p50_ms"] <= summary["handler_p99_ms"]
    # Priority is a head start in time: bulk (-10 x 1 s) waits at least 10 s, express overtakes.
    tiers = {r["tier"]: r for r in pq.read_table(rep / "latency_by_priority.parquet").to_pylist()}
    assert tiers["bulk"]["p50_ms"] >= 10_000 > tiers["express"]["p99_ms"]
    dist = pq.read_table(rep / "latency_distribution.parquet").to_pylist()
    assert len(dist) == 101 and dist[-1]["pickup_ms"] == pytest.approx(summary["pickup_max_ms"], rel=0.01)
    by_priority = pq.read_table(rep / "latency_by_priority.parquet").to_pylist()
    assert {r["tier"] for r in by_priority} == {"express", "standard", "bulk"}
    assert sum(r["messages"] for r in by_priority) == n

    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_run_script_checks_its_options() -> None:
    # The script ./run demo calls: its imports resolve and its options parse, without Spark.
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "run.py"), "--events", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "--events, --workers and --concurrency must be positive" in proc.stderr
