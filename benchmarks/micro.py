"""Micro benchmark of the core calls, one client process.

Prints messages per second for: send one per transaction, send batches, take+ack one at a time
(ack of the previous message rides on the next take: one round trip per message) and take+ack
in batches. Runs on a throwaway embedded server unless --dsn is given.

    python benchmarks/micro.py [--dsn URI] [-n 5000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql

from lonnymq import Client, Message

PAYLOAD = {"order_id": 123456, "customer": "c-000042", "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 120}


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>10,.0f} msg/s  ({n} in {seconds:.2f}s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dsn")
    ap.add_argument("-n", type=int, default=5000, help="messages for the one-at-a-time runs")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=50)
    args = ap.parse_args()

    with server(args.dsn) as dsn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            with Client(dsn, schema=schema, pool_size=1) as c:
                c.migrate()
                c.create_queue("bench")
                results = run(c, args)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"lonnymq micro benchmark ({dsn.split('@')[-1]})")
    for name, line in results:
        print(f"  {name:<32} {line}")


def run(c: Client, args: argparse.Namespace) -> list[tuple[str, str]]:
    out = []
    t = time.perf_counter()
    for _ in range(args.n):
        c.send("bench", PAYLOAD)
    out.append(("send, one per transaction", rate(args.n, time.perf_counter() - t)))

    total = args.batch * args.batches
    t = time.perf_counter()
    for _ in range(args.batches):
        c.send_batch("bench", [PAYLOAD] * args.batch)
    out.append((f"send_batch of {args.batch}", rate(total, time.perf_counter() - t)))

    t = time.perf_counter()
    prev: list[Message] = []
    done = 0
    while done < args.n:
        got = c.take("bench", 1, ack=prev)
        if not got:
            break
        prev = got
        done += 1
    if prev:
        c.ack(prev)
    out.append(("take+ack one at a time", rate(done, time.perf_counter() - t)))

    t = time.perf_counter()
    done = 0
    prev = []
    while True:
        got = c.take("bench", 100, ack=prev)
        if not got:
            break
        prev = got
        done += len(got)
    out.append(("take+ack batches of 100", rate(done, time.perf_counter() - t)))
    return out


if __name__ == "__main__":
    main()
