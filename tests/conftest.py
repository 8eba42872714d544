"""Test fixtures: one real PostgreSQL per run, one freshly migrated schema per test.

With ``LONNYMQ_TEST_DSN`` set, tests run against that server; otherwise a throwaway embedded
server (pgserver's PostgreSQL 16) is started for the run. Every test gets its own schema,
installed by the real migrations, and dropped afterwards, so tests cannot see each other.

Under pytest-xdist (``./run test`` runs ``-n``), each worker is its own pytest session: it starts
its own embedded server, or, on a given server, works in its own database (``<db>_<worker>``,
made for the run and dropped after it), so a snapshot one worker's test holds never holds back
another worker's vacuum. A Spark module's tests share one JVM: they run on one worker
(``xdist_group``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lonnymq import Client
from schema_pool import SchemaPool

#: Spark's own failure when a Python worker it started did not connect back within 10 s.
SPARK_WORKER_TIMEOUT = r"Python worker failed to connect back|waiting for the Python worker to connect back"

#: The pytest-xdist worker running this process ("gw0", "gw1", ...), None without xdist.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")

#: The SQL's own tests: the ones ./run test runs on both PostgreSQL versions (marked `both`).
SQL_TESTS = Path(__file__).parent / "sql"


def pytest_configure(config: pytest.Config) -> None:
    # Spark and worker subprocesses must run this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# tryfirst: xdist's own hook reads the groups to pin the tests to processes, and -m selects by the
# markers added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A Spark module's tests share its JVMs (the session, or the standalone cluster): under
    # xdist (--dist loadgroup) each such module runs on one worker, not a JVM on every worker
    # (a test that names its own group runs with that group: a long module split over two).
    for item in items:
        if item.path.is_relative_to(SQL_TESTS):
            item.add_marker(pytest.mark.both)
        if item.get_closest_marker("spark") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        if item.get_closest_marker("spark"):
            # Spark gives a Python worker it starts a fixed 10 s to connect back (not a setting:
            # PythonWorkerFactory), which a loaded 2-core machine can miss before any of our
            # code runs. Only that failure is run again (pytest-rerunfailures), at most three times.
            item.add_marker(pytest.mark.flaky(reruns=3, only_rerun=[SPARK_WORKER_TIMEOUT]))


#: How much more CPU a process running Spark's tests asks for (a nice value below the others'):
#: Spark gives a Python worker it starts 10 s to connect back, a fixed timeout, and the worker
#: spends about a second of CPU importing PySpark first; with the two passes' seven processes,
#: their servers and the JVMs sharing 2 cores, a slower machine than usual missed it (a streaming
#: query failed on its fourth try). The JVMs and every Python worker they start inherit it.
SPARK_NICE = -5
_spark_niced = False


# tryfirst: before the test's fixtures start the JVMs.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _spark_niced
    if not _spark_niced and item.get_closest_marker("spark"):
        _spark_niced = True
        # Not root (nor CAP_SYS_NICE): the timeout stays the risk it was.
        with contextlib.suppress(PermissionError):
            os.nice(SPARK_NICE)


#: The longest xdist groups, longest first (minutes each in CI; the rest take seconds). ./run test
#: hands work out in collection order (--no-loadscope-reorder) and gives a worker its next unit
#: only when it is nearly done, so these start at once on separate workers, the many short tests
#: fill the others, and the run is not left waiting for a long group that started last.
LONG_GROUPS = ("test_cluster", "shard", "test_spark", "test_spark_streaming", "web")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup, except that a process still running a long group gets the unit at the
    queue's end (a module of short tests): xdist queues a unit on a process a test before that
    process runs out, so whatever it hands such a process waits there until the long group ends
    (the Spark pipeline once waited 3 minutes behind the cluster's last test while the other
    processes ran short tests)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LongGroupsApart(LoadGroupScheduling):
        def _assign_work_unit(self, node: Any) -> None:
            busy = {
                scope for scope, unit in self.assigned_work.get(node, {}).items() if not all(unit.values())
            }
            if busy & set(LONG_GROUPS) and len(self.workqueue) > 1:
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

    return LongGroupsApart(config, log)


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name"))


# trylast: after every conftest (tests/shard's too) has named the groups.
@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_long_groups_first(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_GROUPS)}
    slow = len(LONG_GROUPS)  # then the other tests marked slow, then the rest, in their order
    items.sort(
        key=lambda item: rank.get(_group(item) or "", slow if item.get_closest_marker("slow") else slow + 1)
    )


#: ./run test's timeline (docs/testing.md): with LONNYMQ_TEST_TIMELINE set to a file, each test
#: appends one JSON line there (the pass, the process, the test, its group, its start and end),
#: to read which tests each process ran when and what a pass's end waited for
#: (tools/cputime.py --timeline).
_TIMELINE = os.environ.get("LONNYMQ_TEST_TIMELINE")


if _TIMELINE:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        start = time.time()
        yield
        line = {
            "pass": "pg15" if os.environ.get("LONNYMQ_SQL_COVERAGE") else "pg16",
            "worker": WORKER,
            "test": item.nodeid,
            "group": _group(item),
            "start": round(start, 3),
            "end": round(time.time(), 3),
        }
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps(line) + "\n")


@pytest.fixture(scope="session")
def server() -> Iterator[object | None]:
    """The embedded server of this run (None when LONNYMQ_TEST_DSN points elsewhere)."""
    if os.environ.get("LONNYMQ_TEST_DSN"):
        yield None
        return
    from lonnymq.embedded import temporary_server

    with temporary_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def dsn(server: object | None) -> Iterator[str]:
    # The embedded server object is typed loosely here so a DSN-only run never imports it.
    dsn = os.environ["LONNYMQ_TEST_DSN"] if server is None else server.dsn  # type: ignore[attr-defined]
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:  # fail fast, with the reason
        pytest.exit(f"cannot reach the test PostgreSQL at {dsn!r}: {e}", returncode=3)
    if server is not None or WORKER is None:
        yield dsn
        return
    # A shared server under xdist: this worker's own database, named after this run too (two
    # runs on one server, e.g. two engineers', must not drop each other's databases).
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:8]
    name = f"{conninfo_to_dict(dsn).get('dbname') or 'postgres'}_{WORKER}_{run}"
    db = sql.Identifier(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(db))
    mine = make_conninfo(dsn, dbname=name)
    if os.environ.get("LONNYMQ_SQL_COVERAGE"):  # the profiler's functions, in this database too
        with psycopg.connect(mine, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    yield mine
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))


@pytest.fixture(scope="session")
def schema_pool(dsn: str) -> Iterator[SchemaPool]:
    """This test process's migrated schemas, reset between tests (tests/schema_pool.py)."""
    pool = SchemaPool(dsn)
    yield pool
    pool.close()


@pytest.fixture
def schema(dsn: str, schema_pool: SchemaPool) -> Iterator[str]:
    """A schema with lonnymq installed by its migrations, in exactly the state ``migrate()``
    leaves (a used one is reset or dropped afterwards: tests/schema_pool.py)."""
    name = schema_pool.acquire(f"t_{uuid.uuid4().hex[:12]}")
    yield name
    if os.environ.get("LONNYMQ_SQL_COVERAGE"):  # tools/sqlcheck.py coverage: read profiles before DROP
        from sql_coverage import record_schema

        record_schema(dsn, name, os.environ["LONNYMQ_SQL_COVERAGE"], schema_pool.connection())
    schema_pool.release(name)


@pytest.fixture
def client(dsn: str, schema: str) -> Iterator[Client]:
    with Client(dsn, schema=schema) as c:
        yield c


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection for direct SQL."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
