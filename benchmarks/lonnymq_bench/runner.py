"""Command line of the suite: ``python benchmarks/bench.py`` (or ``python -m lonnymq_bench`` from
``benchmarks/``; same options)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import harness
from .server import dsn_or_temporary
from .systems import REGISTRY, System, load
from .workloads import RUNNERS, WORKLOADS, Bench, Config


def _csv(choices: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {text!r}")
        return items

    return parse


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers like 2,4; got {text!r}")
    return values


def _prefix(text: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", text):
        raise argparse.ArgumentTypeError(f"use 1-41 of a-z 0-9 _, got {text!r}")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="PostgreSQL server to run on (a role that may CREATE DATABASE); "
        "default: a throwaway embedded PostgreSQL",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and one repetition: checks the suite works, numbers mean little",
    )
    p.add_argument(
        "--workloads",
        type=_csv(WORKLOADS),
        default=list(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)",
    )
    p.add_argument(
        "--systems",
        type=_csv(list(REGISTRY)),
        default=list(REGISTRY),
        help=f"comma-separated subset of {','.join(REGISTRY)} (default: all)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="directory for results.json and chart.png (default: bench-results/<timestamp>)",
    )
    p.add_argument("--reps", type=int, help="repetitions of the throughput workloads (default 3)")
    p.add_argument("--procs", type=_ints, help="worker processes for the drains (default 2,4)")
    p.add_argument(
        "--backlog",
        type=int,
        help="backlog of the batched drains (default 100000; one-at-a-time drains use a quarter)",
    )
    p.add_argument(
        "--phase-seconds",
        type=float,
        help="time box of each send/drain phase (default 5 s for sends, 10 s for drains)",
    )
    p.add_argument(
        "--latency-rate", type=float, help="send rate of the pickup-latency workload (default 50/s)"
    )
    p.add_argument(
        "--flat-rows",
        type=int,
        help="future-dated rows, and as many leased rows, for the flat dequeue workload (default 1000000)",
    )
    p.add_argument(
        "--churn-minutes", type=float, help="duration of the churn workload per system (default 10)"
    )
    p.add_argument(
        "--churn-systems",
        type=_csv(list(REGISTRY)),
        help="systems to run the churn workload for (default: all selected that support it)",
    )
    p.add_argument(
        "--db-prefix",
        default="bench",
        type=_prefix,
        help="scratch databases are named <prefix>_<system> (default: bench)",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch databases")
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="measure nothing: merge these results.json files (e.g. of separate runs) "
        "and write the table, results.json and chart.png again",
    )


def config_from(args: argparse.Namespace) -> Config:
    c = Config.quick() if args.quick else Config()
    if args.reps:
        c.reps = args.reps
    if args.procs:
        c.drain_procs = args.procs
    if args.backlog:
        c.backlog_batch = args.backlog
        c.backlog_one = max(1, args.backlog // 4)
    if args.phase_seconds:
        c.send_seconds = c.drain_seconds = args.phase_seconds
    if args.latency_rate:
        c.latency_rate = args.latency_rate
    if args.flat_rows is not None:
        c.flat_future = c.flat_leased = args.flat_rows
    if args.churn_minutes is not None:
        c.churn_minutes = args.churn_minutes
    return c


def rerender(paths: Sequence[Path], out: Path) -> int:
    """Merge saved results and report them again (no database needed)."""
    import json

    from . import report

    docs = [json.loads(p.read_text()) for p in paths]
    names: list[str] = []
    for d in docs:
        names += [n for n in d["meta"]["systems"] if n not in names]
    b = Bench([(load(n), "") for n in names if n in REGISTRY], Config(), lambda line: None)
    for d in docs:
        b.throughput += d["throughput"]
        b.latency += d["latency"]
        b.flat += d["flat"]
        b.churn += d["churn"]
    meta = {"merged_from": [str(p) for p in paths], "runs": [d["meta"] for d in docs]}
    rows = report.summarize(b)
    tgts = report.targets(b)
    report.print_report(b, rows, tgts)
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "results.json", meta, b, rows, tgts)
    first = docs[0]["meta"]
    title = (
        f"LonnyMQ bench, PostgreSQL {first['server']['server_version']}, {first['server']['cpus']} CPUs, "
        f"synchronous_commit={first['server']['synchronous_commit']}, {first['started']}"
    )
    report.write_chart(out / "chart.png", b, rows, title)
    print(f"wrote {out / 'results.json'} and {out / 'chart.png'}")
    return 0


@contextlib.contextmanager
def installed_systems(
    base: str,
    systems: Sequence[System],
    prefix: str,
    keep: bool,
    meta: dict[str, Any],
    log: Callable[[str], None],
) -> Iterator[list[tuple[System, str]]]:
    """Record the server's settings in ``meta``, install each system into a scratch database
    ``<prefix>_<system>`` of its own (versions into ``meta``) and yield [(system, its DSN)];
    the databases are dropped afterwards unless ``keep``."""
    meta["server"] = harness.server_settings(base)
    log(
        f"lonnymq bench on PostgreSQL {meta['server']['server_version']} "
        f"(synchronous_commit={meta['server']['synchronous_commit']}, fsync={meta['server']['fsync']}), "
        f"{meta['server']['cpus']} CPUs, load {meta['server']['loadavg_at_start']}; "
        f"payload {harness.PAYLOAD_BYTES} B of JSON"
    )
    meta.setdefault("versions", {})
    installed: list[tuple[System, str]] = []
    try:
        for s in systems:
            dsn = harness.create_database(base, f"{prefix}_{s.name}")
            installed.append((s, dsn))
            meta["versions"][s.name] = s.install(dsn)
            log(f"installed {s.label}: {meta['versions'][s.name]['version']}")
        yield installed
    finally:
        if not keep:
            for s, _ in installed:
                harness.drop_database(base, f"{prefix}_{s.name}")


def run(args: argparse.Namespace) -> int:
    if args.from_json:
        return rerender(args.from_json, args.out or Path("bench-results") / "merged")
    config = config_from(args)
    systems = [load(name) for name in args.systems]
    missing = [m for m in (s.missing() for s in systems) if m]
    if missing:
        for m in missing:
            print(f"bench: {m}", file=sys.stderr)
        return 2
    out = args.out or Path("bench-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, flush=True)

    started = time.time()
    meta: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "workloads": args.workloads,
        "systems": args.systems,
        "config": config.as_dict(),
        "payload_bytes": harness.PAYLOAD_BYTES,
        "versions": {},
    }
    with (
        dsn_or_temporary(args.dsn) as base,
        installed_systems(base, systems, args.db_prefix, args.keep, meta, log) as installed,
    ):
        b = Bench(installed, config, log)
        for w in args.workloads:
            log(f"== {w}")
            if w == "churn" and args.churn_systems:
                b.systems = [(s, d) for s, d in installed if s.name in args.churn_systems]
            RUNNERS[w](b)
            b.systems = installed
    meta["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["seconds"] = round(time.time() - started)
    meta["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())

    from . import report

    rows = report.summarize(b)
    tgts = report.targets(b)
    report.print_report(b, rows, tgts)
    report.write_json(out / "results.json", meta, b, rows, tgts)
    title = (
        f"LonnyMQ bench, PostgreSQL {meta['server']['server_version']}, {meta['server']['cpus']} CPUs, "
        f"synchronous_commit={meta['server']['synchronous_commit']}, {meta['started']}"
    )
    charted = report.write_chart(out / "chart.png", b, rows, title)
    log(
        f"wrote {out / 'results.json'}"
        + (f" and {out / 'chart.png'}" if charted else " (no chart: matplotlib is not installed)")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="Benchmark LonnyMQ against pgmq, PgQueuer, a bare SKIP LOCKED queue and the "
        "PostgreSQL floor on one server.",
    )
    add_arguments(p)
    return run(p.parse_args(argv))
