"""Held-snapshot benchmark (issue 17): a fixed offered load while vacuum is held back.

One connection opens ``REPEATABLE READ``, reads one of the system's tables and keeps that
snapshot for the whole run, so no row deleted or updated after it can be vacuumed. Meanwhile a
producer sends at a fixed offered rate (``--rate`` msg/s, in small batches every 10 ms) and
``--consumers`` processes lease and acknowledge ``--take`` messages per call, as fast as they
can. Every ``--interval`` seconds it reports, per system: offered, sent and consumed msg/s,
backlog, take-call latency p50/p99 (calls that returned messages), dead and live tuples
(``pg_stat_user_tables``) and table + index size of the system's tables (partitions included).

    python benchmarks/held_snapshot.py [--dsn URI] [--systems lonnymq,pgmq,pgqueuer]
        [--rate 2000] [--minutes 10] [--interval 60] [--take 10] [--consumers 2] [--quick]

Systems run one after the other, each in its own scratch database (``<db-prefix>_<system>``)
on the same server (default: a throwaway embedded PostgreSQL). Results go to a table on
stdout and to ``--out`` (JSON). The consumer per system:

* LonnyMQ: ``take(n, ack=previous)`` through the sync client (lease + ack of the previous
  batch in one round trip);
* pgmq: ``read(vt=30, qty=n)`` then ``delete(ids)``;
* PgQueuer: its own ``QueueManager`` loop with ``batch_size=n``; the timed call is its
  ``Queries.dequeue`` (PgQueuer acknowledges through its buffered log).

The load engine (``run_held``) takes any ``Adapter``; docs/storage/proto.py drives storage
prototypes through it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from lonnymq_bench import harness
from lonnymq_bench.harness import payload, percentile
from lonnymq_bench.server import dsn_or_temporary
from lonnymq_bench.systems import load

#: (dsn) -> (send a list of payloads in one transaction, close)
SenderFactory = Callable[[str], tuple[Callable[[list[dict[str, Any]]], Any], Callable[[], None]]]
#: (dsn, n, stop event) -> list of (time.time() at the end of a take call, messages, seconds)
ConsumerRun = Callable[[str, int, Any], list[tuple[float, int, float]]]
#: (dsn) -> (one maintenance pass, close); run every ``maintain_every`` seconds
MaintainFactory = Callable[[str], tuple[Callable[[], Any], Callable[[], None]]]


@dataclass
class Adapter:
    """What the load engine needs from a system."""

    name: str
    what: str  # the consumer call, for the report
    tables: Sequence[str]  # "schema.table" (partitioned parents include their partitions)
    sender: SenderFactory
    consumer: ConsumerRun
    maintain: MaintainFactory | None = None
    maintain_every: float = 1.0


@dataclass
class Config:
    rate: float = 2000.0
    minutes: float = 10.0
    interval: float = 60.0
    take: int = 10
    consumers: int = 2

    @classmethod
    def quick(cls) -> Config:
        return cls(rate=200.0, minutes=0.25, interval=5.0, take=10, consumers=1)


# -- the systems ---------------------------------------------------------------------------


def _lonnymq_consumer(dsn: str, n: int, stop: Any) -> list[tuple[float, int, float]]:
    from lonnymq_bench.systems.lonnymq import QUEUE, _client

    c, conn = _client(dsn)
    calls = []
    prev: list[Any] = []
    while not stop.is_set():
        t = time.perf_counter()
        got = c.take(QUEUE, n, ack=prev)
        calls.append((time.time(), len(got), time.perf_counter() - t))
        prev = got
        if not got:
            time.sleep(0.005)
    if prev:
        c.ack(prev)
    conn.close()
    return calls


def _pgmq_consumer(dsn: str, n: int, stop: Any) -> list[tuple[float, int, float]]:
    from lonnymq_bench.systems.pgmq import DELETE_MANY, QUEUE, READ, VT

    c = psycopg.connect(dsn, autocommit=True)
    calls = []
    while not stop.is_set():
        t = time.perf_counter()
        rows = c.execute(READ, [QUEUE, VT, n]).fetchall()
        if rows:
            c.execute(DELETE_MANY, [QUEUE, [r[0] for r in rows]]).fetchall()
        calls.append((time.time(), len(rows), time.perf_counter() - t))
        if not rows:
            time.sleep(0.005)
    c.close()
    return calls


def _pgqueuer_consumer(dsn: str, n: int, stop: Any) -> list[tuple[float, int, float]]:
    """PgQueuer's own loop; its ``Queries.dequeue`` is wrapped to time each take call."""
    import asyncio
    from datetime import timedelta

    from lonnymq_bench.systems.pgqueuer import ENTRYPOINT, _Session
    from pgqueuer.qm import QueueManager
    from pgqueuer.types import QueueExecutionMode

    s = _Session(dsn)
    calls: list[tuple[float, int, float]] = []
    inner = s.queries.dequeue

    async def timed_dequeue(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        jobs = await inner(*args, **kwargs)
        calls.append((time.time(), len(jobs), time.perf_counter() - t))
        return jobs

    s.queries.dequeue = timed_dequeue  # type: ignore[method-assign]
    qm = QueueManager(s.queries)

    @qm.entrypoint(ENTRYPOINT)
    async def bench(job: Any) -> None:
        return None

    async def stopper() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
        qm.shutdown.set()

    async def go() -> None:
        task = asyncio.create_task(stopper())
        try:
            await qm.run(
                batch_size=n, mode=QueueExecutionMode.continuous, dequeue_timeout=timedelta(seconds=30)
            )
        finally:
            task.cancel()

    try:
        s.run(go())
    finally:
        s.close()
    return calls


CONSUMERS: dict[str, tuple[ConsumerRun, str]] = {
    "lonnymq": (_lonnymq_consumer, "take(n, ack=prev)"),
    "pgmq": (_pgmq_consumer, "read(n) + delete(ids)"),
    "pgqueuer": (_pgqueuer_consumer, "QueueManager batch_size=n (timed: Queries.dequeue)"),
}


def adapter_for(name: str) -> Adapter:
    s = load(name)
    consumer, what = CONSUMERS[name]
    return Adapter(name, what, s.tables, s.batch_sender, consumer)


# -- the load engine -----------------------------------------------------------------------


def _producer(sender: SenderFactory, dsn: str, rate: float, stop: Any, out: Any) -> None:
    send, close = sender(dsn)
    chunk = max(1, round(rate / 100))  # a batch every ~10 ms
    msgs = [payload(i) for i in range(chunk)]
    sent: list[tuple[float, int]] = []
    start = time.monotonic()
    k = 0
    try:
        while not stop.is_set():
            delay = start + k * chunk / rate - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.2))
                continue
            send(msgs)
            sent.append((time.time(), chunk))
            k += 1
    finally:
        close()
        out.put(("producer", sent))


def _consumer(run: ConsumerRun, dsn: str, n: int, stop: Any, out: Any, i: int) -> None:
    try:
        out.put((f"consumer{i}", run(dsn, n, stop)))
    except BaseException as e:
        out.put((f"consumer{i}", f"error: {type(e).__name__}: {e}"))
        raise


def _maintainer(factory: MaintainFactory, dsn: str, every: float, stop: Any, out: Any) -> None:
    tick, close = factory(dsn)
    ticks: list[tuple[float, float, Any]] = []
    try:
        while not stop.wait(every):
            t = time.perf_counter()
            r = tick()
            ticks.append((time.time(), time.perf_counter() - t, r))
    finally:
        close()
        out.put(("maintain", ticks))


def storage(dsn: str, tables: Sequence[str]) -> dict[str, int]:
    """Live and dead tuples and total bytes (heap, TOAST, indexes) of ``tables`` and their
    partitions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "WITH RECURSIVE rels(relid) AS ("
            "  SELECT r.rel::oid FROM unnest(%s::regclass[]) AS r(rel)"
            "  UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN rels ON i.inhparent = rels.relid)"
            "SELECT coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),"
            "       coalesce(sum(pg_total_relation_size(c.oid)), 0)"
            "  FROM rels JOIN pg_class c ON c.oid = rels.relid AND c.relkind = 'r'"
            "  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid",
            [list(tables)],
        ).fetchone()
    assert row is not None
    return {"live_tuples": int(row[0]), "dead_tuples": int(row[1]), "bytes": int(row[2])}


def run_held(
    dsn: str,
    a: Adapter,
    c: Config,
    log: Callable[[str], None] | None = None,
    hold: bool = True,
    hold_reads: str | None = None,
) -> dict[str, Any]:
    """Run the offered load against ``a`` for ``c.minutes`` with a snapshot held (``hold``);
    returns the per-interval timeline. The holder reads ``hold_reads`` (default: the system's
    first table, which it then keeps ACCESS SHARE locked, as pg_dump does)."""
    seconds = c.minutes * 60
    log = log or (lambda line: print(line, flush=True))
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    out = ctx.Queue()
    holder = psycopg.connect(dsn)
    if hold:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(f"SELECT count(*) FROM {hold_reads or a.tables[0]}")
    procs = [ctx.Process(target=_producer, args=(a.sender, dsn, c.rate, stop, out), daemon=True)]
    procs += [
        ctx.Process(target=_consumer, args=(a.consumer, dsn, c.take, stop, out, i), daemon=True)
        for i in range(c.consumers)
    ]
    if a.maintain is not None:
        procs.append(
            ctx.Process(target=_maintainer, args=(a.maintain, dsn, a.maintain_every, stop, out), daemon=True)
        )
    samples: list[dict[str, Any]] = []
    wall0 = time.time()
    for p in procs:
        p.start()
    results: dict[str, Any] = {}
    try:
        end = time.monotonic() + seconds
        next_at = time.monotonic() + c.interval
        while time.monotonic() < end - 1e-3:
            time.sleep(max(0.0, min(next_at, end) - time.monotonic()))
            st = storage(dsn, a.tables)
            samples.append({"t": round(time.time() - wall0, 1), **st})
            log(
                f"  {a.name:<14} t={samples[-1]['t']:>6.0f}s dead {st['dead_tuples']:>10,}"
                f"  live {st['live_tuples']:>9,}  size {st['bytes'] / 2**20:>8.1f} MB"
            )
            next_at += c.interval
        stop.set()
        for _ in procs:
            name, value = out.get(timeout=120)
            if isinstance(value, str):
                raise RuntimeError(f"{a.name} {name}: {value}")
            results[name] = value
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        holder.rollback()
        holder.close()
    calls = [x for k, v in results.items() if k.startswith("consumer") for x in v]
    return {
        "system": a.name,
        "consumer": a.what,
        "held": hold,
        "holder_reads": (hold_reads or a.tables[0]) if hold else None,
        "config": asdict(c),
        "timeline": _bin(results.get("producer", []), calls, wall0, c, samples),
        "maintenance": _ticks(results.get("maintain", []), wall0, c),
    }


def _bin(
    sent: list[tuple[float, int]],
    calls: list[tuple[float, int, float]],
    wall0: float,
    c: Config,
    samples: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    nbins = max(1, int(c.minutes * 60 / c.interval + 1e-9))  # whole intervals only
    s = [0] * nbins
    got = [0] * nbins
    lat: list[list[float]] = [[] for _ in range(nbins)]
    for t, n in sent:
        i = int((t - wall0) // c.interval)
        if 0 <= i < nbins:
            s[i] += n
    for t, n, d in calls:
        i = int((t - wall0) // c.interval)
        if 0 <= i < nbins:
            got[i] += n
            if n:
                lat[i].append(d * 1000)
    rows = []
    backlog = 0
    for i in range(nbins):
        backlog += s[i] - got[i]
        row: dict[str, Any] = {
            "t_end_s": round((i + 1) * c.interval, 1),
            "offered_per_s": c.rate,
            "sent_per_s": round(s[i] / c.interval, 1),
            "consumed_per_s": round(got[i] / c.interval, 1),
            "backlog": backlog,
            "takes": len(lat[i]),
            "take_p50_ms": round(percentile(lat[i], 50), 3) if lat[i] else None,
            "take_p99_ms": round(percentile(lat[i], 99), 3) if lat[i] else None,
        }
        if i < len(samples):
            row.update({k: samples[i][k] for k in ("dead_tuples", "live_tuples", "bytes")})
        rows.append(row)
    return rows


def _ticks(ticks: list[tuple[float, float, Any]], wall0: float, c: Config) -> list[dict[str, Any]]:
    """Maintenance passes per interval: count, slowest, and what they reported."""
    nbins = max(1, int(c.minutes * 60 / c.interval + 1e-9))  # whole intervals only
    out: list[dict[str, Any]] = [{"passes": 0, "max_ms": 0.0, "results": {}} for _ in range(nbins)]
    for t, d, r in ticks:
        i = min(nbins - 1, max(0, int((t - wall0) // c.interval)))
        b = out[i]
        b["passes"] += 1
        b["max_ms"] = round(max(b["max_ms"], d * 1000), 1)
        key = str(r)
        b["results"][key] = b["results"].get(key, 0) + 1
    return out if ticks else []


# -- report --------------------------------------------------------------------------------


def print_table(runs: list[dict[str, Any]]) -> None:
    head = (
        f"{'system':<14} {'t(s)':>6} {'offered/s':>9} {'sent/s':>8} {'taken/s':>8} {'backlog':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'dead tup':>10} {'live tup':>9} {'MB':>8}"
    )
    print(head)
    print("-" * len(head))

    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in runs:
        for row in r["timeline"]:
            mb = row["bytes"] / 2**20 if "bytes" in row else None
            print(
                f"{r['system']:<14} {row['t_end_s']:>6.0f} {row['offered_per_s']:>9,.0f} "
                f"{row['sent_per_s']:>8,.0f} {row['consumed_per_s']:>8,.0f} {row['backlog']:>9,} "
                f"{f(row['take_p50_ms'], '>8.2f')} {f(row['take_p99_ms'], '>8.2f')} "
                f"{f(row.get('dead_tuples'), '>10,')} {f(row.get('live_tuples'), '>9,')} {f(mb, '>8.1f')}"
            )
        print()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/held_snapshot.py",
        description="Offered load with a REPEATABLE READ snapshot held: throughput, take latency, "
        "dead tuples and size per interval, for LonnyMQ, pgmq and PgQueuer.",
    )
    p.add_argument("--dsn", help="server to run on (a role that may CREATE DATABASE); default: embedded")
    p.add_argument("--systems", default="lonnymq,pgmq,pgqueuer", help="comma-separated (default: all three)")
    p.add_argument("--rate", type=float, help="offered msg/s (default 2000)")
    p.add_argument("--minutes", type=float, help="duration per system (default 10)")
    p.add_argument("--interval", type=float, help="seconds per report row (default 60)")
    p.add_argument("--take", type=int, help="messages per take call (default 10)")
    p.add_argument("--consumers", type=int, help="consumer processes (default 2)")
    p.add_argument("--no-hold", action="store_true", help="do not hold a snapshot (the baseline)")
    p.add_argument("--quick", action="store_true", help="15 s at 200 msg/s, 5 s rows: a smoke run")
    p.add_argument("--out", type=Path, help="JSON file (default bench-results/held-snapshot-<time>.json)")
    p.add_argument("--db-prefix", default="held", help="scratch databases <prefix>_<system> (default held)")
    args = p.parse_args(argv)
    c = Config.quick() if args.quick else Config()
    for k in ("rate", "minutes", "interval", "take", "consumers"):
        if getattr(args, k) is not None:
            setattr(c, k, getattr(args, k))
    names = [x.strip() for x in args.systems.split(",") if x.strip()]
    bad = [n for n in names if n not in CONSUMERS]
    if bad:
        p.error(f"unknown systems {bad}; choose from {', '.join(CONSUMERS)}")
    missing = [m for m in (load(n).missing() for n in names) if m]
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 2
    out = args.out or Path("bench-results") / f"held-snapshot-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    runs = []
    with dsn_or_temporary(args.dsn) as base:
        meta = {
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "server": harness.server_settings(base),
            "config": asdict(c),
        }
        print(
            f"held snapshot: {c.rate:g} msg/s offered, {c.consumers} consumers x take({c.take}), "
            f"{c.minutes:g} min per system, rows every {c.interval:g} s, "
            f"PostgreSQL {meta['server']['server_version']}, load {meta['server']['loadavg_at_start']}",
            flush=True,
        )
        for name in names:
            s = load(name)
            db = f"{args.db_prefix}_{name}"
            dsn = harness.create_database(base, db)
            try:
                s.install(dsn)
                harness.vacuum(dsn, s.tables)
                runs.append(run_held(dsn, adapter_for(name), c, hold=not args.no_hold))
            finally:
                harness.drop_database(base, db)
    meta["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print()
    print_table(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    print(f"wrote {out}")
    return 0


__all__ = ["Adapter", "Config", "print_table", "run_held", "storage"]

if __name__ == "__main__":
    raise SystemExit(main())
