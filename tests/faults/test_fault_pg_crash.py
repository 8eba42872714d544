"""Crash safety of the database: PostgreSQL stopped in immediate mode (a crash: no shutdown
checkpoint, recovery from WAL at the next start) and restarted, several times, under load.

The test runs its own embedded server so it can crash it without disturbing other tests. Two
producer threads send 20,000 messages with de-duplication keys ("m-<n>"), retrying a batch
whose outcome they could not learn (the commit may or may not have happened: at-least-once
sends; the key makes the retry a no-op while the first copy is still queued). Three consumers
(tests/fault_consumer.py --retry; two in lease mode, one draining with take(n, ack=previous),
its acks in take's transaction) reconnect after each crash and record the
deliveries they had in hand. Afterwards:

* every key was sent with a known outcome and every message committed was processed and
  acknowledged exactly once; none came back after its ack (tests/fault_helpers.py);
* duplicates of a delivery only for leases in flight at a crash (or expired before the ack);
* a key has two messages only if a send of it had an unknown outcome.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fault_helpers import Consumer, check_at_least_once, create_tables, queue_size, wait_until_empty
from lonnymq import Client, Envelope
from lonnymq.embedded import EmbeddedServer, temporary_server

pytestmark = [pytest.mark.once, pytest.mark.slow, pytest.mark.timeout(400)]

MESSAGES = 20_000
PRODUCERS = 2
BATCH = 200
CONSUMERS = 3
CRASHES = 3
SCHEMA = "lonnymq"


@pytest.fixture
def crashable() -> Iterator[EmbeddedServer]:
    with temporary_server() as srv:
        yield srv


class Producer(threading.Thread):
    """Sends its share of keys in batches; on a connection error, reconnects and resends the
    same batch. ``unknown`` are keys of batches whose first outcome was not learnt."""

    def __init__(self, dsn: str, keys: list[int]) -> None:
        super().__init__()
        self.dsn, self.keys = dsn, keys
        self.unknown: set[str] = set()
        self.outcomes: Counter[str] = Counter()
        self.ids: set[int] = set()  # messages known to be committed (from send results)
        self.error: BaseException | None = None
        self.retries = 0

    def run(self) -> None:
        try:
            conn: psycopg.Connection[Any] | None = None
            for start in range(0, len(self.keys), BATCH):
                batch = [Envelope({"n": n}, key=f"m-{n}") for n in self.keys[start : start + BATCH]]
                while True:
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                        results = Client(conn, schema=SCHEMA).send_batch("q", batch)
                        self.outcomes.update(r.outcome for r in results)
                        self.ids.update(r.id for r in results if r.id is not None)
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        self.unknown.update(e.key for e in batch if e.key)
                        self.retries += 1
                        if conn is not None:
                            conn.close()
                        conn = None
                        time.sleep(0.1 + random.random() * 0.2)
                time.sleep(0.02)
            if conn is not None:
                conn.close()
        except BaseException as e:
            self.error = e


def test_immediate_stop_and_restart_under_load(crashable: EmbeddedServer) -> None:
    dsn = crashable.dsn
    with Client(dsn, schema=SCHEMA, pool_size=1) as mq:
        mq.migrate()
        mq.create_queue("q", lease=2, max_attempts=1000)
    with psycopg.connect(dsn, autocommit=True) as c:
        create_tables(c, SCHEMA)

    started = time.monotonic()
    numbers = list(range(MESSAGES))
    producers = [Producer(dsn, numbers[i::PRODUCERS]) for i in range(PRODUCERS)]
    # The first consumer drains with take(n, ack=previous) (its acks in take's transaction).
    consumers = [
        Consumer(
            dsn, SCHEMA, "--mode", "drain" if k == 0 else "lease", "--batch", "20", "--lease", "2", "--retry"
        )
        for k in range(CONSUMERS)
    ]
    for p in producers:
        p.start()

    def sent() -> int:
        return sum(p.outcomes.total() for p in producers)

    crashes: list[tuple[int, float]] = []
    for k in range(CRASHES):
        # Crash while producers are busy (at about 25%, 50%, 75% of the sends).
        target = MESSAGES * (k + 1) // (CRASHES + 1)
        while sent() < target and any(p.is_alive() for p in producers):
            time.sleep(0.05)
        t0 = time.monotonic()
        crashable.stop("immediate")
        time.sleep(random.uniform(0.2, 1.0))
        crashable.start()
        crashes.append((sent(), time.monotonic() - t0))
    for p in producers:
        p.join(180)
        assert not p.is_alive() and p.error is None, p.error

    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_until_empty(conn, SCHEMA, timeout=120)
        for c in consumers:
            c.proc.terminate()
        stats = [c.finish() for c in consumers]
        s = sql.Identifier(SCHEMA)
        by_key = dict(
            conn.execute(
                sql.SQL("SELECT key, array_agg(DISTINCT id) FROM {}.fault_result GROUP BY key").format(s)
            ).fetchall()
        )
        processed = {i for arr in by_key.values() for i in arr}
        report = check_at_least_once(conn, SCHEMA, processed)
        leftover = queue_size(conn, SCHEMA)
        # The drain-mode consumer's acks, made by take(n, ack=previous), are among those checked.
        drained = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.fault_ack WHERE pid = %s").format(s), (consumers[0].pid,)
        ).fetchone()
    elapsed = time.monotonic() - started

    # Messages known to be committed were all processed (and, by the check above, acknowledged
    # once); the others processed are first copies of sends whose outcome was unknown.
    confirmed = set().union(*(p.ids for p in producers))
    unknown = set().union(*(p.unknown for p in producers))
    assert confirmed <= processed, f"committed but never processed: {sorted(confirmed - processed)[:10]}"
    key_of = {i: k for k, arr in by_key.items() for i in arr}
    assert {key_of[i] for i in processed - confirmed} <= unknown
    assert set(by_key) == {f"m-{n}" for n in numbers}, "a key was never delivered"
    doubled = {k for k, arr in by_key.items() if len(arr) > 1}
    assert doubled <= unknown, f"keys sent twice without an unknown outcome: {sorted(doubled - unknown)[:10]}"
    assert leftover == 0
    assert drained is not None and drained[0] > 0, "the drain-mode consumer acknowledged nothing"
    assert sum(st["db_errors"] for st in stats) > 0, "the consumers never saw a crash"
    print(
        f"\nPostgreSQL crashes (sent so far, seconds down): {crashes}; {elapsed:.1f}s in all; "
        f"producer retries {sum(p.retries for p in producers)}, keys with unknown outcome {len(unknown)}, "
        f"keys enqueued twice {len(doubled)}, outcomes {sum((p.outcomes for p in producers), Counter())}; "
        f"{report}; consumers {stats}"
    )
