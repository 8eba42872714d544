"""Crash safety of consumers: kill -9 of consumer processes at random points.

20,000 messages are sent while four consumers (tests/fault_consumer.py) process them, three
taking and acknowledging in turn (lease mode), one draining with ``take(n, ack=previous)``;
every 0.15-0.5 s one consumer, chosen at random, is SIGKILLed wherever it is (between take and
processing, between processing and ack, inside the ack transaction, ...) and replaced. Afterwards
(tests/fault_helpers.py): every message was acknowledged exactly once, none came back after its
ack, and every message processed more than once had its earlier deliveries in the hands of a
killed consumer (or its lease expired before the ack) — checked by message id and token.
"""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from fault_helpers import Consumer, check_at_least_once, create_tables, queue_size, wait_until_empty
from lonnymq import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MESSAGES = 20_000
CONSUMERS = 4
LEASE = 2.0
KILLS = 20


def test_kill_9_consumers_at_random_points(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("q", lease=LEASE, max_attempts=1000)
    create_tables(conn, schema)
    rnd = random.Random()
    args = ["--batch", "20", "--lease", str(LEASE), "--jitter", "0.003"]
    # The first slot drains with take(n, ack=previous) (its acks in take's transaction).
    modes = ["drain", *["lease"] * (CONSUMERS - 1)]
    consumers = [Consumer(dsn, schema, "--mode", modes[k], *args) for k in range(CONSUMERS)]

    sent: list[int] = []
    producer_error: list[BaseException] = []

    def produce() -> None:
        try:
            with Client(dsn, schema=schema, pool_size=1) as mq:
                for start in range(0, MESSAGES, 500):
                    sent.extend(
                        r.id for r in mq.send_batch("q", [{"i": i} for i in range(start, start + 500)])
                    )  # type: ignore[misc]
                    time.sleep(0.05)
        except BaseException as e:
            producer_error.append(e)

    started = time.monotonic()
    producer = threading.Thread(target=produce)
    producer.start()
    killed: set[int] = set()
    while len(killed) < KILLS and (producer.is_alive() or queue_size(conn, schema) > 500):
        time.sleep(rnd.uniform(0.15, 0.5))
        victim = rnd.randrange(CONSUMERS)
        consumers[victim].kill()
        killed.add(consumers[victim].pid)
        consumers[victim] = Consumer(dsn, schema, "--mode", modes[victim], *args)
    producer.join()
    assert producer_error == []
    wait_until_empty(conn, schema, timeout=120)
    for c in consumers:
        c.proc.terminate()
    stats = [c.finish() for c in consumers]
    elapsed = time.monotonic() - started

    report = check_at_least_once(conn, schema, set(sent), killed)
    print(f"\nkill -9: {len(killed)} kills in {elapsed:.1f}s; {report}; survivors {stats}")
    assert len(sent) == MESSAGES
    assert len(killed) >= 5, "too few kills landed while messages were flowing"
