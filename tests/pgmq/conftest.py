"""Fixtures of the pgmq facade's tests: a database of its own per test (the facade is one
``pgmq`` schema per database) with LonnyMQ and the facade installed, and clients on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from lonnymq import Client


def pgmq_kwargs(dsn: str) -> dict[str, Any]:
    """The connection arguments of pgmq's Python client for ``dsn``."""
    info = conninfo_to_dict(dsn)
    return {
        "host": str(info.get("host", "localhost")),
        "port": str(info.get("port", "5432")),
        "database": str(info["dbname"]),
        "username": str(info.get("user", "postgres")),
        "password": str(info.get("password", "")),
    }


@pytest.fixture
def db_dsn(dsn: str) -> Iterator[str]:
    """A fresh database with LonnyMQ (schema lonnymq) and the pgmq facade installed."""
    name = f"pgmq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(dsn, dbname=name)
    try:
        with Client(url, pool_size=1) as client:
            client.migrate(pgmq=True)
        yield url
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg(db_dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture
def lq(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, pool_size=1) as c:
        yield c


@pytest.fixture
def pgmq_client(db_dsn: str) -> Iterator[Any]:
    pgmq_queue = pytest.importorskip("pgmq").PGMQueue
    q = pgmq_queue(**pgmq_kwargs(db_dsn), pool_size=2, init_extension=False)
    yield q
    q.close()


@pytest.fixture
def pgmq_args(db_dsn: str) -> dict[str, Any]:
    """The connection arguments of pgmq's Python clients (sync and async) for the test's database."""
    return pgmq_kwargs(db_dsn)
