"""The lean drain and pop read the window's two candidate ranges when the queue has no frozen
generation (sql/take.sql): take(1, ack=previous)'s one statement and take_tx(1)'s DELETE have a
copy each for a queue with one frozen generation (a third range), used only then. The general
path's _lock_ready reads the frozen list only when the frozen flag says a queue may have one
(generations.sql), as the heads of take() and take_tx() do."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from core_helpers import Sql, freeze_backlog, table_scans
from lonnymq.sql import function_text


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def _queue(db: Sql, frozen: bool, n: int = 5) -> int:
    """Queue "q" with ``n`` ready messages and no frozen generation of its own; with ``frozen``,
    another queue's backlog frozen (the flag set: the heads look the list up and find none for
    "q"). No rotation is due at the time returned."""
    db.call("queue_create", p_name="q")
    now = db.now()
    if frozen:
        db.call("queue_create", p_name="other")
        freeze_backlog(db, "other", now)
    db.send("q", [b"x"] * n, now)
    db.q("SELECT setval('{s}.message_gen_started_seq', %s)", (now,))
    return now


both = pytest.mark.parametrize("frozen", [False, True], ids=["none frozen", "another queue frozen"])


@both
def test_the_common_drain_reads_two_ranges_and_the_acks_key(db: Sql, frozen: bool) -> None:
    """take(1, ack=previous) of a queue without a frozen generation: three index scans of the
    ordinary queues' partition (the window's two generations and the ack's key), not a fourth for
    an empty frozen range."""
    now = _queue(db, frozen)
    prev = db.take("q", 1, now)[0]
    with db.conn.transaction():
        before = table_scans(db, "message_logged")
        rows = db.take("q", 1, now, p_ack_ids=[prev["id"]], p_ack_tokens=[prev["token"]])
        assert len(rows) == 1 and rows[0]["id"] != prev["id"]
        assert table_scans(db, "message_logged") - before == 3
    assert db.row("q", prev["id"]) is None  # acknowledged


@pytest.mark.parametrize(
    ("frozen", "scans"),
    [("none", 2), ("another queue's", 2), ("its own", 3)],
    ids=["none frozen", "another queue frozen", "its own frozen"],
)
def test_the_common_pop_reads_two_ranges(db: Sql, frozen: str, scans: int) -> None:
    """take_tx(1) of a queue without a frozen generation: two index scans of the ordinary queues'
    partition (the window's two generations), not a third for an empty frozen range. With one
    of its own (the frozen copy of the DELETE, passes on main too): three, the frozen row first."""
    if frozen == "its own":
        db.call("queue_create", p_name="q")
        now = db.now()
        first = freeze_backlog(db, "q", now)[0]
    else:
        now = _queue(db, frozen == "another queue's")
        [row] = db.q("SELECT min(id) AS id FROM {s}.message WHERE queue_id = %s", (db.queue_id("q"),))
        first = row["id"]
    with db.conn.transaction():
        before = table_scans(db, "message_logged")
        rows = db.call("take_tx", p_queue="q", p_limit=1, p_now=now)
        assert [r["id"] for r in rows] == [first]
        assert table_scans(db, "message_logged") - before == scans


@both
def test_an_empty_take_reads_the_frozen_list_only_when_the_flag_says_so(db: Sql, frozen: bool) -> None:
    """take(1) of an empty queue goes on to the general path (_lock_ready): with no frozen
    generation anywhere (the flag clear) it does not read message_gen_frozen; with one (another
    queue's), it does."""
    now = _queue(db, frozen, n=0)
    with db.conn.transaction():
        before = table_scans(db, "message_gen_frozen")
        assert db.take("q", 1, now) == []
        assert db.take("q", 10, now) == []
        assert (table_scans(db, "message_gen_frozen") > before) is frozen


def test_two_frozen_generations_go_the_general_way_in_order(db: Sql) -> None:
    """A queue with two frozen generations is neither copy's: a drain and a pop take the general
    path, which reads the list (the flag set) and delivers the oldest generation's rows first
    (passes on main too: the behaviour kept, the new IF's fall-through tested)."""
    db.call("queue_create", p_name="q")
    now = db.now()
    first = freeze_backlog(db, "q", now, 8)
    second = [r["id"] for r in db.send("q", [b"s"] * 8, now)]
    for _ in range(4):
        db.q("SELECT {s}.rotate(p_force => true, p_max_moves => 5, p_now => %s)", (now,))
    [gens] = db.q("SELECT f.gens FROM {s}.message_gen_frozen f")
    assert len(gens["gens"]) == 2, gens
    prev = db.take("q", 1, now)[0]
    got = [prev["id"]]
    for _ in range(3):
        prev = db.take("q", 1, now, p_ack_ids=[prev["id"]], p_ack_tokens=[prev["token"]])[0]
        got.append(prev["id"])
    got += [r["id"] for r in db.call("take_tx", p_queue="q", p_limit=1, p_now=now)]
    assert got == first[:5]
    assert db.row("q", first[0]) is None and db.row("q", first[3]) is not None  # acked; leased
    assert db.row("q", second[0]) is not None  # (the newer generation waits behind the older)


#: The lean statements with copies: take()'s one-delivery drain and take_tx()'s one-message
#: DELETE (the first two matches: the UNLOGGED queues' DELETE follows).
COPIED = {
    "take": r"RETURN QUERY\s+(WITH d AS \(\s+DELETE FROM \{schema\}\.message_logged m\s+WHERE .*?m\.payload);",
    "take_tx": r"RETURN QUERY\s+(DELETE FROM .*?m\.last_error, m\.payload);",
}


@pytest.mark.parametrize("function", ["take", "take_tx"])
def test_the_copies_differ_only_in_the_frozen_range(function: str) -> None:
    """Each lean statement's two copies are the same statement but for the candidate ranges:
    the window's two generations, or the queue's frozen one and the window's (keep them in step)."""
    window, frozen = (
        re.sub(r"\s+", " ", m[1])
        for m in list(re.finditer(COPIED[function], function_text(function), re.S))[:2]
    )
    two = "(VALUES (v_head.gen - 1), (v_head.gen))"
    three = "(VALUES (v_head.frozen[1]), (v_head.gen - 1), (v_head.gen))"
    assert window.count(two) == 1 and three not in window
    assert frozen.count(three) == 1
    assert frozen.replace(three, two) == window
