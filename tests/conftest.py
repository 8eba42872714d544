"""Test fixtures: one real PostgreSQL per run, one freshly migrated schema per test.

With ``LONNYMQ_TEST_DSN`` set, tests run against that server; otherwise a throwaway embedded
server (pgserver's PostgreSQL 16) is started for the run. Every test gets its own schema,
installed by the real migrations, and dropped afterwards, so tests cannot see each other.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client


def pytest_configure(config: pytest.Config) -> None:
    # Spark and worker subprocesses must run this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


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
def dsn(server: object | None) -> str:
    # The embedded server object is typed loosely here so a DSN-only run never imports it.
    dsn = os.environ["LONNYMQ_TEST_DSN"] if server is None else server.dsn  # type: ignore[attr-defined]
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as e:  # fail fast, with the reason
        pytest.exit(f"cannot reach the test PostgreSQL at {dsn!r}: {e}", returncode=3)
    return dsn


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A fresh schema with lonnymq installed by its migrations; dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with Client(dsn, schema=name, pool_size=1) as c:
        c.migrate()
    yield name
    if os.environ.get("LONNYMQ_SQL_COVERAGE"):  # tools/sqlcheck.py coverage: read profiles before DROP
        from sql_coverage import record_schema

        record_schema(dsn, name, os.environ["LONNYMQ_SQL_COVERAGE"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def client(dsn: str, schema: str) -> Iterator[Client]:
    with Client(dsn, schema=schema) as c:
        yield c


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection for direct SQL."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
