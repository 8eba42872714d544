"""take_tx(queue, 1)'s lean pop (sql/take.sql): the first statement reads the queue and says
whether the call may take it (lean: one message of an ordinary queue, not paused, without
channels or archiving, no frozen generation), and one DELETE then deletes the first ready
message. Every other call, and a lean pop that deleted nothing, goes on as before: these
tests pin what each of those cases hands out (the lean DELETE alone would get each wrong)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_take_lean import _last_attempt_leased

from lonnymq import Client
from lonnymq.errors import QueueNotFound


def _pop(conn: Any, s: sql.Identifier, queue: str, now: int | None = None, **kw: Any) -> list[bytes]:
    args = sql.SQL("").join(
        sql.SQL(", {} => {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in kw.items()
    )
    stmt = sql.SQL("SELECT payload FROM {}.take_tx({}, 1, p_now => {}{})").format(
        s, sql.Literal(queue), sql.Literal(now), args
    )
    return [bytes(r[0]) for r in conn.execute(stmt).fetchall()]


def test_pop_delivers_in_order_and_deletes(client: Client, conn: Any, schema: str) -> None:
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"1", b"2", b"3"])
    assert [_pop(conn, s, "q") for _ in range(4)] == [[b"1"], [b"2"], [b"3"], []]
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (0,)
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.archive").format(s)).fetchone() == (0,)


def test_pop_takes_the_row_of_a_frozen_generation_first(client: Client, conn: Any, schema: str) -> None:
    """A queue with a frozen generation (a backlog a rotation could not move: generations.sql)
    is not the lean pop's: its frozen row, due first, is delivered before the window's."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"window"])
    frozen = client.send("q", b"frozen")
    [(qid, gen)] = conn.execute(
        sql.SQL("SELECT q.id, g.last_value FROM {}.queue q, {}.message_gen_seq g WHERE q.name = 'q'").format(
            s, s
        )
    ).fetchall()
    conn.execute(
        sql.SQL(
            "UPDATE {}.message SET gen = %s, dequeue_at = dequeue_at - 1000 WHERE queue_id = %s AND id = %s"
        ).format(s),
        (gen - 5, qid, frozen.id),
    )
    conn.execute(
        sql.SQL("INSERT INTO {}.message_gen_frozen (queue_id, gens) VALUES (%s, ARRAY[%s::bigint])").format(
            s
        ),
        (qid, gen - 5),
    )
    assert _pop(conn, s, "q") == [b"frozen"]
    assert _pop(conn, s, "q") == [b"window"]


def test_pop_dead_letters_an_expired_last_attempt_and_delivers_the_next(
    client: Client, conn: Any, schema: str
) -> None:
    """The first candidate's lease expired on its last attempt: the lean DELETE deletes nothing,
    the general path dead-letters it and the same call delivers the next message."""
    s = sql.Identifier(schema)
    now, _ = _last_attempt_leased(client, conn, s)
    assert _pop(conn, s, "q", now + 2000) == [b"2"]
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (0,)
    assert conn.execute(sql.SQL("SELECT sum(dead) FROM {}.queue_stat").format(s)).fetchone() == (1,)


@pytest.mark.parametrize("archive", [None, True, False])
def test_pop_of_an_archiving_queue_archives_unless_told_not_to(
    client: Client, conn: Any, schema: str, archive: bool | None
) -> None:
    s = sql.Identifier(schema)
    client.create_queue("q", archive=True)
    client.send_batch("q", [b"1"])
    kw = {} if archive is None else {"p_archive": archive}
    assert _pop(conn, s, "q", **kw) == [b"1"]
    archived = conn.execute(sql.SQL("SELECT status FROM {}.archive").format(s)).fetchall()
    assert archived == ([] if archive is False else [("acked",)])


def test_pop_of_an_ordinary_queue_told_to_archive_archives(client: Client, conn: Any, schema: str) -> None:
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"1"])
    assert _pop(conn, s, "q", p_archive=True) == [b"1"]
    assert conn.execute(sql.SQL("SELECT status FROM {}.archive").format(s)).fetchall() == [("acked",)]


def test_pop_of_a_paused_queue_and_of_a_channel_queue(client: Client, conn: Any, schema: str) -> None:
    s = sql.Identifier(schema)
    client.create_queue("p")
    client.send_batch("p", [b"1"])
    conn.execute(sql.SQL("SELECT {}.queue_pause('p')").format(s))
    assert _pop(conn, s, "p") == []
    client.create_queue("c")
    client.send("c", b"c1", channel="x")
    client.send("c", b"c2", channel="x")
    assert _pop(conn, s, "c") == [b"c1"]
    [(size,)] = conn.execute(sql.SQL("SELECT current_size FROM {}.channel").format(s)).fetchall()
    assert size == 1  # the channel path counted the message out


def test_pop_of_an_unknown_queue_raises(client: Client) -> None:
    with pytest.raises(QueueNotFound):
        client.take_tx("nope", 1)


def test_a_pop_or_take_short_of_messages_calls_no_sql_function(
    client: Client, conn: Any, schema: str
) -> None:
    """A pop or take that got fewer messages than asked looks for an expired lease the general
    path must deal with (_undeliverable_ready). That was a SQL function, which PostgreSQL never
    inlines when its body has a sub-select: each call went through fmgr_sql, which plans its
    statement at every call (an empty pop did 3.1x a pop's instructions). It is PL/pgSQL now,
    its plan cached: no SQL function is called (track_functions counts only those not inlined)."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"1", b"2"])
    conn.execute("SET track_functions = 'all'")
    with conn.transaction():
        assert _pop(conn, s, "q") == [b"1"]
        take = sql.SQL("SELECT payload FROM {}.take('q', 5)").format(s)
        assert [bytes(r[0]) for r in conn.execute(take).fetchall()] == [b"2"]  # fewer than asked
        assert _pop(conn, s, "q") == []  # an empty pop
        called = conn.execute(
            "SELECT f.funcname, f.calls FROM pg_stat_xact_user_functions f"
            " JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang"
            " WHERE f.schemaname = %s AND l.lanname = 'sql'",
            [schema],
        ).fetchall()
    assert called == []


def test_the_short_pop_check_reads_the_lease_index_after_the_table_fills(
    client: Client, conn: Any, schema: str
) -> None:
    """That check's plan is cached with take_tx's: one planned while the table was empty, then
    kept while it fills (no ANALYZE yet), must still read the partial index of leases, not walk
    the dequeue index (whose first column is the generation) past every message of the table."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.create_queue("e")
    conn.execute(sql.SQL("ALTER TABLE {}.message_logged SET (autovacuum_enabled = false)").format(s))
    assert _pop(conn, s, "e") == []  # plans the check on the empty table
    client.send_batch("q", [b"x"] * 3000)
    # The check's own plan, by auto_explain (nested statements logged as notices). The embedded
    # PostgreSQL 16 does not ship it: there the test is skipped; CI's PostgreSQL 15 pass runs it.
    # (A bound on the buffers the whole pop reads is no substitute: a generation's rotation or
    # sweep on the real clock, inside the same call, reads hundreds.)
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.UndefinedFile:
        pytest.skip("auto_explain is not installed on this server (the embedded PostgreSQL 16)")
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
        conn.execute("SET auto_explain." + setting)
    assert _pop(conn, s, "e") == []
    [check] = [p for p in plans if "m.leased" in p]
    assert "queue_id_channel_dequeue_at_idx" in check
    assert "gen_queue_id_dequeue_at_id_idx" not in check
