"""The send floor: the least a send with LonnyMQ's guarantees must write, in plain SQL. What
``send()`` of one message writes, on LonnyMQ's own tables (installed by its migrations): the
message row (its heap tuple, primary key and dequeue index entries) and the queue's one counter
row (``queue_stat``: total_sent and the dashboard's minute), one statement, one round trip, one
commit. No function call, no queue lookup by name, no hold on the generation, no wake-up check,
no argument checks: everything ``send()`` does besides writing is what it costs above this
floor (issue 12: "where a target is physically out of reach, prove it with a floor")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from ..harness import Ctx, payload
from .base import System, Variant
from .lonnymq import QUEUE, SCHEMA, LonnyMQ

#: The floor's statement: {s} the schema, {q} the queue's id, {gen} the generation (the one
#: current at install: any one will do for the floor), {ct} / {p} the content type and body
#: Client.send() stores (as literals, or as placeholders for a driver's parameters).
#: benchmarks/server_instructions.py counts the same text.
TEMPLATE = """
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
     ins AS (
       INSERT INTO {s}.message (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority,
                                     content_type, payload)
       SELECT {q}, nextval('{s}.message_id_seq'), {gen}, now.ms, now.ms, now.ms, 0, {ct}, {p}
         FROM now
       RETURNING id, enqueued_at),
     st AS (INSERT INTO {s}.queue_stat (queue_id, minute, sent) SELECT {q}, ins.enqueued_at / 60000, 1 FROM ins)
SELECT id FROM ins
"""

SEND = TEMPLATE.format(s=SCHEMA, q="%(q)s", gen="%(gen)s", ct="%(ct)s", p="%(p)b")


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def _where(c: psycopg.Connection[Any]) -> dict[str, Any]:
    row = c.execute(
        f"SELECT q.id, s.last_value FROM {SCHEMA}.queue q, {SCHEMA}.message_gen_seq s WHERE q.name = %s",
        (QUEUE,),
    ).fetchone()
    assert row is not None
    return {"q": row[0], "gen": row[1]}


class SendFloor(System):
    """Installed, emptied and counted as LonnyMQ is (its migrations, its queue); only sends."""

    name = "sendfloor"
    label = "send floor"
    tables = (f"{SCHEMA}.message", f"{SCHEMA}.queue_stat")

    def install(self, dsn: str) -> dict[str, Any]:
        LonnyMQ().install(dsn)
        return {"version": "INSERT message + queue_stat row, one plain statement on LonnyMQ's tables"}

    def clear(self, dsn: str) -> None:
        LonnyMQ().clear(dsn)

    def remaining(self, dsn: str) -> int:
        return LonnyMQ().remaining(dsn)

    def commits(self) -> list[Variant]:
        # A commit-style reference (only the producers benchmark runs it), not a send: the
        # suite's send workloads leave it out.
        return [
            Variant(
                self.name,
                "INSERT message + queue_stat",
                "one",
                _send_one,
                note="the rows send() writes, one plain statement on LonnyMQ's tables",
            )
        ]


def send_loop(
    c: psycopg.Connection[Any], ctx: Ctx, send: Callable[[bytes, str | None], object]
) -> Callable[[], int]:
    """A floor's producer (the send floor's, the API send floor's): ``send(body, content_type)``
    one message a call until the phase ends, then ``c`` closed. Each call serialises its payload,
    as every producer here does (LonnyMQ's send(), the seed's and pgmq's Jsonb): until 2026-11-27
    the floors sent bodies encoded once up front, sparing themselves the serialisation every
    other system pays (docs/benchmarks.md, runs 17-22)."""
    from lonnymq.client.ops import encode_payload

    msgs = [payload(i) for i in range(1000)]

    def work() -> int:
        n = 0
        while not ctx.expired():
            send(*encode_payload(msgs[n % 1000]))
            n += 1
        c.close()
        return n

    return work


def _send_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = _connect(dsn)
    args = _where(c)
    return send_loop(c, ctx, lambda body, ctype: c.execute(SEND, {**args, "ct": ctype, "p": body}).fetchone())
