"""Concurrency: 8 processes drain 50,000 messages with take_tx, recording each message in a
results table in the same transaction; 5% of the transactions roll back on purpose (their
messages must come back untouched and be taken again). Zero double deliveries: every message
is in the committed results exactly once, as its first delivery, and the queue is empty."""

from __future__ import annotations

import time
from collections import Counter

import psycopg
import pytest
from psycopg import sql

from fault_helpers import Consumer, create_tables, queue_size
from lonnymq import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MESSAGES = 50_000
PROCESSES = 8


def test_eight_take_tx_processes_never_share_a_message(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("q")
    create_tables(conn, schema)
    sent: list[int] = []
    for start in range(0, MESSAGES, 5000):
        sent += [r.id for r in client.send_batch("q", [{"i": i} for i in range(start, start + 5000)])]  # type: ignore[misc]
    started = time.monotonic()
    procs = [
        Consumer(dsn, schema, "--mode", "tx", "--batch", "50", "--rollback", "0.05", "--exit-when-empty")
        for _ in range(PROCESSES)
    ]
    stats = [p.finish(timeout=240) for p in procs]
    elapsed = time.monotonic() - started

    rows = conn.execute(
        sql.SQL("SELECT id, token FROM {}.fault_result").format(sql.Identifier(schema))
    ).fetchall()
    ids = [i for i, _ in rows]
    doubles = [i for i, n in Counter(ids).items() if n > 1]
    assert doubles == [], f"{len(doubles)} messages delivered twice, e.g. {doubles[:10]}"
    assert set(ids) == set(sent) and len(ids) == MESSAGES
    assert queue_size(conn, schema) == 0
    # A rolled-back take_tx leaves no trace: every committed take was the message's first delivery.
    assert {t for _, t in rows} == {1}
    rolled_back = sum(s["rolled_back"] for s in stats)
    # Several processes took messages at once (on a loaded machine one that starts last may find
    # the queue drained already: taking nothing is no failure of take_tx).
    assert rolled_back > 0 and sum(1 for s in stats if s["messages"] > 0) >= 4, stats
    print(
        f"\ntake_tx: {MESSAGES} messages, {PROCESSES} processes, {elapsed:.1f}s "
        f"({MESSAGES / elapsed:,.0f} msg/s), {rolled_back} batches rolled back and retaken; {stats}"
    )
