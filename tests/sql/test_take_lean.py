"""take(queue, 1)'s lean path (sql/take.sql): one UPDATE leases the first ready message, found
by the candidate queries that test_plans.py tests and changed by ctid. Its plan, taken verbatim
from take(); and what it does when it leases nothing: the general path deals with what it
locked (a lease expired on the last attempt is dead-lettered, the next message delivered)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from psycopg import sql
from test_send_lean import _assert_changed_by_ctid, _generic_plan, _nodes, _now, _statement

from lonnymq import Client, Envelope

#: take()'s variables in its lean statements, as the parameters of _plan_on_a_loaded_queue.
_NAMES = {
    "q.id": "$1",
    "v_gen": "$2",
    "v_now": "$3",
    "v_lease": "$4",
    "q.max_attempts": "$5",
    "v_held": "$6",
    "p_limit": "$7",  # (take(1)'s too: the window's query is the batch's, see take())
    "v_frozen": "$8",  # (the batch's: its one frozen generation, v_frozen[1])
}


def _plan_on_a_loaded_queue(
    client: Client, conn: Any, schema: str, stmt: str, limit: int, unlogged: bool = False
) -> dict[str, Any]:
    """The generic plan of take()'s statement ``stmt`` (its variables as in _NAMES) on queue
    "q" with ready and leased messages beside another queue's, analysed."""
    s = sql.Identifier(schema)
    for name in ("other", "q"):
        client.create_queue(name, unlogged=unlogged)
        client.send_batch(name, [b"x"] * 4000)
    client.take("q", 1000)  # leased: new entries at the end of the dequeue index
    conn.execute(sql.SQL("ANALYZE {}.message").format(s))
    [(qid, gen)] = conn.execute(
        sql.SQL("SELECT q.id, g.last_value FROM {}.queue q, {}.message_gen_seq g WHERE q.name = 'q'").format(
            s, s
        )
    ).fetchall()
    return _generic_plan(
        conn,
        f"PREPARE lean_take(integer, bigint, bigint, bigint, integer, bigint, integer, bigint[]) AS {stmt}",
        f"lean_take({qid}, {gen}, {_now(conn, s)}, 30000, 5, NULL, {limit}, NULL)",
    )


def _no_rotation_due(conn: Any, schema: str) -> None:
    """The last rotation set to now: no take rotates for the next 2 s (a fresh schema's first
    take would, and a rotation moves rows)."""
    conn.execute(
        sql.SQL("SELECT setval({}, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)").format(
            sql.Literal(sql.Identifier(schema, "message_gen_started_seq").as_string(conn))
        )
    )


@pytest.mark.parametrize("nth", [0, 1, 2], ids=["no frozen row", "no frozen row, unlogged", "a frozen row"])
def test_plan_of_the_lean_take(client: Client, conn: Any, schema: str, nth: int) -> None:
    """The UPDATEs of take(1) (without a row of a frozen generation: of an ordinary queue, in its
    partition, and of an UNLOGGED one; with a frozen row): the candidates
    from the dequeue index in order, the row leased by ctid (a TID scan: never a scan of the
    queue's part of the primary key), no sequential scan; on a queue with ready and leased
    messages beside another queue's, analysed."""
    stmt = _statement("take", r"RETURN QUERY\s+(UPDATE .*?m\.last_error, m\.payload);", _NAMES, schema, nth)
    _assert_changed_by_ctid(_plan_on_a_loaded_queue(client, conn, schema, stmt, limit=1))


def _last_attempt_leased(client: Client, conn: Any, s: sql.Identifier) -> tuple[int, int]:
    """Queue ``q`` (max_attempts 1) whose first message is leased for 1 s at the returned
    ``now`` and whose second is due at ``now + 1500``, after that lease expired: (now, the
    second's id)."""
    client.create_queue("q", max_attempts=1)
    first = client.send("q", b"1")
    now = _now(conn, s)
    second = client.send("q", b"2", at=now + 1500)
    take = sql.SQL("SELECT id, attempt FROM {}.take('q', 1, 1000, NULL, NULL, %s)").format(s)
    assert conn.execute(take, (now,)).fetchall() == [(first.id, 1)]
    return now, second.id


def test_take_one_dead_letters_an_expired_last_attempt_and_delivers_the_next(
    client: Client, conn: Any, schema: str
) -> None:
    """The first candidate's lease expired on its last attempt: the lean UPDATE leases nothing,
    the general path dead-letters it and the same call delivers the next message."""
    s = sql.Identifier(schema)
    now, second = _last_attempt_leased(client, conn, s)
    take = sql.SQL("SELECT id, attempt FROM {}.take('q', 1, 1000, NULL, NULL, %s)").format(s)
    assert conn.execute(take, (now + 2000,)).fetchall() == [(second, 1)]  # first's lease expired
    conn.commit()
    left = sql.SQL("SELECT id FROM {}.message ORDER BY id").format(s)
    assert conn.execute(left).fetchall() == [(second,)]
    dead = sql.SQL("SELECT sum(dead) FROM {}.queue_stat").format(s)
    assert conn.execute(dead).fetchone() == (1,)


def test_take_acks_one_delivery_of_a_plain_queue_itself(client: Client, conn: Any, schema: str) -> None:
    """take(1, ack=[one]) acknowledges it with its own statement (no nested ack() call): the row
    deleted, ack's memory and the acked count written once; a repeat of that ack, or an ack
    with a stale token, goes to ack() and changes nothing; the next message is delivered
    each time."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"1", b"2", b"3", b"4"])
    [a] = client.take("q", 1)
    [b] = client.take("q", 1, ack=[a])
    [c] = client.take("q", 1, ack=[a])  # a repeat: nothing more
    stale = dataclasses.replace(b, token=b.token + 1)
    [d] = client.take("q", 1, ack=[stale])  # b was not acked
    assert [m.payload for m in (a, b, c, d)] == [b"1", b"2", b"3", b"4"]
    settled = conn.execute(
        sql.SQL("SELECT id, token, outcome FROM {}.settled ORDER BY id").format(s)
    ).fetchall()
    assert settled == [(a.id, a.token, "acked")]
    [(acked,)] = conn.execute(sql.SQL("SELECT sum(acked) FROM {}.queue_stat").format(s)).fetchall()
    assert acked == 1
    left = conn.execute(sql.SQL("SELECT id, leased FROM {}.message ORDER BY id").format(s)).fetchall()
    assert left == [(b.id, True), (c.id, True), (d.id, True)]
    conn.rollback()


def _partitions_locked(conn: Any, schema: str) -> set[str]:
    """The message partitions (and their indexes) this transaction has locked."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND c.relnamespace = %s::regnamespace"
        " AND c.relname LIKE 'message\\_%%logged%%'",
        (schema,),
    ).fetchall()
    return {r[0] for r in rows}


def test_pop_and_take_of_an_ordinary_queue_open_only_its_partition(
    client: Client, conn: Any, schema: str
) -> None:
    """A pop (take_tx(1)) and a take(1) of an ordinary queue read and change message_logged
    only: over the partitioned table each of their statements opened (and locked)
    message_unlogged and its indexes too."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    client.send_batch("q", [b"1", b"2"])
    # No rotation due (a fresh schema's first take rotates, and a rotation moves rows in both
    # partitions): the statements of the take itself are what this test looks at.
    _no_rotation_due(conn, schema)
    for call, payload in (("take_tx('q', 1)", b"1"), ("take('q', 1)", b"2")):
        with conn.transaction():
            [(got,)] = conn.execute(sql.SQL(f"SELECT payload FROM {{}}.{call}").format(s)).fetchall()
            locked = _partitions_locked(conn, schema)
        assert bytes(got) == payload
        assert "message_logged" in locked and not [n for n in locked if "unlogged" in n], (call, locked)
    left = conn.execute(sql.SQL("SELECT payload, leased FROM {}.message").format(s)).fetchall()
    assert [(bytes(p), leased) for p, leased in left] == [(b"2", True)]


def test_pop_and_drain_of_an_unlogged_queue(client: Client, conn: Any, schema: str) -> None:
    """An UNLOGGED queue's messages are in the other partition: its pops and drains take the
    paths over the partitioned table, with the same results (in order, the ack written once),
    beside an ordinary queue whose messages they never touch."""
    s = sql.Identifier(schema)
    client.create_queue("u", unlogged=True)
    client.create_queue("q")
    client.send_batch("q", [b"q1", b"q2"])
    client.send_batch("u", [b"1", b"2", b"3", b"4"])
    pop = sql.SQL("SELECT payload FROM {}.take_tx('u', 1)").format(s)
    assert [bytes(r[0]) for r in conn.execute(pop).fetchall()] == [b"1"]
    [a] = client.take("u", 1)
    [b] = client.take("u", 1, ack=[a])
    [c] = client.take("u", 1, ack=[a])  # a repeat: nothing more
    assert [m.payload for m in (a, b, c)] == [b"2", b"3", b"4"]
    assert conn.execute(pop).fetchall() == []  # b and c are leased
    settled = conn.execute(sql.SQL("SELECT id, token, outcome FROM {}.settled").format(s)).fetchall()
    assert settled == [(a.id, a.token, "acked")]
    [(acked,)] = conn.execute(sql.SQL("SELECT sum(acked) FROM {}.queue_stat").format(s)).fetchall()
    assert acked == 1
    assert [m.payload for m in client.peek("q")] == [b"q1", b"q2"]


#: take(n)'s lean statements (a queue without a frozen generation): of an ordinary queue, in
#: its partition, and of an UNLOGGED one.
BATCH_TAKE = r"RETURN QUERY\s+(UPDATE [^;]*?FROM unnest\(ARRAY.*?m\.last_error, m\.payload);"


@pytest.mark.parametrize("nth", [0, 1], ids=["ordinary", "unlogged"])
def test_plan_of_the_lean_batch_take(client: Client, conn: Any, schema: str, nth: int) -> None:
    """take(n)'s UPDATE: the candidates from the dequeue index in order, each row leased by its
    ctid (a TID scan per candidate: no read of the queue's part of the primary key), no
    sequential scan; and the join is a nested loop over the array of candidates, whose order is
    the order in which the UPDATE returns its rows (take() does not sort them again). On a queue
    with ready and leased messages beside another queue's, analysed."""
    stmt = _statement("take", BATCH_TAKE, _NAMES, schema, nth)
    plan = _plan_on_a_loaded_queue(client, conn, schema, stmt, limit=100, unlogged=nth == 1)
    nodes = list(_nodes(plan))
    assert not [x for x in nodes if x["Node Type"] in ("Seq Scan", "Hash Join", "Merge Join")], plan
    changes = [x for x in nodes if x["Node Type"] == "Tid Scan"]
    # (PostgreSQL 15 prints the condition "(ctid = t.tid)", 16 "(t.tid = ctid)".)
    conds = {"(ctid = t.tid)", "(t.tid = ctid)"}
    assert changes and all(x.get("TID Cond") in conds for x in changes), plan
    part = "message_unlogged_gen" if nth == 1 else "message_logged_gen"
    assert [x for x in nodes if x.get("Index Name", "").startswith(part)], plan
    assert not [x for x in nodes if x.get("Index Name", "").endswith("_pkey")], plan
    # ModifyTable <- Nested Loop (outer: the array's unnest; inner: the TID scans).
    [join] = [x for x in plan["Plans"] if x.get("Parent Relationship") == "Outer"]
    assert join["Node Type"] == "Nested Loop", plan
    outer, inner = (x for x in join["Plans"] if x.get("Parent Relationship") in ("Outer", "Inner"))
    assert outer["Node Type"] == "Function Scan" and outer["Function Name"] == "unnest", plan
    assert {x["Node Type"] for x in _nodes(inner)} <= {"Tid Scan", "Append"}, plan


@pytest.mark.parametrize("unlogged", [False, True], ids=["ordinary", "unlogged"])
def test_take_n_leases_in_order_and_fills_the_batch_past_dead_letters(
    client: Client, conn: Any, schema: str, unlogged: bool
) -> None:
    """take(n): the ready messages in (dequeue_at, id) order (priority first), leased once with
    their token; a later take(n) dead-letters the candidates whose lease expired on their last
    attempt (they do not count against n) and delivers the next ones in the same call."""
    s = sql.Identifier(schema)
    client.create_queue("q", max_attempts=1, unlogged=unlogged)
    low = client.send("q", b"low")
    high = client.send("q", b"high", priority=5)
    mid = client.send("q", b"mid", priority=1)
    now = _now(conn, s)
    later = [client.send("q", p, at=now + 1500) for p in (b"a", b"b", b"c")]  # due after the leases
    take = sql.SQL("SELECT id, attempt, token FROM {}.take('q', %s, 1000, NULL, NULL, %s)").format(s)
    assert conn.execute(take, (5, now)).fetchall() == [(high.id, 1, 1), (mid.id, 1, 1), (low.id, 1, 1)]
    conn.commit()
    assert conn.execute(take, (2, now + 2000)).fetchall() == [(later[0].id, 1, 1), (later[1].id, 1, 1)]
    conn.commit()
    dead = sql.SQL("SELECT sum(dead) FROM {}.queue_stat").format(s)
    assert conn.execute(dead).fetchone() == (3,)
    left = sql.SQL("SELECT id, leased FROM {}.message ORDER BY id").format(s)
    assert conn.execute(left).fetchall() == [(later[0].id, True), (later[1].id, True), (later[2].id, False)]


@pytest.mark.parametrize("unlogged", [False, True], ids=["ordinary", "unlogged"])
def test_take_n_of_a_plain_queue_leases_in_one_statement(
    client: Client, conn: Any, schema: str, unlogged: bool
) -> None:
    """take(n, ack=...) of a plain queue without frozen generations leases with its own
    statement: no call of _lock_ready() or _deliver() (nested frames, the rows copied through
    their result sets, a probe of the primary key per row); an ordinary queue's acks are
    deleted in take's own statement (tests/sql/test_take_batch_ack.py), an UNLOGGED one's go
    to _ack() as before."""
    s = sql.Identifier(schema)
    client.create_queue("q", unlogged=unlogged)
    client.send_batch("q", [b"x"] * 30)
    first = client.take("q", 10)
    conn.execute("SET track_functions = 'pl'")
    call = sql.SQL("SELECT id FROM {}.take('q', 10, p_ack_ids => %s, p_ack_tokens => %s)").format(s)
    taken = conn.execute(call, ([m.id for m in first], [m.token for m in first])).fetchall()
    calls = {
        name: conn.execute(
            "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regproc), 0)", (f"{schema}.{name}",)
        ).fetchone()[0]
        for name in ("_lock_ready", "_deliver", "_ack")
    }
    conn.commit()
    assert [r[0] for r in taken] == sorted(r[0] for r in taken) and len(taken) == 10
    assert not {m.id for m in first} & {r[0] for r in taken}
    assert calls == {"_lock_ready": 0, "_deliver": 0, "_ack": 1 if unlogged else 0}, calls
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.message").format(s)).fetchone() == (20,)


def _frozen_backlog(client: Client, conn: Any, schema: str, generations: int) -> None:
    """Queue "q" with a backlog frozen in ``generations`` generations (each rotated out of the
    window with more rows than a rotation moves) and a few newer rows in the window."""
    s = sql.Identifier(schema)
    client.create_queue("q")
    rotate = sql.SQL("SELECT {}.rotate(p_force => true, p_max_moves => 5)").format(s)
    for g in range(generations):
        client.send_batch("q", [b"old %d" % g] * 20)
        for _ in range(2):
            conn.execute(rotate)
    # Newer rows in the window, two of them ahead of the backlog by priority (an earlier
    # dequeue_at): the batch merges the frozen generation with the window.
    client.send_batch("q", [b"new"] * 3 + [Envelope(b"urgent", priority=10)] * 2)
    [(frozen,)] = conn.execute(
        sql.SQL(
            "SELECT cardinality(f.gens) FROM {}.message_gen_frozen f JOIN {}.queue q ON q.id = f.queue_id"
        ).format(s, s)
    ).fetchall()
    assert frozen == generations
    # No rotation due while the test takes (a rotation would move or thaw what it set up).
    _no_rotation_due(conn, schema)
    conn.commit()


@pytest.mark.parametrize("generations", [1, 2], ids=["one frozen generation", "two"])
def test_take_n_of_a_queue_with_a_frozen_backlog(
    client: Client, conn: Any, schema: str, generations: int
) -> None:
    """take(n) of a queue whose backlog is frozen in one generation leases in its own statement
    (a drain that outlasts two rotations), the same rows in the same order as the general path
    (_lock_ready, asked first in a transaction rolled back); with two frozen generations it
    takes the general path, whose order (the oldest generation first) is not a merge."""
    s = sql.Identifier(schema)
    _frozen_backlog(client, conn, schema, generations)
    with conn.transaction(force_rollback=True):
        [(expected,)] = conn.execute(
            sql.SQL(
                "SELECT r.ids FROM {}.queue q, {}._lock_ready(q, 15, (extract(epoch FROM clock_timestamp())"
                " * 1000)::bigint) r WHERE q.name = 'q'"
            ).format(s, s)
        ).fetchall()
    conn.execute("SET track_functions = 'pl'")
    taken = conn.execute(sql.SQL("SELECT id FROM {}.take('q', 15)").format(s)).fetchall()
    calls = conn.execute(
        "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regproc), 0)", (f"{schema}._lock_ready",)
    ).fetchone()
    conn.commit()
    assert [r[0] for r in taken] == expected and len(expected) == 15
    urgent = conn.execute(sql.SQL("SELECT id FROM {}.message WHERE payload = 'urgent'").format(s)).fetchall()
    assert expected[:2] == sorted(r[0] for r in urgent)  # merged ahead of the frozen rows
    assert calls == ((0,) if generations == 1 else (1,)), calls
