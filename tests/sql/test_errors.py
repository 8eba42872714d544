"""The SQL core's answers to bad input, called directly: what any language's binding sees.

Every bad argument is refused with its SQLSTATE (class LQ: LQ001 queue not found, LQ002 invalid
argument, LQ003 payload too large, ...) and a primary message that names what is wrong, before
anything is written. tests/client/test_bad_input.py checks the SQLSTATE of the commonest calls;
this file covers the remaining functions and checks the message a caller reads, then that the
client maps the error to its typed exception.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from core_helpers import _TYPES, Sql, drop_schema, fresh_schema_name
from lonnymq import Client, errors
from lonnymq.client.ops import map_error

# Parameter types of the functions below that core_helpers.Sql does not know.
TYPES = {
    **_TYPES,
    "p_channel": "text",
    "p_max_concurrency": "int",
    "p_release_interval_ms": "bigint",
    "p_max_size": "bigint",
    "p_on_full": "text",
    "p_channel_max_concurrency": "int",
    "p_channel_release_interval_ms": "bigint",
    "p_channel_max_size": "bigint",
    "p_channel_on_full": "text",
    "p_schedule": "text",
    "p_payload": "bytea",
    "p_kind": "text",
    "p_priority": "int2",
    "p_misfire_grace_ms": "bigint",
    "p_source": "text",
    "p_tick_ms": "bigint",
}


def call(conn: psycopg.Connection[Any], schema: str, func: str, **args: Any) -> list[dict[str, Any]]:
    parts = [sql.SQL("{} => %s::{}").format(sql.Identifier(n), sql.SQL(TYPES[n])) for n in args]  # type: ignore[arg-type]
    query = sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(func), sql.SQL(", ").join(parts)
    )
    values = [
        [None if x is None else Jsonb(x) for x in v] if n == "p_headers" and v else v for n, v in args.items()
    ]
    return conn.cursor(row_factory=dict_row).execute(query, values).fetchall()


@pytest.fixture(scope="module")
def shared(dsn: str) -> Iterator[str]:
    """One schema for calls that must write nothing: queue "q" (100-byte payloads) holding one
    message, with a configured channel "c"."""
    name = fresh_schema_name()
    with Client(dsn, schema=name, pool_size=1) as c:
        c.migrate()
        c.create_queue("q", max_payload_bytes=100)
        c.set_channel("q", "c", max_concurrency=1)
        c.send("q", b"live")
    yield name
    drop_schema(dsn, name)


def snapshot(conn: psycopg.Connection[Any], schema: str) -> tuple[Any, ...]:
    """Everything these calls could write."""
    return tuple(
        conn.execute(
            sql.SQL("SELECT * FROM {}.{} ORDER BY 1, 2").format(sql.Identifier(schema), sql.Identifier(table))
        ).fetchall()
        for table in ("queue", "message", "channel", "archive", "cron")
    )


LONG = "x" * 513

# (function, arguments, SQLSTATE, the primary message (a regex, matched from its start))
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # queue_create: settings, and the default policy of the channels its messages create
    ("queue_create", {"p_name": "n", "p_priority_step_ms": None}, "LQ002", "priority_step_ms must be >= 0"),
    ("queue_create", {"p_name": "n", "p_lease_ms": 0}, "LQ002", "lease_ms must be positive, got 0"),
    ("queue_create", {"p_name": "n", "p_max_attempts": None}, "LQ002", "queue settings must not be NULL"),
    ("queue_create", {"p_name": "n", "p_retention_ms": -1}, "LQ002", "retention_ms must be >= 0"),
    ("queue_create", {"p_name": "n", "p_max_payload_bytes": 104857601}, "LQ002", "max_payload_bytes must be at most 100 MiB"),
    ("queue_create", {"p_name": "n", "p_channel_max_concurrency": 0}, "LQ002", "max_concurrency must be positive, got 0"),
    ("queue_create", {"p_name": "n", "p_channel_max_size": -3}, "LQ002", "max_size must be positive, got -3"),
    ("queue_create", {"p_name": "n", "p_channel_release_interval_ms": -1}, "LQ002", "release_interval_ms must be >= 0"),
    ("queue_create", {"p_name": "n", "p_channel_on_full": "block"}, "LQ002", "on_full must be reject or drop"),
    ("queue_create", {"p_name": "n", "p_channel_on_full": None}, "LQ002", "on_full must be reject or drop"),
    ("queue_create", {"p_name": "n", "p_dead_letter_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("queue_create", {"p_name": "q"}, "LQ005", "queue 'q' already exists"),
    ("queue_create", {"p_name": "Q"}, "LQ002", "invalid queue name 'Q'"),
    # send_batch: the message says which message (1-based) is wrong
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a", None]}, "LQ002", "message 2 has no payload"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a", b"x" * 101]}, "LQ003", "message 2 payload is 101 bytes; queue 'q' allows at most 100"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a", b"b"], "p_headers": [{}, [1]]}, "LQ002", "message 2 headers must be a JSON object"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a", b"b", b"c"], "p_delays_ms": [0, 0, -1]}, "LQ002", "message 3 delay must be >= 0"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a"], "p_priorities": [101]}, "LQ002", r"message 1 priority 101 is outside -100\.\.100"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a"], "p_channels": [""]}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a"], "p_channels": [LONG]}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a"], "p_keys": ["k", "l"]}, "LQ002", "all per-message arrays must have as many elements as payloads"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"a"], "p_on_conflict": "merge"}, "LQ002", "on_conflict must be ignore, replace or error"),
    # settling: the arrays must pair up, and the queue must exist
    ("give_up", {"p_queue": "q", "p_ids": [1, 2], "p_tokens": [1]}, "LQ002", "ids and tokens must have the same length"),
    ("give_up", {"p_queue": "q", "p_ids": [1], "p_tokens": None}, "LQ002", "ids and tokens must have the same length"),
    ("give_up", {"p_queue": "nope", "p_ids": [1], "p_tokens": [1]}, "LQ001", "queue 'nope' does not exist"),
    ("nack", {"p_queue": "q", "p_ids": [1], "p_tokens": [1, 2]}, "LQ002", "ids and tokens must have the same length"),
    ("nack", {"p_queue": "q", "p_ids": [1], "p_tokens": [1], "p_delays_ms": [-5]}, "LQ002", "delay must be >= 0"),
    ("nack", {"p_queue": "nope", "p_ids": [1], "p_tokens": [1]}, "LQ001", "queue 'nope' does not exist"),
    ("extend", {"p_queue": "q", "p_ids": [1, 2], "p_tokens": [1]}, "LQ002", "ids and tokens must have the same length"),
    ("extend", {"p_queue": "q", "p_ids": [1], "p_tokens": [1], "p_lease_ms": -1}, "LQ002", "lease_ms must be positive, got -1"),
    ("extend", {"p_queue": "nope", "p_ids": [1], "p_tokens": [1]}, "LQ001", "queue 'nope' does not exist"),
    ("ack", {"p_queue": "q", "p_ids": [1, 2], "p_tokens": [1]}, "LQ002", "ids and tokens must have the same length"),
    # reading
    ("peek", {"p_queue": "q", "p_limit": 100001}, "LQ002", "limit must be between 1 and 100000, got 100001"),
    ("peek", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("next_ready_in", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("queue_metrics", {"p_name": "q", "p_cap": 100001}, "LQ002", "limit must be between 1 and 100000"),
    ("take_tx", {"p_queue": "q", "p_limit": None}, "LQ002", "limit must be between 1 and 100000, got <NULL>"),
    ("dead_list", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("dead_list", {"p_queue": "q", "p_limit": 100001}, "LQ002", "limit must be between 1 and 100000"),
    # channels
    ("channel_set", {"p_queue": "nope", "p_channel": "c"}, "LQ001", "queue 'nope' does not exist"),
    ("channel_set", {"p_queue": "q", "p_channel": ""}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("channel_set", {"p_queue": "q", "p_channel": None}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("channel_set", {"p_queue": "q", "p_channel": LONG}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("channel_set", {"p_queue": "q", "p_channel": "c", "p_max_concurrency": 0}, "LQ002", "max_concurrency must be positive"),
    ("channel_set", {"p_queue": "q", "p_channel": "c", "p_max_size": 0}, "LQ002", "max_size must be positive"),
    ("channel_set", {"p_queue": "q", "p_channel": "c", "p_release_interval_ms": -1}, "LQ002", "release_interval_ms must be >= 0"),
    ("channel_set", {"p_queue": "q", "p_channel": "c", "p_on_full": "wait"}, "LQ002", "on_full must be reject or drop"),
    ("channel_reset", {"p_queue": "q", "p_channel": ""}, "LQ002", "a channel name must have 1 to 512 characters"),
    ("channel_reset", {"p_queue": "nope", "p_channel": "c"}, "LQ001", "queue 'nope' does not exist"),
    ("channel_list", {"p_queue": "q", "p_limit": 0}, "LQ002", "limit must be between 1 and 100000, got 0"),
    ("channel_list", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("channel_recount", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    # dead letters and housekeeping
    ("dead_requeue", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("dead_purge", {"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ("maintain", {"p_limit": None}, "LQ002", "limit must be between 1 and 100000"),
    # cron schedules
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "nope", "p_payload": b"x"}, "LQ001", "queue 'nope' does not exist"),
    ("cron_upsert", {"p_name": "a b", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x"}, "LQ002", "invalid schedule name 'a b'"),
    ("cron_upsert", {"p_name": None, "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x"}, "LQ002", "invalid schedule name NULL"),
    ("cron_upsert", {"p_name": "s" * 201, "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x"}, "LQ002", "invalid schedule name"),
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": None}, "LQ002", "a schedule needs a payload"),
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x", "p_priority": -101}, "LQ002", r"priority must be in -100\.\.100"),
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x", "p_priority": None}, "LQ002", r"priority must be in -100\.\.100"),
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x", "p_misfire_grace_ms": -1}, "LQ002", "misfire_grace_ms must be >= 0"),
    ("cron_upsert", {"p_name": "s", "p_schedule": "* * * * *", "p_queue": "q", "p_payload": b"x", "p_source": "web"}, "LQ002", "source must be code or cli"),
]  # fmt: skip


@pytest.mark.parametrize(("func", "args", "sqlstate", "message"), CASES, ids=lambda v: repr(v)[:50])
def test_bad_input_is_refused_with_its_sqlstate_and_message(
    conn: psycopg.Connection[Any], shared: str, func: str, args: dict[str, Any], sqlstate: str, message: str
) -> None:
    before = snapshot(conn, shared)
    with pytest.raises(psycopg.Error) as e:
        call(conn, shared, func, **args)
    assert e.value.sqlstate == sqlstate, str(e.value)
    primary = e.value.diag.message_primary or ""
    assert re.match(message, primary), primary
    # The binding's typed exception for it (queue names get the narrower InvalidQueueName).
    expected = (
        errors.InvalidQueueName
        if primary.startswith("invalid queue name")
        else errors.SQLSTATE_ERRORS[sqlstate]
    )
    assert type(map_error(e.value)) is expected
    assert snapshot(conn, shared) == before


def test_a_valid_call_of_each_checked_function_passes(conn: psycopg.Connection[Any], shared: str) -> None:
    """The checks above refuse only what is wrong: the edges they draw are accepted."""
    db = Sql(conn, shared)
    now = db.now()
    conn.execute("BEGIN")
    try:
        assert call(conn, shared, "queue_create", p_name="n", p_priority_step_ms=0, p_retention_ms=0,
                    p_max_payload_bytes=104857600, p_channel_release_interval_ms=0,
                    p_channel_on_full="drop") == [{"queue_create": True}]  # fmt: skip
        rows = call(conn, shared, "send_batch", p_queue="q", p_payloads=[b"a", b"x" * 100],
                    p_channels=["y" * 512, None], p_priorities=[-100, 100], p_delays_ms=[0, None],
                    p_headers=[{}, None], p_now=now)  # fmt: skip
        assert [r["outcome"] for r in rows] == ["created", "created"]
        assert call(conn, shared, "cron_upsert", p_name="S" + "s" * 199, p_schedule="* * * * *",
                    p_queue="q", p_payload=b"", p_priority=100, p_misfire_grace_ms=0,
                    p_source="cli", p_now=now) == [{"cron_upsert": "created"}]  # fmt: skip
        assert call(conn, shared, "peek", p_queue="q", p_limit=100000) != []
    finally:
        conn.execute("ROLLBACK")


def test_client_raises_the_typed_exception_of_sql_errors(dsn: str, shared: str) -> None:
    """Errors only the database can detect reach client code as lonnymq exceptions."""
    with Client(dsn, schema=shared, pool_size=1) as c:
        with pytest.raises(errors.QueueNotFound, match="queue 'nope' does not exist"):
            c.set_channel("nope", "c")
        with pytest.raises(errors.QueueNotFound):
            c.reset_channel("nope", "c")
        with pytest.raises(errors.QueueNotFound):
            c.channels("nope")
        with pytest.raises(errors.QueueNotFound):
            c.dead_letters("nope")
        with pytest.raises(errors.QueueNotFound):
            c.requeue_dead("nope")
        with pytest.raises(errors.QueueNotFound):
            c.create_queue("n", dead_letter_queue="nope")
        with pytest.raises(errors.QueueExists, match="queue 'q' already exists"):
            c.create_queue("q")
        with pytest.raises(errors.PayloadTooLarge, match="queue 'q' allows at most 100"):
            c.send_batch("q", [b"ok", b"x" * 101])
        assert [m.payload for m in c.peek("q", 10)] == [b"live"]
        assert [q.name for q in c.list_queues()] == ["q"]


def test_only_the_owner_may_read_at_a_future_clock(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection[Any]
) -> None:
    """queue_metrics and next_ready_in take p_now (for tests) like take does, with the same
    rule: nobody but the schema owner may pass a clock ahead of the server's. Anyone may pass
    one in the past."""
    role = f"lq_reader_{uuid.uuid4().hex[:8]}"
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, sql.Identifier(role)))
        conn.execute(
            sql.SQL(
                "GRANT EXECUTE ON FUNCTION {s}.queue_metrics(text, integer, bigint),"
                " {s}.next_ready_in(text, bigint) TO {r}"
            ).format(s=s, r=sql.Identifier(role))
        )
        client.create_queue("q")
        client.send("q", b"later", delay=3600)
        now = Sql(conn, schema).now()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier(role)))
            for func in ("queue_metrics", "next_ready_in"):
                with pytest.raises(psycopg.Error) as e:
                    call(
                        c,
                        schema,
                        func,
                        **{"p_name" if func == "queue_metrics" else "p_queue": "q"},
                        p_now=now + 3_600_001,
                    )
                assert e.value.sqlstate == "LQ002", func
                assert (e.value.diag.message_primary or "").startswith("p_now may not be in the future")
            # Within the second of slack, or in the past: answered at that clock.
            [r] = call(c, schema, "next_ready_in", p_queue="q", p_now=now - 1000)
            assert 3_540_000 < r["next_ready_in"] <= 3_601_000
            [m] = call(c, schema, "queue_metrics", p_name="q", p_now=now)
            assert (m["ready"], m["scheduled"]) == (0, 1)
        # The owner may look ahead: the message is ready an hour from now.
        [m] = call(conn, schema, "queue_metrics", p_name="q", p_now=now + 3_600_001 + 60_000)
        assert (m["ready"], m["scheduled"]) == (1, 0)
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
