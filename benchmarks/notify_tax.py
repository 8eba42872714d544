"""The NOTIFY tax (issue 12 item 1): 8 concurrent single-message producer processes (one message
per transaction) through ``send``, with the waiter-gated wake-up (``_wake``: NOTIFY only while
a consumer waits) against the old behaviour (``SET lonnymq.wake = 'always'``: NOTIFY on every
send), interleaved and repeated; then idle pickup (a producer's commit to a waiting
``receive()`` returning) p50/p99 with 1 and 8 waiters.

    .venv/bin/python benchmarks/notify_tax.py --dsn postgresql://root@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time

import psycopg
from psycopg import sql

from lonnymq import Client

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


def pickup(dsn: str, waiters: int, rounds: int) -> list[float]:
    """Milliseconds from a send's commit to a waiting receive() returning it."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        with Client(dsn, schema=SCHEMA, pool_size=1) as c:
            while not stop.is_set():
                for m in c.receive("q", timeout=1, poll=30):
                    with lock:
                        lat.append((time.time() - float(m.payload)) * 1000)
                    c.ack(m)

    ts = [threading.Thread(target=consume) for _ in range(waiters)]
    for t in ts:
        t.start()
    with Client(dsn, schema=SCHEMA, pool_size=1) as p:
        for _ in range(rounds):
            time.sleep(0.1)  # every waiter is asleep again
            p.send("q", str(time.time()).encode())
    time.sleep(0.5)
    stop.set()
    for t in ts:
        t.join()
    return lat


def reset(dsn: str) -> None:
    with Client(dsn, schema=SCHEMA) as c:
        c.purge_queue("q")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("VACUUM {}.message").format(sql.Identifier(SCHEMA)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--producers", type=int, default=8)
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
        rates: dict[str, list[float]] = {"always": [], "waiters": []}
        for _ in range(a.repeat):
            for mode in ("always", "waiters"):  # interleaved: the machine's noise hits both
                reset(a.dsn)
                rates[mode].append(throughput(a.dsn, mode, a.producers, a.seconds))
        for mode, r in rates.items():
            print(f"{a.producers} producers, notify {mode:8}: median {statistics.median(r):7.0f}/s  runs {r}")
        ratio = statistics.median(rates["waiters"]) / statistics.median(rates["always"])
        print(f"waiter-gated / NOTIFY-every-send: {ratio:.2f}x")
        reset(a.dsn)
        for w in (1, 8):
            lat = sorted(pickup(a.dsn, w, a.rounds))
            p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
            print(f"idle pickup, {w} waiter(s): p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(lat)} messages)")
    finally:
        with psycopg.connect(a.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    main()
