"""Wake-ups without a NOTIFY per send (issue 12 item 1): sends notify only while a consumer is
registered as a waiter, and no wake-up is lost when a send races the registration."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client
from worker_helpers import waiters

POLL = 120.0  # fallback poll: only a NOTIFY (or the trailing look) can wake a consumer in time
#: How long to wait for what must happen, and the bounds on how long it took: a fraction of the
#: poll, with room for a loaded CI machine (load 6-12).
PATIENCE = 60.0


@pytest.fixture
def listener(dsn: str, schema: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        yield c


def _call(c: psycopg.Connection, schema: str, fn: str, *args: object) -> object:
    placeholders = sql.SQL(", ").join(sql.Placeholder() * len(args))
    row = c.execute(
        sql.SQL("SELECT {}.{}({})").format(sql.Identifier(schema), sql.Identifier(fn), placeholders), args
    ).fetchone()
    assert row is not None
    return row[0]


def _drain(listener: psycopg.Connection, wait: float = 0.3, expect: int = 0) -> list[str]:
    """The notifications ``listener`` gets: first the ``expect`` expected ones (waited for up to
    PATIENCE s: a loaded machine may take long to deliver them), then any more within ``wait`` s
    (a short wait only ever decides that nothing more came)."""
    got = [n.payload for n in listener.notifies(timeout=PATIENCE, stop_after=expect)] if expect else []
    return got + [n.payload for n in listener.notifies(timeout=wait)]


#: The SQL sends that wake a waiting consumer: send() and the plain send (send_plain).
SENDS = ["send", "send_plain"]


def _send(c: psycopg.Connection, schema: str, fn: str, queue: str) -> None:
    """One message by ``fn`` (send or send_plain) on ``c``."""
    c.execute(
        sql.SQL("SELECT * FROM {}.{}(%s, %s::bytea)").format(sql.Identifier(schema), sql.Identifier(fn)),
        (queue, b"x"),
    )


@pytest.mark.parametrize("fn", SENDS)
def test_send_notifies_only_while_someone_waits(
    client: Client, schema: str, listener: psycopg.Connection, conn: psycopg.Connection, fn: str
) -> None:
    client.create_queue("q")
    _send(conn, schema, fn, "q")
    assert _drain(listener) == []  # nobody waits: no NOTIFY, no commit lock
    assert _call(listener, schema, "wait_begin", "q") == []
    _send(conn, schema, fn, "q")
    assert _drain(listener, expect=1) == ["q"]
    assert _call(listener, schema, "wait_end", "q", True) is True
    assert _call(listener, schema, "wait_end", "q", True) is False  # not registered any more
    _send(conn, schema, fn, "q")
    assert _drain(listener) == []
    # Registered twice, released one at a time.
    _call(listener, schema, "wait_begin", "q")
    _call(listener, schema, "wait_begin", "q")
    assert _call(listener, schema, "wait_end", "q", False) is True
    _send(conn, schema, fn, "q")
    assert _drain(listener, expect=1) == ["q"]
    assert _call(listener, schema, "wait_end", "q", False) is True
    assert _call(listener, schema, "wait_end", "nope", True) is False  # unknown queue: no error
    with pytest.raises(psycopg.Error):
        _call(listener, schema, "wait_begin", "nope")


def test_a_closed_session_stops_waiting(
    dsn: str, client: Client, schema: str, listener: psycopg.Connection
) -> None:
    client.create_queue("q")
    with psycopg.connect(dsn, autocommit=True) as other:
        _call(other, schema, "wait_begin", "q")
        client.send("q", 1)
    client.send("q", 2)  # the waiter's session is gone: its registration with it
    with psycopg.connect(dsn, autocommit=True) as probe:
        probe.execute(sql.SQL("LISTEN {}").format(sql.Identifier(schema)))
        assert _drain(probe) == []


@pytest.mark.parametrize("fn", SENDS)
def test_always_setting_notifies_every_send(
    dsn: str, client: Client, schema: str, listener: psycopg.Connection, fn: str
) -> None:
    client.create_queue("q")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET lonnymq.wake = 'always'")
        _send(c, schema, fn, "q")
    assert _drain(listener, expect=1) == ["q"]


@pytest.mark.parametrize("fn", SENDS)
def test_send_lock_held_elsewhere_makes_sends_notify(
    dsn: str, client: Client, schema: str, listener: psycopg.Connection, conn: psycopg.Connection, fn: str
) -> None:
    """A session holding the send lock exclusively (not LonnyMQ's doing) never blocks a send: it
    notifies instead."""
    client.create_queue("q")
    with psycopg.connect(dsn, autocommit=True) as c:
        keys = c.execute(
            sql.SQL("SELECT k.* FROM {}._wait_keys((SELECT id FROM {}.queue WHERE name = 'q')) k").format(
                sql.Identifier(schema), sql.Identifier(schema)
            )
        ).fetchone()
        assert keys is not None
        c.execute("SELECT pg_advisory_lock(%s, %s)", [keys[0], keys[2]])
        _send(conn, schema, fn, "q")  # another session's send
        assert _drain(listener, expect=1) == ["q"]


def test_wait_begin_reports_sends_in_flight(dsn: str, client: Client, schema: str) -> None:
    """A send that looked for waiters before the registration is waited for (wait_pending)."""
    client.create_queue("q")
    with psycopg.connect(dsn) as tx, psycopg.connect(dsn, autocommit=True) as waiter:
        client.send("q", 1, conn=tx)  # looked: nobody waits, so it will not notify
        pending = _call(waiter, schema, "wait_begin", "q")
        assert isinstance(pending, list) and len(pending) == 1
        assert _call(waiter, schema, "wait_pending", pending) == pending
        tx.commit()
        assert _call(waiter, schema, "wait_pending", pending) == []


def test_wait_begin_waits_for_a_probe_at_most_lock_timeout(dsn: str, client: Client, schema: str) -> None:
    """The wait lock held exclusively (a send probing it) delays wait_begin, for at most 1 s."""
    client.create_queue("q")
    with psycopg.connect(dsn, autocommit=True) as c, psycopg.connect(dsn, autocommit=True) as w:
        keys = c.execute(
            sql.SQL("SELECT k.* FROM {}._wait_keys((SELECT id FROM {}.queue WHERE name = 'q')) k").format(
                sql.Identifier(schema), sql.Identifier(schema)
            )
        ).fetchone()
        assert keys is not None
        c.execute("SELECT pg_advisory_lock(%s, %s)", [keys[1], keys[2]])
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _call(w, schema, "wait_begin", "q")
        timer = threading.Timer(
            0.2, lambda: c.execute("SELECT pg_advisory_unlock(%s, %s)", [keys[1], keys[2]])
        )
        started = time.monotonic()  # before the timer's 0.2 s start, however slow this thread
        timer.start()
        assert _call(w, schema, "wait_begin", "q") == []
        timer.join()
        assert time.monotonic() - started >= 0.15


def test_receive_waits_for_a_send_in_flight(dsn: str, client: Client, schema: str) -> None:
    """A send whose transaction is open while receive() registers is picked up at its commit,
    though it never notifies."""
    client.create_queue("q")
    with psycopg.connect(dsn) as tx:
        client.send("q", b"x", conn=tx)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.extend(client.receive("q", timeout=PATIENCE, poll=POLL)))
        t.start()
        # Registered while the send is in flight (a condition: a loaded machine may take longer
        # than any fixed pause to get there).
        deadline = time.monotonic() + PATIENCE
        while not waiters(dsn, schema, "q"):
            assert time.monotonic() < deadline, "receive() never registered"
            time.sleep(0.02)
        assert not got
        tx.commit()
        started = time.monotonic()
        t.join(PATIENCE)
    # At the commit, not at the timeout (PATIENCE) nor the poll.
    assert len(got) == 1 and time.monotonic() - started < PATIENCE / 2


def test_no_lost_wakeup_under_concurrency(dsn: str, client: Client, schema: str) -> None:
    """Several producers and waiters, many rounds: every message sent while consumers wait is
    picked up long before the poll."""
    client.create_queue("q")
    consumers, producers, rounds = 4, 3, 15
    got: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    total = rounds * producers

    def consume() -> None:
        try:
            with Client(dsn, schema=schema, pool_size=1) as c:
                # Until told to stop (a lost wake-up would wait out the timeout: PATIENCE s).
                while ms := c.receive("q", timeout=PATIENCE, poll=POLL):
                    c.ack(ms)
                    if ms[0].payload == b"stop":
                        return
                    with lock:
                        got.extend(time.monotonic() - float(m.payload) for m in ms)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(consumers)]
    for t in threads:
        t.start()
    with Client(dsn, schema=schema, pool_size=producers) as p:
        for i in range(rounds):
            time.sleep(0.05 + 0.01 * (i % 5))  # consumers are (mostly) waiting again

            def send() -> None:
                p.send("q", str(time.monotonic()).encode())

            senders = [threading.Thread(target=send) for _ in range(producers)]
            for s in senders:
                s.start()
            for s in senders:
                s.join()
        deadline = time.monotonic() + 2 * PATIENCE
        while len(got) < total and not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_batch("q", [b"stop"] * consumers)  # one each: receive() takes one at a time
    for t in threads:
        t.join(2 * PATIENCE)
    assert not errors
    assert len(got) == total
    # A lost wake-up waits for the poll (108-132 s); a loaded machine may take seconds.
    assert max(got) < PATIENCE / 2, sorted(got)[-5:]
