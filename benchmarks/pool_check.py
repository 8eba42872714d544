"""The cost of checking pooled connections on checkout (``Client(check_connections=...)``).

Sends one message per call (one transaction each, the latency-bound case where the check's extra
round trip shows most) with the check on and off, interleaved in rounds so drift in the machine's
load hits both alike; prints the median latency per send of each.

    python benchmarks/pool_check.py [--dsn URI] [-n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql

from lonnymq import Client


def per_send_us(c: Client, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        c.send("q", {"n": i})
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dsn")
    ap.add_argument("-n", type=int, default=2000, help="sends per round and setting")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    with server(args.dsn) as dsn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            clients = {
                check: Client(dsn, schema=schema, pool_size=1, check_connections=check)
                for check in (True, False)
            }
            clients[True].migrate()
            clients[True].create_queue("q")
            results: dict[bool, list[float]] = {True: [], False: []}
            for c in clients.values():
                per_send_us(c, 200)  # warm up
            for _ in range(args.rounds):
                for check, c in clients.items():
                    results[check].append(per_send_us(c, args.n))
                    c.purge_queue("q")
            for c in clients.values():
                c.close()
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    on, off = statistics.median(results[True]), statistics.median(results[False])
    print(f"send, one per call, {args.rounds} rounds x {args.n}: median us per send")
    print(f"  check_connections=True : {on:8.1f}  (rounds: {', '.join(f'{x:.0f}' for x in results[True])})")
    print(f"  check_connections=False: {off:8.1f}  (rounds: {', '.join(f'{x:.0f}' for x in results[False])})")
    print(f"  cost of the check      : {on - off:8.1f} us per send ({(on - off) / off:+.0%})")


if __name__ == "__main__":
    main()
