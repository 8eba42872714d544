"""The pop floor: the least a pop with LonnyMQ's guarantees must do, in plain SQL, measured the
way the seed's delete-on-dequeue is (issue 12: "where a target is physically out of reach, prove
it with a floor measured the same way").

What ``take_tx(q, 1)`` (and ``pop()``) of an ordinary queue writes is the message row's delete
and nothing else: no ``queue_stat`` counter (``stats.sql`` counts sends, acks, nacks, dead
letters and cancels; a pop is none of them, and ``queue_metrics``' depth counts the message
table), no ``settled`` row (that is ack's memory of a delivery token, for answering a repeated
ack; a pop hands out no token to settle), no ``archive`` row (pop never archives). So the floor
is one statement on LonnyMQ's own tables (installed by its migrations): the DELETE of the first
ready message of the queue, found in the order and with the reads its guarantees need:

* the queue's dequeue index (``message_dequeue_idx``: generation, queue, dequeue_at, id, plain
  messages only) walked in (dequeue_at, id) order up to the clock: FIFO, scheduled delivery;
* ``FOR UPDATE SKIP LOCKED``: exactly-once among concurrent consumers, none waiting;
* the row deleted by its ``ctid`` in ``message_logged`` (the partition of every ordinary queue),
  as the lean pop deletes it, only if it may be delivered (``attempts < max_attempts`` and not
  superseded: a lease that expired on its last attempt goes to the dead letters instead);
* RETURNING the columns a delivery carries.

Left out, and so what ``take_tx`` costs above this floor: the function call (its SECURITY DEFINER
frame and SET clauses), the lookup of the queue by name (its id, its partition, max_attempts,
pause and archive flags, and channels are constants here), the generation handling (one
generation, the current one at install, instead of the window's two and the queue's frozen
ones), the argument checks and the general path's fall-backs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ..harness import Ctx
from .base import System, Variant
from .lonnymq import QUEUE, SCHEMA, LonnyMQ

#: The server's clock in epoch milliseconds, as take_tx reads it (now_ms()).
CLOCK = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

#: The columns of a delivery, as take_tx returns them; {lease} is its lease_until (a pop's is
#: NULL: ``NULL::bigint, `` where the row is take_tx's type, empty in the plain statements).
COLUMNS = (
    "m.id, m.attempts + 1, m.deliveries + 1, {lease}m.scheduled_at, m.enqueued_at, m.priority,"
    " m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload"
)

#: The floor's statement: {s} the schema, {q} the queue's id, {gen} its generation, {max} its
#: max_attempts, {now} the clock (as literals, or as placeholders for a driver's parameters).
#: benchmarks/server_instructions.py counts the same text.
TEMPLATE = (
    "DELETE FROM {s}.message_logged m"
    " WHERE m.ctid = (SELECT x.ctid FROM {s}.message_logged x"
    " WHERE x.gen = {gen} AND x.queue_id = {q} AND x.channel IS NULL AND x.dequeue_at <= {now}"
    " ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " AND m.attempts < {max} AND m.superseded_by IS NULL"
    " RETURNING " + COLUMNS.format(lease="")
)

#: The same with LonnyMQ's generations (sql/generations.sql): the first ready message of each of
#: the window's two generations (gen - 1 and gen) locked, the earlier deleted, as take_tx's lean
#: pop reads them. What the dequeue index's leading generation costs a pop, beside the floor
#: above (benchmarks/server_instructions.py counts it as ``popfloor2``).
WINDOW_TEMPLATE = (
    "DELETE FROM {s}.message_logged m"
    " WHERE m.ctid = (SELECT CASE WHEN w.ok THEN w.tid END"
    " FROM (VALUES ({gen} - 1), ({gen})) AS g(gen) CROSS JOIN LATERAL ("
    " SELECT x.ctid AS tid, x.id, x.dequeue_at, x.attempts < {max} AND x.superseded_by IS NULL AS ok"
    " FROM {s}.message_logged x"
    " WHERE x.gen = g.gen AND x.queue_id = {q} AND x.channel IS NULL AND x.dequeue_at <= {now}"
    " ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE SKIP LOCKED) w ORDER BY w.dequeue_at, w.id LIMIT 1)"
    " RETURNING " + COLUMNS.format(lease="")
)

POP = TEMPLATE.format(s=SCHEMA, q="%(q)s", gen="%(gen)s", max="%(max)s", now=CLOCK)


def where(c: psycopg.Connection[Any], schema: str = SCHEMA, queue: str = QUEUE) -> dict[str, Any]:
    """The floor's constants of ``queue``: its id, the current generation and its max_attempts."""
    stmt = sql.SQL(
        "SELECT q.id, s.last_value, q.max_attempts FROM {}.queue q, {}.message_gen_seq s WHERE q.name = %s"
    ).format(sql.Identifier(schema), sql.Identifier(schema))
    row = c.execute(stmt, (queue,)).fetchone()
    assert row is not None
    return {"q": row[0], "gen": row[1], "max": row[2]}


class PopFloor(System):
    """Installed, emptied, preloaded and counted as LonnyMQ is (its migrations, its queue, its
    send_batch); only pops."""

    name = "popfloor"
    label = "pop floor"
    tables = (f"{SCHEMA}.message",)

    def install(self, dsn: str) -> dict[str, Any]:
        LonnyMQ().install(dsn)
        return {
            "version": "DELETE of the first ready message by ctid, one plain statement on LonnyMQ's tables"
        }

    def clear(self, dsn: str) -> None:
        LonnyMQ().clear(dsn)

    def preload(self, dsn: str, n: int) -> None:
        LonnyMQ().preload(dsn, n)

    def remaining(self, dsn: str) -> int:
        return LonnyMQ().remaining(dsn)

    def pops(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "DELETE message_logged ... SKIP LOCKED",
                "one",
                _pop_one,
                note="what take_tx(1) writes, one plain statement on LonnyMQ's tables",
            )
        ]


def _pop_one(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = psycopg.connect(dsn, autocommit=True)
    args = where(c)

    def work() -> int:
        n = 0
        while not ctx.expired():
            if c.execute(POP, args).fetchone() is None:
                break
            n += 1
        c.close()
        return n

    return work
