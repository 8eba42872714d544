"""Volatility of the SQL core is declared on purpose: every function file states it, the key
functions carry the category that is true for them, and the two intended exceptions to
plpgsql_check's advice (_invalid, _channel_ready_at) behave as their comments say."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql

from lonnymq.sql import FUNCTION_RE, function_files

EXPECTED = {
    # Write, or read the moving clock: VOLATILE.
    "now_ms": "v",
    "_now": "v",
    "send_batch": "v",
    "take": "v",
    "take_tx": "v",
    "_lock_ready": "v",
    "_deliver": "v",
    "_ack": "v",
    "cron_list": "v",
    # Reads only: STABLE (one snapshot for all their queries).
    "_read_now": "s",
    "_queue": "s",
    "peek": "s",
    "next_ready_in": "s",
    "queue_metrics": "s",
    "channel_list": "s",
    "spark_read_messages": "s",
    # Arguments only: IMMUTABLE.
    "_dequeue_at": "i",
    "_check_limit": "i",
    "_check_positive": "i",
    # Intended exceptions (see their comments in sql/util.sql and sql/channels.sql).
    "_invalid": "s",
    "_channel_ready_at": "v",
}


def test_every_function_declares_its_volatility() -> None:
    undeclared = []
    for f in function_files():
        for match in FUNCTION_RE.finditer(f.template):
            header = f.template[match.start() : f.template.index("$$", match.start())]
            if not re.search(r"\b(?:VOLATILE|STABLE|IMMUTABLE)\b", header):
                undeclared.append(f"{f.name}: {match[1]}")
    assert undeclared == []


def test_key_functions_have_the_volatility_that_is_true_for_them(
    conn: psycopg.Connection[tuple[object, ...]], schema: str
) -> None:
    rows = conn.execute(
        "SELECT p.proname, p.provolatile FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace AND p.proname = ANY (%s)",
        (sql.Identifier(schema).as_string(conn), list(EXPECTED)),
    ).fetchall()
    assert dict(rows) == EXPECTED  # type: ignore[arg-type]


def test_invalid_is_not_folded_while_planning(
    conn: psycopg.Connection[tuple[object, ...]], schema: str
) -> None:
    """An IMMUTABLE _invalid('constant') would be evaluated by the planner, raising in a branch
    that never runs; STABLE keeps the raise where the call is executed."""
    q = sql.SQL("SELECT CASE WHEN g > %s THEN {}._invalid('boom') END FROM generate_series(1, 3) g").format(
        sql.Identifier(schema)
    )
    assert conn.execute(q, (3,)).fetchall() == [(None,)] * 3
    with pytest.raises(psycopg.Error) as e:
        conn.execute(q, (2,))
    assert e.value.sqlstate == "LQ002"


def test_read_clock_is_the_statement_start(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """_read_now (queue_metrics, next_ready_in) is the time the statement started, not the
    moving clock: evaluated after a 50 ms sleep in the same statement, it has not moved."""
    [(read, started)] = conn.execute(
        sql.SQL(
            "SELECT {}._read_now(NULL), (extract(epoch FROM statement_timestamp()) * 1000)::bigint"
            " FROM pg_sleep(0.05)"
        ).format(sql.Identifier(schema))
    ).fetchall()
    assert read == started
