"""The seed design's bare SKIP LOCKED queue: one table and a minimal ``message_dequeue()`` that
takes-and-deletes one message. No leases, no retries, no scheduling: the cheapest thing that
can be called a queue, and the reference for LonnyMQ's one-at-a-time lease+ack."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..harness import Ctx, payload
from .base import System, Variant

DDL = """
CREATE TABLE q (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
CREATE FUNCTION message_dequeue() RETURNS SETOF q LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    DELETE FROM q
     WHERE id = (SELECT id FROM q ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
    RETURNING *;
END $$;
"""

INSERT_ONE = "INSERT INTO q (payload) VALUES (%s) RETURNING id"
# Binary parameters, as LonnyMQ's client uses them.
INSERT_BATCH = "INSERT INTO q (payload) SELECT unnest(%b::jsonb[])"
DEQUEUE = "SELECT id, payload FROM message_dequeue()"


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _send_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = _connect(dsn)
    msgs = [payload(i) for i in range(1000)]

    def work() -> int:
        n = 0
        while not ctx.expired():
            c.execute(INSERT_ONE, [Jsonb(msgs[n % 1000])]).fetchone()
            n += 1
        c.close()
        return n

    return work


def _send_batch(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = _connect(dsn)
    msgs = [payload(i) for i in range(1000)]

    def work() -> int:
        n = 0
        while not ctx.expired():
            c.execute(INSERT_BATCH, [[Jsonb(m) for m in msgs]])
            n += len(msgs)
        c.close()
        return n

    return work


def drain_statement(stmt: str) -> Callable[[str, Ctx], Callable[[], int]]:
    """A worker that runs ``stmt`` (which takes-and-deletes rows) until it returns none."""

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = _connect(dsn)

        def work() -> int:
            n = 0
            while not ctx.expired():
                rows = c.execute(stmt).fetchall()
                if not rows:
                    break
                n += len(rows)
            c.close()
            return n

        return work

    return factory


def _pickup_poll(interval: float) -> Callable[[str, Ctx], Callable[[], list[tuple[int, float]]]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[int, float]]]:
        c = _connect(dsn)

        def work() -> list[tuple[int, float]]:
            seen = []
            while not ctx.expired():
                row = c.execute(DEQUEUE).fetchone()
                if row is None:
                    time.sleep(interval)
                    continue
                seen.append((row[0], time.time()))
            c.close()
            return seen

        return work

    return factory


def churn_statement(stmt: str) -> Callable[[str, Ctx], Callable[[], list[tuple[float, int, float]]]]:
    def factory(dsn: str, ctx: Ctx) -> Callable[[], list[tuple[float, int, float]]]:
        c = _connect(dsn)

        def work() -> list[tuple[float, int, float]]:
            calls = []
            while not ctx.stop.is_set():
                t = time.perf_counter()
                n = len(c.execute(stmt).fetchall())
                calls.append((time.time(), n, time.perf_counter() - t))
                if not n:
                    time.sleep(0.01)
            c.close()
            return calls

        return work

    return factory


class BareTable(System):
    """A system that is one table of (id, payload, ...) in public, made by ``ddl``."""

    table = "q"
    ddl = DDL
    version = ""

    def install(self, dsn: str) -> dict[str, Any]:
        with _connect(dsn) as c:
            c.execute(self.ddl)
        return {"version": self.version}

    def clear(self, dsn: str) -> None:
        """Empty every table the system lists (``tables``: ``schema.name``), else ``table``."""
        names = [sql.Identifier(*t.split(".")) for t in self.tables] or [sql.Identifier(self.table)]
        with _connect(dsn) as c:
            c.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(names)))

    def preload(self, dsn: str, n: int) -> None:
        insert = sql.SQL("INSERT INTO {} (payload) SELECT unnest(%b::jsonb[])").format(
            sql.Identifier(self.table)
        )
        with _connect(dsn) as c:
            for start in range(0, n, 1000):
                c.execute(insert, [[Jsonb(payload(i)) for i in range(start, min(n, start + 1000))]])

    def remaining(self, dsn: str) -> int:
        with _connect(dsn) as c:
            row = c.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.table))).fetchone()
            return int(row[0]) if row else 0


class Seed(BareTable):
    name = "seed"
    label = "bare SKIP LOCKED (seed)"
    tables: tuple[str, ...] = ("public.q",)
    version = "seed design"

    def sends(self) -> list[Variant]:
        return [
            Variant(self.name, "INSERT", "one", _send_one),
            Variant(self.name, "INSERT ... unnest(1000)", "batch", _send_batch),
        ]

    def drains(self) -> list[Variant]:
        return self.pops()

    def pops(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "message_dequeue()",
                "one",
                drain_statement(DEQUEUE),
                note="take-and-delete one, no lease",
            )
        ]

    def pickups(self) -> list[Variant]:
        return [Variant(self.name, "message_dequeue() polling 100 ms", "poll", _pickup_poll(0.1))]

    def producer(self, dsn: str) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
        c = _connect(dsn)

        def send(p: dict[str, Any]) -> Any:
            row = c.execute(INSERT_ONE, [Jsonb(p)]).fetchone()
            return row[0] if row else None

        return send, c.close

    def batch_sender(self, dsn: str) -> tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]:
        c = _connect(dsn)
        return (lambda ps: c.execute(INSERT_BATCH, [[Jsonb(p) for p in ps]])), c.close
