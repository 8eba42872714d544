"""What channels cost: take + ack throughput of a plain queue against the same queue with its
messages spread over channels, measured in one run on one server.

    python benchmarks/channels_bench.py                    # embedded PostgreSQL
    LONNYMQ_BENCH_DSN=postgresql://... python benchmarks/channels_bench.py --messages 50000

For each (queue kind, batch size) the queue is filled, then drained by --workers threads, each
with its own connection, looping take(n=batch, ack=previous batch): one round trip per batch,
the way the worker drains. Prints messages per second; the channel queue also gets a policy
run (max_concurrency=2 per channel) since limits take the per-channel path too.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql

from lonnymq import Client, Envelope, Message


def fill(c: Client, queue: str, messages: int, channels: int) -> None:
    chunk = 5_000
    for start in range(0, messages, chunk):
        batch = [
            Envelope(b"x" * 64, channel=f"tenant-{i % channels}" if channels else None)
            for i in range(start, min(start + chunk, messages))
        ]
        c.send_batch(queue, batch)


def drain(dsn: str, schema: str, queue: str, batch: int, workers: int) -> tuple[int, float]:
    done = [0] * workers
    barrier = threading.Barrier(workers + 1)

    def work(k: int) -> None:
        with Client(dsn, schema=schema, pool_size=1) as c:
            c.list_queues()  # connected before the clock starts
            barrier.wait()
            held: list[Message] = []
            while True:
                got = c.take(queue, batch, ack=held)
                done[k] += len(held)
                held = got
                # [] can also mean "all ready channels are being served by others right now".
                if not got and c.metrics(queue, cap=1).ready == 0:
                    break
            if held:
                c.ack(held)
                done[k] += len(held)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return sum(done), time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--channels", type=int, default=100)
    ap.add_argument("--batches", default="1,10", help="take batch sizes, comma separated")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dsn", default=os.environ.get("LONNYMQ_BENCH_DSN"))
    args = ap.parse_args()
    kinds = [
        ("plain", 0, None),
        (f"{args.channels} channels", args.channels, None),
        (f"{args.channels} channels, max_concurrency=2", args.channels, 2),
    ]
    with server(args.dsn) as dsn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            with Client(dsn, schema=schema, pool_size=1) as c:
                c.migrate()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
                print(
                    f"PostgreSQL {version}, {args.messages} messages of 64 bytes, "
                    f"{args.workers} workers, take(n=batch, ack=previous)"
                )
                print(f"{'queue':<40} {'batch':>5} {'msgs/s':>10}")
                for batch in (int(b) for b in args.batches.split(",")):
                    for label, channels, limit in kinds:
                        queue = f"q{uuid.uuid4().hex[:8]}"
                        c.create_queue(queue, lease=300, channel_max_concurrency=limit)
                        fill(c, queue, args.messages, channels)
                        n, seconds = drain(dsn, schema, queue, batch, args.workers)
                        assert n == args.messages, (n, args.messages)
                        print(f"{label:<40} {batch:>5} {n / seconds:>10,.0f}")
                        c.drop_queue(queue)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
