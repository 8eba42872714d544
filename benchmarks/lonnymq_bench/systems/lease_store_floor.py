"""The lease floor on LonnyMQ's tables: the least a drain with LonnyMQ's guarantees must do, in
plain SQL, measured the way the lease floor is (issue 12: "where a target is physically out of
reach, prove it with a floor measured the same way").

What ``take(q, n, ack=previous)`` of an ordinary queue does, as one plain statement on LonnyMQ's
own tables (installed by its migrations), with nothing else:

* the acknowledgement of the previous deliveries as LonnyMQ must make it: each row found by its
  key (``queue_id, id``: the primary key) with its token checked (``deliveries = token AND
  leased``: a stale consumer's ack deletes nothing), deleted; ack's memory of each (a row in
  ``settled``: what answers a repeated or stale ack once the row is gone, sql/settle.sql); the
  queue's acked count (one ``queue_stat`` row: the dashboard's minute and the totals);
* the lease of the next ``n``: the window's two generations of the queue's dequeue index
  (``message_dequeue_idx``: generation, queue, dequeue_at, id) read in (dequeue_at, id) order up
  to the clock, ``FOR UPDATE SKIP LOCKED``, the first ``n`` leased by ctid if they may be
  delivered (``attempts < max_attempts``, not superseded), in the lease's UPDATE (dequeue_at to
  the lease's expiry, attempts and deliveries, the token, counted, ``leased``);
* RETURNING the delivery's columns, as take returns them.

The queue's id, generation (the window is it and the one before), max_attempts and lease are
parameters; the clock is read once. Left out, and so what ``take()`` costs above this floor: the
function call (its SECURITY DEFINER frame and SET clauses), the lookup of the queue by name, the
generation handling (rotation, frozen generations), the argument checks, the lock of each
acknowledged row in id order before its delete (sql/settle.sql's ``_ack``), the paused, channel
and archive branches and the general path's fall-backs. ``api_floor.py``'s ``take`` is this
statement through a secure function (``apileasefloor``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ..harness import Ctx
from .base import Variant
from .lonnymq import QUEUE, SCHEMA
from .pop_floor import CLOCK, PopFloor

#: The delivery's columns, as take() returns them (its row type ``delivery``: id, attempt,
#: token, lease_until, ...).
RETURNING = (
    " RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at, m.priority,"
    " m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload"
)

#: The statement's CTEs: {s} the schema, {q} the queue's id, {gen} its generation, {max} its
#: max_attempts, {lease} its lease (ms), {now} the clock (epoch ms, a literal or read once),
#: {n} the batch, {ids} / {toks} the previous deliveries' ids and tokens (bigint[] / int[]).
#: The ack ``a`` finds each row by its key (a LATERAL probe of the primary key per (id, token),
#: where a join of the arrays with the table could be planned as a read of the partial index of
#: leases, dead entries included) and deletes it by ctid (a row changed since the probe's
#: snapshot is in a new version, not deleted: a stale token); ack's memory ``k`` and the count
#: ``st`` read its rows. ``leased IS TRUE``, not ``leased`` (the same rows), as settle.sql says
#: it: the probe could otherwise read the partial index of leases, whose statistics, taken
#: before the drain, say it is empty, and walk its dead entries on every call.
CTES = (
    "a AS (DELETE FROM {s}.message_logged m WHERE m.ctid = ANY (ARRAY("
    "SELECT k.tid FROM unnest({ids}, {toks}) AS t(id, token) CROSS JOIN LATERAL ("
    "SELECT x.ctid AS tid FROM {s}.message_logged x"
    " WHERE x.queue_id = {q} AND x.id = t.id AND x.deliveries = t.token"
    " AND x.leased IS TRUE LIMIT 1) k))"
    " RETURNING m.id, m.deliveries),"
    " k AS (INSERT INTO {s}.settled (queue_id, id, token, outcome, settled_at)"
    " SELECT {q}, a.id, a.deliveries, 'acked', {now} FROM a),"
    " st AS (INSERT INTO {s}.queue_stat (queue_id, minute, acked)"
    " SELECT {q}, {now} / 60000, count(*) FROM a HAVING count(*) > 0),"
    " p AS (SELECT w.tid FROM (VALUES ({gen} - 1), ({gen})) AS g(gen) CROSS JOIN LATERAL ("
    " SELECT x.ctid AS tid, x.dequeue_at, x.id FROM {s}.message_logged x"
    " WHERE x.gen = g.gen AND x.queue_id = {q} AND x.channel IS NULL AND x.dequeue_at <= {now}"
    " ORDER BY x.dequeue_at, x.id LIMIT {n} FOR UPDATE SKIP LOCKED) w"
    " ORDER BY w.dequeue_at, w.id LIMIT {n})"
)
#: The lease of the rows ``p`` locked, returning the deliveries.
LEASE = (
    "UPDATE {s}.message_logged m SET dequeue_at = {now} + {lease}, attempts = m.attempts + 1,"
    " deliveries = m.deliveries + 1, leased = true"
    " FROM p WHERE m.ctid = p.tid AND m.attempts < {max} AND m.superseded_by IS NULL" + RETURNING
)
#: The floor's statement. benchmarks/server_instructions.py counts the same CTEs and lease.
TEMPLATE = "WITH " + CTES + " " + LEASE

#: The clock read once (an InitPlan: a bound of the index scan, as take's v_now).
CLOCK_ONCE = "(SELECT " + CLOCK + ")"


def drain_statement(n: int, schema: str = SCHEMA) -> sql.Composed:
    """The floor's statement for batch ``n`` on ``schema``'s tables, with a driver's parameters
    %(q)s, %(gen)s, %(max)s, %(lease)s (where()) and %(ids)b, %(toks)b (the previous
    deliveries), the clock read once."""
    return sql.SQL(TEMPLATE).format(
        s=sql.Identifier(schema),
        q=sql.Placeholder("q"),
        gen=sql.Placeholder("gen"),
        max=sql.Placeholder("max"),
        lease=sql.Placeholder("lease"),
        now=sql.SQL(CLOCK_ONCE),
        n=sql.Literal(n),
        ids=sql.SQL("{}::bigint[]").format(sql.Placeholder("ids", "b")),
        toks=sql.SQL("{}::int[]").format(sql.Placeholder("toks", "b")),
    )


def where(c: psycopg.Connection[Any], schema: str = SCHEMA, queue: str = QUEUE) -> dict[str, Any]:
    """The floor's constants of ``queue``: its id, the current generation, max_attempts, lease."""
    stmt = sql.SQL(
        "SELECT q.id, s.last_value, q.max_attempts, q.lease_ms FROM {}.queue q, {}.message_gen_seq s"
        " WHERE q.name = %s"
    ).format(sql.Identifier(schema), sql.Identifier(schema))
    row = c.execute(stmt, (queue,)).fetchone()
    assert row is not None
    return {"q": row[0], "gen": row[1], "max": row[2], "lease": row[3]}


def drain_loop(
    c: psycopg.Connection[Any], ctx: Ctx, call: Callable[[list[int], list[int]], list[Any]]
) -> int:
    """take(n, ack=previous) through ``call(ids, tokens)`` until the deadline or an empty take;
    the last deliveries acknowledged by a call that leases nothing (limit 0). Rows are
    take()'s: id first, the token third."""
    done = 0
    ids: list[int] = []
    toks: list[int] = []
    while not ctx.expired():
        rows = call(ids, toks)
        if not rows:
            ids, toks = [], []
            break
        done += len(rows)
        ids, toks = [r[0] for r in rows], [r[2] for r in rows]
    if ids:
        call(ids, toks)  # (the ack of the last batch, and one more lease: the remaining count
        # is what was left; the harness checks counted + left = backlog)
    c.close()
    return done


class LeaseStoreFloor(PopFloor):
    """Installed, emptied, preloaded and counted as LonnyMQ is (its migrations, its queue, its
    send_batch); only drains."""

    name = "leasestorefloor"
    label = "lease floor on LonnyMQ's tables"
    tables = (f"{SCHEMA}.message", f"{SCHEMA}.queue_stat", f"{SCHEMA}.settled")
    version = (
        "the previous deliveries deleted by key with their token checked (settled + queue_stat rows),"
        " the next n leased by ctid from the window's two generations, one plain statement on"
        " LonnyMQ's tables"
    )

    def install(self, dsn: str) -> dict[str, Any]:
        super().install(dsn)
        return {"version": self.version}

    def pops(self) -> list[Variant]:
        return []

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                f"ack+lease {n}, one statement on LonnyMQ's tables",
                kind,
                _drain(n),
                note=f"what take({n}, ack=previous) writes, one plain statement",
            )
            for kind, n in (("one", 1), ("batch", 100))
        ]


def _drain(n: int) -> Callable[[str, Ctx], Callable[[], int]]:
    stmt = drain_statement(n)

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = psycopg.connect(dsn, autocommit=True)
        args = where(c)

        def work() -> int:
            return drain_loop(
                c, ctx, lambda ids, toks: c.execute(stmt, {**args, "ids": ids, "toks": toks}).fetchall()
            )

        return work

    return factory
