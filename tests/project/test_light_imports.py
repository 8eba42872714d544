"""The package holds the product only: importing it never pulls in the benchmarks' peers
(pgqueuer, pgmq, asyncpg) or the example's charting (matplotlib), and the benchmark and demo
pipeline commands are not part of its CLI (they run from benchmarks/ and examples/)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["matplotlib", "pgqueuer", "pgmq", "asyncpg"]


def test_importing_the_package_stays_light() -> None:
    code = (
        "import json, sys\n"
        "import lonnymq, lonnymq.spark, lonnymq.cli, lonnymq.worker, lonnymq.embedded\n"
        "lonnymq.cli.build_parser()  # every subcommand module too\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert "lonnymq.cli.worker" in loaded  # the check above really imported the commands
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == []


def test_benchmarks_and_pipeline_are_not_in_the_package() -> None:
    code = (
        "import importlib.util\n"
        "print([n for n in ('lonnymq.bench', 'lonnymq.spark.pipeline', 'lonnymq.spark.report',"
        " 'lonnymq.cli.bench', 'lonnymq.cli.pipeline') if importlib.util.find_spec(n)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    usage = subprocess.run(
        [sys.executable, "-m", "lonnymq", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "worker" in usage and "bench" not in usage and "pipeline" not in usage
