"""Sharding through PL/Proxy (issue 23 item 8), side by side in one run on throwaway Debian
PostgreSQL 15 clusters (tools/pgcluster.py; fsync and synchronous_commit on, as in production):

1. The router's per-call cost: one connection, calls in sequence on a queue held by shard 0,
   made directly on the shard and through the router (send; take+ack; batch send of 100),
   interleaved rounds, medians and the router/direct ratio.
2. Scale-out: 8, 16 and 32 concurrent producers (pgbench clients, one connection each), each
   sending single messages to its own queue (``send_batch`` of one message per transaction),
   on one shard cluster and on two, each routed directly (a producer connects to the shard that
   holds its queue; two pgbench runs side by side) and through a router (one pgbench run on it).
   The same for drains (``--drain``): as many consumers, each taking one message of its own
   queue (filled beforehand) and acking it, two statements (two shard transactions, routed or
   direct), per second.

3. Direct routing (``Client(router_dsn, direct=True)``) against the router and against a plain
   client of the shard's own DSN, Python clients all: single calls in sequence on one connection
   (send; take+ack), 5 interleaved rounds, medians; and 8 concurrent producers (8 processes, one
   connection each, single-message sends, each to its own queue, 4 queues on each shard), 2
   rounds. Besides the rates, the CPU time per call of the clients and all three servers
   together (/proc), which other work on a shared machine disturbs far less than the rates.

    .venv/bin/python benchmarks/shard.py             # about two minutes; needs root (runs PostgreSQL
    .venv/bin/python benchmarks/shard.py --quick     # as the postgres OS user) and plproxy
    .venv/bin/python benchmarks/shard.py --json out.json
    .venv/bin/python benchmarks/shard.py --parts direct --json out.json   # part 3 only
    .venv/bin/python benchmarks/shard.py --parts router,scale --levels 8 --drain   # parts 1-2, drains

The numbers of the run quoted in docs/sharding.md come from the first command. On a shared
machine they move by 10-20 % from run to run: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
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
from psycopg import sql

from lonnymq import Client, shard
from lonnymq.shard import catalog as shard_catalog

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


def per_second(call: Callable[[], int], seconds: float) -> float:
    """Units per second of ``call`` (which returns how many it did), called for ``seconds``."""
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += call()
    return done / (time.perf_counter() - t0)


def one_statement(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> Callable[[], int]:
    """A call for :func:`per_second`: ``query`` with ``params`` on ``conn`` (prepared), one unit."""

    def call() -> int:
        conn.execute(query, params, prepare=True)
        return 1

    return call


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
                    results[work][mode].append(per_second(make(c), seconds))
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


def hop_floor(direct_dsn: str, router_dsn: str, seconds: float, rounds: int) -> dict[str, Any]:
    """The least a call through the router can cost over the same call made directly: a
    function that does nothing (``SELECT 1`` in SQL) on the shard, called directly and through a
    bare PL/Proxy function of the router's cluster (``RUN ON 0``: shard 0, none of LonnyMQ's
    routing), one connection each, interleaved rounds, medians. Its difference in microseconds
    is the hop's floor; a call that costs c directly can run through any router of this kind at
    most c / (c + hop) as fast."""
    noop = (
        "CREATE OR REPLACE FUNCTION public.bench_noop(p_key text) RETURNS integer LANGUAGE sql AS 'SELECT 1'"
    )
    with psycopg.connect(direct_dsn, autocommit=True) as conn:
        conn.execute(noop)
    with psycopg.connect(router_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION public.bench_noop(p_key text) RETURNS integer LANGUAGE plproxy AS"
                " $$ CLUSTER {}; RUN ON 0; $$"
            ).format(sql.Literal(shard_catalog.cluster_name("lonnymq")))
        )
    rates: dict[str, list[float]] = {"direct": [], "router": []}
    with psycopg.connect(direct_dsn, autocommit=True) as d, psycopg.connect(router_dsn, autocommit=True) as r:
        for _ in range(rounds):
            for mode, conn in (("direct", d), ("router", r)):
                rates[mode].append(
                    per_second(one_statement(conn, "SELECT public.bench_noop(%s)", ("q",)), seconds)
                )
    d_rate, r_rate = statistics.median(rates["direct"]), statistics.median(rates["router"])
    return {
        "direct_per_s": round(d_rate),
        "router_per_s": round(r_rate),
        "hop_us": round(1e6 / r_rate - 1e6 / d_rate),
    }


#: The calls whose PL/Proxy floor is measured, by their signature in the router's schema.
FLOOR_CALLS = {
    "send": "lonnymq.send(text,bytea,text,text,jsonb,bigint,bigint,smallint,text,text,text,uuid,bigint)",
    "take": "lonnymq.take(text,integer,bigint,bigint[],integer[],bigint)",
    "ack": "lonnymq.ack(text,bigint[],integer[],boolean,bigint)",
}


def call_floors(direct_dsn: str, router_dsn: str, queue: str, seconds: float, rounds: int) -> dict[str, Any]:
    """The same for the calls themselves: ``send(queue, payload)`` and a take of one message
    plus its ack, in raw SQL on the shard directly, through bare PL/Proxy functions with the
    calls' own signatures (``RUN ON 0; TARGET lonnymq.<call>``: PL/Proxy's own cost for these
    calls, their arguments and their unprepared queries on the shard, without LonnyMQ's routing
    functions), and through the router's own functions; one connection each, interleaved
    rounds, medians, microseconds a send or a take + ack (the queue refilled outside the
    timing). The queue must live on shard 0."""
    cluster = sql.Literal(shard_catalog.cluster_name("lonnymq"))
    with psycopg.connect(router_dsn, autocommit=True) as conn:
        for name, signature in FLOOR_CALLS.items():
            args, result = conn.execute(
                "SELECT pg_get_function_arguments(%s::regprocedure), pg_get_function_result(%s::regprocedure)",
                (signature, signature),
            ).fetchone() or ("", "")
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE FUNCTION public.{}({}) RETURNS {} LANGUAGE plproxy AS"
                    " $$ CLUSTER {}; RUN ON 0; TARGET lonnymq.{}; $$"
                ).format(
                    sql.Identifier(f"bench_{name}"),
                    sql.SQL(args),
                    sql.SQL(result),
                    cluster,
                    sql.SQL(name),  # PL/Proxy's TARGET takes no quoted name (FLOOR_CALLS' keys)
                )
            )
    #: Each way's DSN and the function it calls for a call ``{}``.
    modes = {
        "direct": (direct_dsn, "lonnymq.{}"),
        "bare PL/Proxy": (router_dsn, "public.bench_{}"),
        "router": (router_dsn, "lonnymq.{}"),
    }
    us: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in ("send", "take+ack")}
    conns = {mode: psycopg.connect(dsn, autocommit=True) for mode, (dsn, _) in modes.items()}
    refill = psycopg.connect(direct_dsn, autocommit=True)
    try:
        for _ in range(rounds):
            for mode, (_, function) in modes.items():
                conn = conns[mode]
                send = one_statement(
                    conn, f"SELECT * FROM {function.format('send')}(%s, %s)", (queue, b'{"n": 1}')
                )
                us["send"][mode].append(1e6 / per_second(send, seconds))
                take = f"SELECT id, token FROM {function.format('take')}(%s, 1)"
                ack = f"SELECT * FROM {function.format('ack')}(%s, %s, %s)"
                n, spent = 0, 0.0
                while spent < seconds:
                    t0 = time.perf_counter()
                    got = conn.execute(take, (queue,), prepare=True).fetchall()
                    if got:
                        conn.execute(ack, (queue, [got[0][0]], [got[0][1]]), prepare=True)
                        spent += time.perf_counter() - t0
                        n += 1
                    else:  # refill, untimed
                        refill.execute(
                            "SELECT count(*) FROM lonnymq.send_batch(%s, %s)", (queue, [b'{"n": 1}'] * 500)
                        )
                us["take+ack"][mode].append(1e6 * spent / max(n, 1))
    finally:
        for conn in (*conns.values(), refill):
            conn.close()
    out: dict[str, Any] = {}
    for work, by_mode in us.items():
        r = {f"{mode}_us": round(statistics.median(v)) for mode, v in by_mode.items()}
        r["ceiling"] = round(r["direct_us"] / r["bare PL/Proxy_us"], 3)
        r["router / direct"] = round(r["direct_us"] / r["router_us"], 3)
        r["router / bare PL/Proxy"] = round(r["bare PL/Proxy_us"] / r["router_us"], 3)
        out[work] = r
    return out


# -- 2. scale-out ------------------------------------------------------------------------------

#: One single-message send per transaction, client i to its own queue PREFIX<i> (pgbench: C, so the
#: load generator is not what saturates first on a small machine, as a Python process would).
SCRIPT = "SELECT id FROM lonnymq.send_batch('{prefix}' || :client_id, ARRAY['{{\"n\": 1}}'::bytea]);\n"


#: A drain: take one message of queue PREFIX<i> and ack it (two statements, two transactions,
#: as a consumer makes them). The queues are filled beforehand well beyond what a run drains;
#: an empty take would ack nothing (id 0) and is checked for after the run.
DRAIN_SCRIPT = (
    "SELECT coalesce(max(t.id), 0) AS mid, coalesce(max(t.token), 0) AS mtok"
    " FROM lonnymq.take('{prefix}' || :client_id, 1) AS t \\gset\n"
    "SELECT count(*) FROM lonnymq.ack('{prefix}' || :client_id, ARRAY[:mid]::bigint[], ARRAY[:mtok]::integer[]);\n"
)

#: The floor of the producers' case: the same single-message transactions with nothing of
#: LonnyMQ's, one bare INSERT of the same payload into a plain table of the shard's database
#: (one row per transaction, durable commits as configured): what one cluster and two clusters
#: on this machine allow, measured in the same run.
FLOOR_SCRIPT = (
    "INSERT INTO public.bench_floor (client, payload) VALUES (:client_id, '{{\"n\": 1}}'::bytea);\n"
)


def create_floor(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.bench_floor"
            " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, client integer, payload bytea)"
        )


#: Messages put in each queue before a drain (a run drains far fewer).
DRAIN_FILL = 4000


def fill(dsn: str, prefix: str, n: int, per_queue: int) -> None:
    with Client(dsn) as c:
        for i in range(n):
            c.purge_queue(f"{prefix}{i}")
            for _ in range(per_queue // 1000):
                c.send_batch(f"{prefix}{i}", [b"1"] * 1000)


def min_ready(dsn: str, prefix: str, n: int) -> int:
    with Client(dsn) as c:
        return min(c.metrics(f"{prefix}{i}").ready for i in range(n))


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


def pgbench(runs: list[tuple[str, str, int]], seconds: float, workdir: Path, template: str = SCRIPT) -> float:
    """Sum of the transactions per second of concurrent pgbench runs, each (dsn, prefix, clients),
    each client running ``template`` (default: a single-message send)."""
    procs = []
    for k, (dsn, prefix, clients) in enumerate(runs):
        script = workdir / f"send_{k}.sql"
        script.write_text(template.format(prefix=prefix))
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


# -- 3. direct routing ------------------------------------------------------------------------

#: The three ways a Python client reaches a queue's shard.
MODES = ("shard", "router", "direct")


def _client(mode: str, router_dsn: str, shard_dsn: str) -> Client:
    if mode == "shard":
        return Client(shard_dsn, pool_size=1)
    return Client(router_dsn, pool_size=1, direct=mode == "direct")


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(clusters: list[pgcluster.Cluster]) -> float:
    """CPU time (user + system) of this process and of every process of ``clusters`` (the
    postmasters and their children: backends, PL/Proxy's connections): what the calls cost the
    machine, whatever else runs on it."""
    masters = {int((c.datadir / "postmaster.pid").read_text().split()[0]) for c in clusters}
    total = time.process_time()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid in masters or ppid in masters:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def direct_calls(
    router_dsn: str,
    shard_dsn: str,
    queue: str,
    seconds: float,
    rounds: int,
    clusters: list[pgcluster.Cluster],
) -> dict[str, Any]:
    """ops/s of single calls in sequence, per mode (medians of ``rounds`` interleaved rounds),
    and the CPU time per call of the client and the servers together."""
    clients = {m: _client(m, router_dsn, shard_dsn) for m in MODES}

    def send(c: Client) -> int:
        c.send(queue, {"n": 1})
        return 1

    def take_ack(c: Client) -> int:
        got = c.take(queue)
        if not got:
            c.send_batch(queue, [{"n": 1}] * 200)
            return 0
        c.ack(got[0])
        return 1

    works: dict[str, Callable[[Client], int]] = {"send": send, "take+ack": take_ack}
    rates: dict[str, dict[str, list[float]]] = {w: {m: [] for m in MODES} for w in works}
    cpu: dict[str, dict[str, list[float]]] = {w: {m: [] for m in MODES} for w in works}
    try:
        for c in clients.values():
            c.open()
            c.send(queue, {"n": 0})  # connected (and, direct, the map and the route read) before
        for _ in range(rounds):
            for work, fn in works.items():
                for mode, c in clients.items():
                    done = 0
                    c0 = cpu_seconds(clusters)
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < seconds:
                        done += fn(c)
                    rates[work][mode].append(done / (time.perf_counter() - t0))
                    cpu[work][mode].append((cpu_seconds(clusters) - c0) / max(done, 1))
    finally:
        for c in clients.values():
            c.close()
    out: dict[str, Any] = {}
    for work, by_mode in rates.items():
        med = {m: statistics.median(v) for m, v in by_mode.items()}
        out[work] = {
            **{f"{m}_per_s": round(med[m]) for m in MODES},
            **{f"{m}_us": round(1e6 / med[m]) for m in MODES},
            **{f"{m}_cpu_us": round(1e6 * statistics.median(cpu[work][m])) for m in MODES},
            "direct / router": round(med["direct"] / med["router"], 2),
            "direct / shard": round(med["direct"] / med["shard"], 2),
            "router / shard": round(med["router"] / med["shard"], 2),
        }
    return out


def _producer(
    mode: str, router_dsn: str, shard_dsn: str, queue: str, seconds: float, start: Any, done: Any
) -> None:
    with _client(mode, router_dsn, shard_dsn) as c:
        c.send(queue, {"n": 0})  # connected, map and route read
        start.wait()
        n = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            c.send(queue, {"n": 1})
            n += 1
        done.put((n, time.perf_counter() - t0, time.process_time() - c0))


def direct_producers(
    router_dsn: str,
    shard_dsns: list[str],
    n: int,
    seconds: float,
    rounds: int,
    clusters: list[pgcluster.Cluster],
) -> dict[str, Any]:
    """messages/s of ``n`` concurrent single-message producers (processes), per mode, and the
    CPU time per message of the producers and the servers together."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    prefix = balanced_prefix(router_dsn, n, len(shard_dsns), f"dp{n}x")
    queues = [f"{prefix}{i}" for i in range(n)]
    create_queues(router_dsn, prefix, n)
    homes = [home(router_dsn, q, len(shard_dsns)) for q in queues]
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            start, done = ctx.Barrier(n + 1), ctx.Queue()
            procs = [
                ctx.Process(
                    target=_producer,
                    args=(mode, router_dsn, shard_dsns[h], q, seconds, start, done),
                )
                for q, h in zip(queues, homes, strict=True)
            ]
            for p in procs:
                p.start()
            start.wait(timeout=120)
            s0 = cpu_seconds(clusters) - time.process_time()
            got = [done.get(timeout=120) for _ in procs]
            servers = cpu_seconds(clusters) - time.process_time() - s0
            for p in procs:
                p.join(30)
            sent = sum(g[0] for g in got)
            rates[mode].append(sum(g[0] / g[1] for g in got))
            cpu[mode].append((servers + sum(g[2] for g in got)) / max(sent, 1))
    med = {m: statistics.median(v) for m, v in rates.items()}
    return {
        **{f"{m}_per_s": round(med[m]) for m in MODES},
        **{f"{m}_cpu_us": round(1e6 * statistics.median(cpu[m])) for m in MODES},
        "direct / router": round(med["direct"] / med["router"], 2),
        "direct / shard": round(med["direct"] / med["shard"], 2),
        "router / shard": round(med["router"] / med["shard"], 2),
    }


def print_direct(results: dict[str, Any]) -> None:
    print("\n3. direct=True vs the router vs the shard's own DSN (Python clients)")
    print(f"{'':<22}{'shard':>9}{'router':>9}{'direct':>9}{'d/router':>10}{'d/shard':>9}{'r/shard':>9}")
    rows = [(f"{w} /s (1 conn)", r) for w, r in results["calls"].items()]
    rows.append((f"{results['producers_n']} producers msg/s", results["producers"]))
    for name, r in rows:
        print(
            f"{name:<22}{r['shard_per_s']:>9}{r['router_per_s']:>9}{r['direct_per_s']:>9}"
            f"{r['direct / router']:>10}{r['direct / shard']:>9}{r['router / shard']:>9}"
        )
    print("CPU per call (per message), clients + router + shards (us):")
    for name, r in rows:
        print(f"  {name:<20}" + "".join(f"{m} {r[f'{m}_cpu_us']:>6}   " for m in MODES))
    print(f"load average {results['load_average_before']:.1f} -> {results['load_average_after']:.1f}")


def _ratios(row: dict[str, float]) -> None:
    if "floor, 1 cluster" in row:
        row["floor 2 clusters / 1"] = round(row["floor, 2 clusters"] / row["floor, 1 cluster"], 2)
    row["2 clusters / 1, direct"] = round(row["2 clusters, direct"] / row["1 cluster, direct"], 2)
    row["2 clusters / 1, router"] = round(row["2 clusters, router"] / row["1 cluster, router"], 2)
    row["router / direct, 2 clusters"] = round(row["2 clusters, router"] / row["2 clusters, direct"], 2)


def _table(title: str, what: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    cols = list(next(iter(rows.values())).keys())
    widths = [max(len(c), 8) + 2 for c in cols]
    print(f"{what:<10}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for n, row in rows.items():
        print(f"{n:<10}" + "".join(f"{row[c]:>{w}}" for c, w in zip(cols, widths, strict=True)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short cases (a smoke run)")
    ap.add_argument("--levels", default="8,16,32", help="producer counts (default 8,16,32)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument(
        "--parts", default="router,scale,direct", help="parts to run (default router,scale,direct)"
    )
    ap.add_argument("--producers", type=int, default=8, help="producers of part 3 (default 8)")
    ap.add_argument("--drain", action="store_true", help="part 2 also for drains (take 1 + ack)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
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
        if "router" in parts:
            print("per-call cost (direct on shard 0 vs through the router)...", file=sys.stderr)
            load = os.getloadavg()[0]
            results["per_call"] = per_call(a.dsn, router.dsn, q0, call_seconds, rounds)
            results["hop_floor"] = hop = hop_floor(a.dsn, router.dsn, call_seconds, rounds)
            results["call_floors"] = call_floors(a.dsn, router.dsn, q0, call_seconds, rounds)
            for r in results["per_call"].values():
                # The best router/direct ratio a call of this direct cost allows (the floor's hop).
                r["ceiling"] = round(r["direct_us_per_call"] / (r["direct_us_per_call"] + hop["hop_us"]), 3)
            results["per_call_load_average"] = [load, os.getloadavg()[0]]
        if "direct" in parts:
            print("direct=True: single calls...", file=sys.stderr)
            q1 = queue_on(router.dsn, 0, 2, "dcall", taken)
            with Client(router.dsn) as c:
                c.create_queue(q1)
            direct: dict[str, Any] = {
                "calls": direct_calls(
                    router.dsn, a.dsn, q1, call_seconds, 1 if args.quick else 5, [router, a, b]
                ),
                "load_average_before": os.getloadavg()[0],
            }
            print(f"direct=True: {args.producers} producers...", file=sys.stderr)
            direct["producers_n"] = args.producers
            direct["producers"] = direct_producers(
                router.dsn, [a.dsn, b.dsn], args.producers, seconds, 1 if args.quick else 2, [router, a, b]
            )
            direct["load_average_after"] = os.getloadavg()[0]
            results["direct"] = direct

        scale: dict[str, dict[str, float]] = {}
        drains: dict[str, dict[str, float]] = {}
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lonnymq-shard-bench-")))
        if "scale" in parts:
            for dsn in (a.dsn, b.dsn):
                create_floor(dsn)
        for n in levels if "scale" in parts else []:
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
            row: dict[str, float] = {"load average before": os.getloadavg()[0]}
            for name, runs in cases.items():
                print(f"{n} producers, {name}...", file=sys.stderr)
                row[name] = round(pgbench(runs, seconds, workdir))
            floors = {
                "floor, 1 cluster": [(a.dsn, "", n)],
                "floor, 2 clusters": [(a.dsn, "", n // 2), (b.dsn, "", n // 2)],
            }
            for name, runs in floors.items():
                print(f"{n} producers, {name}...", file=sys.stderr)
                row[name] = round(pgbench(runs, seconds, workdir, FLOOR_SCRIPT))
            _ratios(row)
            row["load average after"] = os.getloadavg()[0]
            scale[str(n)] = row
            if args.drain:
                drow: dict[str, float] = {"load average before": os.getloadavg()[0]}
                for name, runs in cases.items():
                    for dsn, prefix, k in runs:
                        fill(dsn, prefix, k, DRAIN_FILL)
                    print(f"{n} consumers (drain), {name}...", file=sys.stderr)
                    drow[name] = round(pgbench(runs, seconds, workdir, DRAIN_SCRIPT))
                    drow["least left in a queue"] = min(
                        [min_ready(dsn, prefix, k) for dsn, prefix, k in runs]
                        + [int(drow.get("least left in a queue", DRAIN_FILL))]
                    )
                _ratios(drow)
                drow["load average after"] = os.getloadavg()[0]
                drains[str(n)] = drow
        results["scale"] = scale
        results["drains"] = drains

    if "per_call" in results:
        print("\n1. per call, one connection, queue on shard 0 (ops/s; us per message)")
        print(
            f"{'call':<18}{'direct':>10}{'router':>10}{'ratio':>8}{'direct us':>11}{'router us':>11}"
            f"{'ceiling':>9}{'ratio/ceiling':>15}"
        )
        for work, r in results["per_call"].items():
            print(
                f"{work:<18}{r['direct_per_s']:>10}{r['router_per_s']:>10}{r['ratio']:>8}"
                f"{r['direct_us_per_call']:>11}{r['router_us_per_call']:>11}{r['ceiling']:>9}"
                f"{round(r['ratio'] / r['ceiling'], 3):>15}"
            )
        hop = results["hop_floor"]
        print(
            f"hop floor: a no-op function {hop['direct_per_s']}/s direct, {hop['router_per_s']}/s through a bare"
            f" PL/Proxy function: {hop['hop_us']} us a call (ceiling = direct us / (direct us + hop))"
        )
        for work, sf in results["call_floors"].items():
            print(
                f"{work} in raw SQL: {sf['direct_us']} us direct, {sf['bare PL/Proxy_us']} us through bare"
                f" PL/Proxy functions (ceiling {sf['ceiling']}), {sf['router_us']} us through the router:"
                f" router / direct {sf['router / direct']}, router / bare PL/Proxy {sf['router / bare PL/Proxy']}"
            )
    if scale:
        _table("2. single-message producers, messages/s", "producers", scale)
    if drains:
        _table("2b. drains (take 1 + ack), messages/s", "consumers", drains)
    if "direct" in results:
        print_direct(results["direct"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
