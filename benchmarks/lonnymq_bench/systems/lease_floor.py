"""The lease floor: the least a queue with leases (visibility timeouts) can do per message in
PostgreSQL. A bare table with a visibility column; one plain statement acknowledges the
previous message(s) (DELETE) and leases the next (UPDATE of the visibility time, which moves
the row in its index), in one round trip and one transaction. No function call, no attempts,
no fencing token, no dead-lettering: the physical reference for LonnyMQ's ``take(n, ack=prev)``,
as the floor is for take-and-delete."""

from __future__ import annotations

from collections.abc import Callable

from ..harness import Ctx
from .base import Variant
from .seed import BareTable, _connect

DDL = """
CREATE TABLE lq (id bigserial PRIMARY KEY, vt bigint NOT NULL DEFAULT 0, payload jsonb NOT NULL);
CREATE INDEX lq_vt ON lq (vt, id);
"""

# %(prev)b: the ids leased by the previous call, acknowledged here.
LEASE = """
WITH ack AS (DELETE FROM lq WHERE id = ANY (%(prev)b)),
     now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
     pick AS (SELECT lq.id FROM lq, now WHERE lq.vt <= now.ms ORDER BY lq.vt, lq.id
              LIMIT {n} FOR UPDATE OF lq SKIP LOCKED)
UPDATE lq SET vt = (SELECT ms FROM now) + 30000 FROM pick WHERE lq.id = pick.id
RETURNING lq.id, lq.payload
"""


# The lease floor with ack's memory: each acknowledged id also leaves a row (queue, id, token,
# outcome, time) in an UNLOGGED table with a hash index on the id, as LonnyMQ's ``settled`` does
# since migration 0021 (sql/settle.sql: what answers a repeated or stale ack of a message already
# settled, so a retried ack is idempotent and a stale consumer is told the message is no longer
# its own; before it, a primary key on (queue, id) and a BRIN index on the time). The same as
# benchmarks/server_instructions.py's ``drain*_floor_settled``.
SETTLED_DDL = """
CREATE UNLOGGED TABLE lq_settled (queue_id integer NOT NULL, id bigint NOT NULL, token integer NOT NULL,
                                  outcome text NOT NULL, settled_at bigint NOT NULL);
CREATE INDEX lq_settled_id ON lq_settled USING hash (id);
"""
LEASE_SETTLED = LEASE.replace(
    "WITH ack AS (DELETE FROM lq WHERE id = ANY (%(prev)b)),\n     now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),\n",
    "WITH ack AS (DELETE FROM lq WHERE id = ANY (%(prev)b) RETURNING lq.id),\n"
    "     now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),\n"
    "     mem AS (INSERT INTO lq_settled SELECT 1, ack.id, 1, 'acked', now.ms FROM ack, now),\n",
)
assert LEASE_SETTLED != LEASE


def _lease_ack(n: int, template: str = LEASE) -> Callable[[str, Ctx], Callable[[], int]]:
    stmt = template.format(n=n)

    def factory(dsn: str, ctx: Ctx) -> Callable[[], int]:
        c = _connect(dsn)

        def work() -> int:
            done = 0
            prev: list[int] = []
            while not ctx.expired():
                rows = c.execute(stmt, {"prev": prev}).fetchall()
                if not rows:
                    break
                done += len(rows)
                prev = [r[0] for r in rows]
            if prev:
                c.execute("DELETE FROM lq WHERE id = ANY (%b)", [prev])
            c.close()
            return done

        return work

    return factory


class LeaseFloor(BareTable):
    name = "leasefloor"
    label = "lease floor"
    table = "lq"
    tables = ("public.lq",)
    ddl = DDL
    version = "DELETE previous + UPDATE vt ... LIMIT n SKIP LOCKED, one statement"

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "ack+lease 1, one statement",
                "one",
                _lease_ack(1),
                note="DELETE previous + UPDATE vt of the next, one row",
            ),
            Variant(
                self.name,
                "ack+lease 100, one statement",
                "batch",
                _lease_ack(100),
                note="DELETE previous + UPDATE vt of the next, 100 rows",
            ),
        ]


class LeaseFloorSettled(LeaseFloor):
    """The lease floor and ack's memory: the least a drain with LonnyMQ's settle guarantees
    (an idempotent, fenced ack that remembers what it settled) writes, in one plain statement."""

    name = "leasememfloor"
    label = "lease floor + ack's memory"
    tables = ("public.lq", "public.lq_settled")
    ddl = DDL + SETTLED_DDL
    version = "DELETE previous (+ a settled row each) + UPDATE vt ... LIMIT n SKIP LOCKED, one statement"

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                f"ack+lease {n} + ack's memory, one statement",
                kind,
                _lease_ack(n, LEASE_SETTLED),
                note=f"DELETE previous, a settled row each, UPDATE vt of the next, {n} row(s)",
            )
            for kind, n in (("one", 1), ("batch", 100))
        ]
