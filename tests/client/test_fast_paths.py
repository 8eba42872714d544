"""The client's cheaper paths per call (docs/benchmarks.md, "The client's own CPU per call") give
what the general ones gave: Messages equal to the dataclass's own, named rows whatever the
column names, queue names checked once and still refused when bad, the retry deadline counted
from the call's start, a single ack and an ack-less take as the list forms, deliveries made
straight from their rows as the named rows make them, statements rendered once."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, errors
from lonnymq.client import ops
from lonnymq.client.retry import RetryPolicy
from lonnymq.models import Message, SendResult, new_message, new_send_result


def _values() -> list[Any]:
    """A distinct value for every field of Message, in field order."""
    return [f"v{i}" if f.type == "str" else i + 1 for i, f in enumerate(dataclasses.fields(Message))]


def test_new_message_is_the_dataclass_own() -> None:
    values = _values()
    made, fast = Message(*values), new_message(*values)
    assert type(fast) is Message
    for f in dataclasses.fields(Message):
        assert getattr(fast, f.name) == getattr(made, f.name), f.name
    assert fast == made and repr(fast) == repr(made) and hash(fast) == hash(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.id = 2  # type: ignore[misc]


def test_new_send_result_is_the_dataclass_own() -> None:
    for made, fast in (
        (SendResult(1, "created"), new_send_result(1, "created")),
        (SendResult(None, "dropped"), new_send_result(None, "dropped")),
    ):
        assert type(fast) is SendResult
        assert fast == made and repr(fast) == repr(made) and hash(fast) == hash(made)
        assert (fast.id, fast.outcome) == (made.id, made.outcome)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.id = 2  # type: ignore[misc]


def test_new_message_takes_every_field_and_no_more() -> None:
    values = _values()
    with pytest.raises(TypeError):
        new_message(*values[:-1])
    with pytest.raises(TypeError):
        new_message(*values, None)


def test_a_taken_message_is_what_the_dataclass_makes(client: Client) -> None:
    client.create_queue("fp")
    client.send("fp", {"n": 1}, kind="k", headers={"h": 1}, key="a", channel="c", priority=3)
    (m,) = client.take("fp", 1)
    values = [getattr(m, f.name) for f in dataclasses.fields(Message)]
    assert Message(*values) == m
    assert (m.queue, m.kind, m.headers, m.key, m.channel, m.priority) == ("fp", "k", {"h": 1}, "a", "c", 3)
    assert m.payload == {"n": 1} and m.attempt == 1 and m.status is None


class _Name(str):
    pass


def test_check_queue_remembers_good_names_only() -> None:
    assert ops.check_queue("fine.name") == "fine.name"
    assert "fine.name" in ops._checked_queues
    for bad in ("Bad", "", "1q", "x" * 64, None, 3, ["q"], b"q"):
        with pytest.raises(errors.InvalidQueueName):
            ops.check_queue(bad)
        with pytest.raises(errors.InvalidQueueName):  # a second time, after any caching
            ops.check_queue(bad)
    # A str subclass is checked every time, never remembered (its == or hash may be its own).
    assert ops.check_queue(_Name("sub")) == "sub"
    assert not any(type(n) is not str for n in ops._checked_queues)


def test_check_queue_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_CHECKED_MAX", 3)
    monkeypatch.setattr(ops, "_checked_queues", set())
    for i in range(10):
        ops.check_queue(f"q{i}")
        assert len(ops._checked_queues) <= 3


def test_named_rows_on_any_column_names(conn: psycopg.Connection[Any]) -> None:
    cur = conn.cursor(row_factory=ops.ROW_FACTORY)
    rows = cur.execute(
        'SELECT 1 AS id, 2, 3 AS "with space", 4 AS token FROM generate_series(1, 2)'
    ).fetchall()
    assert len(rows) == 2
    r = rows[0]
    assert (r.id, r.token) == (1, 4) and tuple(r) == (1, 2, 3, 4)
    assert r._fields == ("id", "_1", "_2", "token")
    # A statement that returns no rows: psycopg's own answer (no rows to fetch).
    cur.execute("SET application_name = 'fp'")
    assert cur.rownumber is None
    with pytest.raises(psycopg.ProgrammingError):
        cur.fetchall()


def test_the_retry_deadline_counts_from_the_calls_start() -> None:
    policy = RetryPolicy(deadline=10)
    started = time.monotonic() - 4
    # 6 s left, not 10; the margins leave a loaded machine (CI: load 6-12) 2 s between the calls.
    assert 4 < policy.start(started).remaining() <= 6
    assert 8 < policy.start().remaining() <= 10


def test_one_ack_and_a_take_without_acks_as_the_list_forms(client: Client) -> None:
    client.create_queue("fp", max_attempts=100)
    client.send_batch("fp", [1, 2, 3, 4])
    a, b = client.take("fp", 1), client.take("fp", 1, ack=[])
    assert client.ack(a) == {a[0].id}
    assert client.ack(b[0]) == {b[0].id}
    assert client.ack(b) == {b[0].id}  # a repeat by the same delivery: idempotent
    (c,) = client.take("fp", 1)
    stale = dataclasses.replace(c, token=c.token + 1)
    with pytest.raises(errors.LeaseLost):
        client.ack(stale)
    assert client.ack([stale]) == set()  # a stale token in a list: left out, no error
    assert client.ack([c]) == {c.id}
    (c,) = client.take("fp", 1, ack=())
    c2 = dataclasses.replace(c, queue="other")
    with pytest.raises(errors.InvalidArgument):
        client.ack([c, c2])
    with pytest.raises(errors.InvalidArgument):
        client.ack(["not a message"])  # type: ignore[list-item]
    assert client.ack([c]) == {c.id}


def _peek_columns(s: sql.Identifier, order: str) -> sql.Composed:
    return sql.SQL("SELECT " + order + " FROM {}.peek('fp', 10)").format(s)  # type: ignore[operator]


def test_deliveries_by_position_are_the_named_ones(client: Client, schema: str, conn: Any) -> None:
    """take, take_tx and peek make Messages straight from their rows, by position once the
    result's column names are the delivery type's; a result of other columns (a function whose
    columns changed) is read by name: either way the Messages the named rows make."""
    client.create_queue("fp")
    client.send("fp", {"n": 1}, kind="k", headers={"h": 1}, key="a", channel="c", priority=3)
    client.send("fp", b"\x00raw")
    client.send("fp", "text")
    s = sql.Identifier(schema)
    named = [
        ops._message("fp", r, None)
        for r in conn.cursor(row_factory=ops.ROW_FACTORY).execute(_peek_columns(s, "*"), binary=True)
    ]
    assert len(named) == 3
    reordered = "payload, token, id, attempt, lease_until, scheduled_at, enqueued_at, priority, key, channel"
    reordered += ", kind, content_type, headers, state, last_error, 1 AS extra"
    for columns in ("*", reordered):
        cur = conn.cursor(row_factory=ops._deliveries("fp", None), binary=True)
        got = cur.execute(_peek_columns(s, columns)).fetchall()
        assert got == named and all(type(m) is Message for m in got), columns
        assert [m.payload for m in got] == [{"n": 1}, b"\x00raw", "text"]
    assert client.peek("fp", 10) == named
    taken = client.take_tx("fp", 3)  # delivered: attempt 1
    assert taken == [dataclasses.replace(m, attempt=1, token=m.token + 1) for m in named]


def test_an_ascii_statement_is_rendered_once_for_every_encoding_and_never_for_another_schema(
    dsn: str, schema: str, schema_pool: Any
) -> None:
    other = schema_pool.acquire(f"t_{uuid.uuid4().hex[:12]}")
    try:
        a, b = ops.statements(schema), ops.statements(other)
        with (
            psycopg.connect(dsn, autocommit=True) as utf8,
            psycopg.connect(dsn, autocommit=True, client_encoding="LATIN1") as latin1,
        ):
            assert ops.rendered(a.send_plain, utf8) is ops.rendered(a.send_plain, latin1)
            assert ops.rendered(b.send_plain, latin1) == b.send_plain.as_bytes(utf8)
            assert ops.rendered(b.send_plain, latin1) != ops.rendered(a.send_plain, utf8)
            # Two clients of two schemas on one connection: each call on its own schema.
            ca, cb = Client(latin1, schema=schema), Client(latin1, schema=other)
            for c in (ca, cb):
                c.create_queue("fp")
            sent = {c.schema: c.send("fp", c.schema).id for c in (ca, cb)}
            for c in (ca, cb):
                (m,) = c.take_tx("fp", 5)
                assert (m.id, m.payload) == (sent[c.schema], c.schema)
    finally:
        schema_pool.release(other)
