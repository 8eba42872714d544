"""Idempotent sends (issue 18): a send call carries a key (send_key), and a repeat of the call
creates nothing and returns what the first one did. The lost reply is made for real: the
connection is cut by a proxy once the server has answered (after the commit), or the backend is
killed with pg_terminate_backend while the call waits on a lock (before it)."""

from __future__ import annotations

import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lonnymq import Client, Envelope, errors
from lonnymq.client.ops import new_send_key


def _count(conn: psycopg.Connection[Any], schema: str, queue: str = "q") -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id WHERE q.name = %s"
        ).format(s=sql.Identifier(schema)),
        (queue,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _keys(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.send_key").format(sql.Identifier(schema))).fetchone()
    assert row is not None
    return int(row[0])


# -- the SQL: a repeat with the same key --------------------------------------------------------


def test_a_repeated_send_with_the_same_key_creates_one_message(
    client: Client, conn: Any, schema: str
) -> None:
    client.create_queue("q")
    s = sql.Identifier(schema)
    key = uuid.uuid4()
    send = sql.SQL("SELECT id, outcome FROM {}.send('q', 'x'::bytea, p_send_key => %s)").format(s)
    first = conn.execute(send, (key,)).fetchall()
    again = conn.execute(send, (key,)).fetchall()
    assert first == again and first[0][1] == "created"
    assert _count(conn, schema) == 1
    # The recorded result outlives the message: a repeat after it was consumed creates nothing.
    assert [m.id for m in client.take_tx("q")] == [first[0][0]]
    assert conn.execute(send, (key,)).fetchall() == first
    assert _count(conn, schema) == 0


def test_a_repeated_batch_returns_the_same_ids_and_outcomes(client: Client, conn: Any, schema: str) -> None:
    client.create_queue("q")
    client.send("q", "old", key="k")
    key = uuid.uuid4()
    batch = [Envelope("a", key="k"), Envelope("b"), Envelope("c", key="k2")]
    first = client.send_batch("q", batch, idempotency_key=key)
    assert [r.outcome for r in first] == ["ignored", "created", "created"]
    assert client.send_batch("q", batch, idempotency_key=key) == first
    assert client.send_batch("q", batch, idempotency_key=str(key)) == first
    assert _count(conn, schema) == 3  # old, b, c


def test_keyed_sends_through_every_path_replay(client: Client, conn: Any, schema: str) -> None:
    """The lean statement, and send_batch behind send() (a de-dup key, a channel)."""
    client.create_queue("q")
    for kw in ({}, {"key": "dedup"}, {"channel": "tenant-1"}, {"priority": 5, "delay": 10}):
        key = new_send_key()
        first = client.send("q", "x", idempotency_key=key, **kw)
        assert first.outcome == "created"
        assert client.send("q", "x", idempotency_key=key, **kw) == first
    assert _count(conn, schema) == 4


def test_a_key_is_scoped_to_its_queue(client: Client, conn: Any, schema: str) -> None:
    client.create_queue("q")
    client.create_queue("other", unlogged=True)
    key = uuid.uuid4()
    a = client.send("q", "x", idempotency_key=key)
    b = client.send("other", "x", idempotency_key=key)
    assert a.id != b.id and b.outcome == "created"
    assert _count(conn, schema, "q") == 1 and _count(conn, schema, "other") == 1


def test_a_failed_send_records_no_key(client: Client, conn: Any, schema: str) -> None:
    client.create_queue("q", max_payload_bytes=4)
    key = uuid.uuid4()
    with pytest.raises(errors.PayloadTooLarge):
        client.send("q", b"12345", idempotency_key=key)
    assert _keys(conn, schema) == 0
    assert client.send("q", b"1234", idempotency_key=key).outcome == "created"


def test_a_repeat_while_the_first_call_runs_waits_for_it(
    dsn: str, client: Client, conn: Any, schema: str
) -> None:
    """The first call's transaction is still open (its reply lost, its backend still running):
    the repeat waits for it, then returns its result (commit) or sends (rollback)."""
    client.create_queue("q")
    for outcome in ("commit", "rollback"):
        key = uuid.uuid4()
        got: list[Any] = []
        with psycopg.connect(dsn) as first:
            sent = client.send("q", outcome, idempotency_key=key, conn=first)
            t = threading.Thread(
                target=lambda got=got, key=key: got.append(client.send("q", "repeat", idempotency_key=key))
            )
            t.start()
            time.sleep(0.5)
            assert t.is_alive(), "the repeat did not wait for the first call"
            getattr(first, outcome)()
            t.join(60)
        assert not t.is_alive()
        if outcome == "commit":
            assert got == [sent]
        else:
            assert got[0].outcome == "created" and got[0].id != sent.id
    assert [m.payload for m in client.peek("q")] == ["commit", "repeat"]


# -- the client: which calls carry a key ---------------------------------------------------------


def test_the_client_keys_the_sends_it_may_repeat(dsn: str, schema: str) -> None:
    with Client(dsn, schema=schema) as c:
        c.create_queue("q")
        assert c.ops.send("q", 1).safe_to_retry is False
        assert c._send_key(None, None) is not None  # its pool, a retry policy: keyed
        with psycopg.connect(dsn) as tx:
            assert c._send_key(None, tx) is None  # the caller's transaction: never repeated
        c.send("q", 1)
        c.send_batch("q", [1, 2])
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert _keys(conn, schema) == 2
    with Client(dsn, schema=schema, idempotent_sends=False) as c:
        assert c._send_key(None, None) is None
    with Client(dsn, schema=schema, retry=None) as c:
        assert c._send_key(None, None) is None  # nothing repeats: no key is paid for
    with pytest.raises(errors.InvalidArgument):
        Client(dsn, schema=schema).send("q", 1, idempotency_key="not-a-uuid")


def test_send_keys_are_time_ordered_uuid7() -> None:
    keys = [new_send_key() for _ in range(100)]
    assert all(k.version == 7 and k.variant == uuid.RFC_4122 for k in keys)
    assert len(set(keys)) == 100
    stamps = [k.int >> 80 for k in keys]
    assert stamps == sorted(stamps) and abs(stamps[-1] - time.time() * 1000) < 5000


# -- maintain ------------------------------------------------------------------------------------


def test_maintain_forgets_keys_after_the_retention(client: Client, conn: Any, schema: str) -> None:
    client.create_queue("q")
    s = sql.Identifier(schema)
    now = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchone()[0]
    key = uuid.uuid4()
    send = sql.SQL("SELECT id FROM {}.send('q', 'x'::bytea, p_send_key => %s, p_now => %s)").format(s)
    [(first,)] = conn.execute(send, (key, now)).fetchall()
    maintain = sql.SQL("SELECT {}.maintain(p_now => %s)").format(s)
    conn.execute(maintain, (now + 3_600_000 - 1,))
    assert _keys(conn, schema) == 1  # kept for an hour
    conn.execute(maintain, (now + 3_600_001,))
    assert _keys(conn, schema) == 0
    # Forgotten: the same key sends again.
    [(second,)] = conn.execute(send, (key, now + 3_600_002)).fetchall()
    assert second != first and _count(conn, schema) == 2
    # The retention is a setting (an interval).
    conn.execute("SET lonnymq.send_key_retention = '10 minutes'")
    conn.execute(maintain, (now + 3_600_002 + 600_001,))
    assert _keys(conn, schema) == 0
    conn.execute("SET lonnymq.send_key_retention = 'soon'")
    with pytest.raises(psycopg.Error, match="send_key_retention must be a non-negative interval") as info:
        conn.execute(maintain, (now,))
    assert info.value.sqlstate == "LQ002"


# -- lost replies, for real ----------------------------------------------------------------------


class CutProxy:
    """A TCP proxy in front of PostgreSQL that, once armed, forwards the next query that
    contains ``marker``, swallows the server's answer (the call has committed) and closes the
    client's connection: the client sees a lost connection after the commit."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        host = str(params.get("host") or "localhost").split(",")[0]
        port = int(str(params.get("port") or 5432).split(",")[0])
        self.upstream: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=str(self.port), hostaddr="127.0.0.1")
        self.marker: bytes | None = None
        self.cuts = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes) -> None:
        self.marker = marker

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(self.upstream[0], socket.SOCK_STREAM)
            server.connect(self.upstream[1])
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        cutting = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [], 30)
                if not ready:
                    return
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    if self.marker is not None and self.marker in data:
                        self.marker = None
                        cutting = True
                    server.sendall(data)
                if server in ready:
                    data = server.recv(65536)
                    if not data:
                        return
                    if cutting:
                        # The answer (sent after the commit) is lost with the connection.
                        self.cuts += 1
                        time.sleep(0.05)
                        return
                    client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()


@pytest.fixture
def proxy(dsn: str) -> Iterator[CutProxy]:
    p = CutProxy(dsn)
    yield p
    p.close()


@pytest.mark.parametrize("call", ["send", "send_batch"])
def test_a_send_whose_reply_is_lost_after_the_commit_is_retried_once(
    proxy: CutProxy, dsn: str, schema: str, conn: Any, call: str
) -> None:
    with Client(proxy.dsn, schema=schema) as c:
        c.create_queue("q")
        # A plain message with the client's key: the lean keyed send (send_plain_once).
        proxy.arm(b".send_plain_once(" if call == "send" else b".send_batch(")
        if call == "send":
            result = c.send("q", "x")
            ids = [result.id]
        else:
            ids = [r.id for r in c.send_batch("q", ["x", "y"])]
        assert proxy.cuts == 1  # the first attempt's answer was lost after it committed
    assert _count(conn, schema) == len(ids)  # the retry created nothing
    with Client(dsn, schema=schema) as c:
        assert [m.id for m in c.peek("q")] == ids


def test_without_keys_a_lost_reply_raises_connection_lost(proxy: CutProxy, schema: str, conn: Any) -> None:
    with Client(proxy.dsn, schema=schema, idempotent_sends=False) as c:
        c.create_queue("q")
        proxy.arm(b".send_plain(")  # a plain message without a key: the lean plain send
        with pytest.raises(errors.ConnectionLost) as info:
            c.send("q", "x")
        assert info.value.may_have_committed
    assert _count(conn, schema) == 1  # it had committed


def _kill_when_blocked(dsn: str, schema: str, app_name: str, call: Callable[[], Any]) -> Any:
    """Run ``call`` while the message table is locked, kill its backend once it waits on the
    lock (the statement reached the server and had not committed), then release the lock."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    with psycopg.connect(dsn, autocommit=True) as locker, psycopg.connect(dsn, autocommit=True) as watch:
        with locker.transaction():
            locker.execute(
                sql.SQL("LOCK TABLE {}.message IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
            )
            t = threading.Thread(target=run)
            t.start()
            deadline = time.monotonic() + 10
            while not watch.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (app_name,),
            ).fetchone():
                assert time.monotonic() < deadline, "the call never blocked on the lock"
                time.sleep(0.02)
            watch.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (app_name,),
            )
            time.sleep(0.2)
        t.join(30)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_a_send_killed_in_flight_is_retried(dsn: str, schema: str, conn: Any) -> None:
    app_name = f"lq-idem-{uuid.uuid4().hex[:8]}"
    with Client(make_conninfo(dsn, application_name=app_name), schema=schema) as c:
        c.create_queue("q")
        result = _kill_when_blocked(dsn, schema, app_name, lambda: c.send("q", "x"))
    assert result.outcome == "created"
    assert _count(conn, schema) == 1
