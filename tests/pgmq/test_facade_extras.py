"""The parts of pgmq 1.13's API that the facade builds on LonnyMQ's tables rather than on its
API functions: conditional reads, set_vt on any message, read_with_poll woken by sends, FIFO
group reads, topics, insert notifications and the q_/a_ views. Driven by SQL and by the
official ``pgmq`` Python client where it has the function."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from lonnymq import Client

pytest.importorskip("pgmq")

Conn = psycopg.Connection[dict[str, Any]]


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["msg_id"] for r in rows]


def send(pg: Conn, queue: str, msg: str, group: str | None = None) -> int:
    headers = None if group is None else f'{{"x-pgmq-group": "{group}"}}'
    row = pg.execute("SELECT pgmq.send(%s, %s::jsonb, %s::jsonb) AS id", (queue, msg, headers)).fetchone()
    assert row is not None
    return int(row["id"])


# Conditional read ---------------------------------------------------------------------------


def test_conditional_read_leases_only_matching_messages(pg: Conn, pgmq_client: Any) -> None:
    pg.execute("SELECT pgmq.create('jobs')")
    a1 = send(pg, "jobs", '{"type": "a", "n": 1}')
    send(pg, "jobs", '{"type": "b", "n": 2}')
    a3 = send(pg, "jobs", '{"type": "a", "n": 3, "tags": ["x", "y"]}')
    # Leased for 10 minutes: the checks below (on the real clock) count on it, however slow.
    rows = pg.execute("""SELECT * FROM pgmq.read('jobs', 600, 10, '{"type": "a"}')""").fetchall()
    assert ids(rows) == [a1, a3]
    assert [r["read_ct"] for r in rows] == [1, 1]
    assert rows[0]["vt"] > datetime.now(UTC) + timedelta(seconds=500)
    # leased now: a second conditional read finds nothing, a plain read gets the other one
    assert pg.execute("""SELECT * FROM pgmq.read('jobs', 30, 10, '{"type": "a"}')""").fetchall() == []
    assert [r["message"]["n"] for r in pg.execute("SELECT * FROM pgmq.read('jobs', 30, 10)")] == [2]
    # containment, not equality; qty bounds the batch; the official client passes it through
    for n in (4, 5, 6):
        send(pg, "jobs", f'{{"type": "c", "n": {n}, "tags": ["x", "y"]}}')
    got = pgmq_client.read("jobs", vt=30, qty=2, conditional={"tags": ["y"]})
    assert [m.message["n"] for m in got] == [4, 5]
    assert pgmq_client.read("jobs", vt=30, qty=5, conditional={"type": "zzz"}) == []
    polled = pgmq_client.read_with_poll(
        "jobs", vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=50, conditional={"n": 6}
    )
    assert [m.message["n"] for m in polled] == [6]


# set_vt -------------------------------------------------------------------------------------


def test_set_vt_on_ready_scheduled_and_leased_messages(pg: Conn, pgmq_client: Any) -> None:
    pg.execute("SELECT pgmq.create('v')")
    ready = send(pg, "v", "1")
    later = pg.execute("SELECT pgmq.send('v', '2', 3600) AS id").fetchone()
    assert later is not None
    scheduled = int(later["id"])
    # a ready message becomes invisible until vt, without counting a read
    [r] = pg.execute("SELECT * FROM pgmq.set_vt('v', %s::bigint, 600)", (ready,)).fetchall()
    assert (r["msg_id"], r["read_ct"], r["message"]) == (ready, 0, 1)
    assert timedelta(seconds=500) < r["vt"] - datetime.now(UTC) <= timedelta(seconds=600)
    assert pg.execute("SELECT * FROM pgmq.read('v', 30, 5)").fetchall() == []
    # a scheduled one (and the first) visible now, by array, with timestamptz; unknown ids left out
    now = datetime.now(UTC)
    rows = pg.execute(
        "SELECT * FROM pgmq.set_vt('v', %s::bigint[], %s::timestamptz)", ([ready, scheduled, 999], now)
    ).fetchall()
    assert sorted(ids(rows)) == [ready, scheduled]
    read = pg.execute("SELECT * FROM pgmq.read('v', 30, 5)").fetchall()
    assert (ids(read), [m["read_ct"] for m in read]) == ([ready, scheduled], [1, 1])
    # a leased one: pushed later (still leased), then released at once; the next read counts
    [ext] = pg.execute("SELECT * FROM pgmq.set_vt('v', %s::bigint[], 600)", ([ready],)).fetchall()
    assert ext["vt"] > datetime.now(UTC) + timedelta(seconds=500)
    assert pgmq_client.set_vt("v", [ready, scheduled], 0)  # the official client, array form
    again = pg.execute("SELECT * FROM pgmq.read('v', 30, 5)").fetchall()
    assert (ids(again), [m["read_ct"] for m in again]) == ([ready, scheduled], [2, 2])
    one = pgmq_client.set_vt("v", ready, datetime.now(UTC) + timedelta(hours=1))
    assert one.msg_id == ready and one.vt > datetime.now(UTC) + timedelta(minutes=50)
    assert pg.execute("SELECT * FROM pgmq.set_vt('v', 999::bigint, 5)").fetchall() == []


def test_set_vt_on_a_native_priority_message_keeps_it_readable(pg: Conn, lq: Client) -> None:
    lq.create_queue("native")
    lq.send("native", {"p": 1}, priority=5)
    [m] = lq.peek("native", 1)
    pg.execute("SELECT * FROM pgmq.set_vt('native', %s::bigint, 0)", (m.id,))
    [r] = pg.execute("SELECT * FROM pgmq.read('native', 30, 1)").fetchall()
    assert (r["msg_id"], r["message"]) == (m.id, {"p": 1})


# read_with_poll woken by a send --------------------------------------------------------------


def _poll_in_thread(
    db_dsn: str, query: str, params: tuple[Any, ...]
) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as c:
            out["rows"] = c.execute(query, params).fetchall()
            out["done"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_read_with_poll_is_woken_by_a_send_from_another_connection(db_dsn: str, pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('w')")
    # The poll interval (60 s) and max_poll_seconds (120 s) are far beyond the send: only a
    # wake-up returns it early (the bounds leave a loaded CI machine room: load 6-12).
    query = "SELECT * FROM pgmq.read_with_poll('w', 30, 1, 120, 60000)"
    t, out = _poll_in_thread(db_dsn, query, ())
    time.sleep(0.5)
    sent_at = time.monotonic()
    msg_id = send(pg, "w", '{"wake": 1}')
    t.join(150)
    assert not t.is_alive()
    assert ids(out["rows"]) == [msg_id]
    assert out["done"] - sent_at < 30  # well before the 60 s poll interval

    # A send whose transaction stays open: the reader waits for its commit, not for its poll.
    t, out = _poll_in_thread(db_dsn, query, ())
    time.sleep(0.5)
    with psycopg.connect(db_dsn, row_factory=dict_row) as tx:
        row = tx.execute("SELECT pgmq.send('w', '2') AS id").fetchone()
        assert row is not None
        time.sleep(0.5)
        assert t.is_alive()  # not committed yet: nothing to read
        committed_at = time.monotonic()
        tx.commit()
    t.join(150)
    assert ids(out["rows"]) == [row["id"]]
    assert out["done"] - committed_at < 30


def test_read_with_poll_returns_empty_after_max_poll_seconds(pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('e')")
    pg.execute("SELECT pgmq.create('busy')")
    start = time.monotonic()
    assert pg.execute("SELECT * FROM pgmq.read_with_poll('e', 30, 1, 1, 50)").fetchall() == []
    assert time.monotonic() - start >= 0.9


def test_grouped_with_poll_is_woken_by_a_send(db_dsn: str, pg: Conn, pgmq_client: Any) -> None:
    pg.execute("SELECT pgmq.create('gw')")
    t, out = _poll_in_thread(
        db_dsn, "SELECT * FROM pgmq.read_grouped_rr_with_poll('gw', 30, 5, 120, 60000)", ()
    )
    time.sleep(0.5)
    sent_at = time.monotonic()
    first = send(pg, "gw", "1", group="g")
    t.join(150)
    assert ids(out["rows"]) == [first]
    assert out["done"] - sent_at < 30  # well before the 60 s poll interval
    send(pg, "gw", "2", group="g")  # behind its group's head, which is in flight
    assert (
        pgmq_client.read_grouped_with_poll("gw", vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=50) == []
    )


# FIFO groups --------------------------------------------------------------------------------


def test_grouped_reads_keep_order_within_a_group(pg: Conn, pgmq_client: Any) -> None:
    pg.execute("SELECT pgmq.create('f')")
    a1, a2 = send(pg, "f", "1", "a"), send(pg, "f", "2", "a")
    b1, b2 = send(pg, "f", "3", "b"), send(pg, "f", "4", "b")
    a3 = send(pg, "f", "5", "a")
    d1 = send(pg, "f", "6")  # no header: the default group
    # round robin: the first of each group (oldest head first), then the second, ...
    assert ids(pg.execute("SELECT * FROM pgmq.read_grouped_rr('f', 30, 4)").fetchall()) == [a1, b1, d1, a2]
    # every group now has a message in flight: nothing more, though messages are visible
    assert pg.execute("SELECT * FROM pgmq.read_grouped('f', 30, 10)").fetchall() == []
    assert pg.execute("SELECT * FROM pgmq.read_grouped_rr('f', 30, 10)").fetchall() == []
    # group a's head done: a3 is next for a, but a2 (leased) still blocks it
    pg.execute("SELECT pgmq.delete('f', %s::bigint)", (a1,))
    assert pg.execute("SELECT * FROM pgmq.read_grouped('f', 30, 10)").fetchall() == []
    pg.execute("SELECT pgmq.delete('f', %s::bigint[])", ([a2, b1, d1],))
    # read_grouped fills the batch from the oldest group first
    got = pgmq_client.read_grouped("f", vt=30, qty=2)
    assert [m.msg_id for m in got] == [b2, a3]
    pg.execute("SELECT pgmq.delete('f', %s::bigint[])", ([b2, a3],))

    more = [send(pg, "f", str(i), "x") for i in range(3)] + [send(pg, "f", str(i), "y") for i in range(2)]
    got = pgmq_client.read_grouped("f", vt=30, qty=4)
    assert [m.msg_id for m in got] == more[:4]  # all of x first, then y
    # a message released early (set_vt 0) is its group's head again and comes first
    pg.execute("SELECT pgmq.set_vt('f', %s::bigint[], 0)", (more[:4],))
    rr = pgmq_client.read_grouped_rr("f", vt=30, qty=10)
    assert [m.msg_id for m in rr] == [more[0], more[3], more[1], more[4], more[2]]
    assert [m.read_ct for m in rr] == [2, 2, 2, 1, 2]


def test_read_grouped_head_takes_one_per_group(pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('h')")
    x = [send(pg, "h", str(i), "x") for i in range(3)]
    y = [send(pg, "h", str(i), "y") for i in range(2)]
    assert ids(pg.execute("SELECT * FROM pgmq.read_grouped_head('h', 30, 10)").fetchall()) == [x[0], y[0]]
    assert pg.execute("SELECT * FROM pgmq.read_grouped_head_with_poll('h', 30, 10, 1, 50)").fetchall() == []


def test_a_group_being_read_is_skipped_by_a_concurrent_reader(db_dsn: str, pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('c')")
    a = [send(pg, "c", str(i), "a") for i in range(2)]
    b = [send(pg, "c", str(i), "b") for i in range(2)]
    with (
        psycopg.connect(db_dsn, row_factory=dict_row) as one,
        psycopg.connect(db_dsn, row_factory=dict_row) as two,
    ):
        first = one.execute("SELECT * FROM pgmq.read_grouped('c', 30, 2)").fetchall()
        assert ids(first) == a  # transaction open: group a's rows are locked
        second = two.execute("SELECT * FROM pgmq.read_grouped('c', 30, 5)").fetchall()
        assert ids(second) == b
        one.rollback()  # a's messages were never leased
        two.commit()
        # group a's head held elsewhere: a grouped read gets nothing and holds nothing of a
        one.execute("SELECT * FROM lonnymq.message WHERE id = %s FOR UPDATE", (a[0],))
        assert two.execute("SELECT * FROM pgmq.read_grouped('c', 30, 5)").fetchall() == []
        # (NOWAIT raises if two holds a[1])
        assert one.execute(
            "SELECT id FROM lonnymq.message WHERE id = %s FOR UPDATE NOWAIT", (a[1],)
        ).fetchall()
        one.rollback()
        two.rollback()
    assert ids(pg.execute("SELECT * FROM pgmq.read_grouped('c', 30, 5)").fetchall()) == a


# Topics -------------------------------------------------------------------------------------


def test_topics(pg: Conn, pgmq_client: Any) -> None:
    q = pgmq_client
    for name in ("errors", "all_logs", "audit"):
        q.create_queue(name)
    q.bind_topic("logs.*.error", "errors")
    q.bind_topic("logs.#", "all_logs")
    q.bind_topic("logs.#", "all_logs")  # idempotent
    q.bind_topic("#", "audit")
    assert {(b.pattern, b.queue_name) for b in q.list_topic_bindings()} == {
        ("logs.*.error", "errors"), ("logs.#", "all_logs"), ("#", "audit")
    }  # fmt: skip
    assert [b.pattern for b in q.list_topic_bindings("errors")] == ["logs.*.error"]
    assert [(r.pattern, r.queue_name) for r in q.test_routing("logs.api.error")] == [
        ("#", "audit"), ("logs.#", "all_logs"), ("logs.*.error", "errors")
    ]  # fmt: skip
    assert [r.queue_name for r in q.test_routing("logs.api.v2.error")] == ["audit", "all_logs"]
    assert q.send_topic("logs.api.error", {"e": 1}, headers={"h": 1}) == 3
    assert q.send_topic("other", {"e": 2}, delay=3600) == 1  # audit only, scheduled
    sent = q.send_batch_topic("logs.db.error", [{"b": 1}, {"b": 2}])
    assert sorted((r.queue_name, len([s for s in sent if s.queue_name == r.queue_name])) for r in sent) == [
        ("all_logs", 2), ("all_logs", 2), ("audit", 2), ("audit", 2), ("errors", 2), ("errors", 2)
    ]  # fmt: skip
    [e] = q.read_batch("errors", vt=30, batch_size=1)
    assert (e.message, e.headers) == ({"e": 1}, {"h": 1})
    assert [m.message for m in q.read_batch("audit", vt=30, batch_size=10)] == [{"e": 1}, {"b": 1}, {"b": 2}]
    assert q.unbind_topic("#", "audit") is True
    assert q.unbind_topic("#", "audit") is False
    assert pg.execute("SELECT pgmq.send_topic('nobody.listens', '1')").fetchone() == {"send_topic": 0}
    # dropping a queue through the facade drops its bindings
    q.drop_queue("errors")
    assert [b.queue_name for b in q.list_topic_bindings()] == ["all_logs"]
    # so do queues dropped through LonnyMQ's API
    pg.execute("SELECT lonnymq.queue_drop('all_logs')")
    assert q.list_topic_bindings() == []
    assert q.send_topic("logs.x", {"e": 3}) == 0


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "empty"),
        (".logs", "start with a dot"),
        ("logs.", "end with a dot"),
        ("a..b", "consecutive dots"),
        ("a.**", "consecutive stars"),
        ("a.##", "consecutive hashes"),
        ("a.*#", "adjacent wildcards"),
        ("a b", "invalid characters"),
        ("x" * 256, "255"),
    ],
)
def test_topic_pattern_validation(pg: Conn, pattern: str, message: str) -> None:
    pg.execute("SELECT pgmq.create('t')")
    with pytest.raises(psycopg.Error, match=message):
        pg.execute("SELECT pgmq.bind_topic(%s, 't')", (pattern,))


def test_routing_key_validation(pg: Conn, pgmq_client: Any) -> None:
    assert pgmq_client.validate_routing_key("app.user-service.auth_1") is True
    assert pgmq_client.validate_topic_pattern("app.*.#") is True
    for key, message in [("", "empty"), ("a.*", "invalid characters"), ("a..b", "consecutive dots"),
                         (".a", "start with a dot"), ("a.", "end with a dot")]:  # fmt: skip
        with pytest.raises(psycopg.Error, match=message):
            pg.execute("SELECT pgmq.send_topic(%s, '1')", (key,))
    with pytest.raises(psycopg.Error, match="does not exist"):
        pg.execute("SELECT pgmq.bind_topic('a.b', 'nope')")


# Insert notifications -----------------------------------------------------------------------


def _notifications(listener: psycopg.Connection[Any], seconds: float, expect: int = 0) -> list[str]:
    """The ``expect`` notifications expected (waited for up to 60 s: a loaded machine may be slow
    to deliver them), then any more within ``seconds``."""
    got = [n.channel for n in listener.notifies(timeout=60, stop_after=expect)] if expect else []
    return got + [n.channel for n in listener.notifies(timeout=seconds, stop_after=10)]


def test_notify_insert(db_dsn: str, pg: Conn, pgmq_client: Any) -> None:
    def triggers() -> int:
        row = pg.execute(
            "SELECT count(*) AS n FROM pg_trigger WHERE tgname = 'pgmq_notify_insert'"
        ).fetchone()
        return int(row["n"]) if row else -1

    pg.execute("SELECT pgmq.create('n')")
    pg.execute("SELECT pgmq.create('quiet')")
    assert triggers() == 0  # no queue enabled: sends run no trigger at all
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgmq.q_n.INSERT"')
        listener.execute('LISTEN "pgmq.q_quiet.INSERT"')
        pgmq_client.enable_notify("n", throttle_interval_ms=0)
        assert triggers() > 0
        send(pg, "n", "1")
        send(pg, "quiet", "1")
        assert _notifications(listener, 1.0, expect=1) == ["pgmq.q_n.INSERT"]
        # a batch in one transaction: one notification
        pg.execute("SELECT pgmq.send_batch('n', ARRAY['1', '2', '3']::jsonb[])")
        assert _notifications(listener, 1.0, expect=1) == ["pgmq.q_n.INSERT"]
        # a throttle: the second send within the interval does not notify
        pgmq_client.update_notify("n", 60_000)
        [t] = pgmq_client.list_notify_throttles()
        assert (t.queue_name, t.throttle_interval_ms) == ("n", 60_000)
        send(pg, "n", "2")
        send(pg, "n", "3")
        assert _notifications(listener, 1.0, expect=1) == ["pgmq.q_n.INSERT"]
        pgmq_client.disable_notify("n")
        assert triggers() == 0
        send(pg, "n", "4")
        assert _notifications(listener, 0.5) == []
    with pytest.raises(psycopg.Error, match="does not have notify_insert enabled"):
        pg.execute("SELECT pgmq.update_notify_insert('n', 10)")
    with pytest.raises(psycopg.Error, match="non-negative"):
        pg.execute("SELECT pgmq.enable_notify_insert('n', -1)")
    with pytest.raises(psycopg.Error, match="does not exist"):
        pg.execute("SELECT pgmq.enable_notify_insert('nope')")


def test_dropping_a_queue_through_lonnymq_ends_its_notifications(pg: Conn, lq: Client) -> None:
    lq.create_queue("gone")
    pg.execute("SELECT pgmq.enable_notify_insert('gone', 0)")
    lq.drop_queue("gone")
    assert pg.execute("SELECT * FROM pgmq.list_notify_insert_throttles()").fetchall() == []
    row = pg.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = 'pgmq_notify_insert'").fetchone()
    assert row == {"n": 0}


def test_facade_state_survives_a_reinstall(db_dsn: str, pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('s')")
    pg.execute("SELECT pgmq.bind_topic('a.#', 's')")
    pg.execute("SELECT pgmq.enable_notify_insert('s', 0)")
    pg.execute("COMMENT ON SCHEMA pgmq IS 'LonnyMQ pgmq facade over schema lonnymq; sha256 old'")
    with Client(db_dsn, pool_size=1) as c:
        c.migrate(pgmq=True)  # an older facade: dropped and created again
    assert [r["queue_name"] for r in pg.execute("SELECT * FROM pgmq.list_topic_bindings()")] == ["s"]
    assert [r["queue_name"] for r in pg.execute("SELECT * FROM pgmq.list_notify_insert_throttles()")] == ["s"]
    pg.execute('LISTEN "pgmq.q_s.INSERT"')
    pg.execute("SELECT pgmq.send_topic('a.b', '1')")
    assert [n.channel for n in pg.notifies(timeout=60, stop_after=1)] == ["pgmq.q_s.INSERT"]
    with Client(db_dsn, pool_size=1) as c:
        c.uninstall_pgmq()
    row = pg.execute(
        "SELECT count(*) AS n FROM pg_trigger WHERE tgname IN ('pgmq_notify_insert', 'pgmq_queue_changed')"
    ).fetchone()
    assert row == {"n": 0}  # uninstall leaves nothing on LonnyMQ's tables


# Views --------------------------------------------------------------------------------------


def test_queue_and_archive_views(pg: Conn, lq: Client) -> None:
    def cols(view: str) -> list[str]:
        rows = pg.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
            (view,),
        ).fetchall()
        return [r["attname"] for r in rows]

    pg.execute("SELECT pgmq.create('orders')")
    assert cols("pgmq.q_orders") == [
        "msg_id",
        "read_ct",
        "enqueued_at",
        "last_read_at",
        "vt",
        "message",
        "headers",
    ]
    assert cols("pgmq.a_orders") == [
        "msg_id", "read_ct", "enqueued_at", "last_read_at", "archived_at", "vt", "message", "headers"
    ]  # fmt: skip
    one = send(pg, "orders", '{"o": 1}')
    two = send(pg, "orders", '{"o": 2}')
    pg.execute("SELECT * FROM pgmq.read('orders', 600, 1)")
    rows = pg.execute("SELECT * FROM pgmq.q_orders ORDER BY msg_id").fetchall()
    assert [(r["msg_id"], r["read_ct"], r["message"]) for r in rows] == [
        (one, 1, {"o": 1}),
        (two, 0, {"o": 2}),
    ]
    assert rows[0]["vt"] > datetime.now(UTC) + timedelta(seconds=500)
    pg.execute("SELECT pgmq.archive('orders', %s::bigint)", (one,))
    [a] = pg.execute("SELECT * FROM pgmq.a_orders").fetchall()
    assert (a["msg_id"], a["message"]) == (one, {"o": 1}) and a["archived_at"] is not None
    # a queue LonnyMQ creates gets its views too, and loses them when LonnyMQ drops it
    lq.create_queue("native")
    lq.send("native", {"n": 1})
    assert [r["message"] for r in pg.execute("SELECT * FROM pgmq.q_native")] == [{"n": 1}]
    pg.execute("SELECT pgmq.create('native')")  # an existing queue: its messages stay
    assert [r["message"] for r in pg.execute("SELECT * FROM pgmq.q_native")] == [{"n": 1}]
    lq.drop_queue("native")
    assert pg.execute("SELECT to_regclass('pgmq.q_native') AS r").fetchone() == {"r": None}
    # the consumer role may read the live messages, not the archive (archive_list is admin's)
    pg.execute("SET ROLE lonnymq_consumer")
    try:
        assert len(pg.execute("SELECT * FROM pgmq.q_orders").fetchall()) == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pg.execute("SELECT * FROM pgmq.a_orders")
    finally:
        pg.execute("RESET ROLE")
    meta = pg.execute("SELECT * FROM pgmq.meta ORDER BY queue_name").fetchall()
    assert [(m["queue_name"], m["is_partitioned"], m["is_unlogged"]) for m in meta] == [
        ("orders", False, False)
    ]
    pg.execute("SELECT pgmq.drop_queue('orders')")
    assert pg.execute(
        "SELECT to_regclass('pgmq.q_orders') AS q, to_regclass('pgmq.a_orders') AS a"
    ).fetchone() == {
        "q": None,
        "a": None,
    }


# Privileges ---------------------------------------------------------------------------------


def test_table_level_functions_follow_lonnymq_roles(pg: Conn) -> None:
    pg.execute("SELECT pgmq.create('p')")
    pg.execute("SELECT pgmq.bind_topic('p.#', 'p')")
    pg.execute("SET ROLE lonnymq_producer")
    try:
        assert pg.execute("SELECT pgmq.send_topic('p.x', '{\"k\": 1}') AS n").fetchone() == {"n": 1}
        for query in (
            "SELECT * FROM pgmq.read('p', 30, 1, '{\"k\": 1}')",
            "SELECT * FROM pgmq.read_grouped('p', 30, 1)",
            "SELECT * FROM pgmq.set_vt('p', 1::bigint, 10)",
            "SELECT pgmq.bind_topic('q.#', 'p')",
            "SELECT pgmq.enable_notify_insert('p')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                pg.execute(query)
    finally:
        pg.execute("RESET ROLE")
    pg.execute("SET ROLE lonnymq_consumer")
    try:
        [r] = pg.execute("SELECT * FROM pgmq.read('p', 30, 1, '{\"k\": 1}')").fetchall()
        assert r["message"] == {"k": 1}
        assert (
            len(pg.execute("SELECT * FROM pgmq.set_vt('p', %s::bigint, 0)", (r["msg_id"],)).fetchall()) == 1
        )
        assert len(pg.execute("SELECT * FROM pgmq.read_grouped('p', 30, 1)").fetchall()) == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pg.execute("SELECT pgmq.unbind_topic('p.#', 'p')")
    finally:
        pg.execute("RESET ROLE")


# The official async client -------------------------------------------------------------------


def test_official_async_client_on_the_table_level_functions(pgmq_args: dict[str, Any]) -> None:
    from pgmq.async_queue import PGMQueue as AsyncPGMQueue

    async def main() -> None:
        q = AsyncPGMQueue(**pgmq_args, init_extension=False)
        await q.init()
        try:
            await q.create_queue("aq")
            await q.bind_topic("jobs.#", "aq")
            assert await q.send_topic("jobs.a", {"kind": "a"}, headers={"x-pgmq-group": "g"}) == 1
            sent = await q.send_batch_topic("jobs.b", [{"kind": "b"}, {"kind": "c"}])
            assert [r.queue_name for r in sent] == ["aq", "aq"]
            [m] = await q.read("aq", vt=30, qty=5, conditional={"kind": "b"})
            assert m.message == {"kind": "b"}
            [back] = await q.set_vt("aq", [m.msg_id], 0)
            assert back.msg_id == m.msg_id
            rr = await q.read_grouped_rr("aq", vt=30, qty=5)
            # group g: one message; the default group: b (released again) then c
            assert [x.message["kind"] for x in rr] == ["a", "b", "c"]
            await q.enable_notify("aq", throttle_interval_ms=0)
            assert [t.queue_name for t in await q.list_notify_throttles()] == ["aq"]
            assert await q.read_with_poll("aq", vt=30, qty=1, max_poll_seconds=1, poll_interval_ms=50) == []
        finally:
            await q.close()

    asyncio.run(main())


def test_enabling_notifications_never_stalls_sends_behind_a_long_transaction(db_dsn: str, pg: Conn) -> None:
    """enable_notify_insert re-creates a trigger on the message table. While a transaction that
    has written to it is open (a long producer, a take_tx), that DDL cannot get its lock;
    every send and take would queue behind its waiting request, so it waits 100 ms at a time
    and gives way in between: sends carry on, and the DDL lands once the transaction ends."""
    pg.execute("SELECT pgmq.create('busy')")
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT pgmq.send('busy', '0'::jsonb)")  # ROW EXCLUSIVE until it ends
        enabled: list[BaseException | None] = []

        def enable() -> None:
            try:
                with psycopg.connect(db_dsn, autocommit=True) as c:
                    c.execute("SELECT pgmq.enable_notify_insert('busy', 0)")
                enabled.append(None)
            except BaseException as e:  # pragma: no cover - reported below
                enabled.append(e)

        t = threading.Thread(target=enable)
        t.start()
        slowest = 0.0
        # A lock wait of a second behind the DDL's lock request fails the send (LockNotAvailable):
        # measured by the server, not by the wall clock of a possibly loaded machine.
        pg.execute("SET lock_timeout = '1s'")
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            started = time.monotonic()
            send(pg, "busy", "1")
            pg.execute("SELECT * FROM pgmq.pop('busy')")
            slowest = max(slowest, time.monotonic() - started)
        pg.execute("RESET lock_timeout")
        assert enabled == []  # still waiting for the holder
        holder.rollback()
        t.join(60)
    assert enabled == [None]
    assert slowest < 10, slowest  # a backstop: the lock_timeout above is the check
    row = pg.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = 'pgmq_notify_insert'").fetchone()
    assert row is not None and row["n"] > 0
