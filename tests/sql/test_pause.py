"""Pausing a queue (queue_pause / queue_resume, migration 0011): a paused queue accepts sends
and hands out nothing (take, take_tx, the channel path, Spark's streaming reads, next_ready_in);
what was leased before settles as usual; resuming hands out again in order and wakes the
consumers waiting on the queue."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import Sql


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


def pause(db: Sql, queue: str) -> bool:
    return bool(db.q("SELECT {s}.queue_pause(%s) AS r", (queue,))[0]["r"])


def resume(db: Sql, queue: str) -> bool:
    return bool(db.q("SELECT {s}.queue_resume(%s) AS r", (queue,))[0]["r"])


def paused(db: Sql, queue: str) -> tuple[bool, bool]:
    """(paused as queue_list says, as queue_metrics says)."""
    listed = db.q("SELECT paused FROM {s}.queue_list() WHERE name = %s", (queue,))[0]["paused"]
    metrics = db.call("queue_metrics", p_name=queue)[0]["paused"]
    return listed, metrics


def test_a_paused_queue_accepts_sends_and_hands_out_nothing(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    now = db.now()
    first = ids(db.send("q", [b"a", b"b"], now))
    assert paused(db, "q") == (False, False)
    assert pause(db, "q") is True
    assert pause(db, "q") is False  # already paused
    assert paused(db, "q") == (True, True)
    later = ids(db.send("q", [b"c"], now))
    assert len(later) == 1
    # take (the one-message fast path and the general path), take_tx, next_ready_in.
    assert db.take("q", 1, now) == []
    assert db.take("q", 10, now) == []
    assert db.call("take_tx", p_queue="q", p_limit=10, p_now=now) == []
    assert db.call("next_ready_in", p_queue="q", p_now=now) == [{"next_ready_in": None}]
    # Still counted as ready, and peek still shows them.
    assert db.call("queue_metrics", p_name="q", p_now=now)[0]["ready"] == 3
    assert len(db.call("peek", p_queue="q", p_limit=10)) == 3
    # Resumed: every message, in order.
    assert resume(db, "q") is True
    assert resume(db, "q") is False
    assert paused(db, "q") == (False, False)
    assert db.call("next_ready_in", p_queue="q", p_now=now) == [{"next_ready_in": 0}]
    assert ids(db.take("q", 1, now)) == first[:1]
    assert ids(db.take("q", 10, now)) == first[1:] + later


def test_a_paused_channel_queue_hands_out_nothing(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    now = db.now()
    sent = ids(db.send("q", [b"a", b"b", b"c", b"d"], now, p_channels=["t1", "t2", None, "t1"]))
    assert pause(db, "q")
    assert db.take("q", 1, now) == []
    assert db.take("q", 10, now) == []
    assert db.call("take_tx", p_queue="q", p_limit=10, p_now=now) == []
    assert db.call("next_ready_in", p_queue="q", p_now=now) == [{"next_ready_in": None}]
    assert resume(db, "q")
    got = ids(db.take("q", 10, now))
    assert sorted(got) == sorted(sent)
    assert got.index(sent[0]) < got.index(sent[3])  # one channel's messages stay in order


def test_settles_of_leased_messages_go_on_while_paused(db: Sql) -> None:
    db.call("queue_create", p_name="q", p_max_attempts=5)
    now = db.now()
    db.send("q", [b"%d" % i for i in range(5)], now)
    a, b, c, d = db.take("q", 4, now)
    assert pause(db, "q")
    assert db.call("ack", p_queue="q", p_ids=[a["id"]], p_tokens=[a["token"]], p_now=now) == [
        {"ack": a["id"]}
    ]
    assert ids(db.call("extend", p_queue="q", p_ids=[b["id"]], p_tokens=[b["token"]], p_now=now)) == [b["id"]]
    assert db.call("nack", p_queue="q", p_ids=[c["id"]], p_tokens=[c["token"]], p_now=now)
    # take's own acks are done; it hands out nothing (the nacked message is ready again).
    assert db.take("q", 5, now, p_ack_ids=[d["id"]], p_ack_tokens=[d["token"]]) == []
    assert db.row("q", a["id"]) is None and db.row("q", d["id"]) is None
    assert db.count("q") == 3  # b (leased), c (retry), the one never taken
    assert resume(db, "q")
    assert len(db.take("q", 5, now + 3_600_000)) == 3


def test_take_tx_of_a_paused_queue_leaves_everything(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    now = db.now()
    db.send("q", [b"x"], now)
    assert pause(db, "q")
    with db.conn.transaction():
        assert db.call("take_tx", p_queue="q", p_limit=1, p_now=now) == []
    assert db.count("q") == 1


def test_a_spark_stream_reads_nothing_new_from_a_paused_queue(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    now = db.now()
    db.send("q", [b"a", b"b"], now)
    stream = uuid.uuid4()

    def nxt(after: int) -> dict[str, Any]:
        return db.q(
            "SELECT * FROM {s}.spark_stream_next(%s, 'q', %s, 100, p_now => %s)", (stream, after, now)
        )[0]

    assert pause(db, "q")
    assert nxt(0) == {"batch_id": 0, "messages": 0}
    assert resume(db, "q")
    assert nxt(0) == {"batch_id": 1, "messages": 2}


def test_unknown_queue(db: Sql) -> None:
    for fn in ("queue_pause", "queue_resume"):
        with pytest.raises(psycopg.Error) as e:
            db.q(f"SELECT {{s}}.{fn}('nope')")
        assert e.value.sqlstate == "LQ001"


def test_resume_wakes_a_waiting_consumer_and_pause_does_not(dsn: str, db: Sql, schema: str) -> None:
    """A consumer registered as a waiter (wait_begin, as receive() and the worker do) is
    notified by the resume, as by a send; pausing notifies nobody."""
    db.call("queue_create", p_name="q")
    db.send("q", [b"x"], db.now())
    with psycopg.connect(dsn, autocommit=True) as waiter:
        waiter.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        waiter.execute(sql.SQL("SELECT {}.wait_begin('q')").format(sql.Identifier(schema)))
        assert pause(db, "q")
        assert [n.payload for n in waiter.notifies(timeout=0.3)] == []
        assert resume(db, "q")
        assert [n.payload for n in waiter.notifies(timeout=60, stop_after=1)] == ["q"]
        assert resume(db, "q") is False  # not paused: nothing to wake for
        assert [n.payload for n in waiter.notifies(timeout=0.3)] == []
