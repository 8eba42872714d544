"""Leases: nack, defer, extend, fencing tokens after a lease is lost, max attempts and the
dead-letter queue / archive. Time is moved with the functions' p_now, never by sleeping."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from core_helpers import Sql, as_message
from lonnymq import Client, Envelope, Message, errors


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


def _snapshot(db: Sql) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return db.q("SELECT * FROM {s}.message ORDER BY id"), db.q("SELECT * FROM {s}.archive ORDER BY id")


def test_nack_retries_after_its_delay(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"a", b"b"], t)
    a, b = db.take("q", 2, t)
    out = db.call(
        "nack",
        p_queue="q",
        p_ids=[a["id"], b["id"]],
        p_tokens=[1, 1],
        p_delays_ms=[10_000, 0],
        p_errors=["e-a", None],
        p_now=t,
    )
    assert sorted((r["id"], r["outcome"]) for r in out) == [(a["id"], "retry"), (b["id"], "retry")]
    assert [(d["payload"], d["attempt"], d["last_error"]) for d in db.take("q", 5, t + 9_999)] == [
        (b"b", 2, None)
    ]
    [d] = db.take("q", 5, t + 10_000)
    assert (d["payload"], d["attempt"], d["token"], d["last_error"]) == (b"a", 2, 2, "e-a")


def test_nack_through_the_client(client: Client, db: Sql) -> None:
    client.create_queue("q")
    client.send_batch("q", [b"1", b"2", b"3"])
    m1, m2, m3 = client.take("q", 3)
    assert client.nack(m1, error="boom") == {m1.id: "retry"}
    assert client.nack([m2, m3], delay=[3600, 0], error=["x", "y"]) == {m2.id: "retry", m3.id: "retry"}
    got = client.take("q", 5)
    assert [(m.id, m.attempt, m.last_error) for m in got] == [(m1.id, 2, "boom"), (m3.id, 2, "y")]
    [later] = [m for m in client.peek("q") if m.id == m2.id]
    assert later.last_error == "x" and later.lease_until is None


def test_nack_keeps_priority(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"hi"], t, p_priorities=[5])
    [d] = db.take("q", 1, t)
    db.send("q", [b"older"], t, p_at_ms=[t + 10_000 - 5_001])
    db.send("q", [b"newer"], t, p_at_ms=[t + 10_000 - 4_999])
    db.call("nack", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_now=t + 10_000)
    assert [x["payload"] for x in db.take("q", 5, t + 10_000)] == [b"older", b"hi", b"newer"]


def test_defer_saves_state_and_does_not_count(client: Client, db: Sql) -> None:
    client.create_queue("q", max_attempts=1)
    client.send("q", {"job": 1})
    [m] = client.take("q")
    for step in range(1, 4):
        assert client.defer(m, state={"step": step}) == {m.id: "retry"}
        [m] = client.take("q")
        assert (m.attempt, m.token, m.state) == (1, step + 1, {"step": step})
    assert client.release([m]) == {m.id: "retry"}
    [m] = client.take("q")
    assert (m.attempt, m.state) == (1, {"step": 3})  # release keeps the saved state
    assert client.nack(m, error="finally") == {m.id: "dead"}  # the one real attempt


def test_defer_with_delay(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"x"], t)
    [d] = db.take("q", 1, t)
    db.call(
        "nack",
        p_queue="q",
        p_ids=[d["id"]],
        p_tokens=[d["token"]],
        p_delays_ms=[500],
        p_states=[{"k": "v"}],
        p_count_attempt=False,
        p_now=t,
    )
    assert db.take("q", 1, t + 499) == []
    [d] = db.take("q", 1, t + 500)
    assert (d["attempt"], d["state"]) == (1, {"k": "v"})


def test_extend_pushes_the_lease(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=1)
    t = db.now()
    db.send("q", [b"x"], t)
    [d] = db.take("q", 1, t)
    assert d["lease_until"] == t + 1000
    [e] = db.call(
        "extend", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_lease_ms=5000, p_now=t + 500
    )
    assert e == {"id": d["id"], "lease_until": t + 5500}
    assert db.take("q", 1, t + 5499) == []
    [again] = db.take("q", 1, t + 5500)
    assert (again["attempt"], again["token"]) == (2, 2)
    # Without a lease given, the queue's lease is used.
    [e] = db.call("extend", p_queue="q", p_ids=[d["id"]], p_tokens=[2], p_now=t + 6000)
    assert e["lease_until"] == t + 7000


def test_extend_through_the_client(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=1)
    client.send("q", b"x")
    [m] = client.take("q")
    before = db.now()
    until = client.extend(m, lease=120)
    assert until.keys() == {m.id} and before + 120_000 <= until[m.id] <= db.now() + 120_000
    assert client.extend([m]) == {m.id: pytest.approx(db.now() + 1000, abs=5000)}


# -- lost leases ---------------------------------------------------------------------------


def _lost(client: Client, db: Sql) -> tuple[Message, Message]:
    """A delivery whose lease ran out and that was taken again: (stale, current)."""
    client.create_queue("q")
    client.send("q", b"x", kind="k")
    [stale] = client.take("q", lease=30)
    [d] = db.take("q", 1, db.now() + 31_000)  # 31 s later the lease is gone: taken again
    current = as_message("q", d)
    assert (current.id, current.token, current.attempt) == (stale.id, stale.token + 1, 2)
    return stale, current


@pytest.mark.parametrize("action", ["ack", "nack", "defer", "release", "extend"])
def test_stale_token_is_rejected_and_changes_nothing(client: Client, db: Sql, action: str) -> None:
    stale, current = _lost(client, db)
    client.send("q", b"other")
    [other] = client.take("q")
    before = _snapshot(db)
    call = getattr(client, action)
    with pytest.raises(errors.LeaseLost, match=f"message {stale.id}"):
        call(stale)
    assert _snapshot(db) == before
    assert call([stale]) in (set(), {})  # in a batch: left out of the result
    assert _snapshot(db) == before
    # Mixed with a live delivery, only the live one is settled.
    result = call([stale, other])
    assert set(result) == {other.id}
    assert db.row("q", stale.id) == before[0][[r["id"] for r in before[0]].index(stale.id)]
    # The current holder still can.
    assert current.id in call([current])


def test_ack_twice_succeeds_but_nack_after_ack_is_lease_lost(client: Client) -> None:
    client.create_queue("q")
    client.send("q", b"x")
    [m] = client.take("q")
    client.ack(m)
    assert client.ack(m) == {m.id}  # a repeat of the same settle (issue 11)
    with pytest.raises(errors.LeaseLost):
        client.nack(m)


def test_an_expired_lease_not_yet_retaken_can_still_be_settled(client: Client, db: Sql) -> None:
    """The token fences against a newer holder, not against the clock."""
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"x"], t)
    [d] = db.take("q", 1, t, p_lease_ms=1)
    assert db.call("ack", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_now=t + 10) == [
        {"ack": d["id"]}
    ]


# -- max attempts and dead letters ---------------------------------------------------------


def test_last_failed_attempt_goes_to_the_dead_letter_queue(client: Client, db: Sql) -> None:
    client.create_queue("dlq")
    client.create_queue("work", max_attempts=2, dead_letter_queue="dlq")
    sent = client.send("work", {"n": 1}, kind="email", headers={"trace": "t1"}, key="k1", priority=4)
    [m] = client.take("work")
    assert client.nack(m, error="first") == {m.id: "retry"}
    [m] = client.take("work")
    assert m.attempt == 2
    assert client.nack(m, error="second") == {m.id: "dead"}
    assert db.count("work") == 0 and db.archive("work") == []
    [d] = client.take("dlq")
    assert (d.payload, d.kind, d.last_error, d.attempt, d.priority, d.key) == (
        {"n": 1},
        "email",
        "second",
        1,
        0,
        None,
    )
    assert d.headers["trace"] == "t1"  # type: ignore[index]
    info = d.headers["lonnymq_dead_letter"]  # type: ignore[index]
    assert (info["queue"], info["id"], info["key"], info["attempts"], info["error"], info["enqueued_at"]) == (
        "work",
        sent.id,
        "k1",
        2,
        "second",
        m.enqueued_at,
    )
    # The key is free again in the source queue.
    assert client.send("work", "again", key="k1").outcome == "created"


def test_last_failed_attempt_goes_to_the_archive_without_a_dlq(client: Client, db: Sql) -> None:
    client.create_queue("work", max_attempts=1)
    client.send_batch("work", [Envelope(b"x", kind="k"), Envelope(b"y")])
    mx, my = client.take("work", 2)
    assert client.nack([mx, my], error=["bad x", None]) == {mx.id: "dead", my.id: "dead"}
    assert db.count("work") == 0
    dead = client.dead_letters("work")
    assert [(x.id, x.attempts, x.kind, x.last_error, x.payload) for x in dead] == [
        (mx.id, 1, "k", "bad x", b"x"),
        (my.id, 1, None, None, b"y"),
    ]
    assert [a["status"] for a in db.archive("work")] == ["dead", "dead"]
    assert client.metrics("work").dead == 2
    assert [x.id for x in client.dead_letters("work", after_id=mx.id)] == [my.id]
    assert client.requeue_dead("work", [mx.id]) == 1
    [again] = client.take("work")
    assert (again.payload, again.attempt, again.last_error) == (b"x", 1, "bad x")
    assert client.purge_dead("work") == 1
    assert client.dead_letters("work") == []


def test_lease_expiring_on_the_last_attempt_is_dead_lettered_on_the_next_take(
    client: Client, db: Sql
) -> None:
    client.create_queue("dlq")
    client.create_queue("work", max_attempts=2, dead_letter_queue="dlq", lease=1)
    client.create_queue("solo", max_attempts=1, lease=1)
    t = db.now()
    for queue in ("work", "solo"):
        db.send(queue, [b"x"], t)
    [d1] = db.take("work", 1, t)
    [d2] = db.take("work", 1, t + 1000)  # the first lease expired: attempt 2
    assert (d2["id"], d2["attempt"]) == (d1["id"], 2)
    assert db.take("work", 1, t + 2000) == []  # the last lease expired too
    assert db.count("work") == 0
    [dl] = db.take("dlq", 1, t + 2000)
    assert (dl["payload"], dl["last_error"]) == (b"x", "lease expired on the last attempt")
    assert dl["headers"]["lonnymq_dead_letter"]["attempts"] == 2
    [s] = db.take("solo", 1, t)
    assert db.take("solo", 1, t + 1000) == []
    [a] = db.archive("solo")
    assert (a["id"], a["status"], a["last_error"], a["attempts"]) == (
        s["id"],
        "dead",
        "lease expired on the last attempt",
        1,
    )
    # The late holder's ack is refused and changes nothing.
    assert db.call("ack", p_queue="solo", p_ids=[s["id"]], p_tokens=[s["token"]], p_now=t + 1001) == []
    assert len(db.archive("solo")) == 1


def test_dead_lettering_on_take_keeps_the_previous_error(client: Client, db: Sql) -> None:
    client.create_queue("q", max_attempts=2, lease=1)
    t = db.now()
    db.send("q", [b"x"], t)
    [d] = db.take("q", 1, t)
    db.call("nack", p_queue="q", p_ids=[d["id"]], p_tokens=[1], p_errors=["real error"], p_now=t)
    db.take("q", 1, t)
    assert db.take("q", 1, t + 1000) == []
    [a] = db.archive("q")
    assert (a["status"], a["attempts"]) == ("dead", 2)
    assert a["last_error"] == "lease expired on the last attempt"


def test_take_returns_ready_messages_behind_one_it_dead_letters(client: Client, db: Sql) -> None:
    client.create_queue("q", max_attempts=1, lease=1)
    t = db.now()
    db.send("q", [b"dies"], t)
    db.take("q", 1, t)
    db.send("q", [b"ready"], t, p_at_ms=[t + 1000])  # same dequeue_at as the expired lease
    assert [d["payload"] for d in db.take("q", 1, t + 1000)] == [b"ready"]


def test_take_tx_does_not_deliver_beyond_max_attempts(client: Client, db: Sql) -> None:
    client.create_queue("q", max_attempts=1, lease=1)
    t = db.now()
    db.send("q", [b"x"], t)
    db.take("q", 1, t)
    assert db.call("take_tx", p_queue="q", p_limit=1, p_now=t + 1000) == []


def test_nack_delay_holds_for_priority_messages(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"x"], t, p_priorities=[5])
    [d] = db.take("q", 1, t)
    db.call("nack", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_delays_ms=[3000], p_now=t)
    assert db.take("q", 1, t + 2999) == []
