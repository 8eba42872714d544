"""The workloads. Each one runs every selected system that supports it, in the same run, on the
same server; throughput workloads repeat ``reps`` times with the systems interleaved (their
order rotates each repetition), so slow drifts of a shared machine hit every system alike."""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import psycopg

from . import harness
from .harness import Ctx, payload, percentile, run_procs
from .systems import System, Variant

WORKLOADS = ("send", "drain", "latency", "flat", "churn")


@dataclass
class Config:
    reps: int = 3
    send_procs: int = 2
    send_seconds: float = 5.0
    drain_procs: tuple[int, ...] = (2, 4)
    backlog_one: int = 25_000
    backlog_batch: int = 100_000
    drain_seconds: float = 10.0
    latency_rate: float = 50.0
    latency_seconds: float = 10.0
    latency_consumers: int = 2
    #: The consumers wait idle this long before the first message is sent, and run on this
    #: long after the last one (the time each has to pick it up).
    latency_idle: float = 0.75
    latency_tail: float = 1.75
    flat_future: int = 1_000_000
    flat_leased: int = 1_000_000
    flat_probe: int = 300
    churn_minutes: float = 10.0
    churn_rate: float = 1000.0
    churn_consumers: int = 2
    churn_interval: float = 10.0

    @classmethod
    def quick(cls) -> Config:
        """Tiny sizes: proves the suite end to end in about a minute; the numbers mean little."""
        return cls(
            reps=1,
            send_seconds=0.5,
            backlog_one=200,
            backlog_batch=1000,
            drain_seconds=2.0,
            latency_rate=20.0,
            latency_seconds=1.5,
            flat_future=1000,
            flat_leased=1000,
            flat_probe=30,
            churn_minutes=0.1,
            churn_rate=200.0,
            churn_interval=1.0,
        )

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Bench:
    """A run: the systems with their databases, the configuration, and what was measured."""

    systems: list[tuple[System, str]]
    config: Config
    log: Callable[[str], None]
    throughput: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    flat: list[dict[str, Any]] = field(default_factory=list)
    churn: list[dict[str, Any]] = field(default_factory=list)

    def fresh(self, system: System, dsn: str) -> None:
        system.clear(dsn)
        harness.vacuum(dsn, system.tables)


def _rotate(items: list[Any], k: int) -> list[Any]:
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def _record(
    b: Bench, workload: str, v: Variant, procs: int, rep: int, n: int, seconds: float, **extra: Any
) -> None:
    rec = {
        "workload": workload,
        "kind": v.kind,
        "system": v.system,
        "variant": v.name,
        "headline": v.headline,
        "note": v.note,
        "procs": procs,
        "rep": rep,
        "n": n,
        "seconds": round(seconds, 4),
        "rate": round(n / seconds, 1),
        **extra,
    }
    b.throughput.append(rec)
    b.log(
        f"  {workload:<6} {v.kind:<5} P={procs} {v.system:<9} {v.name:<32} {rec['rate']:>10,.0f} msg/s"
        f"  ({n} in {seconds:.2f}s){'' if extra.get('complete', True) else '  (time-boxed)'}"
    )


# -- send ----------------------------------------------------------------------------------


def send_phase(b: Bench, s: System, dsn: str, v: Variant, procs: int, rep: int, seconds: float) -> None:
    """One timed phase of a send variant on emptied, vacuumed tables; recorded as ``send``."""
    b.fresh(s, dsn)
    run = run_procs(functools.partial(v.factory, dsn), procs, seconds=seconds)
    _record(b, "send", v, procs, rep, sum(run.results), run.seconds)


def send(b: Bench) -> None:
    """Send one message per transaction, and batches of 1,000, from ``send_procs`` processes,
    each for ``send_seconds``."""
    c = b.config
    for rep in range(c.reps):
        for kind in ("one", "batch"):
            todo = [(s, dsn, v) for s, dsn in b.systems for v in s.sends() if v.kind == kind]
            for s, dsn, v in _rotate(todo, rep):
                send_phase(b, s, dsn, v, c.send_procs, rep, c.send_seconds)


# -- drain ---------------------------------------------------------------------------------


def drain_phase(
    b: Bench,
    s: System,
    dsn: str,
    v: Variant,
    procs: int,
    rep: int,
    backlog: int,
    seconds: float,
    workload: str = "drain",
) -> None:
    """One timed phase of a drain variant on a preloaded, vacuumed backlog; stops early after
    ``seconds`` (the rate is then over that window). Checks that the workers' count plus the
    rows left equals the backlog."""
    b.fresh(s, dsn)
    s.preload(dsn, backlog)
    harness.vacuum(dsn, s.tables)
    run = run_procs(functools.partial(v.factory, dsn), procs, seconds=seconds)
    n = sum(run.results)
    left = s.remaining(dsn)
    if n + left != backlog:
        b.log(f"  !! {v.system} {v.name}: counted {n}, {left} left of {backlog}")
    _record(
        b,
        workload,
        v,
        procs,
        rep,
        n,
        run.seconds,
        backlog=backlog,
        complete=left == 0,
        accounted=n + left == backlog,
    )


def drain(b: Bench) -> None:
    """Drain a preloaded backlog with 2 and 4 worker processes, one message per take and in
    batches; a phase stops early after ``drain_seconds`` (the rate is then over that window)."""
    c = b.config
    for rep in range(c.reps):
        for procs in c.drain_procs:
            for kind in ("one", "batch"):
                backlog = c.backlog_one if kind == "one" else c.backlog_batch
                todo = [(s, dsn, v) for s, dsn in b.systems for v in s.drains() if v.kind == kind]
                for s, dsn, v in _rotate(todo, rep):
                    drain_phase(b, s, dsn, v, procs, rep, backlog, c.drain_seconds)


# -- pickup latency ------------------------------------------------------------------------


def _latency_worker(
    system: System, v: Variant, dsn: str, rate: float, count: int, idle: float, ctx: Ctx
) -> Callable[[], Any]:
    if ctx.index > 0:
        return v.factory(dsn, ctx)
    send, close = system.producer(dsn)

    def produce() -> list[tuple[Any, float]]:
        time.sleep(idle)  # the consumers are idle, waiting, when the first message comes
        start = time.monotonic()
        out = []
        for k in range(count):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            mid = send(payload(k))
            out.append((mid, time.time()))
        close()
        return out

    return produce


def latency(b: Bench, *, headline_only: bool = False) -> None:
    """End-to-end pickup latency: one producer sends one message per transaction at a fixed rate
    to idle consumers; latency = consumer has it - producer's commit returned. ``headline_only``:
    each system's idiomatic way of waiting only."""
    c = b.config
    count = max(1, round(c.latency_rate * c.latency_seconds))
    for s, dsn in b.systems:
        for v in s.pickups():
            if headline_only and not v.headline:
                continue
            b.fresh(s, dsn)
            worker = functools.partial(_latency_worker, s, v, dsn, c.latency_rate, count, c.latency_idle)
            seconds = c.latency_idle + c.latency_seconds + c.latency_tail
            run = run_procs(worker, c.latency_consumers + 1, seconds=seconds)
            sent = dict(run.results[0])
            got: dict[Any, float] = {}
            for part in run.results[1:]:
                for mid, t in part:
                    got.setdefault(mid, t)
            ms = [(got[m] - t) * 1000 for m, t in sent.items() if m in got]
            rec = {
                "system": v.system,
                "variant": v.name,
                "kind": v.kind,
                "headline": v.headline,
                "sent": len(sent),
                "received": len(ms),
                "rate": c.latency_rate,
                "consumers": c.latency_consumers,
                "p50_ms": round(percentile(ms, 50), 2),
                "p90_ms": round(percentile(ms, 90), 2),
                "p99_ms": round(percentile(ms, 99), 2),
                "max_ms": round(max(ms, default=math.nan), 2),
            }
            b.latency.append(rec)
            b.log(
                f"  pickup {v.system:<9} {v.name:<32} p50 {rec['p50_ms']:>7.2f} ms  p99 {rec['p99_ms']:>7.2f} ms"
                f"  ({len(ms)}/{len(sent)} received)"
            )


# -- dequeue latency with future-dated and leased rows -------------------------------------


def flat(b: Bench) -> None:
    """Dequeue latency (one take+settle per round trip, one process) from a queue holding
    ``flat_future`` future-dated + ``flat_leased`` leased rows besides the ready ones, and from
    an empty queue, alternating between the two every 10 takes. A dequeue that is an index
    lookup stays flat: the ratio of the medians stays near 1."""
    c = b.config
    for s, dsn in b.systems:
        f = s.flat()
        if f is None:
            continue
        rec: dict[str, Any] = {
            "system": s.name,
            "probe": f.what,
            "n": c.flat_probe,
            "future": c.flat_future,
            "leased": c.flat_leased,
        }
        b.fresh(s, dsn)
        t = time.perf_counter()
        f.setup(dsn, c.flat_future, c.flat_leased)
        rec["setup_seconds"] = round(time.perf_counter() - t, 1)
        harness.vacuum(dsn, s.tables)
        rec["loaded_rows"] = s.remaining(dsn)
        f.ready(dsn, c.flat_probe)
        run = run_procs(
            functools.partial(f.probe, dsn), 1, seconds=3600, extra={"n": c.flat_probe, "chunk": 10}
        )
        for phase in ("empty", "loaded"):
            ms = [x * 1000 for x in run.results[0][phase]]
            rec[f"{phase}_p50_ms"] = round(percentile(ms, 50), 3)
            rec[f"{phase}_p99_ms"] = round(percentile(ms, 99), 3)
        rec["empty_rows"] = 0
        rec["p50_ratio"] = round(rec["loaded_p50_ms"] / rec["empty_p50_ms"], 3)
        b.flat.append(rec)
        b.log(
            f"  flat   {s.name:<9} empty queue p50 {rec['empty_p50_ms']:.3f} ms p99 {rec['empty_p99_ms']:.3f} ms"
            f" | {rec['loaded_rows']:,} future+leased rows p50 {rec['loaded_p50_ms']:.3f} ms"
            f" p99 {rec['loaded_p99_ms']:.3f} ms | ratio {rec['p50_ratio']:.2f}"
        )
        b.fresh(s, dsn)


# -- sustained churn with vacuum held back -------------------------------------------------


def _churn_worker(system: System, v: Variant, dsn: str, rate: float, ctx: Ctx) -> Callable[[], Any]:
    if ctx.index > 0:
        return v.factory(dsn, ctx)
    send, close = system.batch_sender(dsn)
    batch = 100
    msgs = [payload(i) for i in range(batch)]

    def produce() -> list[tuple[float, int]]:
        out = []
        start = time.monotonic()
        k = 0
        while not ctx.stop.is_set():
            delay = start + k * batch / rate - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.5))
                continue
            send(msgs)
            out.append((time.time(), batch))
            k += 1
        close()
        return out

    return produce


def churn(b: Bench) -> None:
    """Producers at ``churn_rate`` msg/s and ``churn_consumers`` batched consumers for
    ``churn_minutes``, while another session holds a snapshot open the whole time, so no dead
    row can be vacuumed. Reports, per interval: sent and consumed msg/s, backlog, take-call
    latency and the dead tuples of the system's tables."""
    c = b.config
    seconds = c.churn_minutes * 60
    for s, dsn in b.systems:
        v = s.churn()
        if v is None:
            continue
        b.fresh(s, dsn)
        holder = psycopg.connect(dsn)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")
        stop = mp.get_context("fork").Event()
        samples: list[dict[str, Any]] = []

        def sample(
            t0: float,
            s: System = s,
            dsn: str = dsn,
            stop: Any = stop,
            samples: list[dict[str, Any]] = samples,
        ) -> None:
            wall0 = time.time()
            next_at = time.monotonic() + c.churn_interval
            end = time.monotonic() + seconds
            while True:
                now = time.monotonic()
                if now >= end:
                    break
                time.sleep(max(0.0, min(next_at, end) - now))
                live, dead = harness.dead_tuples(dsn, s.tables)
                samples.append({"t": round(time.time() - wall0, 1), "live_tuples": live, "dead_tuples": dead})
                b.log(
                    f"  churn  {s.name:<9} t={samples[-1]['t']:>6.0f}s  dead tuples {dead:>10,}  live {live:>9,}"
                )
                next_at += c.churn_interval
            stop.set()

        wall_start = time.time()
        try:
            worker = functools.partial(_churn_worker, s, v, dsn, c.churn_rate)
            run = run_procs(
                worker,
                1 + c.churn_consumers,
                seconds=seconds + 3600,
                stop=stop,
                during=sample,
                timeout=seconds + 600,
            )
        finally:
            holder.rollback()
            holder.close()
        timeline = _bin_churn(run.results, wall_start, c.churn_interval, seconds, samples)
        b.churn.append(
            {
                "system": s.name,
                "variant": v.name,
                "rate": c.churn_rate,
                "consumers": c.churn_consumers,
                "minutes": c.churn_minutes,
                "interval": c.churn_interval,
                "timeline": timeline,
            }
        )
        b.fresh(s, dsn)


def _bin_churn(
    results: list[Any], wall0: float, interval: float, seconds: float, samples: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    nbins = max(1, math.ceil(seconds / interval))
    sent = [0] * nbins
    got = [0] * nbins
    calls: list[list[float]] = [[] for _ in range(nbins)]
    for t, n in results[0]:
        i = int((t - wall0) // interval)
        if 0 <= i < nbins:
            sent[i] += n
    for part in results[1:]:
        for t, n, dt in part:
            i = int((t - wall0) // interval)
            if 0 <= i < nbins:
                got[i] += n
                if n and not math.isnan(dt):
                    calls[i].append(dt * 1000)
    out = []
    backlog = 0
    for i in range(nbins):
        backlog += sent[i] - got[i]
        row: dict[str, Any] = {
            "t": round((i + 1) * interval, 1),
            "sent_per_s": round(sent[i] / interval, 1),
            "consumed_per_s": round(got[i] / interval, 1),
            "backlog": backlog,
            "take_p50_ms": round(percentile(calls[i], 50), 3) if calls[i] else None,
        }
        if i < len(samples):
            row["dead_tuples"] = samples[i]["dead_tuples"]
            row["live_tuples"] = samples[i]["live_tuples"]
        out.append(row)
    return out


RUNNERS: dict[str, Callable[[Bench], None]] = {
    "send": send,
    "drain": drain,
    "latency": latency,
    "flat": flat,
    "churn": churn,
}
