"""A replace of a leased message keeps the new version (issue 11 item 1): the old holder keeps
its lease and settles only the version it took; the new version is another message (a new id,
so no earlier token can settle it) waiting at its own schedule. Through the client, from SQL
(p_now moves time, never sleeping) and under races between real concurrent connections."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from core_helpers import Sql, as_message
from lonnymq import Client, errors


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


def _live(db: Sql, queue: str) -> list[dict[str, Any]]:
    return db.q(
        "SELECT m.id, m.key, m.payload, m.leased, m.attempts, m.superseded_by, m.channel"
        "  FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id",
        (queue,),
    )


def _channel(db: Sql, name: str) -> tuple[int, int]:
    [row] = db.q("SELECT current_size, current_concurrency FROM {s}.channel WHERE name = %s", (name,))
    return row["current_size"], row["current_concurrency"]


def _held_and_replaced(client: Client, db: Sql, **send: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """v1 with key k taken at t (lease 5 s), then replaced by v2 (at t + 60 s unless given)."""
    client.create_queue("q", lease=5, **send.pop("queue", {}))
    t = db.now()
    db.send("q", [b"v1"], t, p_keys=["k"], **send)
    [old] = db.take("q", 1, t)
    [r] = db.send("q", [b"v2"], t + 1, p_keys=["k"], p_on_conflict="replace", p_at_ms=[t + 60_000], **send)
    return old, r, t


def test_replace_of_a_leased_message_reports_updated_and_keeps_both(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=30)
    client.send("q", "v1", key="k", headers={"v": 1})
    [old] = client.take("q")
    r = client.send("q", "v2", key="k", headers={"v": 2}, delay=3600, on_conflict="replace")
    assert r.outcome == "updated" and r.id != old.id
    new = client.get("q", key="k")
    assert new is not None and (new.id, new.payload, new.headers, new.status) == (
        r.id,
        "v2",
        {"v": 2},
        "scheduled",
    )
    held = client.get("q", id=old.id)
    assert held is not None and (held.payload, held.status) == ("v1", "leased")
    # The holder keeps its lease, may extend it, and its ack settles only its version.
    assert set(client.extend(old, lease=60)) == {old.id}
    assert client.ack(old) == {old.id}
    assert client.ack(old) == {old.id}  # a repeat still succeeds
    assert client.get("q", id=old.id) is None
    after = client.get("q", key="k")
    assert after is not None and (after.id, after.payload, after.status) == (r.id, "v2", "scheduled")
    m = client.metrics("q")
    assert (m.ready, m.scheduled, m.leased, m.total_sent) == (0, 1, 0, 1)


def test_the_holder_acks_and_the_new_version_waits_at_its_schedule(client: Client, db: Sql) -> None:
    old, r, t = _held_and_replaced(client, db)
    assert r["outcome"] == "updated" and r["id"] != old["id"]
    assert [(x["id"], x["superseded_by"]) for x in _live(db, "q")] == [(old["id"], r["id"]), (r["id"], None)]
    assert db.take("q", 1, t + 2) == []  # the old version is leased, the new one scheduled
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 3) == [
        {"ack": old["id"]}
    ]
    assert db.take("q", 1, t + 59_999) == []
    [new] = db.take("q", 1, t + 60_000)
    assert (new["id"], new["payload"], new["attempt"], new["token"]) == (r["id"], b"v2", 1, 1)


def test_an_old_token_never_settles_the_new_version(client: Client, db: Sql) -> None:
    old, r, t = _held_and_replaced(client, db)
    for func in ("ack", "extend"):
        assert db.call(func, p_queue="q", p_ids=[r["id"]], p_tokens=[old["token"]], p_now=t + 2) == []
    assert db.call("nack", p_queue="q", p_ids=[r["id"]], p_tokens=[old["token"]], p_now=t + 2) == []
    # A take after the old lease expired removes the old version and delivers the new one.
    [new] = db.take("q", 1, t + 60_000)
    assert new["id"] == r["id"] and [x["id"] for x in _live(db, "q")] == [r["id"]]
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 60_001) == []
    assert db.call("ack", p_queue="q", p_ids=[r["id"]], p_tokens=[new["token"]], p_now=t + 60_001) == [
        {"ack": r["id"]}
    ]


@pytest.mark.parametrize("count_attempt", [True, False], ids=["nack", "defer"])
def test_a_nack_or_defer_of_the_old_version_deletes_it_and_keeps_the_new(
    client: Client, db: Sql, count_attempt: bool
) -> None:
    old, r, t = _held_and_replaced(client, db, queue={"max_attempts": 1})
    args = {
        "p_queue": "q",
        "p_ids": [old["id"]],
        "p_tokens": [old["token"]],
        "p_count_attempt": count_attempt,
    }
    # On its last attempt, yet not dead-lettered: the old payload is superseded.
    assert db.call("nack", **args, p_now=t + 2) == [{"id": old["id"], "outcome": "retry"}]
    assert db.call("nack", **args, p_now=t + 3) == [{"id": old["id"], "outcome": "retry"}]  # a repeat
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 3) == []
    assert [(x["id"], x["payload"], x["attempts"]) for x in _live(db, "q")] == [(r["id"], b"v2", 0)]
    assert db.q("SELECT count(*) AS n FROM {s}.archive")[0]["n"] == 0
    [new] = db.take("q", 1, t + 60_000)
    assert (new["id"], new["attempt"]) == (r["id"], 1)


def test_the_client_nack_of_the_old_version_reports_retry(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=30)
    client.send("q", "v1", key="k")
    [old] = client.take("q")
    r = client.send("q", "v2", key="k", delay=3600, on_conflict="replace")
    assert client.defer(old) == {old.id: "retry"}
    assert client.nack(old) == {old.id: "retry"}
    assert [m.id for m in client.peek("q")] == [r.id]


def test_give_up_dead_letters_the_old_version_only(client: Client, db: Sql) -> None:
    old, r, t = _held_and_replaced(client, db)
    assert db.call("give_up", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 2) == [
        {"give_up": old["id"]}
    ]
    [dead] = db.q("SELECT id, status, payload FROM {s}.archive")
    assert (dead["id"], dead["status"], dead["payload"]) == (old["id"], "dead", b"v1")
    assert [x["id"] for x in _live(db, "q")] == [r["id"]]


@pytest.mark.parametrize("n", [1, 3])
def test_an_expired_lease_of_the_old_version_deletes_it(client: Client, db: Sql, n: int) -> None:
    old, r, t = _held_and_replaced(client, db)
    db.send("q", [b"other"], t + 2, p_at_ms=[t + 5_000])  # behind the old version's lease expiry
    # At t + 5 s the old lease expired: take removes the old version (not retried, not dead) and
    # goes on to the next ready message; the new version waits at its schedule.
    got = db.take("q", n, t + 5_000)
    assert [g["payload"] for g in got] == [b"other"]
    assert [x["id"] for x in _live(db, "q") if x["payload"] != b"other"] == [r["id"]]
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 5_001) == []
    assert db.q("SELECT count(*) AS n FROM {s}.archive")[0]["n"] == 0


def test_take_tx_also_removes_an_expired_old_version(client: Client, db: Sql) -> None:
    _, r, t = _held_and_replaced(client, db)
    assert db.call("take_tx", p_queue="q", p_limit=1, p_now=t + 5_000) == []
    assert [x["id"] for x in _live(db, "q")] == [r["id"]]


def test_a_new_version_ready_now_is_delivered_while_the_old_is_held(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=5)
    t = db.now()
    db.send("q", [b"v1"], t, p_keys=["k"])
    [old] = db.take("q", 1, t)
    [r] = db.send("q", [b"v2"], t + 1, p_keys=["k"], p_on_conflict="replace")
    [new] = db.take("q", 1, t + 2)
    assert (new["id"], new["payload"]) == (r["id"], b"v2")
    # A replace of the new version while it is leased supersedes it in turn.
    [r3] = db.send("q", [b"v3"], t + 3, p_keys=["k"], p_on_conflict="replace")
    assert r3["outcome"] == "updated" and r3["id"] not in (old["id"], r["id"])
    assert [(x["payload"], x["superseded_by"]) for x in _live(db, "q")] == [
        (b"v1", r["id"]), (b"v2", r3["id"]), (b"v3", None),
    ]  # fmt: skip


def test_a_second_replace_updates_the_pending_new_version(client: Client, db: Sql) -> None:
    old, r, t = _held_and_replaced(client, db)
    [r2] = db.send("q", [b"v3"], t + 2, p_keys=["k"], p_on_conflict="replace", p_at_ms=[t + 10_000])
    assert (r2["id"], r2["outcome"]) == (r["id"], "updated")
    assert [(x["id"], x["payload"], x["superseded_by"]) for x in _live(db, "q")] == [
        (old["id"], b"v1", r["id"]), (r["id"], b"v3", None),
    ]  # fmt: skip
    [new] = db.take("q", 1, t + 10_000)
    assert new["payload"] == b"v3"


def test_a_batch_replace_of_a_leased_key_keeps_the_last_row(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=5)
    t = db.now()
    db.send("q", [b"v1", b"j1"], t, p_keys=["k", "j"])
    [old] = db.take("q", 1, t)
    res = db.send(
        "q", [b"a", b"v2", b"b", b"v3"], t + 1, p_keys=[None, "k", "j", "k"], p_on_conflict="replace"
    )
    assert [x["outcome"] for x in res] == ["created", "ignored", "updated", "updated"]
    assert res[1]["id"] == res[3]["id"] != old["id"]
    assert {x["key"]: x["payload"] for x in _live(db, "q") if x["superseded_by"] is None} == {
        None: b"a", "k": b"v3", "j": b"b",
    }  # fmt: skip


def test_ignore_and_error_keep_their_meaning(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=30)
    client.send("q", "v1", key="k")
    [old] = client.take("q")
    r = client.send("q", "v2", key="k", on_conflict="ignore")
    assert (r.outcome, r.id) == ("ignored", old.id)
    with pytest.raises(errors.DuplicateKey):
        client.send("q", "v2", key="k", on_conflict="error")
    new = client.send("q", "v2", key="k", delay=3600, on_conflict="replace")
    # With a new version pending, ignore reports that one.
    assert client.send("q", "v9", key="k", on_conflict="ignore").id == new.id
    with pytest.raises(errors.DuplicateKey):
        client.send("q", "v9", key="k", on_conflict="error")
    got = client.get("q", key="k")
    assert got is not None and got.payload == "v2"


def test_cancel_by_key_cancels_the_new_version_and_the_holder_settles(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=30)
    client.send("q", "v1", key="k")
    [old] = client.take("q")
    new = client.send("q", "v2", key="k", delay=3600, on_conflict="replace")
    assert client.cancel("q", key="k") is True
    assert client.get("q", key="k") is None and client.get("q", id=new.id) is None
    assert client.cancel("q", key="k") is False  # the leased old version is not the key's any more
    assert client.ack(old) == {old.id}
    assert client.peek("q") == []


def test_channel_counts_follow_both_versions(client: Client, db: Sql) -> None:
    old, r, t = _held_and_replaced(client, db, p_channels=["c"])
    assert _channel(db, "c") == (2, 1)
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 2)
    assert _channel(db, "c") == (1, 0)
    [new] = db.take("q", 1, t + 60_000)
    assert new["id"] == r["id"] and _channel(db, "c") == (1, 1)
    assert db.call("channel_recount", p_queue="q") == [{"channel_recount": 0}]


@pytest.mark.parametrize("how", ["nack", "expiry"])
def test_channel_counts_when_the_old_version_leaves(client: Client, db: Sql, how: str) -> None:
    old, r, t = _held_and_replaced(client, db, p_channels=["c"], queue={"max_attempts": 1})
    # A message of another channel, ready when the old lease expires.
    db.send("q", [b"d"], t + 2, p_channels=["d"])
    if how == "nack":
        assert db.call("nack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 2)
        assert _channel(db, "c") == (1, 0)
    else:
        [got] = db.take("q", 2, t + 5_000)  # the expired old head is removed, not dead-lettered
        assert got["payload"] == b"d"
        assert _channel(db, "c") == (1, 0)
        assert db.q("SELECT count(*) AS n FROM {s}.archive")[0]["n"] == 0
    assert [x["id"] for x in _live(db, "q") if x["channel"] == "c"] == [r["id"]]
    got = db.take("q", 2, t + 60_000)
    assert r["id"] in [g["id"] for g in got] and _channel(db, "c") == (1, 1)
    assert db.call("channel_recount", p_queue="q") == [{"channel_recount": 0}]


def test_a_replace_racing_the_ack_of_the_old_version(client: Client, dsn: str, schema: str, db: Sql) -> None:
    client.create_queue("q", lease=30)
    for i in range(8):
        key = f"k{i}"
        client.send("q", "v1", key=key)
        [old] = client.take("q")
        barrier = threading.Barrier(2)
        out: dict[str, Any] = {}

        def ack(old: Any = old, out: dict[str, Any] = out, barrier: threading.Barrier = barrier) -> None:
            with Client(dsn, schema=schema, pool_size=1) as c:
                barrier.wait()
                out["ack"] = c.ack(old)

        def replace(key: str = key, out: dict[str, Any] = out, barrier: threading.Barrier = barrier) -> None:
            with Client(dsn, schema=schema, pool_size=1) as c:
                barrier.wait()
                out["send"] = c.send("q", "v2", key=key, on_conflict="replace")

        threads = [threading.Thread(target=ack), threading.Thread(target=replace)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert out["ack"] == {old.id}
        # Before the ack: a new version ('updated'); after it: a new message ('created').
        assert out["send"].outcome in ("updated", "created") and out["send"].id != old.id
        live = [x for x in _live(db, "q") if x["key"] == key]
        assert [(x["id"], x["payload"], x["leased"], x["superseded_by"]) for x in live] == [
            (out["send"].id, b"v2", False, None)
        ]
        client.cancel("q", key=key)


def test_an_old_token_acking_after_the_replace_on_another_connection(
    client: Client, dsn: str, schema: str, db: Sql
) -> None:
    client.create_queue("q", lease=30)
    client.send("q", "v1", key="k")
    with (
        Client(dsn, schema=schema, pool_size=1) as consumer,
        Client(dsn, schema=schema, pool_size=1) as producer,
    ):
        [old] = consumer.take("q")
        new = producer.send("q", "v2", key="k", on_conflict="replace")
        assert consumer.ack(old) == {old.id}
        # The new version is ready now: delivered with a fresh lease, and the old token of the
        # first delivery cannot touch it.
        [m] = consumer.take("q")
        assert (m.id, m.payload, m.attempt) == (new.id, "v2", 1)
        stale = as_message("q", {**_row_of(old), "id": new.id, "token": old.token + 5})
        with pytest.raises(errors.LeaseLost):
            consumer.ack(stale)
        assert producer.ack(m) == {new.id}
    assert _live(db, "q") == []


def _row_of(m: Any) -> dict[str, Any]:
    return {
        "id": m.id, "token": m.token, "attempt": m.attempt, "lease_until": m.lease_until,
        "scheduled_at": m.scheduled_at, "enqueued_at": m.enqueued_at, "priority": m.priority,
        "key": m.key, "channel": m.channel, "kind": m.kind, "content_type": m.content_type,
        "headers": m.headers, "state": m.state, "last_error": m.last_error, "payload": b"x",
    }  # fmt: skip
