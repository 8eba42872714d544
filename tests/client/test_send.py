"""Send: single and batch, payload encodings, scheduling, priority, de-duplication keys and
enqueueing inside the caller's transaction."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import CountingConnection, Sql
from lonnymq import Client, Envelope, errors
from lonnymq.models import JSON, TEXT


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


@pytest.fixture
def q(client: Client) -> str:
    client.create_queue("q")
    return "q"


def test_send_one(client: Client, q: str, db: Sql) -> None:
    r = client.send(q, b"hello")
    assert r.outcome == "created" and isinstance(r.id, int)
    [m] = client.peek(q)
    assert (m.id, m.body, m.attempt, m.token, m.lease_until) == (r.id, b"hello", 0, 0, None)
    assert m.enqueued_at == m.scheduled_at
    assert abs(m.enqueued_at - db.now()) < 60_000


def test_batch_of_20000_is_one_round_trip_in_input_order(dsn: str, schema: str, q: str, db: Sql) -> None:
    n = 20_000
    with CountingConnection.connect(dsn, autocommit=True) as c:
        client = Client(c, schema=schema)
        results = client.send_batch(q, [f"m{i}" for i in range(n)], conn=c)
        assert c.executed == 1
    assert [r.outcome for r in results] == ["created"] * n
    ids = [r.id for r in results]
    assert all(a < b for a, b in itertools.pairwise(ids))
    stored = db.q("SELECT m.id, convert_from(m.payload, 'UTF8') AS p FROM {s}.message m ORDER BY m.id")
    assert [(r["id"], r["p"]) for r in stored] == [(ids[i], f"m{i}") for i in range(n)]


def test_batch_with_a_client_of_its_own_is_one_statement(dsn: str, schema: str, q: str) -> None:
    with CountingConnection.connect(dsn, autocommit=True) as c:
        client = Client(c, schema=schema)  # a client built on one connection uses it
        client.send_batch(q, [Envelope(i, kind="k", priority=i % 3) for i in range(100)])
        assert c.executed == 1
        assert len(client.take(q, 100)) == 100


def test_empty_batch(client: Client, q: str) -> None:
    assert client.send_batch(q, []) == []
    assert client.peek(q) == []


PAYLOADS: list[tuple[Any, str | None]] = [
    (b"\x00\xffraw", None),
    (b"", None),
    (bytearray(b"ba"), None),
    (memoryview(b"mv"), None),
    ("héllo wörld ✓", TEXT),
    ("", TEXT),
    ({"a": [1, 2.5, None, True], "b": {"c": "d"}}, JSON),
    ([1, "two"], JSON),
    (42, JSON),
    (None, JSON),
    (False, JSON),
]


def test_payload_round_trip(client: Client, q: str) -> None:
    for payload, _ in PAYLOADS:
        client.send(q, payload)
    client.send_batch(q, [p for p, _ in PAYLOADS])
    got = client.take(q, 100)
    assert len(got) == 2 * len(PAYLOADS)
    for m, (payload, ctype) in zip(got, PAYLOADS * 2, strict=True):
        expected = bytes(payload) if isinstance(payload, (bytearray, memoryview)) else payload
        assert (m.payload, type(m.payload), m.content_type) == (expected, type(expected), ctype)


def test_kind_and_headers_round_trip(client: Client, q: str) -> None:
    headers = {"trace": "abc", "n": 3, "nested": {"x": [1, {"y": None}]}}
    client.send_batch(q, [Envelope(b"1", kind="email.send", headers=headers), Envelope(b"2")])
    a, b = client.take(q, 2)
    assert (a.kind, a.headers) == ("email.send", headers)
    assert (b.kind, b.headers) == (None, None)


def test_delay_schedules_later(client: Client, q: str, db: Sql) -> None:
    # Half an hour and an hour: the client's calls below read the real clock.
    r = client.send(q, b"later", delay=1800)
    client.send(q, b"later2", delay=timedelta(hours=1))
    assert client.take(q) == []
    [m, m2] = client.peek(q)
    assert m.id == r.id and m.scheduled_at - m.enqueued_at == 1_800_000
    assert m2.scheduled_at - m2.enqueued_at == 3_600_000
    assert db.take(q, 10, m.scheduled_at - 1) == []
    [d] = db.take(q, 10, m.scheduled_at)
    assert (d["id"], d["scheduled_at"]) == (r.id, m.scheduled_at)
    assert client.metrics(q).scheduled == 1


def test_at_schedules_at_a_time(client: Client, q: str, db: Sql) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    client.send(q, b"dt", at=when)
    epoch = round(when.timestamp() * 1000) + 5
    client.send(q, b"ms", at=epoch)
    client.send(q, b"past", at=0)  # in the past: ready now
    [past] = client.take(q, 10)
    assert past.payload == b"past" and past.scheduled_at == 0
    leased, dt, ms = client.peek(q)  # in dequeue order: the lease ends first
    assert leased.id == past.id and leased.lease_until is not None
    assert (dt.payload, dt.scheduled_at) == (b"dt", round(when.timestamp() * 1000))
    assert (ms.payload, ms.scheduled_at) == (b"ms", epoch)
    # An hour later "past" is back (its lease ran out), "dt" is due and "ms" 5 ms from due.
    assert [d["payload"] for d in db.take(q, 10, epoch - 1)] == [b"past", b"dt"]
    with pytest.raises(errors.InvalidArgument, match="timezone"):
        client.send(q, b"x", at=datetime.now())
    with pytest.raises(errors.InvalidArgument, match="not both"):
        client.send(q, b"x", at=when, delay=1)


# -- priority ------------------------------------------------------------------------------


def test_higher_priority_is_taken_first(client: Client, q: str) -> None:
    client.send_batch(q, [Envelope(f"p0-{i}") for i in range(3)])
    client.send(q, "p10", priority=10)
    client.send(q, "p-10", priority=-10)  # as if sent 10 s later: not ready yet
    client.send(q, "p5", priority=5)
    assert [m.payload for m in client.take(q, 10)] == ["p10", "p5", "p0-0", "p0-1", "p0-2"]
    [m] = [m for m in client.peek(q) if m.lease_until is None]
    assert (m.payload, m.priority) == ("p-10", -10)


def test_priority_is_worth_priority_step_of_waiting(client: Client, q: str, db: Sql) -> None:
    """Priority p sent at t comes after priority-0 messages scheduled before t - p*step and
    before those scheduled after it; at exactly t - p*step, send order decides."""
    t = db.now()
    step = 1000
    p = 5
    edge = t - p * step
    db.send(q, [b"before"], t, p_at_ms=[edge - 1])
    db.send(q, [b"tie-sent-first"], t, p_at_ms=[edge])
    db.send(q, [b"hi"], t, p_priorities=[p])
    db.send(q, [b"tie-sent-later"], t, p_at_ms=[edge])
    db.send(q, [b"after"], t, p_at_ms=[edge + 1])
    order = [d["payload"] for d in db.take(q, 10, t)]
    assert order == [b"before", b"tie-sent-first", b"hi", b"tie-sent-later", b"after"]


def test_starvation_bound(client: Client, q: str, db: Sql) -> None:
    """A priority-0 message scheduled at s is delivered before every priority-p message sent
    after s + p*step, however many there are: high priorities cannot starve it forever."""
    s = db.now()
    db.send(q, [b"old"], s)
    bound = s + 100 * 1000
    db.send(q, [b"urgent-early"], bound - 1, p_priorities=[100])
    db.send(q, [b"urgent-tie"], bound, p_priorities=[100])  # same dequeue_at, sent later
    for k in range(1, 51):
        db.send(q, [f"urgent-{k}".encode()], bound + k, p_priorities=[100])
    order = [d["payload"] for d in db.take(q, 100, bound + 60)]
    assert order[:3] == [b"urgent-early", b"old", b"urgent-tie"]
    assert order[3:] == [f"urgent-{k}".encode() for k in range(1, 51)]


def test_negative_priority_waits(client: Client, q: str, db: Sql) -> None:
    t = db.now()
    db.send(q, [b"low"], t, p_priorities=[-3])
    assert db.take(q, 1, t + 2999) == []
    db.send(q, [b"zero"], t + 2999)
    assert [d["payload"] for d in db.take(q, 10, t + 3000)] == [b"zero", b"low"]


def test_priority_step_of_the_queue(client: Client, db: Sql) -> None:
    client.create_queue("flat", priority_step=0)
    client.create_queue("steep", priority_step=60)
    t = db.now()
    for queue in ("flat", "steep"):
        db.send(queue, [b"a"], t - 30_000)
        db.send(queue, [b"b"], t, p_priorities=[1])
    assert [d["payload"] for d in db.take("flat", 10, t)] == [b"a", b"b"]
    assert [d["payload"] for d in db.take("steep", 10, t)] == [b"b", b"a"]


# -- de-duplication keys -------------------------------------------------------------------


def _payloads(client: Client, queue: str) -> list[Any]:
    return [m.payload for m in client.peek(queue, 100)]


def test_key_ignore(client: Client, q: str) -> None:
    first = client.send(q, "v1", key="k")
    again = client.send(q, "v2", key="k", kind="other")
    assert (first.outcome, again.outcome, again.id) == ("created", "ignored", first.id)
    [m] = client.peek(q)
    assert (m.payload, m.kind, m.key) == ("v1", None, "k")
    # Another queue has its own keys; after the ack the key is free again.
    client.create_queue("q2")
    assert client.send("q2", "x", key="k").outcome == "created"
    client.ack(client.take(q))
    r = client.send(q, "v3", key="k")
    assert r.outcome == "created" and r.id != first.id


def test_key_replace_updates_a_waiting_message(client: Client, q: str, db: Sql) -> None:
    first = client.send(q, "v1", key="k", delay=60, kind="a", headers={"h": 1})
    r = client.send(q, "v2", key="k", on_conflict="replace", kind="b", priority=3)
    assert (r.outcome, r.id) == ("updated", first.id)
    [m] = client.peek(q)
    assert (m.payload, m.kind, m.headers, m.priority, m.key) == ("v2", "b", None, 3, "k")
    assert m.scheduled_at <= db.now()  # the replacement's schedule: now, not in a minute
    assert [x.payload for x in client.take(q)] == ["v2"]


def test_key_replace_of_a_leased_message_makes_a_new_version(client: Client, q: str, db: Sql) -> None:
    client.create_queue("r", lease=1)
    t = db.now()
    [sent] = db.send("r", [b"v1"], t, p_keys=["k"])
    [d] = db.take("r", 1, t)
    # While leased: the holder keeps its version; the new one is another message (a new id).
    [r] = db.send("r", [b"v2"], t + 500, p_keys=["k"], p_on_conflict="replace")
    assert r["outcome"] == "updated" and r["id"] != sent["id"]
    row = db.row("r", sent["id"])
    assert row is not None and (row["payload"], row["leased"], row["superseded_by"]) == (b"v1", True, r["id"])
    # A further replace updates the new version in place, with a fresh attempt budget; the old
    # holder's token never acks it (tests/client/test_replace_while_leased.py has the rest).
    [r3] = db.send("r", [b"v3"], t + 1001, p_keys=["k"], p_on_conflict="replace")
    assert (r3["id"], r3["outcome"]) == (r["id"], "updated")
    row = db.row("r", r["id"])
    assert row is not None and (row["payload"], row["leased"], row["attempts"]) == (b"v3", False, 0)
    assert db.call("ack", p_queue="r", p_ids=[r["id"]], p_tokens=[d["token"]], p_now=t + 1002) == []
    [d2] = db.take("r", 1, t + 1002)
    assert (d2["payload"], d2["attempt"]) == (b"v3", 1) and d2["token"] != d["token"]


def test_key_error(client: Client, q: str) -> None:
    client.send(q, "v1", key="k")
    with pytest.raises(errors.DuplicateKey):
        client.send(q, "v2", key="k", on_conflict="error")
    with pytest.raises(errors.DuplicateKey):
        client.send_batch(
            q, [Envelope("new", key="fresh"), Envelope("plain"), Envelope("v3", key="k")], on_conflict="error"
        )
    assert _payloads(client, q) == ["v1"]
    # Inside one batch too.
    with pytest.raises(errors.DuplicateKey):
        client.send_batch(q, [Envelope("a", key="x"), Envelope("b", key="x")], on_conflict="error")
    assert _payloads(client, q) == ["v1"]
    rs = client.send_batch(q, [Envelope("a", key="x"), Envelope("b", key="y")], on_conflict="error")
    assert [r.outcome for r in rs] == ["created", "created"]


def test_keys_repeated_within_a_batch(client: Client, q: str) -> None:
    rs = client.send_batch(q, [Envelope("i1", key="a"), Envelope("i2", key="a")])
    assert [r.outcome for r in rs] == ["created", "ignored"] and rs[0].id == rs[1].id
    assert _payloads(client, q) == ["i1"]
    client.purge_queue(q)
    rs = client.send_batch(q, [Envelope("r1", key="a"), Envelope("r2", key="a")], on_conflict="replace")
    assert [r.outcome for r in rs] == ["ignored", "created"] and rs[0].id == rs[1].id
    assert _payloads(client, q) == ["r2"]
    # Replacing an existing message from a batch that names its key twice: the last wins.
    rs = client.send_batch(q, [Envelope("r3", key="a"), Envelope("r4", key="a")], on_conflict="replace")
    assert [r.outcome for r in rs] == ["ignored", "updated"] and rs[1].id == rs[0].id
    assert _payloads(client, q) == ["r4"]


def test_mixed_keyed_and_plain_batch_keeps_input_order(client: Client, q: str) -> None:
    client.send(q, "old", key="b")
    items = [
        Envelope("p1"),
        Envelope("a1", key="a"),
        Envelope("p2"),
        Envelope("b1", key="b"),
        Envelope("p3"),
        Envelope("a2", key="a"),
        Envelope("c1", key="c"),
    ]
    rs = client.send_batch(q, items)
    assert [r.outcome for r in rs] == [
        "created",
        "created",
        "created",
        "ignored",
        "created",
        "ignored",
        "created",
    ]
    assert rs[5].id == rs[1].id
    created = [r.id for r in rs if r.outcome == "created"]
    assert created == sorted(created)
    by_id = {m.id: m.payload for m in client.peek(q, 100)}
    assert [by_id[r.id] for r in rs] == ["p1", "a1", "p2", "old", "p3", "a1", "c1"]
    rs = client.send_batch(q, [Envelope("b2", key="b"), Envelope("p4")], on_conflict="replace")
    assert [r.outcome for r in rs] == ["updated", "created"]


# -- the caller's transaction --------------------------------------------------------------


def test_send_commits_and_rolls_back_with_the_callers_transaction(
    dsn: str, client: Client, q: str, schema: str
) -> None:
    orders = sql.SQL("{}.orders").format(sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE {} (id int)").format(orders))
    with psycopg.connect(dsn) as tx:  # not autocommit: the calls join tx's transaction
        tx.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(orders))
        client.send(q, "order 1", conn=tx)
        client.send_batch(q, ["order 1 again"], conn=tx)
        assert client.peek(q) == []  # not visible to others before commit
        tx.rollback()
        assert client.peek(q) == []
        tx.execute(sql.SQL("INSERT INTO {} VALUES (2)").format(orders))
        client.send(q, "order 2", conn=tx)
        tx.commit()
        assert tx.execute(sql.SQL("SELECT array_agg(id) FROM {}").format(orders)).fetchone()[0] == [2]
    assert _payloads(client, q) == ["order 2"]


def test_failed_send_in_a_transaction_aborts_it(dsn: str, client: Client, q: str) -> None:
    with psycopg.connect(dsn) as tx:
        client.send(q, "a", conn=tx)
        with pytest.raises(errors.QueueNotFound):
            client.send("missing", "b", conn=tx)
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            client.send(q, "c", conn=tx)
        tx.rollback()
    assert client.peek(q) == []


def test_a_delayed_priority_message_is_not_delivered_early(client: Client, q: str, db: Sql) -> None:
    t = db.now()
    db.send(q, [b"later"], t, p_delays_ms=[60_000], p_priorities=[100])
    assert db.take(q, 1, t + 59_999) == []


@pytest.mark.parametrize(
    ("options", "called"),
    [
        ({}, "send_plain"),
        ({"kind": "job"}, "send_plain"),
        ({"headers": {"a": 1}}, "send"),
        ({"delay": 5}, "send"),
        ({"priority": 3}, "send"),
        ({"key": "k"}, "send"),
        ({"channel": "c"}, "send"),
        ({"idempotency_key": "0193a5b0-0000-7000-8000-000000000001"}, "send_plain_once"),
        ({"idempotency_key": "0193a5b0-0000-7000-8000-000000000002", "priority": 1}, "send"),
    ],
)
def test_a_plain_send_calls_send_plain(
    client: Client, q: str, dsn: str, schema: str, options: dict[str, Any], called: str
) -> None:
    """A message with nothing but a payload (and a kind) goes through send_plain, the lean plain
    send, or with an idempotency key send_plain_once, the lean keyed one; any other option
    through send(). The same result either way."""
    with psycopg.connect(dsn) as tx:
        tx.execute("SET track_functions = 'all'")
        sent = client.send(q, {"n": 1}, conn=tx, **options)
        calls = dict(
            tx.execute(
                "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                " WHERE schemaname = %s AND funcname IN ('send', 'send_plain', 'send_plain_once')",
                [schema],
            ).fetchall()
        )
    assert calls == {called: 1}
    assert sent.outcome == "created"
    [m] = client.peek(q)
    assert m.id == sent.id and m.payload == {"n": 1} and m.kind == options.get("kind")
