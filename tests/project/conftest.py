"""Fixtures of the benchmark floors' tests (test_api_floor.py, test_drain_floor.py)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# The benchmark scripts run with benchmarks/ as their first sys.path entry; the tests import the same way.
sys.path.insert(0, str(BENCHMARKS))

from lonnymq_bench.systems.api_floor import ddl  # noqa: E402 - needs the path above


@pytest.fixture
def floor(dsn: str, schema: str) -> Iterator[tuple[psycopg.Connection[tuple[object, ...]], sql.Identifier]]:
    """An autocommit connection and the floor functions over ``schema``'s tables, in a schema
    of their own (dropped after)."""
    text = f"floor_{uuid.uuid4().hex[:12]}"
    name = sql.Identifier(text)
    with psycopg.connect(dsn, autocommit=True) as c:
        for stmt in ddl(schema, text):
            c.execute(stmt)
        try:
            yield c, name
        finally:
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(name))
