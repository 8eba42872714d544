"""send_plain_once (issue 12): a plain message with an idempotency key (a send key) in one lean
statement, send()'s keyed statement with send_plain's defaults, returning the new id: a repeat
of the key creates nothing and returns the first id, concurrent repeats create one message, a
key maintain() forgot (past lonnymq.send_key_retention) sends again; a pooled Client with its
default retry policy (which keys every send) calls it for a plain message."""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from test_send_lean import KEYED_SEND, _calls, _gen_held, _now
from test_send_plain import ERRORS, _flat, _row, plain_plan

from lonnymq import Client
from lonnymq.sql import function_text

#: send_plain_once's statement (the queue's row in q, the key's row, the message, its counter).
ONCE = r"IF p_send_key IS NOT NULL THEN\s+(WITH q AS .*?SELECT ins\.id) INTO v_id FROM ins;"


@pytest.fixture
def s(schema: str) -> sql.Identifier:
    return sql.Identifier(schema)


def _once(conn: psycopg.Connection[Any], s: sql.Identifier, key: uuid.UUID | None, *args: Any) -> int | None:
    rest = "".join(", %s" for _ in args)
    row = conn.execute(
        sql.SQL("SELECT {}.send_plain_once(%s, %s::bytea, %s::uuid" + rest + ")").format(s),  # type: ignore[operator]
        ("q", b"x", key, *args),
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _written(conn: psycopg.Connection[Any], s: sql.Identifier) -> tuple[int, int, int]:
    """(messages, messages counted as sent in queue_stat, send keys recorded)."""
    row = conn.execute(
        sql.SQL(
            "SELECT (SELECT count(*) FROM {s}.message), (SELECT coalesce(sum(sent), 0) FROM {s}.queue_stat),"
            " (SELECT count(*) FROM {s}.send_key)"
        ).format(s=s)
    ).fetchone()
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


def test_a_repeat_returns_the_first_id_and_creates_nothing(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    client.create_queue("q")
    key = uuid.uuid4()
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        first = _once(conn, s, key)
        assert _calls(conn, schema, "send_batch") == 0  # its own statement
    assert isinstance(first, int)
    with conn.transaction():
        again = _once(conn, s, key, "text/plain", "other")  # the key names the call
        assert _calls(conn, schema, "send_batch") == 1  # the replay is send_batch's
    assert again == first
    assert _written(conn, s) == (1, 1, 1)
    # The key's row is send()'s: the id, every outcome 'created' (NULL).
    row = conn.execute(sql.SQL("SELECT key, ids, outcomes FROM {}.send_key").format(s)).fetchone()
    assert row == (key, [first], None)
    # send() with the key replays it too (and send_plain_once a key send() recorded).
    [(by_send, outcome)] = conn.execute(
        sql.SQL("SELECT * FROM {}.send('q', 'x'::bytea, p_send_key => %s)").format(s), (key,)
    ).fetchall()
    assert (by_send, outcome) == (first, "created")
    other = uuid.uuid4()
    [(recorded, _)] = conn.execute(
        sql.SQL("SELECT * FROM {}.send('q', 'y'::bytea, p_send_key => %s)").format(s), (other,)
    ).fetchall()
    assert _once(conn, s, other) == recorded
    # A different key: a new message.
    third = _once(conn, s, uuid.uuid4())
    assert third is not None and third > recorded > first
    assert _written(conn, s) == (3, 3, 3)


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_repeats_of_a_key_create_one_message(
    client: Client, dsn: str, conn: Any, s: sql.Identifier, first_commits: bool
) -> None:
    """A repeat that runs while the first call's transaction is open waits for it on the key's
    index entry: then returns its id (committed) or sends itself (rolled back)."""
    client.create_queue("q")
    key = uuid.uuid4()
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        [(pid,)] = second.execute("SELECT pg_backend_pid()").fetchall()
        mine = _once(first, s, key)  # its transaction stays open

        def repeat() -> None:
            try:
                out["id"] = _once(second, s, key)
            except BaseException as e:  # handed to the test thread
                out["error"] = e

        t = threading.Thread(target=repeat)
        t.start()
        deadline = time.monotonic() + 10
        while not conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
        ).fetchone():
            assert time.monotonic() < deadline, "the repeat never waited for the first call"
            assert t.is_alive(), out
        if first_commits:
            first.commit()
        else:
            first.rollback()
        t.join(10)
    assert "error" not in out, out
    assert (out["id"] == mine) is first_commits
    assert _written(conn, s) == (1, 1, 1)
    row = conn.execute(sql.SQL("SELECT ids FROM {}.send_key").format(s)).fetchone()
    assert row == ([out["id"]],)


def test_a_key_past_its_retention_sends_again(client: Client, conn: Any, s: sql.Identifier) -> None:
    client.create_queue("q")
    key = uuid.uuid4()
    first = _once(conn, s, key)
    after = _now(conn, s)  # the key's at_ms is at most this
    maintain = sql.SQL("SELECT {}.maintain(p_now => %s)").format(s)
    assert _once(conn, s, key) == first  # within the retention (1 hour)
    conn.execute("SET lonnymq.send_key_retention = '10 minutes'")
    conn.execute(maintain, (after + 600_001,))
    assert _written(conn, s)[2] == 0
    second = _once(conn, s, key)  # forgotten: sends again
    assert second is not None and first is not None and second > first
    assert _written(conn, s) == (2, 2, 1)


@pytest.mark.parametrize(("args", "state", "message"), ERRORS)
def test_send_plain_once_raises_what_send_raises(
    client: Client, conn: Any, s: sql.Identifier, args: dict[str, Any], state: str, message: str
) -> None:
    """The errors of send() with a key; nothing written, the key's row neither."""
    client.create_queue("q", max_payload_bytes=10)
    call = {"p_queue": "q", "p_payload": b"x", "p_send_key": uuid.uuid4(), **args}
    stmt = sql.SQL(
        "SELECT {}.send_plain_once(p_queue => %s, p_payload => %s::bytea, p_send_key => %s)"
    ).format(s)
    with pytest.raises(psycopg.Error, match=message) as info:
        conn.execute(stmt, list(call.values()))
    assert info.value.sqlstate == state
    assert _written(conn, s) == (0, 0, 0)


def test_without_a_key_it_sends_without_one(client: Client, conn: Any, s: sql.Identifier) -> None:
    client.create_queue("q")
    a, b = _once(conn, s, None), _once(conn, s, None)
    assert a is not None and b is not None and b > a
    assert _written(conn, s) == (2, 2, 0)


@pytest.mark.parametrize(
    "args",
    [(), ("text/plain",), ("application/json", "job.run"), (None, "k")],
    ids=["payload", "ct", "both", "kind"],
)
@pytest.mark.parametrize("queue", ["q", "u"])
def test_send_plain_once_writes_what_send_writes(
    client: Client, conn: Any, schema: str, s: sql.Identifier, args: tuple[Any, ...], queue: str
) -> None:
    client.create_queue("q", priority_step=2)
    client.create_queue("u", unlogged=True, priority_step=2)
    rest = "".join(", %s" for _ in args)
    keys = uuid.uuid4(), uuid.uuid4()
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        [(a,)] = conn.execute(
            sql.SQL("SELECT {}.send_plain_once(%s, %s::bytea, %s" + rest + ")").format(s),  # type: ignore[operator]
            (queue, b"x", keys[0], *args),
        ).fetchall()
        assert _calls(conn, schema, "send_batch") == 0 and _calls(conn, schema, "send") == 0
    named = ", ".join(["p_content_type => %s", "p_kind => %s"][: len(args)])
    with conn.transaction():
        [(b, outcome)] = conn.execute(
            sql.SQL(
                "SELECT * FROM {}.send(%s, %s::bytea, p_send_key => %s" + (", " + named if args else "") + ")"
            ).format(s),  # type: ignore[operator]
            (queue, b"x", keys[1], *args),
        ).fetchall()
        assert outcome == "created" and _calls(conn, schema, "send_batch") == 0
    assert isinstance(a, int) and b > a and _row(conn, s, a) == _row(conn, s, b)
    rows = conn.execute(
        sql.SQL("SELECT key, ids, outcomes, at_ms <= {}.now_ms() FROM {}.send_key ORDER BY ids").format(s, s)
    ).fetchall()
    assert rows == [(keys[0], [a], None, True), (keys[1], [b], None, True)]
    stats = conn.execute(sql.SQL("SELECT sent FROM {}.queue_stat").format(s)).fetchall()
    assert stats == [(1,), (1,)]  # one appended counter row per call, as send's


def test_send_plain_once_reads_the_generation_and_holds_it(
    client: Client, conn: Any, schema: str, s: sql.Identifier
) -> None:
    """As send(): a generation that moved (a sequence never called reads NULL) takes
    send_batch's path, which records the key too; either way the generation is held."""
    client.create_queue("q")
    conn.execute("SET track_functions = 'pl'")
    for value, called, fallback in ((7, False, True), (9, True, False)):
        conn.execute(sql.SQL("SELECT setval('{}.message_gen_seq', %s, %s)").format(s), (value, called))
        key = uuid.uuid4()
        with conn.transaction():
            calls = _calls(conn, schema, "send_batch")
            mid = _once(conn, s, key)
            assert _calls(conn, schema, "send_batch") == calls + fallback
            assert _gen_held(conn, schema, value)
        assert conn.execute(
            sql.SQL("SELECT gen FROM {}.message WHERE id = %s").format(s), (mid,)
        ).fetchone() == (value,)
        assert _once(conn, s, key) == mid  # recorded either way


def test_send_plain_once_is_sends_keyed_statement() -> None:
    """The two copies of the keyed plain send (send()'s takes headers, times and a priority;
    send_plain_once's writes the defaults): the same queue lookup, checks, locks and wake-up,
    the same key row, the same queue_stat row."""
    send = re.search(KEYED_SEND, function_text("send"), re.S)
    once = re.search(ONCE, function_text("send_plain_once"), re.S)
    assert send and once
    a, b = _flat(send[1]), _flat(once[1])
    lookup = r"FROM \{schema\}\.queue x WHERE x\.name = p_queue AND \{schema\}\._send_ok\([^)]*\)"
    assert re.findall(lookup, a) == re.findall(lookup, b) and len(re.findall(lookup, b)) == 1
    key = re.compile(r"k AS \( INSERT INTO \{schema\}\.send_key .*? RETURNING k\.queue_id \)")
    assert key.findall(a) == key.findall(b) and len(key.findall(b)) == 1
    tail = (
        "FROM q JOIN k ON k.queue_id = q.id RETURNING m.id, m.queue_id ), st AS ( INSERT INTO"
        " {schema}.queue_stat (queue_id, minute, sent) SELECT ins.queue_id, v_now / 60000, 1 FROM ins )"
        " SELECT ins.id"
    )
    assert tail in a and b.endswith(tail)
    assert "nextval('{schema}.message_id_seq') AS mid " in a
    assert b.startswith("WITH q AS ( SELECT x.id, nextval('{schema}.message_id_seq') AS mid ")
    assert (
        "INSERT INTO {schema}.message AS m (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, kind,"
        " content_type, payload) SELECT q.id, q.mid, v_gen, v_now, v_now, v_now, p_kind, p_content_type,"
        " p_payload "
    ) in b
    # The fallback is send()'s: send_batch with the same message and key.
    assert (
        "{schema}.send_batch(p_queue, ARRAY[p_payload], ARRAY[p_kind], ARRAY[p_content_type],"
        " p_send_key => p_send_key)"
    ) in _flat(function_text("send_plain_once"))


def test_plan_of_send_plain_once(client: Client, conn: Any, schema: str, s: sql.Identifier) -> None:
    """send()'s keyed plan (test_send_lean.test_plan_of_the_lean_send): the queue by its name's
    unique index, _send_ok inlined into its filter, no sequential scan, and nothing but the
    queue, send_key, message and queue_stat."""
    variables = {"p_queue": "text", "p_payload": "bytea", "p_send_key": "uuid", "v_now": "bigint"}
    values = "'q7', '\\x00', '0193a5b0-0000-7000-8000-000000000001', 0"
    nodes = plain_plan(client, conn, schema, s, "send_plain_once", ONCE, variables, values)
    assert {x["Relation Name"] for x in nodes if "Relation Name" in x} == {
        "queue",
        "send_key",
        "message",
        "queue_stat",
    }
    assert len(nodes) <= 11, nodes
    assert not [x for x in nodes if x["Node Type"] in ("Subquery Scan", "Result")], nodes


def test_the_default_clients_plain_send_is_send_plain_once(dsn: str, conn: Any) -> None:
    """A pooled Client with its default retry policy keys every send (idempotent_sends): its
    plain messages go through send_plain_once, one call each, never send() or send_batch; a
    message with options still goes through send(). In a schema of its own, migrated here, so
    that no other session's function counts mix in."""
    tag = uuid.uuid4().hex[:12]
    schema = f"t_once_{tag}"
    tracked = make_conninfo(dsn, options="-c track_functions=all", application_name=f"once_{tag}")
    try:
        with Client(tracked, schema=schema, pool_size=1) as c:
            assert c.retry is not None and c.idempotent_sends  # the defaults
            c.migrate()
            c.create_queue("q")
            sent = [c.send("q", {"n": 1}), c.send("q", b"raw", kind="job"), c.send("q", "x", priority=1)]
            [(pid,)] = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"once_{tag}",)
            ).fetchall()
        # A backend flushes its function counts as it exits, before it leaves pg_stat_activity.
        deadline = time.monotonic() + 10
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the client's backend did not exit"
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = dict(
            conn.execute(
                "SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = %s"
                " AND funcname IN ('send', 'send_plain', 'send_plain_once', 'send_batch')",
                (schema,),
            ).fetchall()
        )
        assert calls == {"send_plain_once": 2, "send": 1}
        assert [r.outcome for r in sent] == ["created"] * 3
        s = sql.Identifier(schema)
        keys = conn.execute(sql.SQL("SELECT count(*) FROM {}.send_key").format(s)).fetchone()
        assert keys == (3,)  # each send's key, recorded
    finally:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
