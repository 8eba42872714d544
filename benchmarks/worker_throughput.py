"""Worker throughput: messages per second through a real Worker, from the first fetch to the
last acknowledgement in the database.

    python benchmarks/worker_throughput.py [--n 5000] [--concurrency 8] [--dsn DSN]

Without --dsn / $LONNYMQ_DSN a throwaway embedded PostgreSQL is started. Each run uses its own
schema, dropped at the end. Handlers are no-ops (async, and sync on the thread pool) or sleep
``--work-ms`` to show how concurrency hides handler latency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql

from lonnymq import Client
from lonnymq.worker import App, Worker


def run_once(
    dsn: str, n: int, concurrency: int, mode: str, work_ms: float, cooldown: float
) -> tuple[float, Worker]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    client = Client(dsn, schema=schema)
    try:
        client.migrate()
        client.create_queue("bench", lease=30)
        for start in range(0, n, 1000):
            client.send_batch("bench", list(range(start, min(start + 1000, n))))
        app = App()
        pause = work_ms / 1000

        if mode == "async":

            @app.handler("bench")
            async def handle(job):  # type: ignore[no-untyped-def]
                if pause:
                    await asyncio.sleep(pause)
        else:

            @app.handler("bench")
            def handle_sync(job):  # type: ignore[no-untyped-def]
                if pause:
                    time.sleep(pause)

        async def main() -> tuple[float, Worker]:
            w = Worker(app, dsn, schema=schema, concurrency=concurrency, cron=False, fetch_cooldown=cooldown)
            t0 = time.perf_counter()
            await w.start()
            while w.m_messages.total(outcome="acked") < n:
                await asyncio.sleep(0.005)
            elapsed = time.perf_counter() - t0
            await w.stop()
            return elapsed, w

        elapsed, w = asyncio.run(main())
        assert client.metrics("bench").ready == 0
        return n / elapsed, w
    finally:
        client.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("LONNYMQ_DSN"))
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["async", "sync"], choices=["async", "sync"])
    p.add_argument("--work-ms", type=float, default=0.0, help="handler sleep per message")
    p.add_argument(
        "--fetch-cooldown",
        type=float,
        nargs="+",
        default=[0.002],
        help="Worker(fetch_cooldown=...) values to compare (seconds)",
    )
    args = p.parse_args()
    with server(args.dsn) as dsn:
        print(
            f"{'mode':<6} {'conc':>4} {'work_ms':>7} {'cooldown':>8} {'n':>6} {'msg/s':>9} {'fetches':>8}"
            f" {'msg/fetch':>9}"
        )
        for mode in args.modes:
            for cooldown in args.fetch_cooldown:
                rate, w = run_once(dsn, args.n, args.concurrency, mode, args.work_ms, cooldown)
                fetches = w.m_fetches.total()
                print(
                    f"{mode:<6} {args.concurrency:>4} {args.work_ms:>7} {cooldown:>8} {args.n:>6} {rate:>9.0f}"
                    f" {fetches:>8.0f} {w.m_fetched.total() / max(fetches, 1):>9.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
