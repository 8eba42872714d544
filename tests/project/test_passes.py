"""./run test's two passes between them run every test: the PostgreSQL 15 pass takes
``-m "not once"``, the PostgreSQL 16 pass ``-m "once or both"``, where
``both`` is the marker tests/conftest.py gives tests/sql. Checked on the selections pytest
itself makes (collection only; no server), with the expressions read from ``run``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: SQL tests (run on both versions), a client module of slow tests, one of quick tests, and one
#: of tests that bring their own servers (marked once).
MODULES = ("tests/sql/test_errors.py", "tests/client/test_fuzz.py", "tests/client/test_send.py",
           "tests/faults/test_restart_run.py")  # fmt: skip


def collected(marks: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marks, *MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_passes_cover_every_test_and_run_the_sql_tests_twice() -> None:
    # In ./run: the PostgreSQL 15 pass (tools/sqlcheck.py coverage) first, then the first pass.
    marks = re.findall(r'-m "([^"]+)"', (ROOT / "run").read_text())
    assert len(marks) == 2, marks
    pg15 = collected(marks[0])
    pg16 = collected(marks[1])
    every = collected("")
    assert pg15 | pg16 == every
    both = pg15 & pg16
    assert both and all(t.startswith("tests/sql/") for t in both)
    # every SQL test that the PostgreSQL 15 pass runs, the PostgreSQL 16 pass runs again
    assert {t for t in pg15 if t.startswith("tests/sql/")} == both
    # the client tests, slow and quick, run on PostgreSQL 15 only; those marked once on 16 only
    assert any(re.match(r"tests/client/test_fuzz\.py::", t) for t in pg15 - pg16)
    assert any(t.startswith("tests/client/test_send.py::") for t in pg15 - pg16)
    assert any(t.startswith("tests/faults/test_restart_run.py::") for t in pg16 - pg15)
