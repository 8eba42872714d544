"""Idle pickup through a shard router (issue 23): milliseconds from a send's return (its commit
on the shard) to a waiting ``receive()`` returning the message, with 1 and 8 waiters, each a
``Client(router)`` or a ``Client(router, direct=True)`` of its own (one thread each), the
producer of the same kind; one message every ``--interval`` seconds to a plain queue. For
comparison, mode ``shard``: plain clients of the shard's own DSN (a single server's wake-ups,
in the same run).

Runs on throwaway Debian PostgreSQL 15 clusters (tools/pgcluster.py: a router and two shards,
fsync and synchronous_commit on); needs root (PostgreSQL runs as the postgres OS user) and
PL/Proxy, as the shard tests do. Only public API, so the same script measures another checkout
(``PYTHONPATH=<its src>``): before wake-ups from the shards existed, a waiter found messages by
its poll (``receive(poll=...)``, 5 s by default), so use fewer rounds there.

    .venv/bin/python benchmarks/shard_wakeups.py --rounds 200
    .venv/bin/python benchmarks/shard_wakeups.py --rounds 30 --json before.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from lonnymq import Client, shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pgcluster

#: Durable commits, as a production server has them; no plpgsql_check preload.
SETTINGS = {"shared_preload_libraries": "''", "fsync": "on", "synchronous_commit": "on"}


def pickup(
    dsn: str, queue: str, direct: bool, waiters: int, rounds: int, interval: float, poll: float
) -> list[float]:
    """Milliseconds from each send's return to the receive() that returned its message."""
    sent: dict[int, float] = {}
    got: dict[int, float] = {}

    def consume() -> None:
        with Client(dsn, pool_size=1, direct=direct) as c:
            while True:
                for m in c.receive(queue, timeout=60, poll=poll):
                    if m.payload == "stop":
                        c.ack(m)
                        return
                    got[int(m.payload)] = time.monotonic()
                    c.ack(m)

    threads = [threading.Thread(target=consume) for _ in range(waiters)]
    for t in threads:
        t.start()
    with Client(dsn, pool_size=1, direct=direct) as p:
        time.sleep(1.0)  # every waiter asleep
        for i in range(rounds):
            p.send(queue, str(i))
            sent[i] = time.monotonic()
            time.sleep(interval)
        time.sleep(max(1.0, 1.5 * poll if len(got) < rounds else 0.0))
        p.send_batch(queue, ["stop"] * waiters)
    for t in threads:
        t.join()
    return sorted((got[i] - sent[i]) * 1000 for i in sent if i in got)


def summary(ms: list[float], rounds: int) -> dict[str, Any]:
    def pct(q: float) -> float:
        return round(ms[min(len(ms) - 1, int(len(ms) * q))], 1)

    return {
        "n": len(ms),
        "lost": rounds - len(ms),
        "p50": pct(0.5),
        "p99": pct(0.99),
        "max": round(ms[-1], 1),
        "mean": round(statistics.fmean(ms), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="sends per case")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between sends")
    ap.add_argument("--poll", type=float, default=5.0, help="receive(poll=...)")
    ap.add_argument("--waiters", default="1,8")
    ap.add_argument("--modes", default="router,direct,shard", help="router, direct, shard")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    pgcluster.ensure_plproxy()
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        router, a, b = (
            stack.enter_context(pgcluster.temporary_cluster(SETTINGS, install=False)) for _ in range(3)
        )
        shard.init(router.dsn, [a.dsn, b.dsn])
        for mode in args.modes.split(","):
            for waiters in (int(w) for w in args.waiters.split(",")):
                queue = f"wake_{mode}_{waiters}"
                with Client(router.dsn) as c:
                    c.create_queue(queue)
                dsn = router.dsn
                if mode == "shard":  # the queue's own shard, as a single server
                    [dsn] = [
                        s.dsn
                        for s, st in zip((a, b), shard.status(router.dsn).shards, strict=True)
                        if queue in st.queues
                    ]
                ms = pickup(dsn, queue, mode == "direct", waiters, args.rounds, args.interval, args.poll)
                case = f"{mode}, {waiters} waiter(s)"
                results[case] = summary(ms, args.rounds)
                print(case, results[case], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
