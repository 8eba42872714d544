"""send_plain (issue 12): send()'s plain case (a payload, a content type, a kind; every other
argument defaulted) returning the new id alone: the same rows, locks and errors as send(),
through a statement kept in step with send()'s plain one (compared here)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_send_lean import PLAIN_SEND, _calls, _gen_held, _generic_plan, _nodes, _now, _statement

from lonnymq import Client
from lonnymq.sql import function_text

#: Every column of a message but its id and times (on the server's clock: compared apart).
COLUMNS = (
    "queue_id, gen, attempts, deliveries, leased, priority, key, channel, kind, content_type, headers,"
    " payload, superseded_by, dequeue_at = enqueued_at, scheduled_at = enqueued_at"
)

#: send_plain's statement (its one INSERT ... SELECT with the queue_stat row).
PLAIN = r"BEGIN\s+(WITH ins AS .*?SELECT ins\.id) INTO v_id FROM ins;"


#: The errors of a plain send (queue 'q' allows 10 bytes): the arguments, SQLSTATE, message.
ERRORS = [
    ({"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
    ({"p_payload": b"x" * 11}, "LQ003", "message 1 payload is 11 bytes; queue 'q' allows at most 10"),
    ({"p_payload": None}, "LQ002", "message 1 has no payload"),
]


@pytest.fixture
def s(schema: str) -> sql.Identifier:
    return sql.Identifier(schema)


def _row(conn: psycopg.Connection[Any], s: sql.Identifier, mid: int) -> tuple[Any, ...]:
    row = conn.execute(
        sql.SQL("SELECT " + COLUMNS + " FROM {}.message WHERE id = %s").format(s),  # type: ignore[operator]
        (mid,),
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    "args",
    [(), ("text/plain",), ("application/json", "job.run"), (None, "k")],
    ids=["payload", "content_type", "both", "kind"],
)
@pytest.mark.parametrize("queue", ["q", "u", "paused"])
def test_send_plain_writes_what_send_writes(
    client: Client, conn: Any, schema: str, s: sql.Identifier, args: tuple[Any, ...], queue: str
) -> None:
    client.create_queue("q", priority_step=2)
    client.create_queue("u", unlogged=True, priority_step=2)
    client.create_queue("paused", priority_step=2)
    client.pause_queue("paused")  # a paused queue accepts sends
    rest = "".join(", %s" for _ in args)
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        before = _now(conn, s)
        [(a,)] = conn.execute(
            sql.SQL("SELECT {}.send_plain(%s, %s::bytea" + rest + ")").format(s),  # type: ignore[operator]
            (queue, b"x", *args),
        ).fetchall()
        assert _calls(conn, schema, "send_batch") == 0  # its own statement
        assert _calls(conn, schema, "send") == 0
    with conn.transaction():
        [(b, outcome)] = conn.execute(
            sql.SQL("SELECT * FROM {}.send(%s, %s::bytea" + rest + ")").format(s),  # type: ignore[operator]
            (queue, b"x", *args),
        ).fetchall()
        assert outcome == "created" and _calls(conn, schema, "send_batch") == 0
    after = _now(conn, s)
    assert isinstance(a, int) and b > a  # the new message's id, from the same sequence
    assert _row(conn, s, a) == _row(conn, s, b)
    times = conn.execute(
        sql.SQL("SELECT enqueued_at FROM {}.message WHERE id = %s").format(s), (a,)
    ).fetchone()
    assert times is not None and before <= times[0] <= after
    stats = conn.execute(
        sql.SQL("SELECT queue_id, minute, sent FROM {}.queue_stat ORDER BY minute, queue_id").format(s)
    ).fetchall()
    queue_id = _row(conn, s, a)[0]
    # One appended counter row per call, as send's.
    assert [(q, n) for q, _, n in stats] == [(queue_id, 1), (queue_id, 1)]
    assert stats[0][1] == times[0] // 60000


@pytest.mark.parametrize(("args", "state", "message"), ERRORS)
@pytest.mark.parametrize("fn", ["send", "send_plain"])
def test_send_plain_raises_what_send_raises(
    client: Client, conn: Any, s: sql.Identifier, args: dict[str, Any], state: str, message: str, fn: str
) -> None:
    client.create_queue("q", max_payload_bytes=10)
    call = {"p_queue": "q", "p_payload": b"x", **args}
    stmt = sql.SQL("SELECT * FROM {}.{}(p_queue => %s, p_payload => %s::bytea)").format(s, sql.Identifier(fn))
    with pytest.raises(psycopg.Error, match=message) as info:
        conn.execute(stmt, list(call.values()))
    assert info.value.sqlstate == state
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (0,)
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.queue_stat").format(s)).fetchone() == (0,)


def test_send_plain_reads_the_generation_and_holds_it(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    """As send(): the generation read with pg_sequence_last_value (NULL for a sequence never
    called, as for a generation that moved between the read and the hold: the statement writes
    nothing and send_batch's path sends, in the sequence's value); the transaction holds the
    generation's advisory lock (shared) until it ends."""
    client.create_queue("q")
    conn.execute("SET track_functions = 'pl'")
    # (the sequence's value, whether it was called, whether the send takes send_batch's path)
    for value, called, fallback in ((7, False, True), (9, True, False)):
        conn.execute(sql.SQL("SELECT setval('{}.message_gen_seq', %s, %s)").format(s), (value, called))
        with conn.transaction():
            calls = _calls(conn, schema, "send_batch")  # pending counts may hold earlier ones
            [(mid,)] = conn.execute(sql.SQL("SELECT {}.send_plain('q', '\\x01')").format(s)).fetchall()
            assert _calls(conn, schema, "send_batch") == calls + fallback
            assert _gen_held(conn, schema, value)
        row = conn.execute(
            sql.SQL("SELECT gen, payload FROM {}.message WHERE id = %s").format(s), (mid,)
        ).fetchone()
        assert row == (value, b"\x01")
    total = conn.execute(sql.SQL("SELECT sum(sent) FROM {}.queue_stat").format(s)).fetchone()
    assert total == (2,)


def _flat(text: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", text).split())


def test_send_plain_is_sends_plain_statement() -> None:
    """The two copies of the plain send (send()'s statement takes headers, times and a
    priority; send_plain's writes the defaults): the same queue lookup, checks, locks and
    wake-up (_send_ok), the same queue_stat row; the message's columns send()'s with its
    defaults (_dequeue_at(now, 0, step, now) is now)."""
    send = re.search(PLAIN_SEND, function_text("send"), re.S)
    plain = re.search(PLAIN, function_text("send_plain"), re.S)
    assert send and plain
    a, b = _flat(send[1]), _flat(plain[1])
    lookup = r"FROM \{schema\}\.queue x WHERE x\.name = p_queue AND \{schema\}\._send_ok\([^)]*\)"
    assert re.findall(lookup, a) == re.findall(lookup, b) and len(re.findall(lookup, b)) == 1
    tail = (
        "RETURNING m.id, m.queue_id ), st AS ( INSERT INTO {schema}.queue_stat (queue_id, minute, sent)"
        " SELECT ins.queue_id, v_now / 60000, 1 FROM ins ) SELECT ins.id"
    )
    assert tail in a and b.endswith(tail)
    assert (
        "INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, priority,"
        " kind, content_type, headers, payload) SELECT x.id, v_gen, {schema}._dequeue_at(v_at, p_priority,"
        " x.priority_step_ms, v_now), v_at, v_now, p_priority, p_kind, p_content_type, p_headers, p_payload "
    ) in a
    assert b.startswith(
        "WITH ins AS ( INSERT INTO {schema}.message AS m (queue_id, gen, dequeue_at, scheduled_at,"
        " enqueued_at, kind, content_type, payload) SELECT x.id, v_gen, v_now, v_now, v_now, p_kind,"
        " p_content_type, p_payload "
    )
    # The fallback is send()'s: send_batch with the same message.
    assert "{schema}.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type])" in _flat(
        function_text("send_plain")
    )


def plain_plan(
    client: Client,
    conn: Any,
    schema: str,
    s: sql.Identifier,
    function: str,
    pattern: str,
    variables: dict[str, str],
    values: str,
) -> list[dict[str, Any]]:
    """The nodes of the generic plan of ``function``'s statement (``pattern``'s group 1, then
    FROM ins) with 300 queues analysed: ``variables`` (name: type) and then p_kind,
    p_content_type and v_gen as parameters, ``values`` and then NULL, NULL, 1 their values. Its
    queue found by its name's unique index, _send_ok inlined into that scan's filter, no
    sequential scan anywhere (a cost far under jit_above_cost)."""
    for i in range(300):
        client.create_queue(f"q{i}")
    conn.execute(sql.SQL("ANALYZE {}.queue").format(s))
    types = {**variables, "p_kind": "text", "p_content_type": "text", "v_gen": "bigint"}
    names = {name: f"${i}" for i, name in enumerate(types, 1)}
    stmt = _statement(function, pattern, names, schema) + " FROM ins"
    plan = _generic_plan(
        conn,
        f"PREPARE {function}_stmt({', '.join(types.values())}) AS {stmt}",
        f"{function}_stmt({values}, NULL, NULL, 1)",
    )
    nodes = list(_nodes(plan))
    assert not [x for x in nodes if x["Node Type"] == "Seq Scan"], plan
    assert plan["Total Cost"] < 1000, plan
    [lookup] = [x for x in nodes if x.get("Relation Name") == "queue"]
    assert lookup["Index Name"] == "queue_name_key"
    assert "pg_advisory_xact_lock_shared" in lookup["Filter"] and "_send_ok" not in lookup["Filter"], lookup
    return nodes


def test_plan_of_send_plain(client: Client, conn: Any, schema: str, s: sql.Identifier) -> None:
    """send()'s plain plan (test_send_lean.test_plan_of_the_lean_send): the queue by its name's
    unique index, _send_ok inlined into its filter, no sequential scan, five nodes."""
    variables = {"p_queue": "text", "p_payload": "bytea", "v_now": "bigint"}
    nodes = plain_plan(client, conn, schema, s, "send_plain", PLAIN, variables, "'q7', '\\x00', 0")
    assert [x["Node Type"] for x in nodes] == [
        "CTE Scan",
        "ModifyTable",
        "Index Scan",
        "ModifyTable",
        "CTE Scan",
    ]
