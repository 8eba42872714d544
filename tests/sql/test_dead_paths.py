"""The paths a delivery takes when things go wrong: given up (dead-lettered before its attempts
are used up), its lease lost to another consumer between take and extend/nack/ack/give_up, and
a queue dropped while someone else drops it or starts dead-lettering into it.

The clock is driven through p_now (take at t, take again after the lease expired), never slept.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import IsolationLevel, sql

from core_helpers import Sql, as_message
from lonnymq import Client, errors

LEASE = 1_000


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def channels(db: Sql, queue: str) -> dict[str, tuple[int, int]]:
    """{channel: (size, leased)} of a queue."""
    return {r["name"]: (r["size"], r["leased"]) for r in db.call("channel_list", p_queue=queue)}


def lost_lease(db: Sql, queue: str, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send one message, take it at now (lease LEASE), take it again after that lease expired:
    (the first delivery, whose token is now stale; the second, current one)."""
    db.send(queue, [b"m"], now)
    [first] = db.take(queue, 1, now, p_lease_ms=LEASE)
    [second] = db.take(queue, 1, now + 2 * LEASE, p_lease_ms=60_000)
    assert (first["id"], first["token"] + 1) == (second["id"], second["token"])
    return first, second


def test_give_up_moves_a_delivery_to_the_dead_letter_queue_at_once(db: Sql) -> None:
    db.call("queue_create", p_name="dlq")
    db.call("queue_create", p_name="q", p_dead_letter_queue="dlq", p_max_attempts=5)
    now = db.now() - 60_000
    [sent] = db.send("q", [b"body"], now, p_keys=["k"], p_headers=[{"h": 1}], p_priorities=[7])
    [d] = db.take("q", 1, now)
    assert d["attempt"] == 1  # four attempts left: give_up does not wait for them

    gone = db.call("give_up", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]],
                   p_errors=["cannot parse"], p_now=now + 5)  # fmt: skip
    assert [r["give_up"] for r in gone] == [sent["id"]]
    assert db.count("q") == 0 and db.archive("q") == []  # moved, not archived
    [m] = db.q("SELECT m.* FROM {s}.message m WHERE m.queue_id = %s", (db.queue_id("dlq"),))
    assert bytes(m["payload"]) == b"body"
    assert m["last_error"] == "cannot parse"
    assert (m["priority"], m["attempts"], m["leased"]) == (0, 0, False)
    assert m["scheduled_at"] == m["dequeue_at"] == now + 5  # ready in the dead-letter queue now
    assert m["headers"] == {
        "h": 1,
        "lonnymq_dead_letter": {
            "queue": "q", "id": sent["id"], "key": "k", "attempts": 1, "error": "cannot parse",
            "enqueued_at": now,
        },
    }  # fmt: skip
    [again] = db.take("dlq", 1, now + 10)
    assert again["id"] == m["id"] and again["last_error"] == "cannot parse"


def test_give_up_of_a_channel_message_moves_its_channel_count(db: Sql) -> None:
    db.call("queue_create", p_name="dlq")
    db.call("queue_create", p_name="q", p_dead_letter_queue="dlq")
    now = db.now() - 60_000
    db.send("q", [b"a", b"b"], now, p_channels=["c", "c"])
    [d] = db.take("q", 1, now)
    assert channels(db, "q") == {"c": (2, 1)}

    gone = db.call("give_up", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_now=now + 1)
    assert [r["give_up"] for r in gone] == [d["id"]]
    # It left the source channel (and its lease with it) and entered the dead-letter queue's
    # channel of the same name, which take now serves channel by channel.
    assert channels(db, "q") == {"c": (1, 0)}
    assert channels(db, "dlq") == {"c": (1, 0)}
    [x] = db.take("dlq", 5, now + 2)
    assert (bytes(x["payload"]), x["channel"], x["last_error"]) == (b"a", "c", None)
    assert channels(db, "dlq") == {"c": (1, 1)}
    [y] = db.take("q", 5, now + 2)
    assert bytes(y["payload"]) == b"b"


def test_give_up_without_dead_letter_queue_archives_it_as_dead(db: Sql, client: Client) -> None:
    db.call("queue_create", p_name="q")
    now = db.now() - 60_000
    db.send("q", [b"a"], now)
    [d] = db.take("q", 1, now)
    db.call("give_up", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_errors=[None], p_now=now + 1)
    [dead] = client.dead_letters("q")
    assert (dead.id, dead.attempts, dead.payload) == (d["id"], 1, b"a")
    assert db.count("q") == 0


def test_give_up_with_a_lost_lease_changes_nothing(db: Sql) -> None:
    db.call("queue_create", p_name="dlq")
    db.call("queue_create", p_name="q", p_dead_letter_queue="dlq")
    now = db.now() - 60_000
    first, second = lost_lease(db, "q", now)
    before = db.row("q", first["id"])

    gone = db.call("give_up", p_queue="q", p_ids=[first["id"]], p_tokens=[first["token"]],
                   p_errors=["too late"], p_now=now + 2 * LEASE + 1)  # fmt: skip
    assert gone == []
    assert db.row("q", first["id"]) == before  # still the second consumer's, untouched
    assert db.count("dlq") == 0
    # An id that does not exist (already settled) is skipped the same way.
    assert db.call("give_up", p_queue="q", p_ids=[first["id"] + 1000], p_tokens=[1]) == []
    # The current holder can still give it up.
    gone = db.call("give_up", p_queue="q", p_ids=[second["id"]], p_tokens=[second["token"]],
                   p_now=now + 2 * LEASE + 2)  # fmt: skip
    assert [r["give_up"] for r in gone] == [second["id"]]
    assert db.count("dlq") == 1


def test_extend_nack_and_ack_after_the_lease_was_lost_change_nothing(db: Sql) -> None:
    db.call("queue_create", p_name="q", p_max_attempts=2)
    now = db.now() - 60_000
    first, second = lost_lease(db, "q", now)
    assert second["attempt"] == 2  # the current holder is on the last attempt
    before = db.row("q", first["id"])
    stale = {"p_queue": "q", "p_ids": [first["id"]], "p_tokens": [first["token"]]}
    t = now + 2 * LEASE + 10

    assert db.call("extend", **stale, p_lease_ms=3_600_000, p_now=t) == []
    # A stale nack neither retries it nor, although attempts are used up, dead-letters it.
    assert db.call("nack", **stale, p_errors=["late failure"], p_now=t) == []
    assert list(db.call("ack", **stale, p_now=t)) == []
    assert db.row("q", first["id"]) == before
    assert before is not None and before["dequeue_at"] == second["lease_until"]
    assert db.archive("q") == []

    # The current token still works.
    [ext] = db.call("extend", p_queue="q", p_ids=[second["id"]], p_tokens=[second["token"]],
                    p_lease_ms=5_000, p_now=t)  # fmt: skip
    assert ext == {"id": second["id"], "lease_until": t + 5_000}


def test_the_client_raises_lease_lost_for_a_stale_delivery(db: Sql, client: Client) -> None:
    db.call("queue_create", p_name="q")
    now = db.now() - 60_000  # both leases are in the past for the client's real clock
    first, second = lost_lease(db, "q", now)
    stale = as_message("q", first)
    before = db.row("q", first["id"])
    for settle in (client.extend, client.nack, client.defer, client.ack):
        with pytest.raises(errors.LeaseLost, match=f"message {first['id']} of queue 'q': token 1 is stale"):
            settle(stale)
    assert db.row("q", first["id"]) == before
    # In a batch, the stale delivery is just left out.
    assert client.extend([stale]) == {}
    assert client.ack([stale, as_message("q", second)]) == {second["id"]}


# -- queue_drop against concurrent changes ----------------------------------------------------


def _wait_until_blocked(conn: psycopg.Connection[Any], pids: list[int]) -> None:
    """Until every backend of pids waits for a lock."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        n = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY (%s) AND wait_event_type = 'Lock'",
            (pids,),
        ).fetchone()
        if n is not None and n[0] == len(pids):
            return
        time.sleep(0.02)
    raise AssertionError("the concurrent drops never waited for the first one")


def test_concurrent_drops_of_a_queue_serialise(dsn: str, schema: str, client: Client, db: Sql) -> None:
    """While one transaction drops a queue, other drops wait for it, then find nothing: false
    with if_exists, QueueNotFound otherwise (never an error about the vanished queue's rows)."""
    client.create_queue("x")
    client.send("x", b"m")
    results: dict[str, Any] = {}
    pids: list[int] = []
    ready = threading.Barrier(3)

    def other(name: str, if_exists: bool) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            pids.append(c.info.backend_pid)
            ready.wait(30)
            try:
                results[name] = Client(c, schema=schema).drop_queue("x", if_exists=if_exists)
            except errors.LonnyMQError as e:
                results[name] = e

    with psycopg.connect(dsn) as first:
        assert Client(first, schema=schema).drop_queue("x", conn=first) is True  # not committed yet
        threads = [threading.Thread(target=other, args=a) for a in (("lenient", True), ("strict", False))]
        for t in threads:
            t.start()
        ready.wait(30)
        _wait_until_blocked(db.conn, pids)
        first.commit()
    for t in threads:
        t.join(30)
    assert results["lenient"] is False
    assert isinstance(results["strict"], errors.QueueNotFound)
    assert client.list_queues() == []
    assert db.q("SELECT count(*) AS n FROM {s}.message") == [{"n": 0}]


@pytest.mark.parametrize("via", ["sql", "client"])
def test_drop_refuses_a_queue_that_became_a_dead_letter_queue_meanwhile(
    dsn: str, schema: str, client: Client, db: Sql, via: str
) -> None:
    """A drop in a REPEATABLE READ transaction does not see a queue created after its snapshot
    that dead-letters into the dropped one; the foreign key does, and the drop is refused as
    QueueInUse (LQ006) with nothing dropped, not with a bare foreign key error."""
    client.create_queue("d")
    client.send("d", b"kept")
    with psycopg.connect(dsn) as tx:
        tx.isolation_level = IsolationLevel.REPEATABLE_READ
        tx.execute("SELECT 1")  # the transaction's snapshot: no queue names d yet
        client.create_queue("x", dead_letter_queue="d")  # committed by another session
        if via == "sql":
            with pytest.raises(psycopg.Error) as e:
                tx.execute(sql.SQL("SELECT {}.queue_drop('d')").format(sql.Identifier(schema)))
            assert e.value.sqlstate == "LQ006"
            assert e.value.diag.message_primary == "queue 'd' became the dead-letter queue of another queue"
        else:
            with pytest.raises(errors.QueueInUse, match="queue 'd' became the dead-letter queue"):
                Client(tx, schema=schema).drop_queue("d", conn=tx)
        tx.rollback()
    assert sorted(q.name for q in client.list_queues()) == ["d", "x"]
    assert [m.payload for m in client.peek("d")] == [b"kept"]
    # Once committed, the reference is seen up front.
    with pytest.raises(errors.QueueInUse, match="queue 'd' is the dead-letter queue of 'x'"):
        client.drop_queue("d")


# -- dead letters found by take, requeue of nothing, counters that outlived their messages ----


def test_take_on_a_channel_queue_dead_letters_plain_messages_whose_last_lease_expired(db: Sql) -> None:
    """On a queue served channel by channel, plain messages are still candidates; one whose
    lease expired on its last attempt goes to the archive as dead instead of being delivered
    again, and does not take a place of the call's limit."""
    db.call("queue_create", p_name="q", p_max_attempts=1)
    now = db.now() - 60_000
    db.send("q", [b"p1", b"p2"], now)
    first = db.take("q", 2, now, p_lease_ms=LEASE)
    assert [bytes(d["payload"]) for d in first] == [b"p1", b"p2"]
    db.send("q", [b"c1", b"p3"], now + 1, p_channels=["c", None])  # the queue now uses channels

    # Candidates in time order: p3, then p1 and p2 (expired): p1 is dead-lettered, and the two
    # places of the call go to p3 and the channel's c1.
    later = db.take("q", 2, now + 2 * LEASE)
    assert sorted(bytes(d["payload"]) for d in later) == [b"c1", b"p3"]

    def dead() -> list[tuple[int, str, str]]:
        return [(a["id"], a["status"], a["last_error"]) for a in db.archive("q")]

    expired = [(d["id"], "dead", "lease expired on the last attempt") for d in first]
    assert dead() == expired[:1]
    assert db.take("q", 5, now + 3 * LEASE) == []  # p2 now, and the rest are leased
    assert dead() == expired


def test_requeue_of_nothing_returns_zero_and_wakes_no_one(
    db: Sql, client: Client, dsn: str, schema: str
) -> None:
    db.call("queue_create", p_name="q")
    now = db.now() - 60_000
    db.send("q", [b"a"], now)
    [d] = db.take("q", 1, now)
    db.call("give_up", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_now=now + 1)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        # Sends notify only while someone waits on the queue (docs/wakeups.md): register.
        listener.execute(sql.SQL("SELECT {}.wait_begin('q')").format(sql.Identifier(schema)))
        assert client.requeue_dead("q", [d["id"] + 1]) == 0  # not a dead message of q
        assert list(listener.notifies(timeout=0.3)) == []
        assert [a["status"] for a in db.archive("q")] == ["dead"]
        assert client.requeue_dead("q", [d["id"]]) == 1
        assert [n.payload for n in listener.notifies(timeout=60, stop_after=1)] == ["q"]
    assert db.archive("q") == [] and db.count("q") == 1


def ready_in(db: Sql, queue: str) -> int | None:
    [row] = db.call("next_ready_in", p_queue=queue)
    return row["next_ready_in"]  # type: ignore[no-any-return]


def test_a_channel_whose_messages_vanished_is_never_ready(db: Sql, client: Client) -> None:
    """A crash empties an UNLOGGED queue's messages but not its (logged) channel counters. A
    channel counted as holding messages it no longer has is not reported ready (no consumer
    polls for it) until channel_recount corrects the counters."""
    db.call("queue_create", p_name="q", p_unlogged=True)
    now = db.now() - 60_000
    db.send("q", [b"a", b"b"], now, p_channels=["c", "c"])
    assert ready_in(db, "q") == 0
    # What crash recovery does to an UNLOGGED table: it comes back empty.
    db.conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(db.schema, "message_unlogged")))
    c = client.set_channel("q", "c", max_concurrency=2)  # recomputes its ready_at
    assert (c.size, c.ready_at) == (2, None)
    assert ready_in(db, "q") is None
    assert db.take("q", 5, now + 1) == []
    assert db.call("channel_recount", p_queue="q") == [{"channel_recount": 1}]
    assert channels(db, "q") == {"c": (0, 0)}  # configured: kept while empty
