"""Helpers of the shard tests."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster

#: No plpgsql_check preload: these clusters only run the core and PL/Proxy.
SETTINGS = {"shared_preload_libraries": "''"}


def start_clusters(
    n: int, stack: ExitStack, settings: dict[str, str] | None = None
) -> list[pgcluster.Cluster]:
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")
    pgcluster.ensure_plproxy()
    conf = settings or SETTINGS
    return [stack.enter_context(pgcluster.temporary_cluster(conf, install=False)) for _ in range(n)]


def home(router_dsn: str, queue: str, shards: int = 2) -> int:
    """The shard the router sends ``queue``'s calls to (PL/Proxy: hashtext & (shards - 1))."""
    with psycopg.connect(router_dsn) as conn:
        row = conn.execute("SELECT hashtext(%s) & %s", (queue, shards - 1)).fetchone()
    assert row is not None
    return int(row[0])


def roles_on_router(router_dsn: str, shard_dsns: list[str]) -> None:
    """The producer and consumer roles created on the router too (as docs/sharding.md says),
    then the router rebuilt (``shard init``) so that they get its grants."""
    with psycopg.connect(router_dsn, autocommit=True) as conn:
        for role in ("lonnymq_producer", "lonnymq_consumer"):
            if not conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchall():
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    shard.init(router_dsn, shard_dsns)


def as_producer_then_consumer(c: Client, conn: psycopg.Connection[Any], queue: str) -> None:
    """On ``conn`` (a superuser's, autocommit): a send to ``queue`` as lonnymq_producer, then its
    take and ack as lonnymq_consumer (:func:`roles_on_router` first); the role stays the
    consumer's."""
    conn.execute("SET ROLE lonnymq_producer")
    c.send(queue, "by a producer", conn=conn)
    conn.execute("SET ROLE lonnymq_consumer")
    got = c.take(queue, conn=conn)
    assert [m.payload for m in got] == ["by a producer"]
    assert c.ack(got, conn=conn) == {got[0].id}


def map_version(router: str) -> int:
    """The version of the router's shard map."""
    with psycopg.connect(router) as conn:
        row = conn.execute("SELECT version FROM lonnymq._shard_map()").fetchone()
    assert row is not None
    return int(row[0])


#: Bounds of the wake-up tests through a router. A receive() or worker there looks at its queue
#: again at least every MAP_TTL (10 s: it re-reads the shard map), whatever its poll, so a lost
#: wake-up shows as a lag of up to 10 s and a move followed late (at the next map read) as a
#: registration up to 10 s late: the bounds must stay under that, with room for a loaded CI
#: machine (load 6-12; they were 1 s and 3 s).
WAKE_LAG = 3.0
FOLLOW = 6.0
#: How long to wait for what must happen where no such limit applies.
PATIENCE = 60.0


def waiters(shard_dsn: str) -> set[int]:
    """The sessions of a shard's database registered as waiters on some queue (holding a wait
    lock there)."""
    with psycopg.connect(shard_dsn) as conn:
        rows = conn.execute(
            "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock'"
            " AND classid = (hashtext('lonnymq/wait') & 2147483647)::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return {int(r[0]) for r in rows}


def registered_anew(shard_dsn: str, before: set[int], timeout: float, what: str) -> None:
    """Wait up to ``timeout`` seconds until a session other than ``before`` waits on the shard."""
    deadline = time.monotonic() + timeout
    while not waiters(shard_dsn) - before:
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def waiter_follows(
    c: Client, queue: str, src: str, dst: str, relocate: Callable[[], object], send: Callable[[], object]
) -> tuple[list[object], float]:
    """A receive() of ``c`` waiting on ``queue`` in a thread (poll=30: polling cannot be what
    finds a message), registered on shard database ``src``; ``relocate()`` moves the queue to
    ``dst``, where the receive must be registered within FOLLOW s; then ``send()`` sends to it.
    Returns what the receive returned and the seconds from the send's return to its return."""
    before = [waiters(src), waiters(dst)]
    got: list[object] = []
    woke: list[float] = []

    def wait() -> None:
        got.extend(m.payload for m in c.receive(queue, timeout=2 * PATIENCE, poll=30))
        woke.append(time.monotonic())

    t = threading.Thread(target=wait)
    t.start()
    try:
        registered_anew(src, before[0], PATIENCE, "receive() never registered on the queue's shard")
        relocate()
        registered_anew(dst, before[1], FOLLOW, "receive() did not follow the queue to its new shard")
        send()
        sent = time.monotonic()
    finally:
        t.join(2 * PATIENCE)
    return got, woke[0] - sent


class Threads:
    """Threads (``self.threads``) started on entering, told to stop (``self.stop``) and joined on
    leaving."""

    threads: list[threading.Thread]
    stop: threading.Event

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


class Traffic(Threads):
    """A producer and a consumer of one queue through the router, in threads: the producer sends
    numbered messages one by one, the consumer takes up to 10, holds them briefly (so leases
    are in flight when the queue moves) and acks them. Records what committed and each call's
    duration."""

    def __init__(self, dsn: str, queue: str, first: int = 0, *, direct: bool = False) -> None:
        self.dsn, self.queue, self.first, self.direct = dsn, queue, first, direct
        self.stop = threading.Event()
        self.sent: list[int] = []
        self.delivered: list[tuple[int, float]] = []  # (n, monotonic time of the take)
        self.acked: list[tuple[int, float]] = []
        self.calls: list[tuple[float, float]] = []  # (start, seconds) of every call
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self.produce, self.consume)]

    def timed(self, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            return f(*args, **kwargs)
        finally:
            self.calls.append((t0, time.monotonic() - t0))

    def produce(self) -> None:
        try:
            with Client(self.dsn, pool_size=1, direct=self.direct) as c:
                n = self.first
                while not self.stop.is_set():
                    self.timed(c.send, self.queue, {"n": n})
                    self.sent.append(n)
                    n += 1
        except BaseException as e:
            self.errors.append(e)

    def consume(self) -> None:
        try:
            with Client(self.dsn, pool_size=1, direct=self.direct) as c:
                while not self.stop.is_set():
                    got = self.timed(c.take, self.queue, 10)
                    now = time.monotonic()
                    self.delivered.extend((m.payload["n"], now) for m in got)
                    if not got:
                        time.sleep(0.005)
                        continue
                    time.sleep(0.03)
                    done = self.timed(c.ack, got)
                    if done != {m.id for m in got}:
                        raise AssertionError(f"ack refused for {sorted({m.id for m in got} - done)}")
                    now = time.monotonic()
                    self.acked.extend((m.payload["n"], now) for m in got)
        except BaseException as e:
            self.errors.append(e)

    def progress(self, sent: int, acked: int = 0, timeout: float = PATIENCE) -> None:
        """Wait until the traffic has sent ``sent`` and acked ``acked`` messages more than so far:
        the tests wait for traffic this way rather than sleeping a fixed time (a loaded CI
        machine sends far fewer in one)."""
        s0, a0 = len(self.sent), len(self.acked)
        deadline = time.monotonic() + timeout
        while len(self.sent) < s0 + sent or len(self.acked) < a0 + acked:
            assert not self.errors, self.errors[:3]
            assert time.monotonic() < deadline, (
                f"traffic stalled: {len(self.sent) - s0} sent, {len(self.acked) - a0} acked"
            )
            time.sleep(0.02)

    def stalls(self, start: float, end: float) -> float:
        """The longest call that overlapped [start, end]."""
        return max((d for t, d in self.calls if t <= end and t + d >= start), default=0.0)


def drain(dsn: str, queue: str) -> list[int]:
    got: list[int] = []
    with Client(dsn) as c:
        while batch := c.take(queue, 500):
            got.extend(m.payload["n"] for m in batch)
            c.ack(batch)
    return got


def kill_all(c: Client, q: str, n: int) -> dict[int, str]:
    """Take ``n`` messages of ``q`` and nack each past its last attempt (max_attempts=1):
    id -> payload of the messages dead-lettered."""
    dead: dict[int, str] = {}
    while len(dead) < n:
        got = c.take(q, 7)
        assert got, f"only {len(dead)} of {n} taken"
        assert c.nack(got, error="boom") == {m.id: "dead" for m in got}
        dead.update({m.id: m.payload for m in got})
    return dead
