"""The clients decode rows by column name on a row factory of their own, so a caller's connection
or pool may use any row factory (``dict_row``, ``namedtuple_row``, ``tuple_row``): every public
call works with ``conn=`` such a connection and on a client built on such a pool, and the
caller's connection keeps its row factory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, namedtuple_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from lonnymq import AsyncClient, Client, Envelope, Message, SendResult, errors

ROW_FACTORIES = {"dict_row": dict_row, "namedtuple_row": namedtuple_row, "tuple_row": tuple_row}


@pytest.fixture(params=list(ROW_FACTORIES))
def row_factory(request: pytest.FixtureRequest) -> Any:
    return ROW_FACTORIES[request.param]


def _assert_row_factory_kept(conn: psycopg.Connection[Any], row_factory: Any) -> None:
    row = conn.execute("SELECT 1 AS one").fetchone()
    if row_factory is dict_row:
        assert row == {"one": 1}
    elif row_factory is namedtuple_row:
        assert row is not None and row.one == 1
    else:
        assert type(row) is tuple and row == (1,)


def _scenario(client: Client, kw: dict[str, Any]) -> None:
    """Every public call of the sync client but migrate and receive, with ``kw`` (``conn=`` or
    nothing), checking the decoded values field by field."""
    q, q2 = "rf", "rf.dead"
    assert client.create_queue(q, max_attempts=3, archive=True, **kw) is True
    assert client.create_queue(q, if_not_exists=True, **kw) is False
    assert client.create_queue(q2, max_attempts=1, lease=45, **kw) is True
    infos = {i.name: i for i in client.list_queues(**kw)}
    assert sorted(infos) == [q, q2]
    assert (infos[q].max_attempts, infos[q].archive, infos[q].lease_ms) == (3, True, 30_000)
    assert (infos[q2].max_attempts, infos[q2].archive, infos[q2].lease_ms) == (1, False, 45_000)
    assert infos[q].dead_letter_queue is None and infos[q].created_at.tzinfo is not None

    # send, send_batch
    r = client.send(q, {"n": 1}, kind="k", headers={"h": 1}, key="one", channel="c1", priority=5, **kw)
    assert r.outcome == "created" and isinstance(r.id, int)
    assert client.send(q, "dup", key="one", **kw) == SendResult(r.id, "ignored")
    rs = client.send_batch(q, [Envelope(b"two", channel="c1"), "three"], **kw)
    assert [x.outcome for x in rs] == ["created", "created"]
    two, three = (x.id for x in rs)
    assert r.id is not None and two is not None and three is not None

    # channels
    ch = client.set_channel(q, "c1", max_concurrency=5, **kw)
    assert (ch.queue, ch.name, ch.max_concurrency, ch.max_size, ch.on_full) == (q, "c1", 5, None, "reject")
    assert (ch.explicit, ch.size, ch.leased) == (True, 2, 0)
    assert [(c.queue, c.name, c.size, c.max_concurrency) for c in client.channels(q, **kw)] == [
        (q, "c1", 2, 5)
    ]
    assert client.reset_channel(q, "c1", **kw) is True
    assert client.reset_channel(q, "c1", **kw) is False

    # metrics, peek
    m = client.metrics(q, **kw)
    assert (m.queue, m.ready, m.scheduled, m.leased, m.dead) == (q, 3, 0, 0, 0)
    assert m.oldest_ready_age_ms is not None and m.next_scheduled_at is None
    peeked = {p.id: p for p in client.peek(q, **kw)}
    assert sorted(peeked) == sorted([r.id, two, three])
    p1 = peeked[r.id]
    assert (p1.queue, p1.kind, p1.headers, p1.key, p1.channel, p1.priority) == (
        q,
        "k",
        {"h": 1},
        "one",
        "c1",
        5,
    )
    assert (p1.payload, peeked[two].payload, peeked[three].payload) == ({"n": 1}, b"two", "three")

    # take, extend, defer, nack, release, ack
    [a] = client.take(q, 1, lease=60, **kw)
    assert (a.id, a.queue, a.attempt, a.payload, a.kind, a.headers) == (r.id, q, 1, {"n": 1}, "k", {"h": 1})
    assert (a.key, a.channel, a.priority, a.state, a.last_error) == ("one", "c1", 5, None, None)
    assert isinstance(a.token, int) and a.lease_until is not None
    assert a.lease_until >= a.enqueued_at + 59_000 and a.scheduled_at <= a.lease_until
    ext = client.extend(a, lease=120, **kw)
    assert list(ext) == [a.id] and ext[a.id] >= a.lease_until + 59_000
    assert client.defer(a, state={"step": 2}, **kw) == {a.id: "retry"}
    by_id = {x.id: x for x in client.take(q, 3, **kw)}  # channels are served round robin
    a2 = by_id.pop(a.id)
    assert (a2.attempt, a2.state, a2.token != a.token) == (1, {"step": 2}, True)
    assert client.nack(a2, error="boom", **kw) == {a.id: "retry"}
    assert client.release(list(by_id.values()), **kw) == {two: "retry", three: "retry"}
    by_id = {x.id: x for x in client.take(q, 3, **kw)}
    a3 = by_id[a.id]
    assert (a3.attempt, a3.last_error, a3.state) == (2, "boom", {"step": 2})
    assert client.release(list(by_id.values()), **kw) == {a.id: "retry", two: "retry", three: "retry"}
    got = client.take(q, 3, **kw)
    assert sorted(x.id for x in got) == sorted([a.id, two, three])
    assert client.ack(got[:1], **kw) == {got[0].id}
    assert client.ack(got[0], **kw) == {got[0].id}  # a repeat succeeds
    with pytest.raises(errors.LeaseLost):
        client.nack(got[0], **kw)
    assert client.take(q, 1, ack=got[1:2], **kw) == []
    assert client.ack(got[2], archive=False, **kw) == {got[2].id}
    m = client.metrics(q, **kw)
    assert (m.ready, m.leased) == (0, 0)  # take(ack=...) acknowledged got[1]

    # take_tx (in autocommit mode its own transaction), purge_queue
    client.send_batch(q, ["tx", "p1", "p2"], **kw)
    [t] = client.take_tx(q, **kw)
    assert (t.queue, t.payload) == (q, "tx")
    client.purge_queue(q, **kw)
    assert client.metrics(q, **kw).ready == 0

    # dead letters
    d = client.send(q2, b"doomed", kind="kd", key="kk", headers={"x": True}, **kw)
    [dm] = client.take(q2, **kw)
    assert client.nack(dm, error="fatal", **kw) == {d.id: "dead"}
    assert client.metrics(q2, **kw).dead == 1
    [dead] = client.dead_letters(q2, **kw)
    assert (dead.id, dead.attempts, dead.kind, dead.key, dead.last_error) == (d.id, 1, "kd", "kk", "fatal")
    assert (dead.headers, dead.payload, dead.content_type) == ({"x": True}, b"doomed", None)
    assert dead.archived_at >= dm.enqueued_at
    assert client.requeue_dead(q2, **kw) == 1
    [again] = client.take(q2, **kw)
    assert again.payload == b"doomed"
    assert client.nack([again], **kw) == {again.id: "dead"}
    assert client.purge_dead(q2, **kw) == 1
    assert client.dead_letters(q2, **kw) == []

    # housekeeping
    assert client.maintain(**kw) >= 0
    assert client.drop_queue(q2, **kw) is True
    assert client.drop_queue(q2, if_exists=True, **kw) is False


def _receive(client: Client, kw: dict[str, Any]) -> None:
    """receive() runs on the client's connections (no conn=): the pool's row factory applies."""
    client.create_queue("rcv", if_not_exists=True, **kw)
    client.send("rcv", b"now", **kw)
    [m] = client.receive("rcv", timeout=5, poll=1)
    assert isinstance(m, Message) and (m.queue, m.payload, m.attempt) == ("rcv", b"now", 1)
    assert client.ack(m, **kw) == {m.id}
    assert client.receive("rcv", timeout=0.05, poll=1) == []  # also decodes next_ready_in


@pytest.fixture
def pool(dsn: str, row_factory: Any) -> Iterator[ConnectionPool[Any]]:
    kwargs = {"autocommit": True, "row_factory": row_factory}
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs=kwargs) as p:
        yield p


def test_every_call_with_conn(dsn: str, schema: str, row_factory: Any) -> None:
    with (
        Client(dsn, schema=schema) as client,
        psycopg.connect(dsn, autocommit=True, row_factory=row_factory) as c,
    ):
        _scenario(client, {"conn": c})
        _assert_row_factory_kept(c, row_factory)


def test_every_call_on_a_callers_pool(schema: str, pool: ConnectionPool[Any], row_factory: Any) -> None:
    with Client(pool, schema=schema) as client:
        _scenario(client, {})
        _receive(client, {})
    with pool.connection() as c:
        _assert_row_factory_kept(c, row_factory)


def test_every_call_on_a_callers_connection(dsn: str, schema: str, row_factory: Any) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=row_factory) as c:
        _scenario(Client(c, schema=schema), {})
        _assert_row_factory_kept(c, row_factory)


def test_take_tx_in_a_callers_transaction(dsn: str, schema: str, row_factory: Any) -> None:
    with Client(dsn, schema=schema) as client, psycopg.connect(dsn, row_factory=row_factory) as c:
        client.create_queue("tx")
        r = client.send("tx", {"a": 1}, conn=c)  # not committed yet: invisible to the client's pool
        assert client.peek("tx") == []
        [m] = client.take_tx("tx", conn=c)
        assert (m.id, m.payload, m.attempt) == (r.id, {"a": 1}, 1)
        c.rollback()
        assert client.peek("tx") == []
        r = client.send("tx", "b", conn=c)
        c.commit()
        [m] = client.take_tx("tx", conn=c)
        assert m.id == r.id and client.peek("tx", conn=c) == []
        c.rollback()
        assert [p.id for p in client.peek("tx")] == [r.id]


def test_migrate_with_conn(dsn: str, schema: str, row_factory: Any) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=row_factory) as c:
        assert Client(c, schema=schema).migrate(conn=c) == []


def test_migrate_on_a_callers_pool(schema: str, pool: ConnectionPool[Any], row_factory: Any) -> None:
    with Client(pool, schema=schema) as client:
        assert client.migrate() == []


def test_async_calls(dsn: str, schema: str, row_factory: Any) -> None:
    """A representative set of async calls, with ``conn=`` and on a caller's pool."""

    async def scenario(client: AsyncClient, kw: dict[str, Any], q: str) -> None:
        assert await client.create_queue(q, max_attempts=1, **kw) is True
        assert [i.name for i in await client.list_queues(**kw)].count(q) == 1
        r = await client.send(q, {"n": 1}, kind="k", channel="c", **kw)
        [b] = await client.send_batch(q, [Envelope(b"b", key="kb")], **kw)
        assert (r.outcome, b.outcome) == ("created", "created")
        assert [(c.name, c.size) for c in await client.channels(q, **kw)] == [("c", 1)]
        assert (await client.metrics(q, **kw)).ready == 2
        assert [p.id for p in await client.peek(q, **kw)] == [r.id, b.id]
        m1, m2 = await client.take(q, 2, lease=60, **kw)
        assert (m1.id, m1.payload, m1.kind, m1.channel, m2.payload, m2.key) == (
            r.id,
            {"n": 1},
            "k",
            "c",
            b"b",
            "kb",
        )
        assert list(await client.extend([m1], lease=90, **kw)) == [m1.id]
        assert await client.nack(m2, error="e", **kw) == {m2.id: "dead"}
        assert await client.ack(m1, **kw) == {m1.id}
        [dead] = await client.dead_letters(q, **kw)
        assert (dead.id, dead.payload, dead.last_error) == (m2.id, b"b", "e")

    async def main() -> None:
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=row_factory) as c,
            AsyncClient(dsn, schema=schema) as client,
        ):
            await scenario(client, {"conn": c}, "a1")
        kwargs = {"autocommit": True, "row_factory": row_factory}
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=kwargs, open=False)
        async with pool, AsyncClient(pool, schema=schema) as client:
            await scenario(client, {}, "a2")
            await client.send("a2", "r")
            [m] = await client.receive("a2", timeout=5, poll=1)
            assert (m.queue, m.payload) == ("a2", "r")
            assert await client.receive("a2", timeout=0.05, poll=1) == []

    asyncio.run(main())
