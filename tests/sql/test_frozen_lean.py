"""A frozen backlog's one-at-a-time drain and pop (sql/take.sql): ``take(q, 1, ack=previous)``'s
one-statement drain and ``take_tx(q, 1)``'s lean pop take the queue's one frozen generation as a
third candidate range, as the batch's statement does, instead of the general path's three
statements. A drain that outlasts two rotations has its backlog frozen for the rest of its run
(generations.sql), so this is the drain of any real backlog."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from core_helpers import Sql, freeze_backlog, table_scans


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def frozen_backlog(db: Sql, queue: str, now: int, n: int = 12) -> list[int]:
    """``n`` messages of ``queue`` frozen in their generation (core_helpers.freeze_backlog), then
    two messages in the window that are due *before* them (sent with an earlier clock): a take
    must merge the ranges by (dequeue_at, id). The order returned is the order every take must
    deliver them in. The last rotation is at ``now``: none is due."""
    db.call("queue_create", p_name=queue)
    old = freeze_backlog(db, queue, now, n)
    early = [r["id"] for r in db.send(queue, [b"early-1", b"early-2"], now - 1000)]
    late = [r["id"] for r in db.send(queue, [b"late"], now)]
    return early + old + late


def test_a_one_at_a_time_drain_of_a_frozen_backlog_keeps_the_order_and_acks_each(db: Sql) -> None:
    now = db.now()
    order = frozen_backlog(db, "q", now)
    got: list[int] = []
    prev: dict[str, Any] | None = None
    for _ in range(len(order) + 1):
        ack = {} if prev is None else {"p_ack_ids": [prev["id"]], "p_ack_tokens": [prev["token"]]}
        rows = db.take("q", 1, now, **ack)
        if not rows:
            break
        assert len(rows) == 1
        prev = rows[0]
        got.append(prev["id"])
    assert got == order
    assert db.count("q") == 0  # every delivery acknowledged by the next call (the last by the empty one)
    acked = db.q("SELECT count(*) AS n FROM {s}.settled WHERE outcome = 'acked'")[0]["n"]
    assert acked == len(order)


def test_a_stale_token_acknowledges_nothing_on_a_frozen_backlog(db: Sql) -> None:
    now = db.now()
    order = frozen_backlog(db, "q", now)
    first = db.take("q", 1, now)[0]
    assert first["id"] == order[0]
    nxt = db.take("q", 1, now, p_ack_ids=[first["id"]], p_ack_tokens=[first["token"] + 1])
    assert [r["id"] for r in nxt] == [order[1]]
    assert db.row("q", first["id"]) is not None  # still leased: the token was not the delivery's


def test_a_pop_of_a_frozen_backlog_keeps_the_order(db: Sql) -> None:
    now = db.now()
    order = frozen_backlog(db, "q", now)
    got = []
    for _ in range(len(order) + 1):
        rows = db.call("take_tx", p_queue="q", p_limit=1, p_now=now)
        if not rows:
            break
        got.append(rows[0]["id"])
    assert got == order
    assert db.count("q") == 0


def test_a_frozen_backlogs_one_at_a_time_drain_is_one_statement(db: Sql) -> None:
    """take(1, ack=previous) on a frozen backlog: one statement that reads each candidate range
    once (the frozen generation and the window's two) and probes the key once (the ack). The
    general path, which such a drain took, read the frozen range in a statement of its own and
    probed the key again for the row that statement locked: five index scans, not four."""
    now = db.now()
    order = frozen_backlog(db, "q", now)
    prev = db.take("q", 1, now)[0]
    assert prev["id"] == order[0]
    with db.conn.transaction():
        before = table_scans(db, "message_logged", index_only=True)
        rows = db.take("q", 1, now, p_ack_ids=[prev["id"]], p_ack_tokens=[prev["token"]])
        assert [r["id"] for r in rows] == [order[1]]
        assert table_scans(db, "message_logged", index_only=True) - before == 4
    assert db.row("q", prev["id"]) is None  # acknowledged
