"""Moving a queue between shards under traffic (issue 23 item 5, ``lonnymq.shard.move``): the
pause it causes, on throwaway Debian PostgreSQL 15 clusters (tools/pgcluster.py; a router and
two shards, fsync and synchronous_commit on).

For each backlog size, a queue on shard 0 gets that many messages (a tenth of them leased, so
leases move too), then a producer (single sends) and a consumer (take 10, ack) run through the
router while the queue moves to shard 1. Reported: the pause (``MoveResult.pause_ms``: from
asking for the queue's fence to releasing it), the longest call of the producer and consumer
that overlapped the move, and the rows moved. Also the router's routing cost per call:
``_shard_of(queue)`` (override lookup and fence) against the bare ``hashtext(queue)`` it
replaced, in a server-side loop. Last, ``shard add`` from two shards to four (new databases on
the same two clusters) with ``--queues`` queues of ``--add-backlog`` messages each, a producer
and a consumer on one queue that moves: total time, queues moved, the longest pause of one
queue and the longest call of that queue's clients.

    .venv/bin/python benchmarks/shard_move.py                 # about half a minute
    .venv/bin/python benchmarks/shard_move.py --backlogs 0 1000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lonnymq import Client, shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pgcluster

SETTINGS = {
    "shared_preload_libraries": "''",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}


def queue_on(router_dsn: str, shard_index: int, prefix: str) -> str:
    with psycopg.connect(router_dsn) as conn:
        i = 0
        while True:
            row = conn.execute("SELECT hashtext(%s) & 1", (f"{prefix}{i}",)).fetchone()
            if row is not None and row[0] == shard_index:
                return f"{prefix}{i}"
            i += 1


class Traffic:
    def __init__(self, dsn: str, queue: str) -> None:
        self.dsn, self.queue = dsn, queue
        self.stop = threading.Event()
        self.calls: list[tuple[float, float]] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self.produce, self.consume)]

    def timed(self, f: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return f(*args)
        finally:
            self.calls.append((t0, time.monotonic() - t0))

    def produce(self) -> None:
        try:
            with Client(self.dsn, pool_size=1) as c:
                while not self.stop.is_set():
                    self.timed(c.send, self.queue, {"p": 1})
        except BaseException as e:
            self.errors.append(e)

    def consume(self) -> None:
        try:
            with Client(self.dsn, pool_size=1) as c:
                while not self.stop.is_set():
                    got = self.timed(c.take, self.queue, 10)
                    if got:
                        self.timed(c.ack, got)
                    else:
                        time.sleep(0.005)
        except BaseException as e:
            self.errors.append(e)

    def longest(self, start: float, end: float) -> float:
        return max((d for t, d in self.calls if t <= end and t + d >= start), default=0.0)


def one_move(router: str, backlog: int) -> dict[str, Any]:
    q = queue_on(router, 0, f"bench_move_{backlog}_")
    with Client(router) as c:
        c.create_queue(q, lease=600)
        for i in range(0, backlog, 1000):
            c.send_batch(q, [{"b": j} for j in range(i, min(backlog, i + 1000))])
        for _ in range(backlog // 10 // 100):
            c.take(q, 100)  # leased for 10 minutes: they move with their lease
    traffic = Traffic(router, q)
    for t in traffic.threads:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    result = shard.move(router, q, 1)
    t1 = time.monotonic()
    time.sleep(1.0)
    traffic.stop.set()
    for t in traffic.threads:
        t.join(30)
    if traffic.errors:
        raise traffic.errors[0]
    before = [d for t, d in traffic.calls if t + d < t0]
    return {
        "backlog": backlog,
        "rows_moved": result.rows["message"],
        "pause_ms": round(result.pause_ms, 1),
        "move_call_ms": round((t1 - t0) * 1000, 1),
        "longest_call_during_ms": round(traffic.longest(t0, t1) * 1000, 1),
        "median_call_before_ms": round(sorted(before)[len(before) // 2] * 1000, 2) if before else None,
        "attempts": result.attempts,
    }


def grow(router: str, shard_dsns: list[str], queues: int, backlog: int) -> dict[str, Any]:
    """``shard add`` 2 -> 4 under traffic on one moving queue."""
    new = []
    for i, dsn in enumerate(shard_dsns):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"bench_grow_{i}")))
        new.append(make_conninfo(dsn, dbname=f"bench_grow_{i}"))
    names = [f"bench_grow_q{i}" for i in range(queues)]
    with Client(router) as c:
        for n in names:
            c.create_queue(n)
            for i in range(0, backlog, 1000):
                c.send_batch(n, [{"b": j} for j in range(i, min(backlog, i + 1000))])
    with psycopg.connect(router) as conn:
        busy = next(
            n for n in names if conn.execute("SELECT hashtext(%s) & 3 >= 2", (n,)).fetchone() == (True,)
        )
    traffic = Traffic(router, busy)
    for t in traffic.threads:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    result = shard.add(router, new)
    t1 = time.monotonic()
    time.sleep(0.5)
    traffic.stop.set()
    for t in traffic.threads:
        t.join(30)
    if traffic.errors:
        raise traffic.errors[0]
    return {
        "queues": queues,
        "backlog_each": backlog,
        "queues_moved": sum(len(m.queues) for m in result.moved),
        "failed": len(result.failed),
        "add_seconds": round(t1 - t0, 2),
        "longest_pause_ms": round(max((m.pause_ms for m in result.moved), default=0.0), 1),
        "longest_call_of_moving_queue_ms": round(traffic.longest(t0, t1) * 1000, 1),
    }


def routing_cost(router: str, n: int = 100_000) -> dict[str, float]:
    """µs per call of the RUN ON expression, old (hashtext) and new (_shard_of), in a loop."""
    out = {}
    with psycopg.connect(router, autocommit=True) as conn:
        for name, expr in (("hashtext", "hashtext('q')"), ("_shard_of", "lonnymq._shard_of('q')")):
            t0 = time.perf_counter()
            conn.execute(
                f"DO $$ BEGIN FOR i IN 1..{n} LOOP PERFORM {expr}; END LOOP; END $$"  # constants only
            )
            out[name] = round((time.perf_counter() - t0) / n * 1e6, 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlogs", type=int, nargs="+", default=[0, 1_000, 10_000, 100_000])
    p.add_argument("--queues", type=int, default=20, help="queues for the shard add run")
    p.add_argument("--add-backlog", type=int, default=1000, help="messages per queue for the shard add run")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    pgcluster.ensure_plproxy()
    with ExitStack() as stack:
        router, a, b = (
            stack.enter_context(pgcluster.temporary_cluster(SETTINGS, install=False)) for _ in range(3)
        )
        shard.init(router.dsn, [a.dsn, b.dsn])
        rows = [one_move(router.dsn, n) for n in args.backlogs]
        cost = routing_cost(router.dsn)
        added = grow(router.dsn, [a.dsn, b.dsn], args.queues, args.add_backlog)
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"routing expression per call (µs): {cost}")
    print(f"shard add 2 -> 4: {added}")
    if args.json:
        args.json.write_text(json.dumps({"moves": rows, "routing_us": cost, "add": added}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
