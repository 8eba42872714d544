"""The PostgreSQL floors: the least a queue operation can cost in plain SQL on a bare table.

- take-and-delete: one statement that takes-and-deletes up to 100 rows (or one) of a bare
  table, FIFO, skipping locked rows. No function call, no lease, no bookkeeping: the physical
  reference that every queue's batched take is a fraction of.
- commit: one transaction that inserts an empty row into a table without columns or indexes and
  commits (``synchronous_commit`` as the server has it): the least durable work a
  one-message-per-transaction send cannot go below (one heap insert, one flushed commit).
"""

from __future__ import annotations

from collections.abc import Callable

from ..harness import Ctx
from .base import Variant
from .seed import DDL as SEED_DDL
from .seed import Seed, _connect, churn_statement, drain_statement

FLOOR = (
    "DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id LIMIT {n}"
    " FOR UPDATE SKIP LOCKED) RETURNING id, payload"
)
COMMIT = "INSERT INTO commit_floor DEFAULT VALUES"


def _commit(dsn: str, ctx: Ctx) -> Callable[[], int]:
    c = _connect(dsn)

    def work() -> int:
        n = 0
        while not ctx.expired():
            c.execute(COMMIT)
            n += 1
        c.close()
        return n

    return work


class Floor(Seed):
    name = "floor"
    label = "PostgreSQL floor"
    tables: tuple[str, ...] = ("public.q", "public.commit_floor")
    ddl = SEED_DDL + "CREATE TABLE commit_floor ();\n"

    version = "DELETE ... LIMIT n SKIP LOCKED RETURNING; INSERT into a bare table per commit"

    def sends(self) -> list[Variant]:
        return []  # the seed's INSERTs are the bare-table reference for sends

    def commits(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "commit floor",
                "one",
                _commit,
                note="INSERT INTO commit_floor DEFAULT VALUES: no columns, no index",
            )
        ]

    def drains(self) -> list[Variant]:
        return [
            *self.pops(),
            Variant(
                self.name,
                "DELETE ... LIMIT 100",
                "batch",
                drain_statement(FLOOR.format(n=100)),
                note="one statement, 100 rows",
            ),
        ]

    def pops(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "DELETE ... LIMIT 1",
                "one",
                drain_statement(FLOOR.format(n=1)),
                headline=False,
                note="one statement, one row",
            )
        ]

    def pickups(self) -> list[Variant]:
        return []

    def churn(self) -> Variant:
        return Variant(self.name, "DELETE ... LIMIT 100", "batch", churn_statement(FLOOR.format(n=100)))
