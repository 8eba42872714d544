"""./run test's two passes between them run every test: the PostgreSQL 15 pass takes
``-m "not once"``, the PostgreSQL 16 pass ``-m "once or both"``, where
``both`` is the marker tests/conftest.py gives tests/sql. Checked on the selections pytest
itself makes (collection only; no server), with the expressions read from ``run``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: SQL tests (run on both versions), a client module of slow tests, one of quick tests, and one
#: of tests that bring their own servers (marked once).
MODULES = ("tests/sql/test_errors.py", "tests/client/test_fuzz.py", "tests/client/test_send.py",
           "tests/faults/test_restart_run.py")  # fmt: skip


#: Collects MODULES once for each -m expression given as an argument, each by pytest.main in one
#: process, and prints the node ids of each selection as one JSON list: pytest and the libraries
#: are imported once (a process per expression cost three times the CPU); the test modules and
#: conftests are imported afresh for each collection, as a process of their own would.
COLLECT = """
import json, sys
from pathlib import Path
import pytest

class Selected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

tests = Path("tests").resolve()
out = []
for marks in sys.argv[1:]:
    sel = Selected()
    rc = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", "-m", marks, *MODULES], plugins=[sel])
    assert rc == 0, (marks, rc)
    out.append(sel.ids)
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").resolve().is_relative_to(tests):
            del sys.modules[name]
print("SELECTIONS " + json.dumps(out))
"""


def collected(*marks: str) -> list[set[str]]:
    """The tests of MODULES that pytest selects with each of ``marks``."""
    done = subprocess.run(
        [sys.executable, "-c", f"MODULES = {MODULES!r}\n{COLLECT}", *marks],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SELECTIONS ")]
    selections = [set(ids) for ids in json.loads(line.removeprefix("SELECTIONS "))]
    assert len(selections) == len(marks)
    return selections


def test_the_passes_cover_every_test_and_run_the_sql_tests_twice() -> None:
    # In ./run: the PostgreSQL 15 pass (tools/sqlcheck.py coverage) first, then the first pass.
    marks = re.findall(r'-m "([^"]+)"', (ROOT / "run").read_text())
    assert len(marks) == 2, marks
    pg15, pg16, every = collected(marks[0], marks[1], "")
    assert pg15 | pg16 == every
    both = pg15 & pg16
    assert both and all(t.startswith("tests/sql/") for t in both)
    # every SQL test that the PostgreSQL 15 pass runs, the PostgreSQL 16 pass runs again
    assert {t for t in pg15 if t.startswith("tests/sql/")} == both
    # the client tests, slow and quick, run on PostgreSQL 15 only; those marked once on 16 only
    assert any(re.match(r"tests/client/test_fuzz\.py::", t) for t in pg15 - pg16)
    assert any(t.startswith("tests/client/test_send.py::") for t in pg15 - pg16)
    assert any(t.startswith("tests/faults/test_restart_run.py::") for t in pg16 - pg15)
