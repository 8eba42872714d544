"""``lonnymq bench``: the benchmark suite (also ``python -m lonnymq.bench``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..bench.runner import add_arguments

    p = sub.add_parser(
        "bench",
        help="benchmark LonnyMQ against pgmq, PgQueuer, a bare SKIP LOCKED queue and the floor",
        description="Benchmark LonnyMQ against pgmq, PgQueuer, a bare SKIP LOCKED queue and the "
        "PostgreSQL floor on one server (embedded by default); prints a table and "
        "writes results.json and chart.png. See docs/benchmarks.md.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.runner import run as run_bench

    return run_bench(args)
