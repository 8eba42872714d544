"""The Spark connector's SQL functions (src/lonnymq/sql/spark.sql) given bad or stale input:
the SQLSTATE and message each refusal carries, commits of streams and batches the database does
not know (any more), and the sweeper removing what crashed writers and abandoned streams left.
Called directly: no Spark needed. Time is passed as p_now, never slept."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, errors
from lonnymq.client.ops import map_error

Conn = psycopg.Connection[Any]

TYPES = {
    "p_run": "uuid",
    "p_stream": "uuid",
    "p_parts": "bigint[]",
    "p_counts": "bigint[]",
    "p_limit": "int",
    "p_chunk": "int",
    "p_archive": "bool",
    "p_queue": "text",
    "p_sink": "text",
    "p_on_conflict": "text",
    "p_table": "text",
}


def call(conn: Conn, schema: str, function: str, **params: Any) -> list[tuple[Any, ...]]:
    """``SELECT * FROM schema.function(p_x => %s, ...)`` with explicit casts (bigint unless named)."""
    args = sql.SQL(", ").join(
        sql.SQL("{} => %s::{}").format(sql.Identifier(k), sql.SQL(TYPES.get(k, "bigint")))  # type: ignore[arg-type]
        for k in params
    )
    query = sql.SQL("SELECT * FROM {}.{}({})").format(sql.Identifier(schema), sql.Identifier(function), args)
    return conn.execute(query, list(params.values())).fetchall()


def rows(conn: Conn, schema: str, table: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT * FROM {}.{} ORDER BY 1, 2").format(sql.Identifier(schema), sql.Identifier(table))
    return conn.execute(query).fetchall()


def stage(conn: Conn, schema: str, run: uuid.UUID, part: int, n: int, staged_at: int | None = None) -> None:
    s = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.spark_stage_part (part, run_id, queue, staged_at)"
            " VALUES (%s, %s, 'q', coalesce(%s, {}.now_ms()))"
        ).format(s, s),
        (part, run, staged_at),
    )
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {}.spark_stage (part, seq, payload) VALUES (%s, %s, %s)").format(s),
            [(part, i, b"p%d" % i) for i in range(n)],
        )


STREAM = uuid.UUID(int=1)
RUN = uuid.UUID(int=2)
NEXT = {"p_stream": STREAM, "p_queue": "q", "p_after": 0, "p_limit": 10}

# (function, arguments, SQLSTATE, the primary message (a regex, matched from its start))
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [1, 2], "p_counts": [1]}, "LQ002", "parts and counts must have the same length"),
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [1], "p_counts": None}, "LQ002", "parts and counts must have the same length"),
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [], "p_counts": [], "p_sink": "s"}, "LQ002", "a sink commit needs a batch id >= 0"),
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [], "p_counts": [], "p_sink": "s", "p_batch": -1}, "LQ002", "a sink commit needs a batch id >= 0"),
    ("spark_write_commit", {"p_queue": "nope", "p_run": RUN, "p_parts": [], "p_counts": []}, "LQ001", "queue 'nope' does not exist"),
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [], "p_counts": [], "p_sink": "s", "p_batch": 0, "p_retention_ms": 0}, "LQ002", "retention_ms"),
    ("spark_prune", {"p_limit": 0}, "LQ002", "limit"),
    ("spark_write_commit", {"p_queue": "q", "p_run": RUN, "p_parts": [1], "p_counts": [1], "p_on_conflict": "x"}, "LQ002", "on_conflict must be ignore, replace or error"),
    ("spark_stream_next", {**NEXT, "p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("spark_stream_next", {**NEXT, "p_after": -1}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_after": None}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_limit": 0}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_chunk": 0}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_chunk": 100001}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_chunk": None}, "LQ002", "invalid stream batch request"),
    ("spark_stream_next", {**NEXT, "p_lease_ms": 0}, "LQ002", "lease_ms must be positive, got 0"),
    ("spark_id_range", {"p_queue": "q", "p_table": "messages; --"}, "LQ002", "table must be messages, archive or dead"),
    ("spark_id_range", {"p_queue": "q", "p_table": None}, "LQ002", "table must be messages, archive or dead"),
    ("spark_id_range", {"p_queue": "nope", "p_table": "messages"}, "LQ001", "queue 'nope' does not exist"),
    ("spark_queue_check", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("spark_sweep", {"p_stage_ttl_ms": -1}, "LQ002", "ttl must be >= 0"),
    ("spark_sweep", {"p_stream_ttl_ms": None}, "LQ002", "ttl must be >= 0"),
]  # fmt: skip


@pytest.mark.parametrize(("func", "args", "sqlstate", "message"), CASES, ids=lambda v: repr(v)[:50])
def test_bad_requests_are_refused_before_anything_changes(
    client: Client, conn: Conn, schema: str, func: str, args: dict[str, Any], sqlstate: str, message: str
) -> None:
    client.create_queue("q")
    client.send("q", b"m")
    stage(conn, schema, RUN, 1, 1)
    before = [rows(conn, schema, t) for t in ("message", "spark_stage", "spark_stream", "spark_sink_commit")]
    with pytest.raises(psycopg.Error) as e:
        call(conn, schema, func, **args)
    assert e.value.sqlstate == sqlstate, str(e.value)
    primary = e.value.diag.message_primary or ""
    assert re.match(message, primary), primary
    assert type(map_error(e.value)) is errors.SQLSTATE_ERRORS[sqlstate]
    assert [
        rows(conn, schema, t) for t in ("message", "spark_stage", "spark_stream", "spark_sink_commit")
    ] == before


def test_commit_of_an_unknown_stream_does_nothing(client: Client, conn: Conn, schema: str) -> None:
    """A commit for a stream the database never planned (or swept) acks nothing and does not
    invent the stream: the next planning call starts it from its own offset."""
    client.create_queue("q")
    client.send("q", b"m")
    assert call(conn, schema, "spark_stream_commit", p_stream=STREAM, p_batch=5) == [(0,)]
    assert rows(conn, schema, "spark_stream") == []
    assert call(conn, schema, "spark_stream_next", **NEXT) == [(1, 1)]


def test_commit_of_a_stale_batch_acks_nothing_and_keeps_the_offset(
    client: Client, conn: Conn, schema: str
) -> None:
    client.create_queue("q")
    client.send_batch("q", [b"a", b"b"])
    s = {"p_stream": STREAM, "p_queue": "q", "p_limit": 1}
    assert call(conn, schema, "spark_stream_next", p_after=0, **s) == [(1, 1)]
    assert call(conn, schema, "spark_stream_next", p_after=1, **s) == [(2, 1)]
    assert call(conn, schema, "spark_stream_commit", p_stream=STREAM, p_batch=2) == [(2,)]
    # A late commit of batch 1 (Spark replaying its commit log) finds nothing left to ack and
    # does not move the stream's committed offset back.
    assert call(conn, schema, "spark_stream_commit", p_stream=STREAM, p_batch=1) == [(0,)]
    [(committed,)] = conn.execute(
        sql.SQL("SELECT committed_batch FROM {}.spark_stream").format(sql.Identifier(schema))
    ).fetchall()
    assert committed == 2
    assert client.peek("q") == []
    with pytest.raises(psycopg.Error, match="already committed batch 2; offset 1 is older") as e:
        call(conn, schema, "spark_stream_next", p_after=1, **s)
    assert type(map_error(e.value)) is errors.InvalidArgument


def test_sweep_removes_stale_staging_and_abandoned_streams_only(
    client: Client, conn: Conn, schema: str
) -> None:
    client.create_queue("q")
    client.send_batch("q", [b"a", b"b"])
    day, week = 86_400_000, 604_800_000
    [(now,)] = conn.execute(sql.SQL("SELECT {}.now_ms()").format(sql.Identifier(schema))).fetchall()
    t = now + 2 * week  # the stream ttl's past is still after the messages were sent
    stage(conn, schema, RUN, 1, 3, staged_at=t - day - 1)  # a crashed write, older than the TTL
    stage(conn, schema, RUN, 2, 2, staged_at=t - day)  # exactly at the TTL: kept
    old, fresh = uuid.UUID(int=10), uuid.UUID(int=11)
    for stream, seen in ((old, t - week - 1), (fresh, t - week)):
        call(
            conn, schema, "spark_stream_next", p_stream=stream, p_queue="q", p_after=0, p_limit=1, p_now=seen
        )

    assert call(conn, schema, "spark_sweep", p_now=t) == [(3, 1)]
    assert [r[0] for r in rows(conn, schema, "spark_stage_part")] == [2]
    assert {r[0] for r in rows(conn, schema, "spark_stage")} == {2}
    assert [r[0] for r in rows(conn, schema, "spark_stream")] == [fresh]
    # The abandoned stream's batch log went with it; its delivery is left to expire on its own.
    assert {r[0] for r in rows(conn, schema, "spark_stream_batch")} == {fresh}
    assert client.metrics("q").leased == 2
    assert call(conn, schema, "spark_sweep", p_now=t) == [(0, 0)]  # nothing more to do
    # TTLs of 0 sweep everything older than now.
    assert call(conn, schema, "spark_sweep", p_stage_ttl_ms=0, p_stream_ttl_ms=0, p_now=t + 1) == [(2, 1)]
