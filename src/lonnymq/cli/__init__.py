"""The ``lonnymq`` command line.

Every subcommand takes ``--dsn`` (default ``$LONNYMQ_DSN``, else a persistent embedded
PostgreSQL) and ``--schema``; commands that print data take ``--json`` for scripts.
Subcommands live in sibling modules, each with ``add_parser(subparsers)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import errors

# Modules providing subcommands. The benchmarks (benchmarks/) and the Spark reference pipeline
# (examples/spark_pipeline/) are not part of the package: they are run from a checkout.
_COMMANDS = ["migrate", "queue", "messages", "dlq", "demo", "worker"]


def common(parser: argparse.ArgumentParser, *, json: bool = False) -> None:
    """Add the options every subcommand shares."""
    parser.add_argument("--dsn", help="PostgreSQL URI/conninfo (default: $LONNYMQ_DSN, else embedded)")
    parser.add_argument("--schema", default="lonnymq", help="schema lonnymq lives in (default: lonnymq)")
    if json:
        parser.add_argument("--json", action="store_true", help="machine-readable JSON output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lonnymq", description="LonnyMQ: a message queue inside PostgreSQL."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except errors.LonnyMQError as e:
        print(f"lonnymq: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
