"""LonnyMQ through its public sync client, installed by its migrations (schema ``lonnymq``).

Each worker process uses a ``Client`` on one autocommit connection, so each call is one round
trip and one transaction, as it is for the peers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from ..harness import Ctx, payload
from .base import FLAT_EMPTY, Flat, System, Variant

QUEUE = "bench"
SCHEMA = "lonnymq"


def _client(dsn: str) -> tuple[Any, psycopg.Connection[Any]]:
    """A client on one autocommit connection of its own (closed by the caller)."""
    from lonnymq import Client

    conn = psycopg.connect(dsn, autocommit=True)
    return Client(conn, schema=SCHEMA), conn


def _send_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c, conn = _client(dsn)
    msgs = [payload(i) for i in range(1000)]

    def work() -> int:
        n = 0
        while not ctx.expired():
            c.send(QUEUE, msgs[n % 1000])
            n += 1
        conn.close()
        return n

    return work


def _send_batch(size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c, conn = _client(dsn)
        msgs = [payload(i) for i in range(size)]

        def work() -> int:
            n = 0
            while not ctx.expired():
                c.send_batch(QUEUE, msgs)
                n += size
            conn.close()
            return n

        return work

    return factory


def _take_ack(size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    """take(n, ack=previous): the previous deliveries are acknowledged in the same round trip
    (and transaction) that leases the next ones."""

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c, conn = _client(dsn)

        def work() -> int:
            n = 0
            prev: list[Any] = []
            while not ctx.expired():
                got = c.take(QUEUE, size, ack=prev)
                if not got:
                    prev = []
                    break
                n += len(got)
                prev = got
            if prev:
                c.ack(prev)
            conn.close()
            return n

        return work

    return factory


def _take_then_ack(size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    """take(n), then ack(them): two round trips and two transactions per take."""

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c, conn = _client(dsn)

        def work() -> int:
            n = 0
            while not ctx.expired():
                got = c.take(QUEUE, size)
                if not got:
                    break
                c.ack(got)
                n += len(got)
            conn.close()
            return n

        return work

    return factory


def _take_tx(size: int) -> Callable[[str, Ctx], Callable[[], int]]:
    """take_tx(n) in autocommit: take-and-delete in one transaction (at-most-once, like a pop)."""

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c, conn = _client(dsn)

        def work() -> int:
            n = 0
            while not ctx.expired():
                got = c.take_tx(QUEUE, size)
                if not got:
                    break
                n += len(got)
            conn.close()
            return n

        return work

    return factory


def _pickup_notify(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[int, float]]]:
    from lonnymq import Client

    c = Client(dsn, schema=SCHEMA, pool_size=1).open()
    c.receive(QUEUE, 1, timeout=0)  # opens the LISTEN connection before the clock starts

    def work() -> list[tuple[int, float]]:
        seen: list[tuple[int, float]] = []
        while not ctx.expired():
            got = c.receive(QUEUE, 10, timeout=0.25)
            now = time.time()
            if got:
                seen.extend((m.id, now) for m in got)
                c.ack(got)
        c.close()
        return seen

    return work


def _pickup_poll(interval: float) -> Callable[[str, Ctx], Callable[[], list[tuple[int, float]]]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[int, float]]]:
        c, conn = _client(dsn)

        def work() -> list[tuple[int, float]]:
            seen: list[tuple[int, float]] = []
            while not ctx.expired():
                got = c.take(QUEUE, 10)
                now = time.time()
                if got:
                    seen.extend((m.id, now) for m in got)
                    c.ack(got)
                else:
                    time.sleep(interval)
            conn.close()
            return seen

        return work

    return factory


def _churn(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[float, int, float]]]:
    c, conn = _client(dsn)

    def work() -> list[tuple[float, int, float]]:
        calls = []
        prev: list[Any] = []
        while not ctx.stop.is_set():
            t = time.perf_counter()
            got = c.take(QUEUE, 100, ack=prev)
            calls.append((time.time(), len(got), time.perf_counter() - t))
            prev = got
            if not got:
                time.sleep(0.01)
        if prev:
            c.ack(prev)
        conn.close()
        return calls

    return work


def _flat_setup(dsn: str, future: int, leased: int) -> None:
    from lonnymq import Envelope

    c, conn = _client(dsn)
    try:
        # Leased: sent ready, then taken with a one-hour lease (never acked).
        for start in range(0, leased, 1000):
            c.send_batch(QUEUE, [payload(i) for i in range(start, min(leased, start + 1000))])
        left = leased
        while left > 0:
            got = c.take(QUEUE, min(left, 50_000), lease=3600)
            if not got:
                break
            left -= len(got)
        # Future-dated: due in a day.
        for start in range(0, future, 1000):
            c.send_batch(
                QUEUE, [Envelope(payload(i), delay=86400) for i in range(start, min(future, start + 1000))]
            )
    finally:
        conn.close()


def _flat_ready(dsn: str, n: int) -> None:
    c, conn = _client(dsn)
    try:
        for queue in (QUEUE, FLAT_EMPTY):
            c.send_batch(queue, [payload(i) for i in range(n)])
    finally:
        conn.close()


def _flat_probe(dsn: str, ctx: Ctx) -> Callable[[], dict[str, list[float]]]:
    c, conn = _client(dsn)
    n, chunk = ctx.extra["n"], ctx.extra["chunk"]

    def work() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"empty": [], "loaded": []}
        prev: dict[str, list[Any]] = {"empty": [], "loaded": []}
        for _ in range(0, n, chunk):
            for phase, queue in (("empty", FLAT_EMPTY), ("loaded", QUEUE)):
                for _ in range(chunk):
                    t = time.perf_counter()
                    got = c.take(queue, 1, ack=prev[phase])
                    out[phase].append(time.perf_counter() - t)
                    prev[phase] = got
        for got in prev.values():
            if got:
                c.ack(got)
        conn.close()
        return out

    return work


class LonnyMQ(System):
    name = "lonnymq"
    label = "LonnyMQ"
    tables = (f"{SCHEMA}.message", f"{SCHEMA}.archive")

    def install(self, dsn: str) -> dict[str, Any]:
        import lonnymq

        c, conn = _client(dsn)
        try:
            c.migrate()
            c.create_queue(QUEUE)
            c.create_queue(FLAT_EMPTY)
        finally:
            conn.close()
        return {"version": lonnymq.__version__}

    def clear(self, dsn: str) -> None:
        c, conn = _client(dsn)
        try:
            c.purge_queue(QUEUE)
            c.purge_queue(FLAT_EMPTY)
        finally:
            conn.close()

    def preload(self, dsn: str, n: int) -> None:
        c, conn = _client(dsn)
        try:
            for start in range(0, n, 1000):
                c.send_batch(QUEUE, [payload(i) for i in range(start, min(n, start + 1000))])
        finally:
            conn.close()

    def remaining(self, dsn: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.message").fetchone()
            return int(row[0]) if row else 0

    def sends(self) -> list[Variant]:
        return [
            Variant(self.name, "send()", "one", _send_one),
            Variant(self.name, "send_batch(1000)", "batch", _send_batch(1000)),
        ]

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "take(1, ack=prev)",
                "one",
                _take_ack(1),
                note="lease + ack, one round trip per message",
            ),
            Variant(
                self.name,
                "take(1) + ack()",
                "one",
                _take_then_ack(1),
                headline=False,
                note="lease + ack, two round trips per message",
            ),
            Variant(
                self.name,
                "take(100, ack=prev)",
                "batch",
                _take_ack(100),
                note="lease + ack, one round trip per 100",
            ),
            Variant(
                self.name,
                "take_tx(100)",
                "batch",
                _take_tx(100),
                headline=False,
                note="take-and-delete, at-most-once",
            ),
        ]

    def pops(self) -> list[Variant]:
        # take_tx on a plain queue without archiving is the lean pop: one DELETE ... RETURNING.
        return [Variant(self.name, "take_tx(1)", "one", _take_tx(1), note="take-and-delete, at-most-once")]

    def pickups(self) -> list[Variant]:
        return [
            Variant(self.name, "receive() (NOTIFY)", "notify", _pickup_notify),
            Variant(self.name, "take() polling 100 ms", "poll", _pickup_poll(0.1), headline=False),
        ]

    def producer(self, dsn: str) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
        c, conn = _client(dsn)
        return (lambda p: c.send(QUEUE, p).id), conn.close

    def batch_sender(self, dsn: str) -> tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]:
        c, conn = _client(dsn)
        return (lambda ps: c.send_batch(QUEUE, ps)), conn.close

    def flat(self) -> Flat:
        return Flat(_flat_setup, _flat_ready, _flat_probe, "take(1, ack=prev) round trip")

    def churn(self) -> Variant:
        return Variant(self.name, "take(100, ack=prev)", "batch", _churn)
