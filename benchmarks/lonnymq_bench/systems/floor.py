"""The PostgreSQL floor: one plain statement that takes-and-deletes up to 100 rows of a bare
table, FIFO, skipping locked rows. No function call, no lease, no bookkeeping: the physical
reference that every queue's batched take is a fraction of."""

from __future__ import annotations

from .base import Variant
from .seed import Seed, churn_statement, drain_statement

FLOOR = (
    "DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id LIMIT {n}"
    " FOR UPDATE SKIP LOCKED) RETURNING id, payload"
)


class Floor(Seed):
    name = "floor"
    label = "PostgreSQL floor"

    version = "DELETE ... LIMIT n SKIP LOCKED RETURNING"

    def sends(self) -> list[Variant]:
        return []  # the seed's INSERTs are the bare-table reference for sends

    def drains(self) -> list[Variant]:
        return [
            Variant(
                self.name,
                "DELETE ... LIMIT 1",
                "one",
                drain_statement(FLOOR.format(n=1)),
                headline=False,
                note="one statement, one row",
            ),
            Variant(
                self.name,
                "DELETE ... LIMIT 100",
                "batch",
                drain_statement(FLOOR.format(n=100)),
                note="one statement, 100 rows",
            ),
        ]

    def pickups(self) -> list[Variant]:
        return []

    def churn(self) -> Variant:
        return Variant(self.name, "DELETE ... LIMIT 100", "batch", churn_statement(FLOOR.format(n=100)))
