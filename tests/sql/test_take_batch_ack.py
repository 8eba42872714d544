"""take(n, ack=previous)'s batch ack of an ordinary queue (sql/take.sql): the deliveries deleted
in take's own statement, without _ack's frame, its lock of each row first and its second
statement; what is left over (repeats, stale tokens, a row another transaction changed while the
statement waited for it) goes to _ack, the general path. What it does when another transaction
holds one of its rows. (Its plan under the statistics that misled joins of the ids with the
message table, settle.sql's header: test_take_ack_scan.py.)"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_dead_paths import _wait_until_blocked

from lonnymq import Client, Envelope, Message
from lonnymq.sql import function_text

#: take()'s variables in the statement, as the parameters of _generic_plan.
_NAMES = {"q.id": "$1", "p_ack_ids": "$2", "p_ack_tokens": "$3", "v_now": "$4"}
#: take()'s batch ack of an ordinary queue (pairs of one token; a batch of mixed tokens goes to
#: _ack whole: test_take_ack_scan.py).
BATCH_ACK = (
    r"(WITH d AS \(\s+DELETE FROM \{schema\}\.message_logged m\s+USING \(SELECT k\.tid\s+FROM .*?)"
    r"\s+INTO v_\w+, v_channels\s+(FROM d);"
)


def _statement(schema: str, pattern: str = BATCH_ACK) -> str:
    """take()'s batch ack (or the statement of take() ``pattern`` finds), its variables as
    parameters, for ``schema``."""
    [match] = re.finditer(pattern, function_text("take"), re.S)
    text = f"{match[1]} {match[2]}"
    for name, param in _NAMES.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", param, text)
    unknown = re.findall(r"(?<![\w.])(?:p|v)_\w+|\bq\.\w+", text)
    assert not unknown, f"take()'s batch ack uses {unknown}: teach this test about them"
    return sql.SQL(text).format(schema=sql.Identifier(schema)).as_string()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _generic_plan(conn: psycopg.Connection[Any], stmt: str, args: str) -> dict[str, Any]:
    """The generic plan of ``stmt`` with take()'s settings (its SET clauses)."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("SET enable_seqscan = off")
    conn.execute("SET enable_sort = off")
    conn.execute("SET jit = off")
    conn.execute("SET enable_memoize = off")
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE batch_ack(integer, bigint[], integer[], bigint) AS {stmt}")  # type: ignore[arg-type]
    row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE batch_ack({args})").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


@pytest.fixture(params=["empty", "leased since analysed", "held snapshot"])
def statistics(request: pytest.FixtureRequest, dsn: str, client: Client, schema: str) -> Iterator[int]:
    """Queue "q" with message's statistics as the parameter says: analysed empty; analysed with
    4,000 ready messages, 3,000 of them leased since; or analysed while another session holds
    a snapshot, after 2,000 messages went through (a handful of live rows, thousands of dead
    entries). Yields the queue's id."""
    client.create_queue("q", lease=3600)
    table = sql.Identifier(schema, "message_logged")
    with psycopg.connect(dsn, autocommit=True) as admin, psycopg.connect(dsn) as holder:
        admin.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(table))
        if request.param == "leased since analysed":
            client.send_batch("q", [b"x"] * 4000)
            admin.execute(sql.SQL("ANALYZE {}").format(table))
            client.take("q", 3000)
        elif request.param == "held snapshot":
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            for _ in range(20):
                client.send_batch("q", [b"x"] * 100)
                client.ack(client.take("q", 100))
            client.send_batch("q", [b"y"] * 5)
            admin.execute(sql.SQL("ANALYZE {}").format(table))
        else:
            admin.execute(sql.SQL("ANALYZE {}").format(table))
        [(qid,)] = admin.execute(
            sql.SQL("SELECT id FROM {} WHERE name = 'q'").format(sql.Identifier(schema, "queue"))
        ).fetchall()
        yield qid
        holder.rollback()


def _ack_calls(conn: psycopg.Connection[Any], schema: str) -> int:
    """How many times this transaction called _ack (track_functions, set by the caller)."""
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
        " WHERE schemaname = %s AND funcname = '_ack'",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _acked_state(conn: psycopg.Connection[Any], s: sql.Identifier) -> tuple[list[Any], list[Any], int]:
    """Queue schema ``s``'s messages (id, deliveries, leased), ack's memory (id, token) and the
    acked count, after a test's acks."""
    rows = conn.execute(
        sql.SQL("SELECT id, deliveries, leased FROM {}.message ORDER BY id").format(s)
    ).fetchall()
    settled = conn.execute(sql.SQL("SELECT id, token FROM {}.settled ORDER BY id").format(s)).fetchall()
    [(counted,)] = conn.execute(
        sql.SQL("SELECT coalesce(sum(acked), 0) FROM {}.queue_stat").format(s)
    ).fetchall()
    return rows, settled, int(counted)


def test_a_drains_batch_ack_is_takes_own(dsn: str, client: Client, schema: str) -> None:
    """take(n, ack=previous) of an ordinary queue acknowledges a batch in its own statement: no
    call of _ack when every delivery is still its own; _ack for what is left over (a stale
    token), which it refuses."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2", b"3", b"4"])
    first = client.take("q", 2)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET track_functions = 'pl'")
        take = sql.SQL("SELECT id FROM {}.take('q', 2, NULL, %s, %s)").format(s)
        nxt = conn.execute(take, ([m.id for m in first], [m.token for m in first])).fetchall()
        assert _ack_calls(conn, schema) == 0
        conn.commit()
        # The same deliveries again (a repeat) and one stale token: left over, to _ack.
        later = conn.execute(
            take, ([m.id for m in first] + [nxt[0][0]], [m.token for m in first] + [99])
        ).fetchall()
        assert _ack_calls(conn, schema) == 1
        conn.commit()
    assert later == []
    rows = client.peek("q", 10)
    assert sorted(m.id for m in rows) == sorted(r[0] for r in nxt)
    with psycopg.connect(dsn) as conn:
        _, settled, counted = _acked_state(conn, s)
    assert settled == sorted((m.id, m.token) for m in first)
    assert counted == 2


# Another transaction holds a row ---------------------------------------------------------------


def _meanwhile(
    s: sql.Identifier, held: list[Message], what: str
) -> list[tuple[sql.Composed, tuple[Any, ...]]]:
    """What another transaction does to the deliveries ``held`` of queue "q" while take's batch
    ack waits for them: its statements and their arguments."""
    pairs = ([m.id for m in held], [m.token for m in held])
    release = (sql.SQL("SELECT * FROM {}.nack('q', %s, %s, p_count_attempt => false)").format(s), pairs)
    lock = sql.SQL("SELECT FROM {}.message WHERE id = ANY (%s) ORDER BY id FOR UPDATE").format(s)
    return {
        "extend": [(sql.SQL("SELECT * FROM {}.extend('q', %s, %s)").format(s), pairs)],  # a new version
        "hold": [(lock, (pairs[0],))],  # another settle's lock by key: no new version
        "release": [release],  # given back: no longer leased
        "re-lease": [
            release,
            (sql.SQL("SELECT * FROM {}.take('q', %s)").format(s), (len(held),)),
        ],  # new tokens
    }[what]


@pytest.mark.parametrize("which", ["one", "all"])
@pytest.mark.parametrize(
    ("what", "still_its"), [("extend", True), ("hold", True), ("release", False), ("re-lease", False)]
)
def test_takes_batch_ack_waits_for_a_held_row_and_checks_its_new_version(
    dsn: str, client: Client, schema: str, which: str, what: str, still_its: bool
) -> None:
    """take(n, ack=previous)'s batch ack that meets rows another transaction holds (the middle
    one of three, or all three) waits for them, then acknowledges a row's new version only if
    it is still the delivery's (leased, the same token): an extended or merely locked row is
    deleted, one given back or delivered again is left as the other transaction left it. The
    rest of the batch is acknowledged either way, each delivery remembered once and counted
    once. (The queue is paused: the take hands nothing out, its acks still count.)"""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2", b"3"])
    taken = client.take("q", 3)
    held = taken[1:2] if which == "one" else taken
    result: dict[str, Any] = {}
    with psycopg.connect(dsn) as other, psycopg.connect(dsn, autocommit=True) as acker:
        for stmt, args in _meanwhile(s, held, what):
            other.execute(stmt, args).fetchall()
        client.pause_queue("q")

        def take() -> None:
            result["got"] = acker.execute(
                sql.SQL("SELECT id FROM {}.take('q', 3, NULL, %s, %s)").format(s),
                ([m.id for m in taken], [m.token for m in taken]),
            ).fetchall()

        thread = threading.Thread(target=take)
        thread.start()
        with psycopg.connect(dsn, autocommit=True) as watcher:
            _wait_until_blocked(watcher, [acker.info.backend_pid])
        other.commit()
        thread.join(30)
    assert result["got"] == []
    expected = {m.id for m in taken if still_its or m not in held}
    with psycopg.connect(dsn) as conn:
        rows, settled, counted = _acked_state(conn, s)
    if still_its:
        assert rows == []
    elif what == "release":
        assert rows == [(m.id, m.token, False) for m in held]
    else:
        assert rows == [(m.id, m.token + 1, True) for m in held]
    assert settled == sorted((m.id, m.token) for m in taken if m.id in expected)
    assert counted == len(expected)


def test_takes_batch_ack_of_a_delivery_twice_acks_it_once(client: Client, conn: Any, schema: str) -> None:
    """The same delivery twice in take's batch ack (and once with a stale token) is
    acknowledged once: deleted, remembered and counted once."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2"])
    a, b = client.take("q", 2)
    ids, tokens = [a.id, b.id, a.id, a.id], [a.token + 7, b.token, a.token, a.token]
    got = conn.execute(
        sql.SQL("SELECT id FROM {}.take('q', 2, NULL, %s, %s)").format(s), (ids, tokens)
    ).fetchall()
    assert got == []
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (0,)
    settled = conn.execute(sql.SQL("SELECT id, token FROM {}.settled ORDER BY id").format(s)).fetchall()
    assert settled == sorted([(a.id, a.token), (b.id, b.token)])
    assert conn.execute(sql.SQL("SELECT sum(acked) FROM {}.queue_stat").format(s)).fetchone() == (2,)


def test_takes_batch_ack_of_channel_messages_leaves_their_channels(
    client: Client, conn: Any, schema: str
) -> None:
    """Messages of a channel acknowledged by take's batch ack leave their channel (its counters
    back to zero, the empty channel's row gone), as ack() leaves them."""
    s = sql.Identifier(schema)
    client.create_queue("c", lease=3600)
    client.send_batch("c", [Envelope(f"{i}", channel="tenant-a") for i in range(3)])
    taken = client.take("c", 3)
    assert len(taken) == 3
    conn.execute(
        sql.SQL("SELECT id FROM {}.take('c', 1, NULL, %s, %s)").format(s),
        ([m.id for m in taken], [m.token for m in taken]),
    ).fetchall()
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (0,)
    rows = conn.execute(
        sql.SQL("SELECT current_size, current_concurrency FROM {}.channel WHERE name = 'tenant-a'").format(s)
    ).fetchall()
    assert rows in ([], [(0, 0)])
