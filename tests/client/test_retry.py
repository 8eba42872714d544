"""Lost connections: the pool's checkout check, the retry of what is safe to repeat, and
ConnectionLost for what is not (lonnymq.client.retry).

Connections are killed for real with pg_terminate_backend (what a PostgreSQL restart or a
failover does to them); a call is caught "in flight" by holding a table lock it waits on."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from lonnymq import Client, Envelope, errors
from lonnymq.client.retry import RetryPolicy


def closed_port() -> int:
    """A loopback port nothing listens on (free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def app_name() -> str:
    return f"lq-retry-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_client(dsn: str, schema: str, app_name: str) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(**kw: Any) -> Client:
        c = Client(make_conninfo(dsn, application_name=app_name), schema=schema, **kw)
        made.append(c)
        c.create_queue("q", if_not_exists=True)
        return c

    yield make
    for c in made:
        c.close()


def kill_backends(conn: psycopg.Connection[Any], app_name: str) -> int:
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app_name,)
    ).fetchall()
    return len(rows)


def wait_blocked(conn: psycopg.Connection[Any], app_name: str, timeout: float = 60) -> None:
    """Until a backend of ``app_name`` waits on a lock."""
    deadline = time.monotonic() + timeout
    while not conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (app_name,),
    ).fetchone():
        assert time.monotonic() < deadline, "the call never blocked on the lock"
        time.sleep(0.02)


def cut_off_in_flight(
    dsn: str, schema: str, conn: psycopg.Connection[Any], app_name: str, call: Callable[[], Any]
) -> Any:
    """Run ``call`` while the message table is locked, kill its backend once it waits on the lock
    (the statement has reached the server), then release the lock; its result or exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    with psycopg.connect(dsn, autocommit=True) as locker:
        with locker.transaction():
            locker.execute(
                sql.SQL("LOCK TABLE {}.message IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
            )
            t = threading.Thread(target=run)
            t.start()
            wait_blocked(conn, app_name)
            assert kill_backends(conn, app_name) >= 1
            time.sleep(0.2)  # let the client see the loss while the lock is still held
        t.join(90)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_dead_pooled_connections_are_replaced_on_checkout(make_client: Any, conn: Any, app_name: str) -> None:
    c = make_client()
    c.send("q", 1)
    assert kill_backends(conn, app_name) >= 1
    # Every pooled connection is dead: the checkout check replaces it, the send never sees it.
    assert c.send("q", 2).outcome == "created"
    assert [m.payload for m in c.peek("q")] == [1, 2]


def test_the_check_costs_no_round_trip_until_the_server_ends_the_session(
    make_client: Any, dsn: str, conn: Any, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check looks at the socket: an empty query only when there is something to read there.
    trips: list[object] = []
    full_check = ConnectionPool.check_connection
    monkeypatch.setattr(ConnectionPool, "check_connection", lambda c: trips.append(c) or full_check(c))
    c = make_client(idempotent_sends=False)  # no idempotency key: a dead connection would raise
    for i in range(20):
        c.send("q", i)
    assert trips == []
    # pg_terminate_backend(pid, timeout) returns once the backend has exited (closed its socket).
    killed = conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = %s",
        (app_name,),
    ).fetchall()
    assert killed and all(ok for (ok,) in killed)
    assert c.send("q", 20).outcome == "created"  # the dead one was seen, checked and replaced
    assert len(trips) >= 1
    assert len(c.peek("q", 100)) == 21


def test_without_the_check_a_dead_connection_fails_the_send(
    make_client: Any, conn: Any, app_name: str
) -> None:
    # Without idempotency keys (tests/client/test_idempotent_send.py: with them, it is retried).
    c = make_client(check_connections=False, idempotent_sends=False)
    c.send("q", 1)
    assert kill_backends(conn, app_name) >= 1
    with pytest.raises(errors.ConnectionLost, match="may have committed") as info:
        c.send("q", 2)
    assert info.value.may_have_committed
    assert isinstance(info.value, psycopg.OperationalError)  # what plain psycopg code catches


def test_without_the_check_a_safe_call_is_retried(make_client: Any, conn: Any, app_name: str) -> None:
    c = make_client(check_connections=False)
    c.send("q", 1)
    assert kill_backends(conn, app_name) >= 1
    assert [m.payload for m in c.take("q")] == [1]


def test_send_cut_off_in_flight_raises_connection_lost(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    c = make_client(idempotent_sends=False)  # with keys it is retried: test_idempotent_send.py
    with pytest.raises(errors.ConnectionLost) as info:
        cut_off_in_flight(dsn, schema, conn, app_name, lambda: c.send("q", "x"))
    assert info.value.may_have_committed
    assert c.peek("q") == []  # here it had not (it waited on the lock), but the client cannot know


def test_ack_cut_off_in_flight_raises_connection_lost(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    c = make_client()
    c.send("q", "x")
    [m] = c.take("q")
    with pytest.raises(errors.ConnectionLost):
        cut_off_in_flight(dsn, schema, conn, app_name, lambda: c.ack(m))
    assert c.ack(m) == {m.id}  # it had not committed: the delivery is still ours


def test_peek_cut_off_in_flight_is_retried(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    c = make_client()
    c.send("q", "x")
    peeked = cut_off_in_flight(dsn, schema, conn, app_name, lambda: c.peek("q"))
    assert [m.payload for m in peeked] == ["x"]


def test_take_cut_off_in_flight_is_retried(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    c = make_client()
    c.send("q", "x")
    taken = cut_off_in_flight(dsn, schema, conn, app_name, lambda: c.take("q"))
    assert [m.payload for m in taken] == ["x"]


def test_no_retry_policy_raises_for_safe_calls_too(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    c = make_client(retry=None)
    with pytest.raises(errors.ConnectionLost) as info:
        cut_off_in_flight(dsn, schema, conn, app_name, lambda: c.peek("q"))
    assert info.value.may_have_committed  # it reached the server (harmless for a peek)


def test_receive_survives_its_listen_connection_being_killed(
    make_client: Any, conn: Any, app_name: str
) -> None:
    c = make_client()
    got: list[Any] = []
    # A long timeout and poll: only listening again on a new connection wakes it within the
    # join below (a loaded CI machine may take many seconds over the rest).
    t = threading.Thread(target=lambda: got.extend(c.receive("q", timeout=300, poll=300)))
    t.start()
    deadline = time.monotonic() + 60
    while not conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
        " AND (query LIKE 'LISTEN%%' OR query LIKE '%%.wait_begin(%%' OR query LIKE '%%.wait_pending(%%')",
        (app_name,),
    ).fetchone():
        assert time.monotonic() < deadline, "receive() never listened"
        time.sleep(0.02)
    assert kill_backends(conn, app_name) >= 1
    time.sleep(0.3)
    with Client(conn.info.dsn, schema=c.schema) as other:
        other.send("q", "wake")
    t.join(120)
    # Woken long before the poll and the timeout: it listened again on a new connection (or found
    # it at once).
    assert not t.is_alive() and [m.payload for m in got] == ["wake"]


def test_unreachable_server_gives_up_at_the_deadline() -> None:
    dsn = f"postgresql://nobody@127.0.0.1:{closed_port()}/x"
    c = Client(dsn, retry=RetryPolicy(deadline=1.5))
    try:
        started = time.monotonic()
        with pytest.raises(errors.ConnectionLost, match="gave up") as info:
            c.peek("q")
        assert not info.value.may_have_committed
        assert time.monotonic() - started < 20  # its 1.5 s, not the default 30 s
    finally:
        c.close()


@pytest.mark.parametrize(
    "kw",
    [{"deadline": 0}, {"initial_delay": -1}, {"max_delay": float("inf")}, {"multiplier": 0.5}, {"jitter": 2}],
)
def test_bad_policy(kw: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidArgument):
        RetryPolicy(**kw)


def test_bad_retry_argument(dsn: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="RetryPolicy"):
        Client(dsn, retry=30)  # type: ignore[arg-type]  # the wrong type is the point


def test_backoff_grows_with_jitter_and_stops_at_the_deadline() -> None:
    b = RetryPolicy(deadline=0.5, initial_delay=0.1, max_delay=0.3, multiplier=2, jitter=0.5).start()
    waits = [b.next_delay() or 0.0 for _ in range(4)]
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2
    assert 0.15 <= waits[2] <= 0.3 and 0.15 <= waits[3] <= 0.3  # capped at max_delay
    time.sleep(0.5)
    assert b.next_delay() is None


def _deadlocks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def _deadlock_a_send(make_client: Any, dsn: str, schema: str, conn: Any, app_name: str, **kw: Any) -> Any:
    """A send_batch to channels a and b, which locks their rows in name order, while another
    transaction holds b and then asks for a: the server detects the deadlock and rolls back the
    send, whose backend waited longest (the other one's deadlock_timeout is set far off).
    Returns the send's result or exception, with the server's count of deadlocks it caused."""
    c = make_client(**kw)
    c.send_batch("q", [Envelope("a0", channel="a"), Envelope("b0", channel="b")])  # the two rows
    before = _deadlocks(conn)
    out: dict[str, Any] = {}

    def send() -> None:
        try:
            out["result"] = c.send_batch("q", [Envelope("a1", channel="a"), Envelope("b1", channel="b")])
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    row = sql.SQL("SELECT 1 FROM {}.channel WHERE name = %s FOR UPDATE").format(sql.Identifier(schema))
    with psycopg.connect(dsn) as other:
        other.execute("SET deadlock_timeout = '60s'")
        other.execute(row, ("b",))
        t = threading.Thread(target=send)
        t.start()
        wait_blocked(conn, app_name)  # the send holds a and waits for b
        other.execute(row, ("a",))  # granted once the server has rolled the send back
        other.rollback()
    t.join(30)
    assert not t.is_alive()
    return out, _deadlocks(conn) - before


def test_a_call_rolled_back_by_a_deadlock_is_repeated(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    out, deadlocks = _deadlock_a_send(make_client, dsn, schema, conn, app_name)
    assert deadlocks == 1 and "error" not in out, out
    # Repeated once the other transaction let go: each message once, in each channel's order.
    assert len(out["result"]) == 2
    c = make_client()
    assert sorted(m.payload for m in c.peek("q", 10)) == ["a0", "a1", "b0", "b1"]


def test_without_a_retry_policy_a_deadlock_is_raised(
    make_client: Any, dsn: str, schema: str, conn: Any, app_name: str
) -> None:
    out, deadlocks = _deadlock_a_send(make_client, dsn, schema, conn, app_name, retry=None)
    assert deadlocks == 1 and isinstance(out.get("error"), psycopg.errors.DeadlockDetected), out
    assert sorted(m.payload for m in make_client().peek("q", 10)) == ["a0", "b0"]  # nothing of it
