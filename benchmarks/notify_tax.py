"""The NOTIFY tax (issue 12 item 1): 8 concurrent single-message producer processes (one message
per transaction) through ``send``, with the waiter-gated wake-up (``_wake``: NOTIFY only while
a consumer waits) against the old behaviour (``SET lonnymq.wake = 'always'``: NOTIFY on every
send), interleaved and repeated; then idle pickup (a producer's commit to a waiting
``receive()`` returning, or to a worker's handler starting) p50/p99 with 1 and 8 waiters.

    .venv/bin/python benchmarks/notify_tax.py --dsn postgresql://root@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import threading
import time

import psycopg
from psycopg import sql

from lonnymq import Client
from lonnymq.worker import App, Job, Worker

SCHEMA = "bench_notify_tax"


def produce(dsn: str, mode: str, seconds: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]  # mp.Queue is not generic at runtime
    with psycopg.connect(dsn, autocommit=True) as c:
        if mode == "always":
            c.execute("SET lonnymq.wake = 'always'")
        with Client(dsn, schema=SCHEMA, pool_size=1) as client:
            while time.time() < start:
                time.sleep(0.001)
            n, end = 0, start + seconds
            payload = {"k": "x" * 180}
            while time.time() < end:
                client.send("q", payload, conn=c)
                n += 1
    out.put(n)


def throughput(dsn: str, mode: str, producers: int, seconds: float) -> float:
    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]  # see above
    start = time.time() + 1.0
    ps = [mp.Process(target=produce, args=(dsn, mode, seconds, start, out)) for _ in range(producers)]
    for p in ps:
        p.start()
    total = sum(out.get() for _ in ps)
    for p in ps:
        p.join()
    return total / seconds


def pickup(dsn: str, waiters: int, rounds: int, kind: str) -> tuple[list[float], list[float]]:
    """Milliseconds from a send's start, and from its return (its commit is in between), to a
    waiting ``receive()`` returning the message or a worker's handler starting on it."""
    sent: dict[int, tuple[float, float]] = {}
    got: dict[int, float] = {}
    stop = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        with Client(dsn, schema=SCHEMA, pool_size=1) as c:
            while not stop.is_set():
                for m in c.receive("q", timeout=1, poll=30):
                    got[int(m.payload)] = time.time()
                    c.ack(m)

    def work() -> None:
        app = App()

        @app.handler("q")
        async def handler(job: Job) -> None:
            got[int(job.payload)] = time.time()

        async def main() -> None:
            workers = [Worker(app, dsn, schema=SCHEMA, poll_interval=30, cron=False) for _ in range(waiters)]
            for w in workers:
                await w.start()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for w in workers:
                await w.stop()

        asyncio.run(main())

    if kind == "receive":
        ts = [threading.Thread(target=consume) for _ in range(waiters)]
        ready.set()
    else:
        ts = [threading.Thread(target=work)]
    for t in ts:
        t.start()
    ready.wait()
    time.sleep(0.5)
    with Client(dsn, schema=SCHEMA, pool_size=1) as p:
        for i in range(rounds):
            time.sleep(0.1)  # every waiter is asleep again
            t0 = time.time()
            p.send("q", str(i).encode())
            sent[i] = (t0, time.time())
    time.sleep(0.5)
    stop.set()
    for t in ts:
        t.join()
    start = sorted((got[i] - a) * 1000 for i, (a, _) in sent.items() if i in got)
    commit = sorted((got[i] - b) * 1000 for i, (_, b) in sent.items() if i in got)
    return start, commit


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def reset(dsn: str) -> None:
    with Client(dsn, schema=SCHEMA) as c:
        c.purge_queue("q")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("VACUUM {}.message").format(sql.Identifier(SCHEMA)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--producers", type=int, nargs="+", default=[1, 8], help="producer process counts")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200, help="sends per pickup measurement")
    a = ap.parse_args()
    with psycopg.connect(a.dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    with Client(a.dsn, schema=SCHEMA) as c:
        c.migrate()
        c.create_queue("q")
    try:
        for n in a.producers:
            rates: dict[str, list[float]] = {"always": [], "waiters": []}
            for _ in range(a.repeat):
                for mode in ("always", "waiters"):  # interleaved: the machine's noise hits both
                    reset(a.dsn)
                    rates[mode].append(throughput(a.dsn, mode, n, a.seconds))
            for mode, r in rates.items():
                runs = ", ".join(f"{x:.0f}" for x in r)
                print(f"{n} producer(s), notify {mode:8}: median {statistics.median(r):7.0f}/s  runs {runs}")
            ratio = statistics.median(rates["waiters"]) / statistics.median(rates["always"])
            print(f"{n} producer(s), waiter-gated / NOTIFY-every-send: {ratio:.2f}x")
        reset(a.dsn)
        for kind in ("receive", "worker"):
            for w in (1, 8):
                start, commit = pickup(a.dsn, w, a.rounds, kind)
                print(
                    f"idle pickup, {kind}, {w} waiter(s), {len(start)} messages: from send() call"
                    f" p50 {pct(start, 0.5):.1f} ms p99 {pct(start, 0.99):.1f} ms; from its return"
                    f" p50 {pct(commit, 0.5):.1f} ms p99 {pct(commit, 0.99):.1f} ms"
                )
    finally:
        with psycopg.connect(a.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    main()
