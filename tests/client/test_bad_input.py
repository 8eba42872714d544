"""Bad input: every wrong argument raises its specific lonnymq.errors exception and writes
nothing, whether it is caught by the client or by the SQL functions (SQLSTATE class LQ)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from core_helpers import CountingConnection, Sql, drop_schema, fresh_schema_name
from lonnymq import Client, Envelope, Message, errors
from lonnymq.client.ops import MAX_PAYLOAD_BYTES, map_error

BAD_NAMES = ["a;drop table x", "A", "", "x" * 100, "q'--", "1abc", "a b", "ä", 'q"', "-a", None, 5]
NOT_FINITE = [math.nan, math.inf, -math.inf]


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


@pytest.fixture(scope="module")
def shared(dsn: str) -> Iterator[tuple[str, Message]]:
    """One schema for the many tests below that must not write anything: queue "q" (100-byte
    payload limit) holding one leased message with key "live" (returned), and a table "x" that
    injection attempts would aim at. Each test checks that it changed nothing."""
    name = fresh_schema_name()
    with Client(dsn, schema=name, pool_size=1) as c:
        c.migrate()
        c.create_queue("q", max_payload_bytes=100)
        c.send("q", b"live", key="live")
        [held] = c.take("q", lease=3600)
        with psycopg.connect(dsn, autocommit=True) as conn:
            Sql(conn, name).q("CREATE TABLE {s}.x (id int)")
    yield name, held
    drop_schema(dsn, name)


@pytest.fixture
def sdb(conn: psycopg.Connection, shared: tuple[str, Message]) -> Sql:
    return Sql(conn, shared[0])


@pytest.fixture
def sclient(dsn: str, shared: tuple[str, Message]) -> Iterator[Client]:
    with Client(dsn, schema=shared[0], pool_size=1) as c:
        yield c


@pytest.fixture
def held(shared: tuple[str, Message]) -> Message:
    return shared[1]


@pytest.fixture
def q(client: Client, db: Sql) -> str:
    client.create_queue("q", max_payload_bytes=100)
    db.q("CREATE TABLE {s}.x (id int)")  # what the injection attempts aim at
    return "q"


def _unchanged(db: Sql) -> tuple[Any, ...]:
    return (
        db.q("SELECT * FROM {s}.message ORDER BY id"),
        db.q("SELECT * FROM {s}.archive"),
        db.q("SELECT name FROM {s}.queue ORDER BY name"),
        db.q("SELECT to_regclass(%s) AS x", (f"{db.schema}.x",)),
    )


# -- queue names ---------------------------------------------------------------------------


CALLS_WITH_A_QUEUE: list[tuple[str, Callable[[Client, Any], Any]]] = [
    ("create_queue", lambda c, n: c.create_queue(n)),
    ("create_queue dlq", lambda c, n: c.create_queue("ok", dead_letter_queue=n)),
    ("drop_queue", lambda c, n: c.drop_queue(n, if_exists=True)),
    ("purge_queue", lambda c, n: c.purge_queue(n)),
    ("metrics", lambda c, n: c.metrics(n)),
    ("send", lambda c, n: c.send(n, b"x")),
    ("send_batch", lambda c, n: c.send_batch(n, [b"x"])),
    ("take", lambda c, n: c.take(n)),
    ("take_tx", lambda c, n: c.take_tx(n)),
    ("receive", lambda c, n: c.receive(n, timeout=0)),
    ("peek", lambda c, n: c.peek(n)),
    ("dead_letters", lambda c, n: c.dead_letters(n)),
    ("requeue_dead", lambda c, n: c.requeue_dead(n)),
    ("purge_dead", lambda c, n: c.purge_dead(n)),
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_invalid_queue_names(sclient: Client, sdb: Sql, name: Any) -> None:
    client, db = sclient, sdb
    before = _unchanged(db)
    for what, call in CALLS_WITH_A_QUEUE:
        if name is None and what == "create_queue dlq":
            continue  # no dead-letter queue: valid
        with pytest.raises(errors.InvalidQueueName):
            call(client, name)
            pytest.fail(what)
    assert _unchanged(db) == before


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if isinstance(n, str)], ids=repr)
def test_invalid_queue_names_reach_sql_safely(sdb: Sql, name: str) -> None:
    db = sdb
    before = _unchanged(db)
    with pytest.raises(psycopg.Error) as e:
        db.call("queue_create", p_name=name)
    assert e.value.sqlstate == "LQ002"
    for func, args in (
        ("send_batch", {"p_payloads": [b"x"]}),
        ("take", {}),
        ("peek", {}),
        ("queue_purge", {}),
        ("ack", {"p_ids": [1], "p_tokens": [1]}),
    ):
        key = "p_name" if func == "queue_purge" else "p_queue"
        with pytest.raises(psycopg.Error) as e:
            db.call(func, **{key: name}, **args)
        assert e.value.sqlstate == "LQ001", func
    assert db.call("queue_drop", p_name=name, p_if_exists=True) == [{"queue_drop": False}]
    assert _unchanged(db) == before


def test_valid_queue_name_edges(client: Client) -> None:
    for name in ("a", "a" * 63, "a.b:c-d_9"):
        assert client.create_queue(name)
        client.send(name, b"x")
        assert [m.payload for m in client.take(name)] == [b"x"]


def test_unknown_queue(sclient: Client, sdb: Sql) -> None:
    client, db = sclient, sdb
    before = _unchanged(db)
    for what, call in CALLS_WITH_A_QUEUE:
        if what in ("create_queue", "drop_queue"):
            continue
        with pytest.raises(errors.QueueNotFound, match="'nope'"):
            call(client, "nope")
            pytest.fail(what)
    with pytest.raises(errors.QueueNotFound):
        client.drop_queue("nope")
    assert _unchanged(db) == before


# -- times -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [-1, -0.001, *NOT_FINITE, timedelta(seconds=-1), "1", True, 1e300], ids=repr
)
def test_bad_delays_and_timeouts(sclient: Client, sdb: Sql, held: Message, value: Any) -> None:
    client, db, q, m = sclient, sdb, "q", held
    before = _unchanged(db)
    calls: list[Callable[[], Any]] = [
        lambda: client.send(q, b"x", delay=value),
        lambda: client.send_batch(q, [b"ok", Envelope(b"x", delay=value)]),
        lambda: client.receive(q, timeout=value),
        lambda: client.receive(q, timeout=1, poll=value),
        lambda: client.take(q, lease=value),
        lambda: client.nack(m, delay=value),
        lambda: client.defer(m, delay=value),
        lambda: client.extend(m, lease=value),
        lambda: client.create_queue("new", lease=value),
        lambda: client.create_queue("new", retention=value),
        lambda: client.create_queue("new", priority_step=value),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(errors.InvalidArgument):
            call()
            pytest.fail(f"call {i} accepted {value!r}")
    assert _unchanged(db) == before


def test_zero_is_not_a_lease(sclient: Client) -> None:
    client, q = sclient, "q"
    with pytest.raises(errors.InvalidArgument):
        client.take(q, lease=0)
    with pytest.raises(errors.InvalidArgument):
        client.create_queue("new", lease=timedelta(0))
    with pytest.raises(errors.InvalidArgument):
        client.receive(q, poll=0)


@pytest.mark.parametrize("at", [2**70, -(2**70), 1.5, "2024-01-01", True], ids=repr)
def test_bad_at(sclient: Client, sdb: Sql, at: Any) -> None:
    with pytest.raises(errors.InvalidArgument):
        sclient.send("q", b"x", at=at)
    assert sdb.count("q") == 1


# -- payloads --------------------------------------------------------------------------------


def test_payload_over_the_queue_limit_writes_nothing(sclient: Client, sdb: Sql) -> None:
    client, db, q = sclient, sdb, "q"
    before = _unchanged(db)
    with pytest.raises(errors.PayloadTooLarge, match="101 bytes"):
        client.send(q, b"x" * 101)
    with pytest.raises(errors.PayloadTooLarge, match="message 3 payload"):
        client.send_batch(q, [b"ok", b"ok", {"big": "x" * 100}])
    assert _unchanged(db) == before
    assert issubclass(errors.PayloadTooLarge, errors.InvalidArgument)


def test_payload_over_the_hard_ceiling_is_refused_before_sending(
    dsn: str, shared: tuple[str, Message], sdb: Sql
) -> None:
    q, db = "q", sdb
    huge = bytes(MAX_PAYLOAD_BYTES + 1)
    with CountingConnection.connect(dsn, autocommit=True) as c:
        client = Client(c, schema=shared[0])
        with pytest.raises(errors.PayloadTooLarge, match="at most 104857600"):
            client.send(q, huge)
        with pytest.raises(errors.PayloadTooLarge):
            client.send_batch(q, [b"small", huge])
        with pytest.raises(errors.PayloadTooLarge):
            client.send(q, "é" * (MAX_PAYLOAD_BYTES // 2 + 1))
        assert c.executed == 0
    del huge
    assert db.count(q) == 1


# -- wrong types -----------------------------------------------------------------------------


class Unjsonable:
    def __repr__(self) -> str:  # a stable test id (pytest-xdist workers must collect the same ids)
        return "Unjsonable()"


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"payload": Unjsonable()}, "payload"),
        ({"payload": {"a": {1, 2}}}, "payload"),
        ({"payload": math.nan}, "payload"),
        ({"payload": {"x": [1, math.inf]}}, "payload"),
        ({"headers": ["a"]}, "headers"),
        ({"headers": "k=v"}, "headers"),
        ({"headers": {1: "int key"}}, "headers"),
        ({"headers": {"a": Unjsonable()}}, "headers"),
        ({"headers": {"a": math.nan}}, "headers"),
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"kind": ""}, "kind"),
        ({"kind": 5}, "kind"),
        ({"kind": "k" * 256}, "kind"),
        ({"kind": "a\x00b"}, "kind"),
        ({"key": ""}, "key"),
        ({"key": 7}, "key"),
        ({"channel": ""}, "channel"),
        ({"on_conflict": "upsert"}, "on_conflict"),
    ],
    ids=repr,
)
def test_wrong_types_in_send(
    dsn: str, shared: tuple[str, Message], sdb: Sql, kwargs: dict[str, Any], what: str
) -> None:
    q = "q"
    with CountingConnection.connect(dsn, autocommit=True) as c:
        client = Client(c, schema=shared[0])
        payload = kwargs.pop("payload", b"x")
        with pytest.raises(errors.InvalidArgument, match=what):
            client.send(q, payload, **kwargs)
        # The same bad item in the middle of a batch: nothing is sent at all.
        on_conflict = kwargs.pop("on_conflict", "ignore")
        with pytest.raises(errors.InvalidArgument, match=what):
            client.send_batch(q, [b"ok", Envelope(payload, **kwargs), b"ok"], on_conflict=on_conflict)  # type: ignore[arg-type]
        assert c.executed == 0
    assert sdb.count(q) == 1


@pytest.mark.parametrize("messages", ["abc", b"abc", {"a": 1}, Envelope(b"x")], ids=repr)
def test_batch_must_be_a_list_of_messages(sclient: Client, sdb: Sql, messages: Any) -> None:
    with pytest.raises(errors.InvalidArgument, match="list of payloads"):
        sclient.send_batch("q", messages)
    assert sdb.count("q") == 1


@pytest.mark.parametrize("n", [0, -1, 100_001, True, 1.0, "1", None], ids=repr)
def test_bad_counts(sclient: Client, n: Any) -> None:
    client, q = sclient, "q"
    for call in (
        lambda: client.take(q, n),
        lambda: client.take_tx(q, n),
        lambda: client.peek(q, n),
        lambda: client.receive(q, n, timeout=0),
        lambda: client.metrics(q, cap=n) if n is not None else client.metrics(q, cap=0),  # None: exact
        lambda: client.dead_letters(q, n),
        lambda: client.maintain(limit=n),
    ):
        with pytest.raises(errors.InvalidArgument):
            call()


def test_bad_queue_settings(client: Client) -> None:
    for kwargs in (
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 1.5},
        {"max_payload_bytes": 0},
        {"max_payload_bytes": MAX_PAYLOAD_BYTES + 1},
        {"max_payload_bytes": "1"},
    ):
        with pytest.raises(errors.InvalidArgument):
            client.create_queue("q", **kwargs)
    assert client.list_queues() == []
    client.create_queue("q")
    with pytest.raises(errors.InvalidArgument):
        client.create_queue("r", dead_letter_queue="Q")
    with pytest.raises(errors.QueueExists):
        client.create_queue("q")


def test_bad_settle_arguments(client: Client, q: str, db: Sql) -> None:
    client.create_queue("other")
    client.send(q, b"1")
    client.send("other", b"2")
    [m] = client.take(q)
    [o] = client.take("other")
    before = _unchanged(db)
    for call in (
        lambda: client.ack([]),
        lambda: client.ack([m, o]),
        lambda: client.ack([m, "not a message"]),  # type: ignore[list-item]
        lambda: client.nack([m, o]),
        lambda: client.nack([m], delay=[1, 2]),
        lambda: client.nack([m], error=["a", "b"]),
        lambda: client.nack(m, error=5),  # type: ignore[arg-type]
        lambda: client.nack(m, state=Unjsonable()),
        lambda: client.defer(m, state={"x": math.nan}),
        lambda: client.extend([]),
        lambda: client.take(q, ack=[o]),
        lambda: client.dead_letters(q, after_id="x"),  # type: ignore[arg-type]
        lambda: client.requeue_dead(q, ["x"]),  # type: ignore[list-item]
    ):
        with pytest.raises(errors.InvalidArgument):
            call()
    assert _unchanged(db) == before
    assert isinstance(m, Message) and client.ack(m) == {m.id}


def test_exceptions_form_a_hierarchy(sclient: Client) -> None:
    client = sclient
    with pytest.raises(errors.LonnyMQError):
        client.take("nope")
    with pytest.raises(ValueError):
        client.take("Nope")
    with pytest.raises(LookupError):
        client.take("nope")


# -- the SQL functions called directly -------------------------------------------------------


SQL_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("queue_create", {"p_name": "n", "p_lease_ms": 0}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_lease_ms": -5}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_lease_ms": None}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_max_attempts": 0}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_max_attempts": None}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_archive": None}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_max_payload_bytes": 0}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_max_payload_bytes": 104857601}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_max_payload_bytes": None}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_retention_ms": -1}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_retention_ms": None}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_priority_step_ms": -1}, "LQ002"),
    ("queue_create", {"p_name": "n", "p_dead_letter_queue": "nope"}, "LQ001"),
    ("queue_create", {"p_name": "q"}, "LQ005"),
    ("queue_create", {"p_name": None}, "LQ002"),
    ("queue_drop", {"p_name": "nope"}, "LQ001"),
    ("queue_purge", {"p_name": "nope"}, "LQ001"),
    ("queue_metrics", {"p_name": "q", "p_cap": 0}, "LQ002"),
    ("queue_metrics", {"p_name": "q", "p_cap": -1}, "LQ002"),
    ("queue_metrics", {"p_name": "nope"}, "LQ001"),
    ("send_batch", {"p_queue": "nope", "p_payloads": [b"x"]}, "LQ001"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x", None]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x", b"y"], "p_priorities": [0, 101]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_priorities": [-101]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x", b"y"], "p_delays_ms": [None, -1]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_headers": [[1, 2]]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_headers": ["str"]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_kinds": ["a", "b"]}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_keys": []}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_on_conflict": "upsert"}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_on_conflict": None}, "LQ002"),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"ok", b"x" * 101]}, "LQ003"),
    (
        "send_batch",
        {"p_queue": "q", "p_payloads": [b"x"], "p_keys": ["live"], "p_on_conflict": "error"},
        "LQ004",
    ),
    ("send_batch", {"p_queue": "q", "p_payloads": [b"x"], "p_delays_ms": [2**63 - 1]}, "22003"),
    ("take", {"p_queue": "q", "p_limit": 0}, "LQ002"),
    ("take", {"p_queue": "q", "p_limit": 100_001}, "LQ002"),
    ("take", {"p_queue": "q", "p_limit": None}, "LQ002"),
    ("take", {"p_queue": "q", "p_lease_ms": 0}, "LQ002"),
    ("take", {"p_queue": "q", "p_ack_ids": [1, 2], "p_ack_tokens": [1]}, "LQ002"),
    ("take", {"p_queue": "nope"}, "LQ001"),
    ("take_tx", {"p_queue": "q", "p_limit": 0}, "LQ002"),
    ("take_tx", {"p_queue": "nope"}, "LQ001"),
    ("peek", {"p_queue": "q", "p_limit": -1}, "LQ002"),
    ("ack", {"p_queue": "q", "p_ids": [1], "p_tokens": []}, "LQ002"),
    ("ack", {"p_queue": "q", "p_ids": [1], "p_tokens": None}, "LQ002"),
    ("ack", {"p_queue": "nope", "p_ids": [1], "p_tokens": [1]}, "LQ001"),
    ("nack", {"p_queue": "q", "p_ids": [1], "p_tokens": [1], "p_delays_ms": [-1]}, "LQ002"),
    ("nack", {"p_queue": "q", "p_ids": [1, 2], "p_tokens": [1]}, "LQ002"),
    ("extend", {"p_queue": "q", "p_ids": [1], "p_tokens": [1], "p_lease_ms": 0}, "LQ002"),
    ("extend", {"p_queue": "q", "p_ids": [1], "p_tokens": [1], "p_lease_ms": -1}, "LQ002"),
    ("extend", {"p_queue": "q", "p_ids": [1], "p_tokens": []}, "LQ002"),
    ("dead_list", {"p_queue": "q", "p_limit": 0}, "LQ002"),
    ("dead_requeue", {"p_queue": "nope"}, "LQ001"),
    ("dead_purge", {"p_queue": "nope"}, "LQ001"),
    ("maintain", {"p_limit": 0}, "LQ002"),
    ("maintain", {"p_limit": -1}, "LQ002"),
]


@pytest.mark.parametrize(("func", "args", "sqlstate"), SQL_CASES, ids=lambda v: repr(v)[:60])
def test_sql_functions_reject_bad_values(sdb: Sql, func: str, args: dict[str, Any], sqlstate: str) -> None:
    db = sdb
    before = _unchanged(db)
    with pytest.raises(psycopg.Error) as e:
        db.call(func, **args)
    assert e.value.sqlstate == sqlstate, str(e.value)
    if sqlstate.startswith("LQ"):
        # The primary message says what is wrong, without SQL text, and maps to a typed error.
        primary = e.value.diag.message_primary
        assert primary and "SELECT" not in primary
        assert type(map_error(e.value)) in (errors.SQLSTATE_ERRORS[sqlstate], errors.InvalidQueueName)
    assert _unchanged(db) == before
    assert [r["payload"] for r in db.q("SELECT payload FROM {s}.message")] == [b"live"]


def test_sql_names_are_never_interpolated(sdb: Sql) -> None:
    """Quotes and semicolons in names are data, in every function that takes a name."""
    db = sdb
    before = _unchanged(db)
    evil = "x'); DROP TABLE x; --"
    for func, key in (
        ("queue_create", "p_name"),
        ("queue_drop", "p_name"),
        ("queue_purge", "p_name"),
        ("queue_metrics", "p_name"),
        ("take", "p_queue"),
        ("dead_purge", "p_queue"),
    ):
        with pytest.raises(psycopg.Error) as e:
            db.call(func, **{key: evil})
        assert e.value.sqlstate in ("LQ001", "LQ002")
    assert _unchanged(db) == before
    assert db.q("SELECT to_regclass(%s) AS r", (f"{db.schema}.x",))[0]["r"] is not None
