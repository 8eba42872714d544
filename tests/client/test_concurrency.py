"""Competing consumers: four processes, each with its own client, drain one queue of 20,000
messages. Every message is delivered exactly once and none is lost."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from core_helpers import Sql, lease_consumer, tx_consumer
from lonnymq import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MESSAGES = 20_000
PROCESSES = 4
BATCH = 50


def _drain(
    dsn: str, schema: str, consumer: Callable[..., None]
) -> tuple[list[list[Any]], list[list[int]], float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=consumer, args=(dsn, schema, "q", BATCH, barrier, out)) for _ in range(PROCESSES)
    ]
    started = time.perf_counter()
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return [r[0] for r in results], [r[1] for r in results], time.perf_counter() - started


def _check(sent: list[int], delivered: list[list[Any]], settled: list[list[int]], db: Sql) -> None:
    ids = [d[0] for per in delivered for d in per]
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert twice == [], f"delivered more than once: {twice[:10]}"
    assert sorted(ids) == sent, f"lost: {sorted(set(sent) - set(ids))[:10]}"
    assert {(d[1], d[2]) for per in delivered for d in per} == {(1, 1)}  # no redelivery
    assert sorted(i for per in settled for i in per) == sent
    assert db.count("q") == 0 and db.take("q", 10, db.now() + 10**9) == []
    for per in delivered:  # each process saw its share in queue order
        per_ids = [d[0] for d in per]
        assert per_ids == sorted(per_ids)


@pytest.fixture
def sent(client: Client) -> list[int]:
    client.create_queue("q")
    ids: list[int] = []
    for start in range(0, MESSAGES, 5000):
        ids += [r.id for r in client.send_batch("q", [f"m{i}" for i in range(start, start + 5000)])]  # type: ignore[misc]
    return ids


def test_leasing_consumers_never_share_a_message(
    dsn: str, schema: str, conn: psycopg.Connection, sent: list[int]
) -> None:
    delivered, acked, took = _drain(dsn, schema, lease_consumer)
    _check(sent, delivered, acked, Sql(conn, schema))
    print(
        f"\n{PROCESSES} leasing consumers drained {MESSAGES} messages in {took:.2f}s"
        f" (per process: {[len(d) for d in delivered]})"
    )


def test_take_tx_consumers_never_share_a_message(
    dsn: str, schema: str, conn: psycopg.Connection, sent: list[int]
) -> None:
    delivered, committed, took = _drain(dsn, schema, tx_consumer)
    _check(sent, delivered, committed, Sql(conn, schema))
    print(
        f"\n{PROCESSES} take_tx consumers drained {MESSAGES} messages in {took:.2f}s"
        f" (per process: {[len(d) for d in delivered]})"
    )
