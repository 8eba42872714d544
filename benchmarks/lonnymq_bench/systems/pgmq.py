"""pgmq, SQL-only install: the ``pgmq.sql`` script shipped in the ``pgmq`` PyPI package (no
CREATE EXTENSION), driven through its SQL functions with psycopg.

The statements are the ones pgmq's own Python client sends (``pgmq/_sql.py``). For batch send
it is also run with binary parameters (``%b``), the driver-level choice LonnyMQ's client makes,
so pgmq is never measured below its best.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..harness import Ctx, payload
from .base import FLAT_EMPTY, Flat, System, Variant

QUEUE = "bench"
VT = 30
SEND = "SELECT * FROM pgmq.send(queue_name=>%s::text, msg=>%s::jsonb)"
SEND_BATCH = "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%s::jsonb[])"
SEND_BATCH_BIN = "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%b::jsonb[])"
READ = "SELECT msg_id, message FROM pgmq.read(queue_name=>%s::text, vt=>%s, qty=>%s)"
READ_POLL = (
    "SELECT msg_id, message FROM pgmq.read_with_poll(queue_name=>%s::text, vt=>%s,"
    " qty=>%s, max_poll_seconds=>%s, poll_interval_ms=>%s)"
)
DELETE_ONE = "SELECT pgmq.delete(queue_name=>%s::text, msg_id=>%s::bigint)"
DELETE_MANY = "SELECT * FROM pgmq.delete(queue_name=>%s::text, msg_ids=>%s::bigint[])"
POP = "SELECT msg_id, message FROM pgmq.pop(queue_name=>%s::text, qty=>%s)"


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _send_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = _connect(dsn)
    msgs = [payload(i) for i in range(1000)]

    def work() -> int:
        n = 0
        while not ctx.expired():
            c.execute(SEND, [QUEUE, Jsonb(msgs[n % 1000])]).fetchall()
            n += 1
        c.close()
        return n

    return work


def _send_batch(stmt: str) -> Callable[[str, Ctx], Callable[[], int]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = _connect(dsn)
        msgs = [payload(i) for i in range(1000)]

        def work() -> int:
            n = 0
            while not ctx.expired():
                c.execute(stmt, [QUEUE, [Jsonb(m) for m in msgs]]).fetchall()
                n += len(msgs)
            c.close()
            return n

        return work

    return factory


def _read_delete(qty: int) -> Callable[[str, Ctx], Callable[[], int]]:
    """read (sets a visibility timeout: pgmq's lease) then delete: at-least-once."""

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = _connect(dsn)

        def work() -> int:
            n = 0
            while not ctx.expired():
                rows = c.execute(READ, [QUEUE, VT, qty]).fetchall()
                if not rows:
                    break
                if qty == 1:
                    c.execute(DELETE_ONE, [QUEUE, rows[0][0]]).fetchall()
                else:
                    c.execute(DELETE_MANY, [QUEUE, [r[0] for r in rows]]).fetchall()
                n += len(rows)
            c.close()
            return n

        return work

    return factory


def _pop(qty: int) -> Callable[[str, Ctx], Callable[[], int]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = _connect(dsn)

        def work() -> int:
            n = 0
            while not ctx.expired():
                rows = c.execute(POP, [QUEUE, qty]).fetchall()
                if not rows:
                    break
                n += len(rows)
            c.close()
            return n

        return work

    return factory


def _pickup(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[int, float]]]:
    """pgmq's long poll with its default interval (100 ms)."""
    c = _connect(dsn)

    def work() -> list[tuple[int, float]]:
        seen: list[tuple[int, float]] = []
        while not ctx.expired():
            rows = c.execute(READ_POLL, [QUEUE, VT, 10, 1, 100]).fetchall()
            now = time.time()
            if rows:
                seen.extend((r[0], now) for r in rows)
                c.execute(DELETE_MANY, [QUEUE, [r[0] for r in rows]]).fetchall()
        c.close()
        return seen

    return work


def _churn(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[float, int, float]]]:
    c = _connect(dsn)

    def work() -> list[tuple[float, int, float]]:
        calls = []
        while not ctx.stop.is_set():
            t = time.perf_counter()
            rows = c.execute(READ, [QUEUE, VT, 100]).fetchall()
            if rows:
                c.execute(DELETE_MANY, [QUEUE, [r[0] for r in rows]]).fetchall()
            calls.append((time.time(), len(rows), time.perf_counter() - t))
            if not rows:
                time.sleep(0.01)
        c.close()
        return calls

    return work


def _flat_setup(dsn: str, future: int, leased: int) -> None:
    with _connect(dsn) as c:
        for start in range(0, leased, 1000):
            msgs = [Jsonb(payload(i)) for i in range(start, min(leased, start + 1000))]
            c.execute(SEND_BATCH_BIN, [QUEUE, msgs]).fetchall()
        left = leased
        while left > 0:  # read with a one-hour visibility timeout, never deleted
            got = len(c.execute(READ, [QUEUE, 3600, min(left, 50_000)]).fetchall())
            if not got:
                break
            left -= got
        for start in range(0, future, 1000):
            msgs = [Jsonb(payload(i)) for i in range(start, min(future, start + 1000))]
            c.execute(
                "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%b::jsonb[], delay=>%s::integer)",
                [QUEUE, msgs, 86400],
            ).fetchall()


def _flat_ready(dsn: str, n: int) -> None:
    with _connect(dsn) as c:
        for queue in (QUEUE, FLAT_EMPTY):
            c.execute(SEND_BATCH_BIN, [queue, [Jsonb(payload(i)) for i in range(n)]]).fetchall()


def _flat_probe(dsn: str, ctx: Ctx) -> Callable[[], dict[str, list[float]]]:
    c = _connect(dsn)
    n, chunk = ctx.extra["n"], ctx.extra["chunk"]

    def work() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"empty": [], "loaded": []}
        for _ in range(0, n, chunk):
            for phase, queue in (("empty", FLAT_EMPTY), ("loaded", QUEUE)):
                for _ in range(chunk):
                    t = time.perf_counter()
                    rows = c.execute(READ, [queue, VT, 1]).fetchall()
                    if rows:
                        c.execute(DELETE_ONE, [queue, rows[0][0]]).fetchall()
                    out[phase].append(time.perf_counter() - t)
        c.close()
        return out

    return work


class Pgmq(System):
    name = "pgmq"
    label = "pgmq"
    requires = ("pgmq",)
    tables = (f"pgmq.q_{QUEUE}", f"pgmq.a_{QUEUE}", f"pgmq.q_{FLAT_EMPTY}", f"pgmq.a_{FLAT_EMPTY}")

    def install(self, dsn: str) -> dict[str, Any]:
        from importlib.metadata import version

        from pgmq import get_embedded_sql_version, install_pgmq_from_sql

        with psycopg.connect(dsn) as c:  # the installer wants a non-autocommit connection
            install_pgmq_from_sql(conn=c)
        with _connect(dsn) as c:
            c.execute("SELECT pgmq.create(%s)", [QUEUE])
            c.execute("SELECT pgmq.create(%s)", [FLAT_EMPTY])
        return {"version": f"pgmq SQL {get_embedded_sql_version()} (Python package {version('pgmq')})"}

    def clear(self, dsn: str) -> None:
        with _connect(dsn) as c:
            c.execute(f"TRUNCATE pgmq.q_{QUEUE}, pgmq.a_{QUEUE}, pgmq.q_{FLAT_EMPTY}, pgmq.a_{FLAT_EMPTY}")

    def preload(self, dsn: str, n: int) -> None:
        with _connect(dsn) as c:
            for start in range(0, n, 1000):
                msgs = [Jsonb(payload(i)) for i in range(start, min(n, start + 1000))]
                c.execute(SEND_BATCH_BIN, [QUEUE, msgs]).fetchall()

    def remaining(self, dsn: str) -> int:
        with _connect(dsn) as c:
            row = c.execute(f"SELECT count(*) FROM pgmq.q_{QUEUE}").fetchone()
            return int(row[0]) if row else 0

    def sends(self) -> list[Variant]:
        return [
            Variant(self.name, "send()", "one", _send_one),
            Variant(
                self.name,
                "send_batch(1000)",
                "batch",
                _send_batch(SEND_BATCH),
                note="its client's statement: %s::jsonb[] (text)",
            ),
            Variant(
                self.name,
                "send_batch(1000) binary",
                "batch",
                _send_batch(SEND_BATCH_BIN),
                note="%b::jsonb[] (binary parameters)",
            ),
        ]

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "read(1) + delete(id)",
                "one",
                _read_delete(1),
                note="visibility timeout + delete, two round trips",
            ),
            *self.pops(),
            Variant(self.name, "read(100) + delete(ids)", "batch", _read_delete(100)),
            Variant(self.name, "pop(100)", "batch", _pop(100), headline=False, note="take-and-delete"),
        ]

    def pops(self) -> list[Variant]:
        return [Variant(self.name, "pop(1)", "one", _pop(1), headline=False, note="take-and-delete")]

    def pickups(self) -> list[Variant]:
        return [Variant(self.name, "read_with_poll() (100 ms)", "poll", _pickup)]

    def producer(self, dsn: str) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
        c = _connect(dsn)

        def send(p: dict[str, Any]) -> Any:
            row = c.execute(SEND, [QUEUE, Jsonb(p)]).fetchone()
            return row[0] if row else None

        return send, c.close

    def batch_sender(self, dsn: str) -> tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]:
        c = _connect(dsn)
        return (lambda ps: c.execute(SEND_BATCH_BIN, [QUEUE, [Jsonb(p) for p in ps]]).fetchall()), c.close

    def flat(self) -> Flat:
        return Flat(_flat_setup, _flat_ready, _flat_probe, "read(1) + delete(id)")

    def churn(self) -> Variant:
        return Variant(self.name, "read(100) + delete(ids)", "batch", _churn)
