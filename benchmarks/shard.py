"""Sharding through PL/Proxy (issue 23 item 8), side by side in one run on throwaway Debian
PostgreSQL 15 clusters (tools/pgcluster.py; fsync and synchronous_commit on, as in production):

1. The router's per-call cost: one connection, calls in sequence on a queue held by shard 0,
   made directly on the shard and through the router (send; take+ack; batch send of 100),
   interleaved rounds, medians and the router/direct ratio.
2. Scale-out: 8, 16 and 32 concurrent producers (pgbench clients, one connection each), each
   sending single messages to its own queue (``send_batch`` of one message per transaction),
   on one shard cluster and on two, each routed directly (a producer connects to the shard that
   holds its queue; two pgbench runs side by side) and through a router (one pgbench run on it).

    .venv/bin/python benchmarks/shard.py             # about a minute; needs root (runs PostgreSQL
    .venv/bin/python benchmarks/shard.py --quick     # as the postgres OS user) and plproxy
    .venv/bin/python benchmarks/shard.py --json out.json

The numbers of the run quoted in docs/sharding.md come from the first command. On a shared
machine they move by 10-20 % from run to run: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

from lonnymq import Client, shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pgcluster

#: Durable commits, as a production server has them; no plpgsql_check preload.
SETTINGS = {
    "shared_preload_libraries": "''",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}


def home(router_dsn: str, queue: str, shards: int) -> int:
    with psycopg.connect(router_dsn) as conn:
        row = conn.execute("SELECT hashtext(%s) & %s", (queue, shards - 1)).fetchone()
    assert row is not None
    return int(row[0])


def queue_on(router_dsn: str, shard_index: int, shards: int, prefix: str, taken: set[str]) -> str:
    i = 0
    while True:
        name = f"{prefix}_{i}"
        if name not in taken and home(router_dsn, name, shards) == shard_index:
            taken.add(name)
            return name
        i += 1


# -- 1. per-call cost --------------------------------------------------------------------------


def per_call(direct_dsn: str, router_dsn: str, queue: str, seconds: float, rounds: int) -> dict[str, Any]:
    """ops/s of each call made directly and through the router (medians of ``rounds``)."""
    clients = {"direct": Client(direct_dsn, pool_size=1), "router": Client(router_dsn, pool_size=1)}

    def send(c: Client) -> Callable[[], int]:
        return lambda: (c.send(queue, {"n": 1}), 1)[1]

    def take_ack(c: Client) -> Callable[[], int]:
        def run() -> int:
            got = c.take(queue)
            if not got:
                c.send_batch(queue, [{"n": 1}] * 200)
                return 0
            c.ack(got[0])
            return 1

        return run

    def batch(c: Client) -> Callable[[], int]:
        return lambda: (c.send_batch(queue, [{"n": 1}] * 100), 100)[1]

    works = {"send": send, "take+ack": take_ack, "batch send (100)": batch}
    results: dict[str, dict[str, list[float]]] = {w: {m: [] for m in clients} for w in works}
    try:
        for c in clients.values():
            c.open()
            c.metrics(queue)  # connect before measuring
        for _ in range(rounds):
            for work, make in works.items():
                for mode, c in clients.items():
                    fn = make(c)
                    done = 0
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < seconds:
                        done += fn()
                    results[work][mode].append(done / (time.perf_counter() - t0))
                    if work.startswith("batch"):
                        clients["direct"].purge_queue(queue)
    finally:
        for c in clients.values():
            c.close()
    out: dict[str, Any] = {}
    for work, modes in results.items():
        d, r = statistics.median(modes["direct"]), statistics.median(modes["router"])
        out[work] = {
            "direct_per_s": round(d),
            "router_per_s": round(r),
            "ratio": round(r / d, 3),
            "direct_us_per_call": round(1e6 / d * (100 if work.startswith("batch") else 1)),
            "router_us_per_call": round(1e6 / r * (100 if work.startswith("batch") else 1)),
        }
    return out


# -- 2. scale-out ------------------------------------------------------------------------------

#: One single-message send per transaction, client i to its own queue PREFIX<i> (pgbench: C, so the
#: load generator is not what saturates first on a small machine, as a Python process would).
SCRIPT = "SELECT id FROM lonnymq.send_batch('{prefix}' || :client_id, ARRAY['{{\"n\": 1}}'::bytea]);\n"


def balanced_prefix(router_dsn: str, n: int, shards: int, stem: str) -> str:
    """A prefix P such that the queues P0..P(n-1) split evenly over the router's shards."""
    with psycopg.connect(router_dsn) as conn:
        for k in range(10_000):
            prefix = f"{stem}{k}_"
            counts = conn.execute(
                "SELECT count(*) FROM generate_series(0, %s - 1) AS i GROUP BY hashtext(%s || i) & %s",
                (n, prefix, shards - 1),
            ).fetchall()
            if len(counts) == shards and all(c[0] == n // shards for c in counts):
                return prefix
    raise RuntimeError("no balanced prefix found")


def create_queues(dsn: str, prefix: str, n: int) -> None:
    with Client(dsn) as c:
        for i in range(n):
            c.create_queue(f"{prefix}{i}", if_not_exists=True)


def pgbench(runs: list[tuple[str, str, int]], seconds: float, workdir: Path) -> float:
    """Sum of the transactions per second of concurrent pgbench runs, each (dsn, prefix, clients)."""
    procs = []
    for k, (dsn, prefix, clients) in enumerate(runs):
        script = workdir / f"send_{k}.sql"
        script.write_text(SCRIPT.format(prefix=prefix))
        argv = [
            str(pgcluster.BINDIR / "pgbench"),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(max(1, round(seconds))),
            "-f",
            str(script),
            dsn,
        ]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    total = 0.0
    for p in procs:
        out, err = p.communicate(timeout=120)
        m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
        if p.returncode != 0 or m is None:
            raise RuntimeError(f"pgbench failed ({p.returncode}):\n{out}{err}")
        total += float(m.group(1))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short cases (a smoke run)")
    ap.add_argument("--levels", default="8,16,32", help="producer counts (default 8,16,32)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    seconds = 1 if args.quick else 3
    call_seconds = 0.2 if args.quick else 0.7
    rounds = 1 if args.quick else 3
    levels = [int(x) for x in args.levels.split(",")]
    pgcluster.ensure_plproxy()
    results: dict[str, Any] = {"settings": SETTINGS, "levels": levels}
    with ExitStack() as stack:
        t0 = time.perf_counter()
        router, a, b = (
            stack.enter_context(pgcluster.temporary_cluster(SETTINGS, install=False)) for _ in range(3)
        )
        # A second router database on the router's server, over shard a alone: one cluster,
        # through a router.
        with psycopg.connect(router.admin_dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE router1")
        router1 = router.admin_dsn().rsplit("/", 1)[0] + "/router1"
        shard.init(router.dsn, [a.dsn, b.dsn])
        shard.init(router1, [a.dsn])
        print(f"clusters and routers ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

        taken: set[str] = set()
        q0 = queue_on(router.dsn, 0, 2, "call", taken)
        with Client(router.dsn) as c:
            c.create_queue(q0)
        print("per-call cost (direct on shard 0 vs through the router)...", file=sys.stderr)
        results["per_call"] = per_call(a.dsn, router.dsn, q0, call_seconds, rounds)

        scale: dict[str, dict[str, float]] = {}
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lonnymq-shard-bench-")))
        for n in levels:
            both = balanced_prefix(router.dsn, n, 2, f"p{n}x")  # n/2 queues on each shard
            create_queues(router.dsn, both, n)
            create_queues(router1, f"one{n}_", n)  # router1 has one shard: all on a
            create_queues(a.dsn, f"a{n}_", n // 2)
            create_queues(b.dsn, f"b{n}_", n // 2)
            cases = {
                "1 cluster, direct": [(a.dsn, f"one{n}_", n)],
                "1 cluster, router": [(router1, f"one{n}_", n)],
                "2 clusters, direct": [(a.dsn, f"a{n}_", n // 2), (b.dsn, f"b{n}_", n // 2)],
                "2 clusters, router": [(router.dsn, both, n)],
            }
            row: dict[str, float] = {}
            for name, runs in cases.items():
                print(f"{n} producers, {name}...", file=sys.stderr)
                row[name] = round(pgbench(runs, seconds, workdir))
            row["2 clusters / 1, direct"] = round(row["2 clusters, direct"] / row["1 cluster, direct"], 2)
            row["2 clusters / 1, router"] = round(row["2 clusters, router"] / row["1 cluster, router"], 2)
            row["router / direct, 2 clusters"] = round(
                row["2 clusters, router"] / row["2 clusters, direct"], 2
            )
            scale[str(n)] = row
        results["scale"] = scale

    print("\n1. per call, one connection, queue on shard 0 (ops/s; us per message)")
    print(f"{'call':<18}{'direct':>10}{'router':>10}{'ratio':>8}{'direct us':>11}{'router us':>11}")
    for work, r in results["per_call"].items():
        print(
            f"{work:<18}{r['direct_per_s']:>10}{r['router_per_s']:>10}{r['ratio']:>8}"
            f"{r['direct_us_per_call']:>11}{r['router_us_per_call']:>11}"
        )
    print("\n2. single-message producers, messages/s")
    cols = list(next(iter(scale.values())).keys())
    widths = [max(len(c), 8) + 2 for c in cols]
    print(f"{'producers':<10}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for n, row in scale.items():
        print(f"{n:<10}" + "".join(f"{row[c]:>{w}}" for c, w in zip(cols, widths, strict=True)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
