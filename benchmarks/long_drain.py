"""One consumer's drain of a long backlog at batch 100: LonnyMQ's take(n, ack=previous) and the
API lease floor (benchmarks/lonnymq_bench/systems/api_floor.py) on the same tables, one
connection, no client objects (rows read as tuples), the rate every 20,000 messages.

    PYTHONPATH=src:benchmarks python benchmarks/long_drain.py --dsn postgresql://.../scratch \\
        --messages 200000 --systems floor,lonnymq,floor,lonnymq

The schemas lonnymq and lonnymq_floor of that database are dropped and re-created before each
system's drain: use a scratch database. Autovacuum is off on the message table during a drain
(the same for both), so each drain runs on the layout its own work leaves.

``--consumers N`` (N > 1): N processes drain the same backlog with the same call, started
together, each leaving after its first empty take, as the benchmark suite's consumers do. Each
reports its message count and its empty take: when (seconds into the drain), and how many
messages were still left then (the backlog less what all consumers had received, counted in
shared memory): more than the other consumers' leases of one batch each ((N - 1) x batch) is an
early empty take, a consumer that left while messages were ready (docs/benchmarks.md, "A false
empty take while another transaction rotates"). Then the overall rate. ``--json`` keeps the
results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg
from lonnymq_bench.systems import api_floor
from lonnymq_bench.systems.lonnymq import LonnyMQ

CALLS = {
    "floor": "SELECT * FROM lonnymq_floor.take(%s::text, %s::integer, %b::bigint[], %b::integer[])",
    "lonnymq": "SELECT * FROM lonnymq.take(%s::text, %s::integer, NULL::bigint, %b::bigint[], %b::integer[])",
}


def prepare(dsn: str, messages: int) -> None:
    """Install both systems afresh and preload ``messages``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS lonnymq_floor CASCADE")
        c.execute("DROP SCHEMA IF EXISTS lonnymq CASCADE")
    api_floor.install_floor(dsn)
    LonnyMQ().preload(dsn, messages)


def batches(c: psycopg.Connection[Any], system: str, batch: int) -> Iterator[list[Any]]:
    """``system``'s take(batch, ack=previous) on ``c`` until its first empty take (which
    acknowledges the last batch): the rows of each batch."""
    ids: list[int] = []
    toks: list[int] = []
    while True:
        rows = c.execute(CALLS[system], (api_floor.QUEUE, batch, ids or None, toks or None)).fetchall()  # type: ignore[arg-type]
        if not rows:
            return
        yield rows
        ids, toks = [r[0] for r in rows], [r[2] for r in rows]


def drain(dsn: str, system: str, messages: int, batch: int, step: int) -> list[float]:
    """Install both systems afresh, preload ``messages``, drain them with ``system``'s call; the
    rate of each ``step`` messages."""
    prepare(dsn, messages)
    rates: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM ANALYZE lonnymq.message_logged")
        c.execute("ALTER TABLE lonnymq.message_logged SET (autovacuum_enabled = false)")
        n = mark = 0
        t = time.perf_counter()
        for rows in batches(c, system, batch):
            n += len(rows)
            if n - mark >= step:
                now = time.perf_counter()
                rates.append((n - mark) / (now - t))
                mark, t = n, now
        c.execute("ALTER TABLE lonnymq.message_logged RESET (autovacuum_enabled)")
    return rates


def consumer(
    dsn: str,
    system: str,
    batch: int,
    messages: int,
    barrier: Barrier,
    total: Synchronized,  # type: ignore[type-arg]
    out: Any,
) -> None:
    """One consumer of the shared drain: takes until its first empty take, then reports its
    count, when it saw the empty take and how many messages were left then."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT 1")
        n = 0
        barrier.wait()
        t0 = time.perf_counter()
        for rows in batches(c, system, batch):
            n += len(rows)
            with total.get_lock():
                total.value += len(rows)
        at = time.perf_counter() - t0
        with total.get_lock():
            left = messages - total.value
    out.put({"messages": n, "empty_at_s": round(at, 3), "left_at_empty": left, "ended": time.perf_counter()})


def drain_shared(dsn: str, system: str, messages: int, batch: int, consumers: int) -> dict[str, Any]:
    """Install both systems afresh, preload ``messages``, drain them with ``consumers`` processes
    running ``system``'s call; each consumer's report and the overall rate."""
    prepare(dsn, messages)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM ANALYZE lonnymq.message_logged")
        c.execute("ALTER TABLE lonnymq.message_logged SET (autovacuum_enabled = false)")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(consumers + 1)
    total = ctx.Value("q", 0)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=consumer, args=(dsn, system, batch, messages, barrier, total, out))
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    reports = [out.get() for _ in procs]
    for p in procs:
        p.join()
    end = max(r.pop("ended") for r in reports)
    early = (consumers - 1) * batch
    for r in reports:
        r["early_empty"] = r["left_at_empty"] > early
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER TABLE lonnymq.message_logged RESET (autovacuum_enabled)")
    got = sum(r["messages"] for r in reports)
    return {
        "system": system,
        "consumers": sorted(reports, key=lambda r: r["empty_at_s"]),
        "messages": got,
        "rate": got / (end - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dsn", required=True, help="a scratch database (schemas lonnymq, lonnymq_floor re-created)"
    )
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--step", type=int, default=20_000)
    ap.add_argument("--systems", default="floor,lonnymq,floor,lonnymq", help="drains in this order")
    ap.add_argument("--consumers", type=int, default=1, help="processes draining the same backlog")
    ap.add_argument("--json", help="write the results there (with --consumers)")
    a = ap.parse_args()
    if a.consumers < 1:
        ap.error("--consumers must be at least 1")
    if a.consumers > 1:
        results = []
        for system in a.systems.split(","):
            r = drain_shared(a.dsn, system, a.messages, a.batch, a.consumers)
            results.append(r)
            each = ", ".join(
                f"{c['messages']} (empty at {c['empty_at_s']:.1f} s, {c['left_at_empty']} left"
                + (", EARLY)" if c["early_empty"] else ")")
                for c in r["consumers"]
            )
            print(f"{system:8s} {r['rate']:8.0f} msg/s overall, {r['messages']} messages; each: {each}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "drains": results}, f, indent=1)
        return
    for system in a.systems.split(","):
        rates = drain(a.dsn, system, a.messages, a.batch, a.step)
        whole = len(rates) * a.step / sum(a.step / r for r in rates) if rates else 0.0
        print(f"{system:8s} {whole:8.0f} msg/s overall; per {a.step}: " + " ".join(f"{r:.0f}" for r in rates))


if __name__ == "__main__":
    main()
