"""The producers benchmark (issue 12 item 4): one-message sends from 1, 8 and 32 producer
processes, batch sends of 1,000, pop, drains at batch 1 and 100 and idle pickup latency, for
LonnyMQ, pgmq, PgQueuer, the seed queue and the PostgreSQL floors side by side in one run,
printed as ratios with the command that reproduces them.

It is the suite's machinery (systems, scratch databases, forked workers on a barrier, phases on
emptied and vacuumed tables, systems interleaved in a rotating order) with workloads of its own:

- ``producers``: one message per transaction, each of ``producers`` process counts, for
  ``send_seconds``; the references are the seed's bare INSERT into a one-index table, the send
  floor (the rows ``send()`` writes, as one plain statement on LonnyMQ's own tables), the API
  send floor (that statement through a secure function, the queue by name: api_floor.py) and
  the floor's commit floor (an empty row into a table without columns or indexes).
- ``batch``: batches of 1,000 per transaction from ``send_procs`` processes.
- ``pop``: take-and-delete one message per call (no lease) from a backlog; the references are
  the seed's delete-on-dequeue, the pop floor (the row ``take_tx(1)`` deletes, as one plain
  statement on LonnyMQ's own tables) and the API pop floors (that DELETE through a secure
  function, over the current generation or the window's two).
- ``drain``: each system's at-least-once path (lease + ack), one message and 100 per call,
  against the lease floor (and the floor's ``DELETE ... LIMIT 100``), the lease floor on
  LonnyMQ's tables (what ``take(n, ack=previous)`` writes, one plain statement:
  lease_store_floor.py) and the API lease floor (that statement through a secure function).
- ``pickup``: one producer at ``latency_rate`` msg/s to idle consumers, p50/p99 from commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import harness, report
from .runner import _csv, _ints, _prefix, installed_systems
from .server import dsn_or_temporary
from .systems import PRODUCERS_ONLY, REGISTRY, System, Variant, load
from .workloads import Bench, _rotate, drain_phase, latency, send_phase
from .workloads import Config as SuiteConfig

WORKLOADS = ("producers", "batch", "pop", "drain", "pickup")
# The suite's systems and the references of this benchmark only (the send and pop floors, plain
# and through a secure function API).
SYSTEMS = [*REGISTRY, *PRODUCERS_ONLY]

# Targets of issue 12 item 4, as ratios within one run.
SENDS_VS_PGMQ = 1.0  # 8 concurrent one-message producers, and one serial producer
SENDS_VS_SEED = 0.8  # 8 concurrent one-message producers
# Where a target is out of reach: >= 0.9x a floor measured the same way (the send floor).
SENDS_VS_FLOOR = 0.9
POP_VS_SEED = 0.8
POP_VS_FLOOR = 0.9  # the pop floor: the row pop deletes, one plain statement
# The same against the API floors (lonnymq_bench/systems/api_floor.py): the floors' statements
# through a SECURITY DEFINER function with a pinned search_path, the queue by name: the least a
# call through LonnyMQ's mandated API can cost. Shown beside the plain floors, not instead.
SENDS_VS_API_FLOOR = 0.9
POP_VS_API_FLOOR = 0.9
DRAIN_VS_LEASE_FLOOR = 0.9
# The drain's floors on LonnyMQ's tables (lease_store_floor.py, api_floor.py's take): what
# take(n, ack=previous) must write, as one plain statement and through a secure function.
DRAIN_VS_STORE_FLOOR = 0.9
DRAIN_VS_API_LEASE_FLOOR = 0.9
# The API lease floor without the partial index of leases (api_floor.py's GuaranteeFloor): only
# the pieces a guarantee needs; the floor issue 12's "prove it with a floor" rule reads.
DRAIN_VS_GUARANTEE_FLOOR = 0.9
PICKUP_P99_MS = 20.0


@dataclass
class Config(SuiteConfig):
    """The suite's configuration with this benchmark's sizes: ``producers`` process counts for
    one-message sends, ``send_procs`` for batch sends, ``drain_procs`` for pops and drains."""

    producers: tuple[int, ...] = (1, 8, 32)
    send_seconds: float = 3.0
    drain_procs: tuple[int, ...] = (2,)
    backlog_one: int = 20_000
    backlog_batch: int = 60_000
    drain_seconds: float = 3.0
    latency_seconds: float = 8.0

    @classmethod
    def quick(cls) -> Config:
        """Tiny sizes: proves the benchmark end to end in seconds; the numbers mean little."""
        return cls(
            reps=1,
            producers=(1, 2),
            send_seconds=0.25,
            backlog_one=200,
            backlog_batch=2000,
            drain_seconds=0.5,
            latency_rate=20.0,
            latency_seconds=0.25,
            latency_idle=0.3,
            latency_tail=0.7,
        )

    def as_dict(self) -> dict[str, Any]:
        used = (
            "reps",
            "producers",
            "send_seconds",
            "send_procs",
            "drain_procs",
            "backlog_one",
            "backlog_batch",
            "drain_seconds",
            "latency_rate",
            "latency_seconds",
            "latency_consumers",
            "latency_idle",
            "latency_tail",
        )
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in used}


def _cfg(b: Bench) -> Config:
    assert isinstance(b.config, Config)
    return b.config


# -- workloads -----------------------------------------------------------------------------


def producers(b: Bench) -> None:
    """One message per transaction from each count of producer processes (the floor's commit
    floor alongside the systems' sends)."""
    c = _cfg(b)
    for rep in range(c.reps):
        for procs in c.producers:
            todo = [
                (s, dsn, v) for s, dsn in b.systems for v in (*s.sends(), *s.commits()) if v.kind == "one"
            ]
            for s, dsn, v in _rotate(todo, rep):
                send_phase(b, s, dsn, v, procs, rep, c.send_seconds)


def batch(b: Bench) -> None:
    """Batches of 1,000 messages per transaction from ``send_procs`` processes."""
    c = b.config
    for rep in range(c.reps):
        todo = [(s, dsn, v) for s, dsn in b.systems for v in s.sends() if v.kind == "batch"]
        for s, dsn, v in _rotate(todo, rep):
            send_phase(b, s, dsn, v, c.send_procs, rep, c.send_seconds)


def _drains(b: Bench, pick: Callable[[System], list[Variant]], kind: str, workload: str) -> None:
    c = b.config
    backlog = c.backlog_one if kind == "one" else c.backlog_batch
    for rep in range(c.reps):
        for procs in c.drain_procs:
            todo = [(s, dsn, v) for s, dsn in b.systems for v in pick(s) if v.kind == kind]
            for s, dsn, v in _rotate(todo, rep):
                drain_phase(b, s, dsn, v, procs, rep, backlog, c.drain_seconds, workload=workload)


def pop(b: Bench) -> None:
    """Take-and-delete one message per call, no lease (LonnyMQ's pop, pgmq's ``pop(1)``, the
    seed's ``message_dequeue()``, the pop floor's plain DELETE on LonnyMQ's tables, the floor's
    ``DELETE ... LIMIT 1``)."""
    _drains(b, lambda s: s.pops(), "one", "pop")


def _leased(s: System) -> list[Variant]:
    """Each system's idiomatic drain: its headline drains other than its pops (the seed's only
    drain is its pop; the floor's batched take-and-delete stays, as the physical reference)."""
    pops = {v.name for v in s.pops()}
    return [v for v in s.drains() if v.headline and v.name not in pops]


def drain(b: Bench) -> None:
    """Each system's at-least-once drain, one message per call, then 100 per call."""
    for kind in ("one", "batch"):
        _drains(b, _leased, kind, "drain")


def pickup(b: Bench) -> None:
    """Idle pickup latency of each system's idiomatic way of waiting."""
    latency(b, headline_only=True)


RUNNERS: dict[str, Callable[[Bench], None]] = {
    "producers": producers,
    "batch": batch,
    "pop": pop,
    "drain": drain,
    "pickup": pickup,
}


# -- targets and report --------------------------------------------------------------------


def targets(b: Bench) -> list[dict[str, Any]]:
    """Issue 12 item 4's targets, and the ratios that put them in context (no goal), each the
    median over repetitions of the per-repetition ratio."""
    have = {s.name for s, _ in b.systems}
    c = _cfg(b)
    out: list[dict[str, Any]] = []

    def add(
        name: str,
        workload: str,
        kind: str,
        procs: int,
        ref: str,
        goal: float | None,
        detail: str,
        pick: str = "best",
    ) -> None:
        if "lonnymq" in have and ref in have:
            value, ratios = report.ratio(b, workload, kind, procs, "lonnymq", ref, pick)
            out.append(report.target(name, value, ratios, goal, ">=", detail))

    for p in c.producers:
        who = "1 producer (serial)" if p == 1 else f"{p} producers"
        add(
            f"send, {who} / pgmq",
            "send",
            "one",
            p,
            "pgmq",
            SENDS_VS_PGMQ if p in (1, 8) else None,
            "send() vs pgmq.send(), one message per transaction",
        )
        add(
            f"send, {who} / bare seed INSERT",
            "send",
            "one",
            p,
            "seed",
            SENDS_VS_SEED if p == 8 else None,
            "vs INSERT ... RETURNING id into a one-index table",
        )
        add(
            f"send, {who} / PgQueuer",
            "send",
            "one",
            p,
            "pgqueuer",
            None,
            "vs Queries.enqueue() of one job",
        )
        add(
            f"send, {who} / send floor",
            "send",
            "one",
            p,
            "sendfloor",
            SENDS_VS_FLOOR if p in (1, 8) else None,
            "vs the rows send() writes (message + queue_stat), one plain statement on LonnyMQ's tables",
        )
        add(
            f"send, {who} / API send floor",
            "send",
            "one",
            p,
            "apisendfloor",
            SENDS_VS_API_FLOOR if p == 8 else None,
            "vs the send floor's statement in a secure function (SECURITY DEFINER, pinned search_path),"
            " the queue by name",
        )
        add(
            f"send, {who} / commit floor",
            "send",
            "one",
            p,
            "floor",
            None,
            "vs an empty row into a table without columns or indexes, per commit",
        )
    for p in (c.send_procs,):
        add(
            f"send_batch(1000) / pgmq send_batch (P={p})",
            "send",
            "batch",
            p,
            "pgmq",
            None,
            "vs pgmq's faster variant in each repetition (text or binary parameters)",
        )
        add(
            f"send_batch(1000) / bare seed INSERT ... unnest (P={p})",
            "send",
            "batch",
            p,
            "seed",
            None,
            "vs one INSERT ... SELECT unnest into a one-index table",
        )
    for p in c.drain_procs:
        add(
            f"pop / seed's delete-on-dequeue (P={p})",
            "pop",
            "one",
            p,
            "seed",
            POP_VS_SEED,
            "vs message_dequeue(): DELETE ... WHERE id = (SELECT ... SKIP LOCKED LIMIT 1)",
        )
        add(
            f"pop / pop floor (P={p})",
            "pop",
            "one",
            p,
            "popfloor",
            POP_VS_FLOOR,
            "vs the row take_tx(1) deletes, one plain statement on LonnyMQ's tables",
        )
        add(
            f"pop / API pop floor (P={p})",
            "pop",
            "one",
            p,
            "apipopfloor",
            POP_VS_API_FLOOR,
            "vs the pop floor's DELETE in a secure function (SECURITY DEFINER, pinned search_path),"
            " the queue by name, the current generation",
        )
        add(
            f"pop / API pop floor, 2 generations (P={p})",
            "pop",
            "one",
            p,
            "apipopfloor2",
            None,
            "the same over the window's two generations, as LonnyMQ's storage reads them",
        )
        add(f"pop / pgmq pop(1) (P={p})", "pop", "one", p, "pgmq", None, "take-and-delete, one per call")
        add(f"pop / floor DELETE ... LIMIT 1 (P={p})", "pop", "one", p, "floor", None, "one plain statement")
        for kind, n in (("one", 1), ("batch", 100)):
            call = f"take({n}, ack=prev)"
            add(
                f"drain at batch {n} / lease floor (P={p})",
                "drain",
                kind,
                p,
                "leasefloor",
                DRAIN_VS_LEASE_FLOOR,
                f"{call} vs one plain statement that acks the previous and leases the next",
            )
            add(
                f"drain at batch {n} / lease floor + ack's memory (P={p})",
                "drain",
                kind,
                p,
                "leasememfloor",
                DRAIN_VS_LEASE_FLOOR,
                f"{call} vs the lease floor's statement that also writes a settled row per ack"
                " (what answers a repeated or stale ack)",
            )
            add(
                f"drain at batch {n} / lease floor on LonnyMQ's tables (P={p})",
                "drain",
                kind,
                p,
                "leasestorefloor",
                DRAIN_VS_STORE_FLOOR,
                f"{call} vs one plain statement on LonnyMQ's tables: the previous deliveries deleted by key"
                " with their token checked (settled + queue_stat rows), the window's next leased",
            )
            add(
                f"drain at batch {n} / API lease floor (P={p})",
                "drain",
                kind,
                p,
                "apileasefloor",
                DRAIN_VS_API_LEASE_FLOOR,
                f"{call} vs that statement in a secure function (SECURITY DEFINER, pinned search_path),"
                " the queue by name",
            )
            add(
                f"drain at batch {n} / guarantee floor (P={p})",
                "drain",
                kind,
                p,
                "guaranteefloor",
                DRAIN_VS_GUARANTEE_FLOOR,
                f"{call} vs the API lease floor without the partial index of leases (a choice of"
                " LonnyMQ's, not a guarantee's)",
            )
            add(
                f"drain at batch {n} / pgmq read+delete (P={p})",
                "drain",
                kind,
                p,
                "pgmq",
                None,
                f"{call} vs read({n}) + delete",
            )
            add(
                f"drain at batch {n} / PgQueuer (P={p})",
                "drain",
                kind,
                p,
                "pgqueuer",
                None,
                f"{call} vs its QueueManager at batch_size={n}" + ("" if n == 1 else " or 10, the faster"),
            )
    for rec in b.latency:
        if rec["system"] == "lonnymq":
            detail = f"{rec['variant']}, {rec['rate']:g} msg/s, {rec['consumers']} idle consumers"
            v = rec["p99_ms"]
            out.append(report.target("idle pickup p99 (ms)", v, [v], PICKUP_P99_MS, "<", detail))
            v = rec["p50_ms"]
            out.append(report.target("idle pickup p50 (ms)", v, [v], None, "<", detail))
    return out


_COLUMNS = (
    "lonnymq",
    "pgmq",
    "pgqueuer",
    "seed",
    "sendfloor",
    "apisendfloor",
    "popfloor",
    "apipopfloor",
    "apipopfloor2",
    "floor",
    "leasefloor",
    "leasememfloor",
    "leasestorefloor",
    "apileasefloor",
    "guaranteefloor",
)
_LABELS = {
    "lonnymq": "LonnyMQ",
    "pgmq": "pgmq",
    "pgqueuer": "PgQueuer",
    "seed": "seed",
    "sendfloor": "send floor",
    "popfloor": "pop floor",
    "apisendfloor": "API send floor",
    "apipopfloor": "API pop floor",
    "apipopfloor2": "API pop floor, 2 gen.",
    "floor": "floor",
    "leasefloor": "lease floor",
    "leasememfloor": "lease floor + ack's memory",
    "leasestorefloor": "lease floor on LonnyMQ's tables",
    "apileasefloor": "API lease floor",
    "guaranteefloor": "guarantee floor",
}


def table(rows: list[dict[str, Any]], lat: list[dict[str, Any]]) -> list[str]:
    """The results as a Markdown table: one line per workload, one column per system, each cell
    the median msg/s (several variants: best first, each named)."""
    lines = [
        "| workload | procs | " + " | ".join(_LABELS[s] for s in _COLUMNS) + " |",
        "| --- | :-: |" + " ---: |" * len(_COLUMNS),
    ]
    what = {
        ("send", "one"): "send, one per transaction",
        ("send", "batch"): "send, batches of 1,000",
        ("pop", "one"): "pop: take-and-delete one",
        ("drain", "one"): "drain at batch 1: lease + ack",
        ("drain", "batch"): "drain at batch 100: lease + ack",
    }
    keys = sorted(
        {(r["workload"], r["kind"], r["procs"]) for r in rows}, key=lambda k: (list(what).index(k[:2]), k[2])
    )
    for w, k, p in keys:
        cells = []
        for s in _COLUMNS:
            mine = sorted(
                (r for r in rows if (r["workload"], r["kind"], r["procs"], r["system"]) == (w, k, p, s)),
                key=lambda r: -r["rate_median"],
            )
            parts = [
                f"{r['rate_median']:,.0f}"
                + ("" if r["complete"] else "†")
                + (f" {r['variant']}" if len(mine) > 1 else "")
                for r in mine
            ]
            cells.append(" / ".join(parts))
        lines.append(f"| {what[(w, k)]} | {p} | " + " | ".join(cells) + " |")
    if lat:
        cells = []
        for s in _COLUMNS:
            r = next((x for x in lat if x["system"] == s), None)
            cells.append("" if r is None else f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}")
        lines.append("| idle pickup p50 / p99 (ms) | 1+2 | " + " | ".join(cells) + " |")
    return lines


def target_table(tgts: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| ratio | goal | median | per repetition | met | compared |",
        "| --- | --- | ---: | --- | --- | --- |",
    ]
    for t in tgts:
        met = {True: "yes", False: "**no**", None: ""}[t["met"]]
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        per = ", ".join(f"{x:.2f}" for x in t["per_rep"])
        lines.append(f"| {t['target']} | {t['goal']} | {value} | {per} | {met} | {t['detail']} |")
    return lines


def variants_used(rows: list[dict[str, Any]]) -> list[str]:
    """What each cell ran: one line per (workload, system) with its variants and notes."""
    seen: dict[tuple[str, str, str], str] = {}
    for r in rows:
        seen.setdefault((r["workload"] + " " + r["kind"], r["system"], r["variant"]), r["note"])
    return [f"- {w}, {_LABELS.get(s, s)}: `{v}`" + (f" ({n})" if n else "") for (w, s, v), n in seen.items()]


# -- command line --------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn", help="server (a role that may CREATE DATABASE); default: a throwaway embedded PostgreSQL"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes, one repetition, producers 1,2: a smoke run"
    )
    p.add_argument(
        "--workloads",
        type=_csv(WORKLOADS),
        default=list(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)",
    )
    p.add_argument(
        "--systems",
        type=_csv(SYSTEMS),
        default=SYSTEMS,
        help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)",
    )
    p.add_argument("--reps", type=int, help="interleaved repetitions (default 3)")
    p.add_argument(
        "--producers", type=_ints, help="producer process counts for one-message sends (default 1,8,32)"
    )
    p.add_argument("--seconds", type=float, help="time box of each send, pop and drain phase (default 3)")
    p.add_argument(
        "--backlog-batch",
        type=int,
        help="messages ready before each drain at batch 100 (default 60,000: a drain of 0.6-0.8 s at"
        " this box's rates; more makes it time-boxed by --seconds)",
    )
    p.add_argument(
        "--out", type=Path, help="results JSON file (default bench-results/producers-<timestamp>.json)"
    )
    p.add_argument(
        "--db-prefix", default="prod", type=_prefix, help="scratch databases <prefix>_<system> (default prod)"
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch databases")
    p.add_argument(
        "--from-json", type=Path, metavar="RESULTS", help="measure nothing: print the report of a saved run"
    )


def config_from(args: argparse.Namespace) -> Config:
    c = Config.quick() if args.quick else Config()
    if args.reps:
        c.reps = args.reps
    if args.producers:
        c.producers = args.producers
    if args.seconds:
        c.send_seconds = c.drain_seconds = args.seconds
    if args.backlog_batch is not None:
        if args.backlog_batch < 1:
            raise SystemExit("producers: --backlog-batch must be at least 1")
        c.backlog_batch = args.backlog_batch
    return c


def run(args: argparse.Namespace) -> int:
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        print_report(doc["meta"], doc["summary"], doc["latency"], doc["targets"])
        return 0
    config = config_from(args)
    systems = [load(name) for name in args.systems]
    missing = [m for m in (s.missing() for s in systems) if m]
    if missing:
        for m in missing:
            print(f"producers: {m}", file=sys.stderr)
        return 2
    out = args.out or Path("bench-results") / f"producers-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, flush=True)

    started = time.time()
    command = shlex.join(["python", "benchmarks/producers.py", *sys.argv[1:]])
    meta: dict[str, Any] = {
        "command": command,
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "workloads": args.workloads,
        "systems": args.systems,
        "config": config.as_dict(),
        "payload_bytes": harness.PAYLOAD_BYTES,
    }
    with (
        dsn_or_temporary(args.dsn) as base,
        installed_systems(base, systems, args.db_prefix, args.keep, meta, log) as installed,
    ):
        b = Bench(installed, config, log)
        for w in args.workloads:
            log(f"== {w}")
            RUNNERS[w](b)
    meta["seconds"] = round(time.time() - started)
    meta["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = report.summarize(b)
    tgts = targets(b)
    print_report(meta, rows, b.latency, tgts)
    report.write_json(out, meta, b, rows, tgts)
    print(f"wrote {out}")
    return 0


def print_report(
    meta: dict[str, Any], rows: list[dict[str, Any]], lat: list[dict[str, Any]], tgts: list[dict[str, Any]]
) -> None:
    s = meta["server"]
    print(
        f"\nmsg/s, median of {meta['config']['reps']} interleaved repetitions († time-boxed); PostgreSQL "
        f"{s['server_version']}, {s['cpus']} CPUs, synchronous_commit={s['synchronous_commit']}, "
        f"load {s['loadavg_at_start']} -> {meta['loadavg_at_end']}, {meta['seconds']} s\n"
    )
    print("\n".join(table(rows, lat)))
    print("\nLonnyMQ / the others, the median of the per-repetition ratios:\n")
    print("\n".join(target_table(tgts)))
    print("\nWhat ran:\n" + "\n".join(variants_used(rows)))
    print(f"\nreproduce: {meta['command']}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/producers.py",
        description="Producers, pops, drains and idle pickup: LonnyMQ against pgmq, PgQueuer, the seed "
        "queue and the PostgreSQL floors, side by side in one run, as ratios.",
    )
    add_arguments(p)
    return run(p.parse_args(argv))
