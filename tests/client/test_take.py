"""Take: what a lease delivers, ack (delete or archive), take-and-ack in one call, take_tx
inside the caller's transaction and exact FIFO order."""

from __future__ import annotations

import dataclasses
import itertools

import psycopg
import psycopg.sql
import pytest

from core_helpers import CountingConnection, Sql, as_message
from lonnymq import Client, Envelope, errors


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


@pytest.fixture
def q(client: Client) -> str:
    client.create_queue("q", lease=30)
    return "q"


def test_lease_delivers_attempt_times_and_token(client: Client, q: str, db: Sql) -> None:
    t = db.now()
    [s] = db.send(q, [b"x"], t - 1000, p_at_ms=[t - 500], p_kinds=["k"], p_keys=["key"])
    [d] = db.take(q, 1, t)
    assert (
        d["id"],
        d["attempt"],
        d["token"],
        d["lease_until"],
        d["scheduled_at"],
        d["enqueued_at"],
        d["kind"],
        d["key"],
    ) == (s["id"], 1, 1, t + 30_000, t - 500, t - 1000, "k", "key")
    # Retried after a nack: the times stay those of the first send; attempt and token move on.
    db.call("nack", p_queue=q, p_ids=[d["id"]], p_tokens=[1], p_delays_ms=[100], p_errors=["e"], p_now=t)
    assert db.take(q, 1, t + 99) == []
    [d] = db.take(q, 1, t + 100, p_lease_ms=5)
    assert (
        d["attempt"],
        d["token"],
        d["lease_until"],
        d["scheduled_at"],
        d["enqueued_at"],
        d["last_error"],
    ) == (2, 2, t + 105, t - 500, t - 1000, "e")


def test_take_through_the_client(client: Client, q: str, db: Sql) -> None:
    client.send_batch(q, [Envelope(b"a", kind="k"), b"b"])
    before = db.now()
    [m] = client.take(q, lease=600)  # minutes: the takes below, on the real clock, find it leased
    after = db.now()
    assert (m.queue, m.payload, m.kind, m.attempt, m.token) == (q, b"a", "k", 1, 1)
    assert before + 600_000 <= m.lease_until <= after + 600_000
    assert m.enqueued_at == m.scheduled_at <= before
    [m2] = client.take(q, 5)
    assert m2.payload == b"b"
    assert client.take(q, 5) == []  # both leased
    assert db.row(q, m.id)["leased"] is True  # type: ignore[index]


def test_ack_deletes(client: Client, q: str, db: Sql) -> None:
    client.send_batch(q, [b"1", b"2", b"3"])
    ms = client.take(q, 3)
    assert client.ack(ms[0]) == {ms[0].id}
    assert client.ack(ms[1:]) == {ms[1].id, ms[2].id}
    assert db.count(q) == 0 and db.archive(q) == []


def test_ack_of_one_delivery_with_ids_beyond_int4(
    client: Client, q: str, conn: psycopg.Connection, schema: str
) -> None:
    """One delivery is acked with scalar parameters (the client's one-delivery statement): ids
    past 2**31 and a stale token go through as they do in arrays."""
    conn.execute(
        psycopg.sql.SQL("SELECT setval({}, 5000000000)").format(
            psycopg.sql.Literal(f"{schema}.message_id_seq")
        )
    )
    conn.commit()
    client.send_batch(q, [b"a", b"b"])
    [a] = client.take(q, 1)
    assert a.id > 2**32
    assert client.ack([a]) == {a.id}
    assert client.ack([a]) == {a.id}  # a repeat: acknowledged already
    [b] = client.take(q, 1)
    stale = dataclasses.replace(b, token=b.token + 1)
    assert client.ack([stale]) == set()
    assert client.ack(b) == {b.id}


def test_ack_archives_on_an_archive_queue_or_when_asked(client: Client, db: Sql) -> None:
    client.create_queue("arch", archive=True)
    client.create_queue("plain")
    for queue in ("arch", "plain"):
        client.send_batch(queue, [Envelope(b"1", kind="k", headers={"h": 1}), b"2"])
    a1, a2 = client.take("arch", 2)
    p1, p2 = client.take("plain", 2)
    client.ack(a1)
    client.ack(a2, archive=False)
    client.ack(p1, archive=True)
    client.ack(p2)
    [arch] = db.archive("arch")
    assert (
        arch["id"],
        arch["status"],
        arch["attempts"],
        arch["deliveries"],
        arch["kind"],
        arch["headers"],
        arch["payload"],
    ) == (a1.id, "acked", 1, 1, "k", {"h": 1}, b"1")
    assert arch["scheduled_at"] == a1.scheduled_at and arch["enqueued_at"] == a1.enqueued_at
    assert [a["id"] for a in db.archive("plain")] == [p1.id]
    assert db.count("arch") == db.count("plain") == 0


def test_take_with_ack_is_one_call(dsn: str, schema: str, client: Client, q: str, db: Sql) -> None:
    client.send_batch(q, [b"1", b"2", b"3", b"4"])
    [m1] = client.take(q)
    with CountingConnection.connect(dsn, autocommit=True) as c:
        [m2, m3] = client.take(q, 2, ack=[m1], conn=c)
        assert c.executed == 1
    assert (m2.payload, m3.payload) == (b"2", b"3")
    assert db.row(q, m1.id) is None
    # Acked in the same transaction as the take: a failing take acks nothing.
    with pytest.raises(errors.InvalidArgument):
        client.take(q, 0, ack=[m2])
    assert db.row(q, m2.id) is not None
    with pytest.raises(errors.InvalidArgument, match="one queue"):
        client.create_queue("other")
        client.take("other", ack=[m2])
    [m4] = client.take(q, 5, ack=[m2, m3])
    assert m4.payload == b"4" and db.count(q) == 1


def test_take_with_a_stale_ack_still_takes(client: Client, q: str, db: Sql) -> None:
    t = db.now()
    db.send(q, [b"1"], t)
    [d] = db.take(q, 1, t, p_lease_ms=1)
    stale = as_message(q, d)
    [again] = db.take(q, 1, t + 1)  # lease ran out: taken again, token 2
    assert again["id"] == d["id"] and again["token"] == 2
    db.send(q, [b"2"], t + 1)
    rows = db.take(q, 5, t + 2, p_ack_ids=[stale.id], p_ack_tokens=[stale.token])
    assert [r["payload"] for r in rows] == [b"2"]
    assert db.row(q, d["id"])["deliveries"] == 2  # type: ignore[index]


# -- take_tx -----------------------------------------------------------------------------


def test_take_tx_is_gone_on_commit(dsn: str, client: Client, q: str, db: Sql) -> None:
    client.send_batch(q, [b"1", b"2", b"3"])
    with psycopg.connect(dsn) as tx:
        ms = client.take_tx(q, 2, conn=tx)
        assert [(m.payload, m.attempt, m.token, m.lease_until) for m in ms] == [
            (b"1", 1, 1, None),
            (b"2", 1, 1, None),
        ]
        # Others skip the locked rows while the transaction is open.
        assert [m.payload for m in client.take(q, 5)] == [b"3"]
        tx.commit()
    assert [r["payload"] for r in db.q("SELECT payload FROM {s}.message")] == [b"3"]
    assert db.archive(q) == []


def test_take_tx_archives_when_asked(dsn: str, client: Client, db: Sql) -> None:
    client.create_queue("arch", archive=True)
    client.send_batch("arch", [b"1", b"2"])
    with psycopg.connect(dsn) as tx:
        client.take_tx("arch", conn=tx)
        client.take_tx("arch", archive=False, conn=tx)
    assert [(a["payload"], a["status"], a["attempts"]) for a in db.archive("arch")] == [(b"1", "acked", 1)]


def test_take_tx_rollback_puts_messages_back_untouched(dsn: str, client: Client, q: str, db: Sql) -> None:
    client.send_batch(q, [b"1", b"2"])
    before = db.q("SELECT * FROM {s}.message ORDER BY id")
    with psycopg.connect(dsn) as tx:
        assert len(client.take_tx(q, 2, conn=tx)) == 2
        tx.rollback()
    assert db.q("SELECT * FROM {s}.message ORDER BY id") == before
    [m, _] = client.take(q, 2)
    assert (m.attempt, m.token) == (1, 1)


def test_take_tx_outside_a_transaction_consumes_at_once(client: Client, q: str, db: Sql) -> None:
    client.send(q, b"1")
    [m] = client.take_tx(q)
    assert m.payload == b"1" and db.count(q) == 0


def test_take_tx_skips_leased_messages(dsn: str, client: Client, q: str) -> None:
    client.send_batch(q, [b"1", b"2"])
    client.take(q)
    with psycopg.connect(dsn) as tx:
        assert [m.payload for m in client.take_tx(q, 5, conn=tx)] == [b"2"]


# -- order ---------------------------------------------------------------------------------


def test_fifo_among_equal_dequeue_times(client: Client, q: str, db: Sql) -> None:
    at = db.now() - 1000
    sent: list[int] = []
    for i in range(10):
        sent += [r.id for r in client.send_batch(q, [Envelope(f"{i}-{j}", at=at) for j in range(95)])]
    for i in range(50):
        sent.append(client.send(q, f"single-{i}", at=at).id)  # type: ignore[arg-type]
    assert len(sent) == 1000 and sent == sorted(sent)
    taken = [m.id for _ in range(300) for m in client.take(q)]
    while batch := client.take(q, 37):
        taken += [m.id for m in batch]
    assert taken == sent
    assert all(a < b for a, b in itertools.pairwise(taken))


def test_fifo_with_take_tx(dsn: str, client: Client, q: str) -> None:
    at = 1_000_000
    sent = [r.id for r in client.send_batch(q, [Envelope(i, at=at) for i in range(1000)])]
    taken: list[int] = []
    with psycopg.connect(dsn) as tx:
        for n in (1, 1, 7, 100, 500, 1000):
            taken += [m.id for m in client.take_tx(q, n, conn=tx)]
    assert taken == sent


def test_fifo_follows_dequeue_time_before_id(client: Client, q: str, db: Sql) -> None:
    t = db.now()
    ids = [r["id"] for r in db.send(q, [b"c", b"a", b"b"], t, p_at_ms=[t - 1, t - 3, t - 2])]
    assert [d["payload"] for d in db.take(q, 3, t)] == [b"a", b"b", b"c"]
    assert ids == sorted(ids)
