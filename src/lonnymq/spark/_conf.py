"""Option parsing and database access shared by the Spark reader and writers.

Spark hands options over as a case-insensitive mapping of strings; everything here turns them
into small, picklable values once, on the driver, so executors never re-parse or re-resolve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from .. import errors
from ..client.ops import check_queue, map_error
from ..migrations import DEFAULT_SCHEMA, check_schema

APPLICATION_NAME = "lonnymq-spark"


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option's value; Spark's option maps are case-insensitive, plain dicts may not be."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return default


def int_option(
    options: Mapping[str, str], name: str, default: int | None, *, low: int = 1, high: int = 2**31 - 1
) -> int | None:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(f"option {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise errors.InvalidArgument(f"option {name} must be between {low} and {high}, got {value}")
    return value


def float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise errors.InvalidArgument(f"option {name} must be a number, got {raw!r}") from None
    if not value > 0:
        raise errors.InvalidArgument(f"option {name} must be positive, got {raw!r}")
    return value


def choice_option(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = option(options, name, default)
    assert raw is not None
    value = raw.lower()
    if value not in choices:
        raise errors.InvalidArgument(f"option {name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


@dataclass(frozen=True)
class Target:
    """Where to connect: the server, lonnymq's schema and the queue."""

    dsn: str
    schema: str
    queue: str

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Target:
        dsn = option(options, "dsn") or os.environ.get("LONNYMQ_DSN")
        if not dsn:
            raise errors.InvalidArgument(
                'lonnymq: give the server with .option("dsn", "postgresql://...") or $LONNYMQ_DSN'
            )
        queue = option(options, "queue")
        if queue is None:
            raise errors.InvalidArgument('lonnymq: give the queue with .option("queue", "...")')
        schema = option(options, "schema", DEFAULT_SCHEMA)
        assert schema is not None
        return cls(dsn, check_schema(schema), check_queue(queue))

    @contextmanager
    def connect(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one task or driver call; closed (rolled back if unfinished) on exit."""
        with psycopg.connect(self.dsn, autocommit=autocommit, application_name=APPLICATION_NAME) as conn:
            yield conn

    def query(self, function: str, args: LiteralString) -> sql.Composed:
        """``SELECT * FROM <schema>.<function>(<args>)``; ``args`` are placeholders with casts."""
        return sql.SQL("SELECT * FROM {}.{}(" + args + ")").format(
            sql.Identifier(self.schema), sql.Identifier(function)
        )

    def call(
        self, conn: psycopg.Connection[Any], function: str, args: LiteralString, params: tuple[Any, ...]
    ) -> list[Any]:
        """Run :meth:`query` with lonnymq's typed errors."""
        query = self.query(function, args)
        try:
            return conn.execute(query, params).fetchall()
        except psycopg.Error as e:
            mapped = map_error(e)
            if mapped is e:
                raise
            raise mapped from e
