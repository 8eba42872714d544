"""``lonnymq pipeline``: the Spark reference pipeline (needs ``lonnymq[spark]`` and Java).

Generates order events with Spark, bulk-enqueues them with ``format("lonnymq")``, drains the
queue with worker processes (with injected failures, retries and dead letters) and writes a
report from the queue's archive: Parquet tables, PNG charts and ``index.html``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pipeline", help="the Spark reference pipeline: events -> queue -> workers -> report")
    common(p)
    p.add_argument(
        "--events",
        type=int,
        default=200_000,
        help="order events to generate (default 200000; the full run: 1000000)",
    )
    p.add_argument("--input", type=Path, help="read the events from this Parquet instead of generating them")
    p.add_argument(
        "--out", type=Path, default=Path("pipeline_out"), help="output directory (default ./pipeline_out)"
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=200, help="handlers at once per worker (default 200)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.set_defaults(func=run, schema="lonnymq_pipeline")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..embedded import resolve_dsn
    from ..spark.pipeline import run as run_pipeline

    console = Console()
    if args.events < 1 or args.workers < 1 or args.concurrency < 1:
        raise SystemExit("pipeline: --events, --workers and --concurrency must be positive")
    dsn = resolve_dsn(args.dsn)
    console.rule("[bold]LonnyMQ Spark reference pipeline")
    console.print(f"server {dsn.split('@')[-1]!r}, schema {args.schema!r}, output {str(args.out)!r}")
    summary = run_pipeline(
        dsn,
        args.schema,
        args.out,
        events=args.events,
        input_path=args.input,
        workers=args.workers,
        concurrency=args.concurrency,
        master=args.master,
        say=console.print,
    )
    console.print_json(json.dumps(summary, default=str))
    console.print(f"[bold green]report:[/bold green] {args.out / 'report' / 'index.html'}")
    return 0
