"""The lean send and pop (issue 12): send() writes exactly what send_batch() writes for one
message, through one statement in the plain case; take_tx()/pop() on a plain queue without
archiving is one DELETE with take_tx's semantics. Plan tests for both statements, taken verbatim
from sql/send.sql and sql/take.sql."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from lonnymq import Client
from lonnymq.sql import function_text

COLUMNS = (
    "gen, dequeue_at, scheduled_at, enqueued_at, attempts, deliveries, leased, priority, key, channel,"
    " kind, content_type, headers, payload"
)


@pytest.fixture
def s(schema: str) -> sql.Identifier:
    return sql.Identifier(schema)


def _now(conn: psycopg.Connection[Any], s: sql.Identifier) -> int:
    row = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchone()
    assert row is not None
    return int(row[0])


def _gen_held(conn: psycopg.Connection[Any], schema: str, gen: int) -> bool:
    """Whether this session holds generation ``gen`` as a writer does (_gen_write: its advisory
    lock, shared, once)."""
    held = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        " AND mode = 'ShareLock' AND classid = (hashtext(%s || '/gen') & 2147483647)::oid"
        " AND objid = %s",
        (schema, gen),
    ).fetchone()
    return held == (1,)


def _calls(conn: psycopg.Connection[Any], schema: str, name: str) -> int:
    """Calls of schema.name in this transaction (track_functions = 'pl')."""
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE schemaname = %s AND funcname = %s",
        (schema, name),
    ).fetchone()
    assert row is not None
    return int(row[0])


CASES: list[dict[str, Any]] = [
    {},
    {"p_kind": "k", "p_content_type": "text/plain", "p_headers": Jsonb({"a": 1})},
    {"p_delay_ms": 5000},
    {"p_at_ms": 0},
    {"p_priority": 7},
    {"p_priority": -3, "p_delay_ms": 1000},
]


@pytest.mark.parametrize("args", CASES)
@pytest.mark.parametrize("queue", ["q", "u", "paused"])
def test_send_writes_what_send_batch_writes(
    client: Client, conn: Any, schema: str, s: sql.Identifier, args: dict[str, Any], queue: str
) -> None:
    client.create_queue("q", priority_step=2)
    client.create_queue("u", unlogged=True, priority_step=2)
    client.create_queue("paused", priority_step=2)
    client.pause_queue("paused")  # a paused queue accepts sends
    now = _now(conn, s)
    names = list(args)
    one = sql.SQL("SELECT id, outcome FROM {}.send(%s, %s::bytea, p_now => %s{})").format(
        s, sql.SQL("").join(sql.SQL(", {} => %s").format(sql.Identifier(n)) for n in names)
    )
    arrays = {
        "p_kind": "p_kinds",
        "p_content_type": "p_content_types",
        "p_headers": "p_headers",
        "p_delay_ms": "p_delays_ms",
        "p_at_ms": "p_at_ms",
        "p_priority": "p_priorities",
    }
    types = {
        "p_kind": "text",
        "p_content_type": "text",
        "p_headers": "jsonb",
        "p_delay_ms": "bigint",
        "p_at_ms": "bigint",
        "p_priority": "int2",
    }
    many = sql.SQL("SELECT id, outcome FROM {}.send_batch(%s, ARRAY[%s::bytea], p_now => %s{})").format(
        s,
        sql.SQL("").join(
            sql.SQL(", {} => ARRAY[%s::{}]").format(sql.Identifier(arrays[n]), sql.SQL(types[n]))
            for n in names
        ),
    )
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        [(a, outcome)] = conn.execute(one, (queue, b"x", now, *args.values())).fetchall()
        assert outcome == "created"
        assert _calls(conn, schema, "send_batch") == 0  # the lean statement
    [(b, _)] = conn.execute(many, (queue, b"x", now, *args.values())).fetchall()
    rows = conn.execute(
        sql.SQL("SELECT " + COLUMNS + " FROM {}.message WHERE id = ANY(%s) ORDER BY id").format(s),  # type: ignore[operator]
        ([a, b],),
    ).fetchall()
    assert rows[0] == rows[1]
    counts = conn.execute(
        sql.SQL(
            "SELECT (SELECT sum(sent) FROM {s}.queue_stat), (SELECT count(*) FROM {s}.queue_stat)"
        ).format(s=s)
    ).fetchone()
    assert counts == (2, 2)  # one appended counter row per call, as send_batch


@pytest.mark.parametrize(
    ("args", "state", "message"),
    [
        ({"p_queue": "nope"}, "LQ001", "queue 'nope' does not exist"),
        ({"p_payload": b"x" * 11}, "LQ003", "message 1 payload is 11 bytes; queue 'q' allows at most 10"),
        ({"p_payload": None}, "LQ002", "message 1 has no payload"),
        ({"p_priority": 101}, "LQ002", r"message 1 priority 101 is outside -100\.\.100"),
        ({"p_delay_ms": -1}, "LQ002", "message 1 delay must be >= 0"),
        ({"p_headers": Jsonb([1])}, "LQ002", "message 1 headers must be a JSON object"),
        ({"p_on_conflict": "merge"}, "LQ002", "on_conflict must be ignore, replace or error"),
        ({"p_channel": ""}, "LQ002", "a channel name must have 1 to 512 characters"),
    ],
)
def test_send_raises_what_send_batch_raises(
    client: Client, conn: Any, s: sql.Identifier, args: dict[str, Any], state: str, message: str
) -> None:
    client.create_queue("q", max_payload_bytes=10)
    call = {"p_queue": "q", "p_payload": b"x", **args}
    types = {"p_priority": "::int2", "p_payload": "::bytea"}
    stmt = sql.SQL("SELECT * FROM {}.send({})").format(
        s,
        sql.SQL(", ").join(
            sql.SQL("{} => %s" + types.get(n, "")).format(sql.Identifier(n))  # type: ignore[operator]
            for n in call
        ),
    )
    with pytest.raises(psycopg.Error, match=message) as info:
        conn.execute(stmt, list(call.values()))
    assert info.value.sqlstate == state
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.send_key").format(s)).fetchone() == (0,)


def test_keyed_and_channel_sends_take_send_batch(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    client.create_queue("q")
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        conn.execute(sql.SQL("SELECT * FROM {}.send('q', 'a'::bytea, p_key => 'k')").format(s))
        conn.execute(sql.SQL("SELECT * FROM {}.send('q', 'b'::bytea, p_channel => 'c')").format(s))
        [(outcome,)] = conn.execute(
            sql.SQL(
                "SELECT outcome FROM {}.send('q', 'c'::bytea, p_key => 'k', p_on_conflict => 'replace')"
            ).format(s)
        ).fetchall()
        assert _calls(conn, schema, "send_batch") == 3
    assert outcome == "updated"
    assert sorted(m.body for m in client.peek("q")) == [b"b", b"c"]


def test_send_goes_to_the_current_generation(client: Client, conn: Any, s: sql.Identifier) -> None:
    client.create_queue("q")
    for _ in range(3):
        gen = conn.execute(sql.SQL("SELECT {}.rotate(p_force => true)").format(s)).fetchone()[0]
        sent = client.send("q", 1)
        row = conn.execute(
            sql.SQL("SELECT gen FROM {}.message WHERE id = %s").format(s), (sent.id,)
        ).fetchone()
        assert row == (gen,)


# -- send_batch's plain batch ---------------------------------------------------------------------

BATCH_ARGS = (
    "p_kinds => %s::text[], p_content_types => %s::text[], p_headers => %s::jsonb[],"
    " p_at_ms => %s::bigint[], p_delays_ms => %s::bigint[], p_priorities => %s::int2[]"
)


def _batch(n: int, now: int) -> tuple[list[bytes], list[Any]]:
    """n messages with every per-message option (some NULL), and the option arrays."""
    payloads = [f"m{i}".encode() for i in range(n)]
    kinds = [None if i % 3 else f"k{i}" for i in range(n)]
    ctypes = [None if i % 2 else "text/plain" for i in range(n)]
    headers = [None if i % 4 else Jsonb({"i": i}) for i in range(n)]
    ats = [None if i % 5 else now - i for i in range(n)]
    delays = [None if i % 7 else 1000 * i for i in range(n)]
    prios = [(i % 11) - 5 for i in range(n)]
    return payloads, [kinds, ctypes, headers, ats, delays, prios]


@pytest.mark.parametrize("queue", ["q", "u"])
def test_send_batch_plain_path_writes_what_the_general_path_writes(
    client: Client, conn: Any, schema: str, s: sql.Identifier, queue: str
) -> None:
    """A plain batch (no keys, channels or send key) is one statement that calls no other
    function of the schema (the queue's lookup, the clock, the wake-up and the generation
    inlined); the same batch with an all-NULL channel array takes the general path. Both return
    (ord, id, 'created') in input order with ids ascending, and write the same rows and one
    queue_stat row each."""
    client.create_queue("q", priority_step=2)
    client.create_queue("u", unlogged=True, priority_step=2)
    now = _now(conn, s)
    payloads, options = _batch(30, now)
    plain = sql.SQL(
        "SELECT ord, id, outcome FROM {}.send_batch(%s, %s::bytea[], " + BATCH_ARGS + ", p_now => %s)"
    ).format(s)  # type: ignore[operator]
    general = sql.SQL(
        "SELECT ord, id, outcome FROM {}.send_batch(%s, %s::bytea[], " + BATCH_ARGS + ", p_now => %s,"  # type: ignore[operator]
        " p_channels => array_fill(NULL::text, ARRAY[%s]))"
    ).format(s)
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        a = conn.execute(plain, (queue, payloads, *options, now)).fetchall()
        for name in ("_queue", "_now", "_wake", "_gen_write", "_send_bad"):
            assert _calls(conn, schema, name) == 0, name  # the plain batch's one statement
    b = conn.execute(general, (queue, payloads, *options, now, len(payloads))).fetchall()
    for rows in (a, b):
        assert [r[0] for r in rows] == list(range(1, 31))
        assert [r[2] for r in rows] == ["created"] * 30
        ids = [r[1] for r in rows]
        assert ids == sorted(ids) and len(set(ids)) == 30
    select = sql.SQL("SELECT " + COLUMNS + " FROM {}.message WHERE id = ANY(%s) ORDER BY id").format(s)  # type: ignore[operator]
    written_a = conn.execute(select, ([r[1] for r in a],)).fetchall()
    written_b = conn.execute(select, ([r[1] for r in b],)).fetchall()
    assert written_a == written_b
    assert [bytes(r[-1]) for r in written_a] == payloads  # ids in input order
    counts = conn.execute(sql.SQL("SELECT sum(sent), count(*) FROM {}.queue_stat").format(s)).fetchone()
    assert counts == (60, 2)


@pytest.mark.parametrize(
    ("bad", "state", "message"),
    [
        ({"payload": None}, "LQ002", "message 25 has no payload"),
        ({"payload": b"x" * 11}, "LQ003", "message 25 payload is 11 bytes; queue 'q' allows at most 10"),
        ({"headers": Jsonb([1])}, "LQ002", "message 25 headers must be a JSON object"),
        ({"delay": -1}, "LQ002", "message 25 delay must be >= 0"),
        ({"priority": 101}, "LQ002", r"message 25 priority 101 is outside -100\.\.100"),
    ],
)
@pytest.mark.parametrize("path", ["plain", "general"])
def test_a_bad_batch_writes_nothing(
    client: Client, conn: Any, s: sql.Identifier, bad: dict[str, Any], state: str, message: str, path: str
) -> None:
    """The plain batch checks each message in the insert's own pass: a bad message (the 25th
    of 40, after 24 good ones) raises the general path's error, and nothing is written: no
    message, no queue_stat row."""
    client.create_queue("q", max_payload_bytes=10)
    payloads: list[bytes | None] = [b"ok"] * 40
    headers: list[Any] = [None] * 40
    delays: list[int | None] = [None] * 40
    prios: list[int | None] = [None] * 40
    payloads[24] = bad.get("payload", b"ok")
    headers[24] = bad.get("headers")
    delays[24] = bad.get("delay")
    prios[24] = bad.get("priority")
    channels = "array_fill(NULL::text, ARRAY[40])" if path == "general" else "NULL"
    stmt = sql.SQL(
        "SELECT * FROM {}.send_batch('q', %s::bytea[], p_headers => %s::jsonb[], p_delays_ms => %s::bigint[],"
        " p_priorities => %s::int2[], p_channels => " + channels + ")"  # type: ignore[operator]
    ).format(s)
    with pytest.raises(psycopg.Error, match=message) as info:
        conn.execute(stmt, (payloads, headers, delays, prios))
    assert info.value.sqlstate == state
    counts = conn.execute(
        sql.SQL("SELECT (SELECT count(*) FROM {s}.message), (SELECT count(*) FROM {s}.queue_stat)").format(
            s=s
        )
    ).fetchone()
    assert counts == (0, 0)


def test_plain_batch_to_an_unknown_queue_or_a_moved_generation(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    """What the plain batch's statement does not write goes on to the general path: an unknown
    queue raises LQ001; a generation sequence never called (pg_sequence_last_value NULL) sends
    through _gen_write, into the sequence's value."""
    with pytest.raises(psycopg.Error, match="queue 'nope' does not exist") as info:
        conn.execute(sql.SQL("SELECT * FROM {}.send_batch('nope', ARRAY['\\x01'::bytea])").format(s))
    assert info.value.sqlstate == "LQ001"
    client.create_queue("q")
    conn.execute(sql.SQL("SELECT setval('{}.message_gen_seq', 7, false)").format(s))
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        ids = [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT id FROM {}.send_batch('q', ARRAY['\\x01'::bytea, '\\x02'])").format(s)
            )
        ]
        assert _calls(conn, schema, "_gen_write") == 1
    gens = conn.execute(sql.SQL("SELECT gen FROM {}.message WHERE id = ANY(%s)").format(s), (ids,)).fetchall()
    assert gens == [(7,), (7,)]


# -- pop / take_tx -------------------------------------------------------------------------------


def test_pop_takes_in_order_and_only_in_the_callers_transaction(
    dsn: str, client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    client.create_queue("q")
    client.send("q", "c")
    client.send("q", "late", delay=3600)
    client.send("q", "a", priority=5)
    client.send("q", "b", priority=2)
    pop = sql.SQL("SELECT id, attempt, token, lease_until, payload FROM {}.pop('q', %s)").format(s)
    with psycopg.connect(dsn) as tx:
        tx.execute("SET track_functions = 'pl'")
        rows = tx.execute(pop, (2,)).fetchall()
        assert [bytes(r[4]) for r in rows] == [b"a", b"b"]
        assert all(r[1] == 1 and r[2] == 1 and r[3] is None for r in rows)
        assert _calls(tx, schema, "_lock_ready") == 0  # the lean DELETE
        # Others skip what this transaction holds.
        assert [bytes(r[4]) for r in conn.execute(pop, (5,)).fetchall()] == [b"c"]
        tx.rollback()
    # Rolled back: untouched.
    assert [m.payload for m in client.peek("q")] == ["a", "b", "late"]
    assert [m.payload for m in client.take_tx("q", 10)] == ["a", "b"]
    assert [m.payload for m in client.peek("q")] == ["late"]


def test_pop_of_a_paused_queue_returns_nothing(client: Client, conn: Any, s: sql.Identifier) -> None:
    client.create_queue("q", archive=True)
    client.send("q", 1)
    client.pause_queue("q")
    assert conn.execute(sql.SQL("SELECT * FROM {}.pop('q')").format(s)).fetchall() == []
    client.resume_queue("q")
    # pop never archives, whatever the queue says.
    assert [
        bytes(r[0]) for r in conn.execute(sql.SQL("SELECT payload FROM {}.pop('q')").format(s)).fetchall()
    ] == [b"1"]
    assert client.archived("q") == []


def test_pop_dead_letters_an_expired_last_lease_and_fills_the_batch(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    client.create_queue("q", max_attempts=1)
    client.send("q", "dies")
    now = _now(conn, s)
    conn.execute(sql.SQL("SELECT * FROM {}.take('q', 1, 1000, p_now => %s)").format(s), (now,))
    client.send("q", "next", at=now + 1500)  # after the expired lease, which comes first
    rows = conn.execute(sql.SQL("SELECT payload FROM {}.pop('q', 1, %s)").format(s), (now + 2000,)).fetchall()
    assert [bytes(r[0]) for r in rows] == [b"next"]
    assert [d.payload for d in client.dead_letters("q")] == ["dies"]


def test_pop_reads_the_frozen_generations_of_a_backlog(client: Client, conn: Any, s: sql.Identifier) -> None:
    client.create_queue("q")
    client.send_batch("q", list(range(30)))
    # Freeze the generation holding them (more than p_max_moves rows), then move on.
    for _ in range(3):
        conn.execute(sql.SQL("SELECT {}.rotate(p_force => true, p_max_moves => 5)").format(s))
    frozen = conn.execute(sql.SQL("SELECT gens FROM {}.message_gen_frozen").format(s)).fetchone()
    assert frozen is not None and frozen[0]
    client.send("q", "new")
    got: list[Any] = []
    while batch := client.take_tx("q", 7):
        got += [m.payload for m in batch]
    assert got == [*range(30), "new"]


# -- plans ---------------------------------------------------------------------------------------


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _statement(function: str, pattern: str, names: dict[str, str], schema: str, nth: int = 0) -> str:
    """The ``nth`` statement of ``function`` that ``pattern`` matches (its group 1), with the
    variables of ``names`` as parameters, for ``schema``."""
    body = function_text(function)
    matches = list(re.finditer(pattern, body, re.S))
    assert len(matches) > nth, f"the statement is not in {function}()"
    text = matches[nth][1]
    for name, param in names.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", param, text)
    unknown = re.findall(r"(?<![\w.])(?:p|v)_\w+|\bq\.(?!id\b|gen\b|priority_step_ms\b|mid\b)\w+", text)
    assert not unknown, f"{function}() statement uses {unknown}: teach this test about them"
    return sql.SQL(text).format(schema=sql.Identifier(schema), schema_name=sql.Literal(schema)).as_string()


def _generic_plan(conn: psycopg.Connection[Any], prepare: str, execute: str) -> dict[str, Any]:
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("SET enable_seqscan = off")  # as the functions run
    conn.execute("SET jit = off")
    conn.execute(prepare)  # type: ignore[arg-type]
    row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {execute}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def _assert_changed_by_ctid(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan of a lean path's statement (pop's DELETE, take(1)'s UPDATE): no sequential scan,
    the candidates from the dequeue index, the rows changed by ctid (TID scans). Its nodes."""
    nodes = list(_nodes(plan))
    assert not [x for x in nodes if x["Node Type"] == "Seq Scan"], plan
    changes = [x for x in nodes if x["Node Type"] == "Tid Scan"]
    assert changes and all(re.match(r"\(ctid = (ANY|\$)", x.get("TID Cond", "")) for x in changes), plan
    candidates = [x for x in nodes if x.get("Index Name", "").startswith("message_logged_gen")]
    assert candidates, plan
    return nodes


#: The lean send's statements in send(): without a send key (one INSERT ... SELECT from the
#: queue's row) and with one (the queue's row in a CTE that both inserts read).
PLAIN_SEND = r"IF p_send_key IS NULL THEN\s+(?:--[^\n]*\n\s*)*RETURN QUERY\s+(WITH ins AS .*?FROM ins);"
KEYED_SEND = r"\bELSE\s+(?:--[^\n]*\n\s*)*RETURN QUERY\s+(WITH q AS .*?FROM ins);"


@pytest.mark.parametrize("keyed", [False, True])
def test_plan_of_the_lean_send(
    client: Client, conn: Any, schema: str, s: sql.Identifier, keyed: bool
) -> None:
    """The plain send's statements (without a send key and with one): the queue found through
    its name's unique index, no sequential scan anywhere (the generation is read by
    pg_sequence_last_value, not a scan of its sequence), with 300 queues analysed. Without a
    key the statement reads and writes nothing but the queue, message and queue_stat: no
    send_key (issue 12). Every node costs its start-up at every call: the plain statement is
    the insert of a join of the queue's row and the locks' subquery (no CTE for the queue, no
    subquery scan for the insert's SELECT), plus the queue_stat insert."""
    for i in range(300):
        client.create_queue(f"q{i}")
    conn.execute(sql.SQL("ANALYZE {}.queue").format(s))
    names = {
        "p_queue": "$1",
        "p_payload": "$2",
        "v_at": "$3",
        "p_priority": "$4",
        "v_now": "$5",
        "p_kind": "$6",
        "p_content_type": "$7",
        "p_headers": "$8",
        "p_send_key": "$9",
        "v_gen": "$10",
    }
    types = "text, bytea, bigint, smallint, bigint, text, text, jsonb, uuid, bigint"
    stmt = _statement("send", KEYED_SEND if keyed else PLAIN_SEND, names, schema)
    key = "'0193a5b0-0000-7000-8000-000000000001'" if keyed else "NULL"
    plan = _generic_plan(
        conn,
        f"PREPARE lean_send({types}) AS {stmt}",
        f"lean_send('q7', '\\x00', 0, 0, 0, NULL, NULL, NULL, {key}, 1)",
    )
    nodes = list(_nodes(plan))
    assert not [x for x in nodes if x["Node Type"] == "Seq Scan"], plan
    # Under enable_seqscan = off a sequential scan would cost 1e10: no plan near jit_above_cost
    # (send() has no jit = off).
    assert plan["Total Cost"] < 1000, plan
    [lookup] = [x for x in nodes if x.get("Relation Name") == "queue"]
    assert lookup["Node Type"] in ("Index Scan", "Index Only Scan"), lookup
    assert lookup["Index Name"] == "queue_name_key"
    # _send_ok() inlined: its locks are the filter's own calls, no call of a function.
    assert "pg_advisory_xact_lock_shared" in lookup["Filter"], lookup
    assert "_send_ok" not in lookup["Filter"], lookup
    relations = {x["Relation Name"] for x in nodes if "Relation Name" in x}
    assert relations == {"queue", "message", "queue_stat"} | ({"send_key"} if keyed else set())
    if not keyed:
        # The queue's index scan does the checks, locks and wake-up in its filter: no join to
        # a subquery of the locks (a nested loop, a subquery scan and a result node before).
        assert [x["Node Type"] for x in nodes] == [
            "CTE Scan",  # ins, returned
            "ModifyTable",  # message
            "Index Scan",  # queue, the checks and locks in its filter
            "ModifyTable",  # queue_stat
            "CTE Scan",  # ins, counted
        ], plan
    else:
        assert len(nodes) <= 11, plan
        assert not [x for x in nodes if x.get("Alias") == "*SELECT*"], plan
        assert not [x for x in nodes if x["Node Type"] in ("Subquery Scan", "Result")], plan


def test_send_reads_the_generation_and_holds_it(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    """The lean send reads the generation with pg_sequence_last_value, which is NULL for a
    sequence never called: that send takes send_batch's path (_gen_write), which puts the
    message in the sequence's value. Either way the transaction holds the generation's
    advisory lock (shared) until it ends, as _gen_write's callers do."""
    client.create_queue("q")
    conn.execute("SET track_functions = 'pl'")
    # (the sequence's value, whether it was called, whether the send takes send_batch's path)
    for value, called, fallback in ((7, False, True), (9, True, False)):
        conn.execute(sql.SQL("SELECT setval('{}.message_gen_seq', %s, %s)").format(s), (value, called))
        for send_key in (None, f"0193a5b0-0000-7000-8000-00000000000{value}"):
            with conn.transaction():
                calls = _calls(conn, schema, "send_batch")  # pending counts may hold earlier ones
                [(mid, outcome)] = conn.execute(
                    sql.SQL("SELECT * FROM {}.send('q', '\\x01', p_send_key => %s)").format(s), (send_key,)
                ).fetchall()
                assert outcome == "created"
                assert _calls(conn, schema, "send_batch") == calls + fallback
                assert _gen_held(conn, schema, value)
            row = conn.execute(
                sql.SQL("SELECT gen FROM {}.message WHERE id = %s").format(s), (mid,)
            ).fetchone()
            assert row == (value,)


def test_the_keyed_send_is_the_plain_send_with_its_key_row() -> None:
    """send() has two copies of its statement (a statement naming send_key pays for it at every
    start-up, key or none): the same queue row, locks and checks, the same message and
    queue_stat rows; the keyed one reads them through q and inserts the key's row first."""
    body = function_text("send")

    def statement(pattern: str) -> str:
        match = re.search(pattern, body, re.S)
        assert match, pattern
        return " ".join(re.sub(r"--[^\n]*", "", match[1]).split())

    plain = statement(PLAIN_SEND)
    keyed = statement(KEYED_SEND)
    lookup = r"FROM \{schema\}\.queue x WHERE x\.name = p_queue AND \{schema\}\._send_ok\([^)]*\)"
    [plain_lookup] = re.findall(lookup, plain)
    [keyed_lookup] = re.findall(lookup, keyed)
    assert plain_lookup == keyed_lookup
    columns = (
        "{schema}._dequeue_at(v_at, p_priority, Q.priority_step_ms, v_now), v_at, v_now, p_priority,"
        " p_kind, p_content_type, p_headers, p_payload"
    )
    assert "SELECT x.id, v_gen, " + columns.replace("Q.", "x.") + " " + plain_lookup in plain
    assert (
        "SELECT q.id, q.mid, v_gen, " + columns.replace("Q.", "q.") + " FROM q JOIN k ON k.queue_id = q.id"
        in keyed
    )
    assert (
        "SELECT x.id, x.priority_step_ms, nextval('{schema}.message_id_seq') AS mid " + keyed_lookup in keyed
    )
    assert re.search(
        r"k AS \( INSERT INTO \{schema\}\.send_key AS k .*? SELECT q\.id, p_send_key, v_now, ARRAY\[q\.mid\] FROM q ON CONFLICT",
        keyed,
    )
    tail = (
        "RETURNING m.id, m.queue_id ), st AS ( INSERT INTO {schema}.queue_stat (queue_id, minute, sent)"
        " SELECT ins.queue_id, v_now / 60000, 1 FROM ins ) SELECT ins.id, 'created'::text FROM ins"
    )
    assert plain.endswith(tail) and keyed.endswith(tail)


def test_a_plain_send_opens_no_send_key(client: Client, conn: Any, schema: str, s: sql.Identifier) -> None:
    """What a plain send's transaction locks: the queue, the generation's sequence, message
    and queue_stat (and their indexes and partitions), never send_key (whose insert a keyed
    send's claim alone carries); a keyed send locks send_key."""
    client.create_queue("q")

    def locked(send_key: str | None) -> set[str]:
        with conn.transaction():
            conn.execute(
                sql.SQL("SELECT * FROM {}.send('q', '\\x01', p_send_key => %s)").format(s), (send_key,)
            )
            rows = conn.execute(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND c.relnamespace = %s::regnamespace",
                (schema,),
            ).fetchall()
        return {r[0] for r in rows}

    plain = locked(None)
    assert "message_pkey" in plain or any(n.startswith("message") for n in plain), plain
    assert "queue_stat" in plain, plain
    assert not [n for n in plain if n.startswith("send_key")], plain
    keyed = locked("0193a5b0-0000-7000-8000-000000000002")
    assert "send_key" in keyed, keyed


def test_plan_of_the_lean_pop(client: Client, conn: Any, schema: str, s: sql.Identifier) -> None:
    """The DELETE of pop/take_tx: the candidates from the dequeue index in order, the rows
    deleted by ctid (a TID scan: never a scan of the queue's part of the primary key), no
    sequential scan."""
    client.create_queue("other")
    client.create_queue("q")
    for _ in range(5):
        client.send_batch("q", [b"x"] * 1000)
        client.send_batch("other", [b"x"] * 1000)
    conn.execute(sql.SQL("ANALYZE {}.message").format(s))
    qid = conn.execute(sql.SQL("SELECT id FROM {}.queue WHERE name = 'q'").format(s)).fetchone()[0]
    gen = conn.execute(sql.SQL("SELECT last_value FROM {}.message_gen_seq").format(s)).fetchone()[0]
    names = {
        "q.id": "$1",
        "v_gen": "$2",
        "v_now": "$3",
        "p_limit": "$4",
        "q.max_attempts": "$5",
        "v_held_tid": "$6",
        "v_held": "$7",
        "v_held_ats": "$8",
        "v_held_ok": "$9",
        # take_tx's lean pop reads the queue's fields from the record its first statement filled.
        "v_head.qid": "$1",
        "v_head.gen": "$2",
        "v_head.now": "$3",
        "v_head.max_attempts": "$5",
        "v_head.frozen": "$6",  # (the frozen copy's: the queue's one frozen generation)
    }
    now = _now(conn, s)
    # The general DELETE, and the one-message DELETE (no frozen generation): rows by ctid.
    general = r"RETURN QUERY\s+(WITH d AS \(\s+DELETE .*?ORDER BY d\.dequeue_at, d\.id);"
    one = r"RETURN QUERY\s+(DELETE FROM .*?m\.last_error, m\.payload);"
    cases = [
        (
            "lean_pop",
            general,
            "integer, bigint, bigint, integer, integer, tid[], bigint[], bigint[], boolean[]",
            f"{qid}, {gen}, {now}, 10, 5, '{{}}', '{{}}', '{{}}', '{{}}'",
        ),
        (
            "lean_pop_one",
            one,
            "integer, bigint, bigint, integer, integer",
            f"{qid}, {gen}, {now}, 1, 5",
        ),
        # Its copy with the queue's one frozen generation as a third candidate range.
        (
            "lean_pop_one_frozen",
            one,
            "integer, bigint, bigint, integer, integer, bigint[]",
            f"{qid}, {gen}, {now}, 1, 5, '{{0}}'",
        ),
        # The same over the partitioned table (an UNLOGGED queue's).
        (
            "lean_pop_one_unlogged",
            one,
            "integer, bigint, bigint, integer, integer",
            f"{qid}, {gen}, {now}, 1, 5",
        ),
    ]
    for name, pattern, types, args in cases:
        nth = {"lean_pop_one_frozen": 1, "lean_pop_one_unlogged": 2}.get(name, 0)
        stmt = _statement("take_tx", pattern, names, schema, nth)
        plan = _generic_plan(conn, f"PREPARE {name}({types}) AS {stmt}", f"{name}({args})")
        nodes = _assert_changed_by_ctid(plan)
        # Nothing read from the primary key.
        assert not [x for x in nodes if "_pkey" in x.get("Index Name", "")], plan


def test_a_null_priority_takes_send_batch_and_sends_at_priority_0(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    """send() checks p_priority itself (no variable for coalesce(p_priority, 0): each costs
    its set-up in every transaction): an explicit NULL takes send_batch's path, which sends the
    message at priority 0, as send() always has."""
    client.create_queue("q")
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        [(mid, outcome)] = conn.execute(
            sql.SQL("SELECT * FROM {}.send('q', 'a'::bytea, p_priority => NULL)").format(s)
        ).fetchall()
        assert _calls(conn, schema, "send_batch") == 1
    assert outcome == "created"
    row = conn.execute(sql.SQL("SELECT priority FROM {}.message WHERE id = %s").format(s), (mid,)).fetchone()
    assert row == (0,)
