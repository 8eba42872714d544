"""The Spark reference pipeline: events -> queue -> workers -> report (``./run demo`` runs it).

    pip install -e '.[spark,embedded]'          # PySpark, pyarrow, matplotlib; Java 17 for Spark
    python examples/spark_pipeline/run.py [--events N] [--out DIR] [--dsn URI]

Generates order events with Spark, bulk-enqueues them with ``format("lonnymq")``, drains the
queue with worker processes (with injected failures, retries and dead letters) and writes a
report from the queue's archive: Parquet tables, PNG charts and ``index.html`` (with the run's
parameters and what each number means). It connects like the ``lonnymq`` CLI: ``--dsn``, else
``$LONNYMQ_DSN``, ``$DATABASE_URL``, ``PG*`` variables, else the development server if one runs
(``lonnymq server start``). The schema (``--schema``) is dropped before the run and kept after it,
for a look at the archive; ``--drop`` drops it at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lonnymq.errors import LonnyMQError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python examples/spark_pipeline/run.py",
        description="The Spark reference pipeline: events -> queue -> workers -> report.",
    )
    p.add_argument(
        "--dsn",
        help="PostgreSQL URI/conninfo (default: $LONNYMQ_DSN, $DATABASE_URL, PG* variables, else the"
        " running development server)",
    )
    p.add_argument(
        "--schema",
        default="lonnymq_pipeline",
        help="schema to run in, dropped first (default lonnymq_pipeline)",
    )
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
    p.add_argument("--drop", action="store_true", help="drop the schema when the run is over")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline import drop_schema, server
    from pipeline import run as run_pipeline
    from rich.console import Console

    from lonnymq.embedded import locate_server

    args = parser().parse_args(argv)
    console = Console()
    if args.events < 1 or args.workers < 1 or args.concurrency < 1:
        raise SystemExit("pipeline: --events, --workers and --concurrency must be positive")
    try:
        dsn, source = locate_server(args.dsn)
    except LonnyMQError as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 2
    console.rule("[bold]LonnyMQ Spark reference pipeline")
    console.print(f"server {server(dsn)} ({source}), schema {args.schema!r}, output {str(args.out)!r}")
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
    if args.drop:
        drop_schema(dsn, args.schema)
    console.print_json(json.dumps(summary, default=str))
    console.print(f"[bold green]report:[/bold green] {args.out / 'report' / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
