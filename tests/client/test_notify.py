"""Wake-ups: one NOTIFY per transaction and queue, and receive() woken by it (and by the clock
for scheduled messages) instead of by polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, Envelope

POLL = 120.0  # receive()'s fallback poll: long enough that only NOTIFY or the clock can wake it
#: How long to wait for what must happen, and the bounds on how long it took: a fraction of the
#: poll, with room for a loaded CI machine (load 6-12).
PATIENCE = 60.0


@pytest.fixture
def listener(dsn: str, schema: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        yield c


def _wait_on(listener: psycopg.Connection, schema: str, *queues: str) -> None:
    """Register ``listener`` as a waiter on ``queues``: sends notify only while one waits."""
    for q in queues:
        listener.execute(sql.SQL("SELECT {}.wait_begin(%s)").format(sql.Identifier(schema)), [q])


def _drain(listener: psycopg.Connection, wait: float = 0.5, expect: int = 0) -> list[str]:
    """The notifications ``listener`` gets: first the ``expect`` expected ones (waited for up to
    PATIENCE s: a loaded machine may take long to deliver them), then any more within ``wait`` s
    (a short wait only ever decides that nothing more came)."""
    got = [n.payload for n in listener.notifies(timeout=PATIENCE, stop_after=expect)] if expect else []
    return got + [n.payload for n in listener.notifies(timeout=wait)]


def test_one_notification_per_transaction(
    dsn: str, schema: str, client: Client, listener: psycopg.Connection
) -> None:
    client.create_queue("a")
    client.create_queue("b")
    _wait_on(listener, schema, "a", "b")
    with psycopg.connect(dsn) as tx:
        for i in range(100):
            client.send("a", i, conn=tx)
        assert _drain(listener, 0.2) == []  # nothing before commit
        tx.commit()
    assert _drain(listener, expect=1) == ["a"]
    client.send_batch("a", list(range(1000)))
    assert _drain(listener, expect=1) == ["a"]
    with psycopg.connect(dsn) as tx:
        client.send_batch("a", [1, 2], conn=tx)
        client.send("b", 3, conn=tx)
        client.send("a", 4, conn=tx)
    assert sorted(_drain(listener, expect=2)) == ["a", "b"]
    client.send("a", 1)
    client.send("a", 2)
    assert _drain(listener, expect=2) == ["a", "a"]  # two transactions: two wake-ups


def test_no_notification_from_a_rolled_back_send(
    dsn: str, schema: str, client: Client, listener: psycopg.Connection
) -> None:
    client.create_queue("a")
    _wait_on(listener, schema, "a")
    with psycopg.connect(dsn) as tx:
        client.send("a", 1, conn=tx)
        tx.rollback()
    assert _drain(listener) == []


def test_receive_is_woken_by_a_send(client: Client, dsn: str, schema: str) -> None:
    client.create_queue("q")

    def send_later() -> None:
        time.sleep(0.3)
        with Client(dsn, schema=schema, pool_size=1) as other:
            other.send("q", b"wake")

    t = threading.Thread(target=send_later)
    started = time.monotonic()
    t.start()
    try:
        got = client.receive("q", timeout=PATIENCE, poll=POLL)
    finally:
        t.join()
    took = time.monotonic() - started
    assert [m.payload for m in got] == [b"wake"]
    assert 0.25 <= took < PATIENCE / 2, took  # woken by NOTIFY, long before the poll or the timeout


def test_receive_times_out_on_an_empty_queue(client: Client) -> None:
    client.create_queue("q")
    started = time.monotonic()
    assert client.receive("q", 3, timeout=0.3, poll=POLL) == []
    took = time.monotonic() - started
    assert 0.3 <= took < PATIENCE / 2, took  # the timeout, not the poll
    assert client.receive("q", timeout=0) == []


def test_receive_wakes_when_a_scheduled_message_is_due(client: Client) -> None:
    client.create_queue("q")
    # The clock is read before the send: the message is due 0.5 s after the server's clock
    # at the send, which a loaded machine may read well before send() returns (read after it,
    # a 0.4 s bound had 59 ms of its 100 ms left at load 9: docs/flaky.md).
    started = time.monotonic()
    client.send("q", b"soon", delay=0.5)
    got = client.receive("q", timeout=PATIENCE, poll=POLL)
    took = time.monotonic() - started
    assert [m.payload for m in got] == [b"soon"]
    assert 0.45 <= took < PATIENCE / 2, took  # when due (the server's clock in ms), not before


def test_receive_returns_what_is_ready_at_once(client: Client) -> None:
    client.create_queue("q")
    client.send_batch("q", [Envelope(i) for i in range(5)])
    started = time.monotonic()
    got = client.receive("q", 3, timeout=PATIENCE, poll=POLL, lease=600)
    assert [m.payload for m in got] == [0, 1, 2]
    assert got[0].lease_until is not None
    assert time.monotonic() - started < PATIENCE / 2  # at once: not after the poll or the timeout
