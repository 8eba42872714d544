"""A consumer process for the fault tests (tests/faults/test_fault_*.py), run as a subprocess.

It writes down what it did in tables of the schema under test (tests/fault_helpers.py makes
them) so the test can check the queue's guarantees afterwards from the database alone:

* ``lease`` mode (at-least-once): take a batch with a lease; record each delivery in
  fault_result (committed: "processed"); then, in one transaction, ack the batch and record the
  acks that took effect in fault_ack and the stale ones in fault_lost. A fault_ack row therefore
  exists exactly when the ack committed.
* ``drain`` mode (at-least-once, a drain's loop): ``take(n, ack=previous)``, n 1 or --batch at
  random (so take's one-delivery statement, its batch ack and its general path all run), in a
  transaction of the consumer's with its bookkeeping: the acks of the previous deliveries that
  took effect (their ``acked`` rows in ack's memory, ``settled``) in fault_ack, the others in
  fault_lost, the new deliveries in fault_result. All of it commits with the take or none does.
* ``tx`` mode (exactly-once): take_tx a batch and record it in fault_result in the same
  transaction; a fraction of the transactions roll back on purpose (--rollback).

With --retry, connection errors (a PostgreSQL crash) are survived: the deliveries of the batch
in hand are recorded in fault_abandoned once the database is back, and the loop goes on (in
drain mode, a failure during a take's transaction abandons the previous deliveries and the new
ones: whether its commit was applied is unknown).
SIGTERM stops it after the current batch; the test SIGKILLs it at random points.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from lonnymq import Client, Message

_stop = False


def _on_term(signum: int, frame: Any) -> None:
    global _stop
    _stop = True


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pid = os.getpid()
        self.s = sql.Identifier(args.schema)
        self.conn: psycopg.Connection[Any] | None = None
        self.mq: Client | None = None
        self.abandoned: list[tuple[int, int]] = []
        self.stats = {"pid": self.pid, "batches": 0, "messages": 0, "rolled_back": 0, "db_errors": 0}

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self.s)  # type: ignore[arg-type]

    def connect(self) -> None:
        deadline = time.monotonic() + self.args.reconnect_for
        while True:
            try:
                self.conn = psycopg.connect(self.args.dsn, autocommit=True, connect_timeout=5)
                self.mq = Client(self.conn, schema=self.args.schema)
                return
            except psycopg.OperationalError:
                if not self.args.retry or time.monotonic() > deadline:
                    raise
                time.sleep(0.1 + random.random() * 0.2)

    def jitter(self) -> None:
        if self.args.jitter:
            time.sleep(random.random() * self.args.jitter)

    def record(self, table: str, messages: list[Message] | list[tuple[int, int]]) -> None:
        assert self.conn is not None
        pairs = [(m.id, m.token) if isinstance(m, Message) else m for m in messages]
        if pairs:
            self.conn.execute(
                self.q(
                    "INSERT INTO {s}."
                    + table
                    + " (id, token, pid) SELECT i, t, %s FROM unnest(%s::bigint[], %s::int[]) AS u(i, t)"
                ),
                (self.pid, [p[0] for p in pairs], [p[1] for p in pairs]),
            )

    def queue_empty(self) -> bool:
        assert self.conn is not None
        row = self.conn.execute(
            self.q(
                "SELECT NOT EXISTS (SELECT FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id WHERE q.name = %s)"
            ),
            (self.args.queue,),
        ).fetchone()
        return bool(row and row[0])

    def lease_batch(self) -> bool:
        assert self.conn is not None and self.mq is not None
        batch = self.mq.take(self.args.queue, self.args.batch, lease=self.args.lease)
        if not batch:
            return False
        self.in_hand = batch
        self.jitter()
        self.record_results(batch)
        self.jitter()
        with self.conn.transaction():
            acked = self.mq.ack(batch, conn=self.conn)
            self.record("fault_ack", [m for m in batch if m.id in acked])
            self.record("fault_lost", [m for m in batch if m.id not in acked])
        self.in_hand = []
        self.stats["messages"] += len(batch)
        return True

    def drain_batch(self) -> bool:
        assert self.conn is not None and self.mq is not None
        prev = self.in_hand
        n = random.choice((1, self.args.batch))
        with self.conn.transaction():
            batch = self.mq.take(self.args.queue, n, lease=self.args.lease, ack=prev, conn=self.conn)
            # Until the commit is answered both are in hand: a server that fails during the
            # commit may have applied it (the new leases held, the previous acknowledged) or not,
            # and the consumer cannot tell which.
            self.in_hand = prev + batch
            if prev:
                # The acks that took effect are the ones ack's memory holds, in this transaction.
                done = self.conn.execute(
                    self.q(
                        "SELECT s.id FROM {s}.settled s JOIN unnest(%s::bigint[], %s::int[]) AS u(i, t)"
                        " ON s.id = u.i AND s.token = u.t WHERE s.outcome = 'acked'"
                    ),
                    ([m.id for m in prev], [m.token for m in prev]),
                ).fetchall()
                acked = {r[0] for r in done}
                self.record("fault_ack", [m for m in prev if m.id in acked])
                self.record("fault_lost", [m for m in prev if m.id not in acked])
            self.record_results(batch)
        self.in_hand = batch
        self.stats["messages"] += len(batch)
        self.jitter()
        return bool(batch or prev)

    def record_results(self, batch: list[Message]) -> None:
        """The deliveries of ``batch`` in fault_result (processed), with their keys."""
        assert self.conn is not None
        if batch:
            self.conn.execute(
                self.q(
                    "INSERT INTO {s}.fault_result (id, token, key, pid) SELECT i, t, k, %s"
                    " FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(i, t, k)"
                ),
                (self.pid, [m.id for m in batch], [m.token for m in batch], [m.key for m in batch]),
            )

    def tx_batch(self) -> bool:
        assert self.conn is not None and self.mq is not None
        rollback = random.random() < self.args.rollback
        with self.conn.transaction():
            batch = self.mq.take_tx(self.args.queue, self.args.batch, conn=self.conn)
            if not batch:
                return False
            self.record("fault_result", batch)
            self.jitter()
            if rollback:
                raise psycopg.Rollback()  # results and takes undone together
        self.stats["rolled_back" if rollback else "messages"] += 1 if rollback else len(batch)
        return True

    def run(self) -> None:
        self.connect()
        self.in_hand: list[Message] = []
        step = {"lease": self.lease_batch, "drain": self.drain_batch, "tx": self.tx_batch}[self.args.mode]
        while not _stop:
            try:
                if self.abandoned:
                    self.record("fault_abandoned", self.abandoned)
                    self.abandoned = []
                if step():
                    self.stats["batches"] += 1
                elif self.args.exit_when_empty and self.queue_empty():
                    break
                else:
                    time.sleep(0.01)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                if not self.args.retry:
                    raise
                self.stats["db_errors"] += 1
                self.abandoned += [(m.id, m.token) for m in self.in_hand]
                self.in_hand = []
                if self.conn is not None:
                    self.conn.close()
                time.sleep(0.1)
                self.connect()
        if self.abandoned and self.conn is not None:
            self.record("fault_abandoned", self.abandoned)
        print(json.dumps(self.stats), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--queue", default="q")
    p.add_argument("--mode", choices=("lease", "drain", "tx"), default="lease")
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--jitter", type=float, default=0.0, help="max random sleep (s) between steps")
    p.add_argument("--rollback", type=float, default=0.0, help="tx mode: share of batches rolled back")
    p.add_argument("--retry", action="store_true", help="survive connection errors")
    p.add_argument("--reconnect-for", type=float, default=60.0)
    p.add_argument("--exit-when-empty", action="store_true")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
