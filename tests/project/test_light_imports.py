"""The package holds the product only: importing it never pulls in the benchmarks' peers
(pgqueuer, pgmq, asyncpg) or the example's charting (matplotlib), and the benchmark and demo
pipeline commands are not part of its CLI (they run from benchmarks/ and examples/)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["matplotlib", "pgqueuer", "pgmq", "asyncpg"]


def loaded_by(imports: str) -> list[str]:
    """The modules a fresh interpreter holds after ``import <imports>`` and building the CLI's
    parser (every command module's options)."""
    code = (
        "import json, sys\n"
        f"import {imports}\n"
        "lonnymq.cli.build_parser()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def test_importing_the_package_stays_light() -> None:
    loaded = loaded_by("lonnymq, lonnymq.spark, lonnymq.cli, lonnymq.worker, lonnymq.embedded")
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


def test_a_command_loads_only_what_it_runs() -> None:
    """Every ``lonnymq`` call builds the whole parser (each command module's options): the demo's
    rich console and the shard router's setup are imported by their commands when they run,
    not by every other command's start-up (docs/testing.md: the test suite starts hundreds)."""
    loaded = loaded_by("lonnymq.cli")
    assert "lonnymq.cli.demo" in loaded and "lonnymq.cli.shard" in loaded
    assert [m for m in loaded if m.split(".")[0] == "rich" or m.startswith("lonnymq.shard")] == []
