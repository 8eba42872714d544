"""The ``lonnymq`` command line.

The server comes from ``--dsn``, else ``$LONNYMQ_DSN``, else ``$DATABASE_URL``, else libpq's
defaults when a ``PG*`` variable is set, else the development server if it is running
(``lonnymq server start``; a one-line note on stderr says so). Nothing is ever started
implicitly: with nothing configured a command fails at once, saying what to set.

The global options (``--dsn``, ``--schema``, ``--json``, ``--utc``, ``--connect-timeout``,
``--debug``) go before or after the subcommand. Failures print one line on stderr (a traceback
only with ``--debug``) and exit 1; usage errors exit 2. Subcommands live in sibling modules,
each with ``add_parser(subparsers)``; the function a command runs is ``args.func(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NoReturn

from .. import __version__

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

# Modules providing subcommands, each with the commands it adds (in this order: the order of
# `lonnymq --help`). The benchmarks (benchmarks/) and the Spark reference pipeline
# (examples/spark_pipeline/) are not part of the package: they are run from a checkout.
# A command's name here only lets `main` build the parser of that command alone; a name missing
# here still works (through the whole parser), and tests/cli/test_startup.py checks the list.
_COMMANDS = {
    "migrate": ("migrate",),
    "queue": ("queue",),
    "messages": ("send", "peek", "take", "ack", "nack", "extend"),
    "msg": ("msg",),
    "archive": ("archive",),
    "dlq": ("dlq",),
    "server": ("server",),
    "demo": ("demo",),
    "worker": ("worker", "cron"),
    "completion": ("completion",),
    "shard": ("shard",),
    "web": ("web",),
}


class UsageError(Exception):
    """A command line that cannot work as given (exit status 2, like argparse's own errors)."""


class CommandError(Exception):
    """A failure already phrased for the user (exit status 1)."""


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the subcommands the defaults are SUPPRESSed: an option given before the subcommand is
    # then not overwritten by the subcommand's default (argparse copies its namespace over).
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    g = parser.add_argument_group("global options (before or after the command)")
    g.add_argument(
        "--dsn",
        default=default(None),
        help="PostgreSQL URI or conninfo (default: $LONNYMQ_DSN, $DATABASE_URL, PG* variables,"
        " else a running `lonnymq server`)",
    )
    g.add_argument("--schema", default=default(None), help="schema lonnymq lives in (default: lonnymq)")
    g.add_argument("--json", action="store_true", default=default(False), help="machine-readable output")
    g.add_argument("--utc", action="store_true", default=default(False), help="show times in UTC")
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=default(None),
        metavar="SECONDS",
        help="give up connecting after this long (default: $LONNYMQ_CONNECT_TIMEOUT, else 5)",
    )
    g.add_argument("--debug", action="store_true", default=default(False), help="show tracebacks of failures")


def common(parser: argparse.ArgumentParser, *, json: bool = True) -> None:
    """Accept the global options on a subcommand too (``json`` is kept for compatibility:
    every command takes ``--json``)."""
    _global_options(parser, top=False)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (what ``--help``, usage errors and completion show)."""
    return _parser(_COMMANDS, argparse.ArgumentParser)


def _parser(modules: Iterable[str], parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = parser_class(
        prog="lonnymq",
        description="LonnyMQ: a message queue inside PostgreSQL.",
        epilog="Configuration and examples: docs/cli.md. Shell completion: lonnymq completion bash.",
    )
    parser.add_argument("--version", action="version", version=f"lonnymq {__version__}")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in modules:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


class _NeedsAll(Exception):
    """The partial parser met what only the whole parser answers (see :func:`parse`)."""


class _PartialParser(argparse.ArgumentParser):
    """A parser holding some commands only: whatever it would print or exit with (help, the
    version, a usage error, a command it does not hold) is left to the whole parser. Its
    subparsers are of its class too (argparse's ``add_subparsers`` default)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        raise _NeedsAll

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _NeedsAll

    def error(self, message: str) -> NoReturn:
        raise _NeedsAll


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``build_parser().parse_args(argv)``, building only the commands ``argv`` names where
    that gives the same answer: a command line that runs a command is parsed by a parser holding
    that command (and any other whose name ``argv`` holds, e.g. as an option's value), which
    parses it as the whole parser does; anything else (help, the version, a usage error) goes
    to the whole parser. Importing every command and building its options was part of each
    ``lonnymq`` call's start-up (docs/startup.md)."""
    words = set(argv)
    modules = [m for m, commands in _COMMANDS.items() if words.intersection(commands)]
    if modules:
        try:
            return _parser(modules, _PartialParser).parse_args(argv)
        except _NeedsAll:
            pass
    return build_parser().parse_args(argv)


def describe(e: BaseException, args: argparse.Namespace) -> str:
    """One line telling the user what went wrong and, where there is one, what to do."""
    import psycopg

    from .. import errors

    schema = getattr(args, "schema", None) or "lonnymq"
    if isinstance(e, psycopg.Error):
        from ..client.ops import map_error

        mapped = map_error(e)
        if mapped is not e:
            e = mapped
    if isinstance(e, errors.NotInstalled):
        flag = "" if schema == "lonnymq" else f" --schema {schema}"
        return (
            f"lonnymq is not installed in schema {schema!r} of this database (or is out of date):"
            f" run `lonnymq migrate{flag}`"
        )
    if isinstance(e, errors.QueueNotFound):
        return f"{_one_line(str(e))} (see `lonnymq queue list`)"
    if isinstance(e, (errors.LonnyMQError, CommandError, UsageError)):
        text = str(e)
        first = _one_line(text.split("\n", 1)[0])
        return first + (" (--debug for details)" if "\n" in text.strip() else "")
    if isinstance(e, psycopg.Error):
        return f"database error: {_one_line(str(e))}"
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}"
    return f"{type(e).__name__}: {_one_line(str(e))}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _failures() -> tuple[type[BaseException], ...]:
    """The exceptions ``main`` reports in one line: imported when one is raised (a command that
    fails before connecting need not import psycopg for it)."""
    import psycopg

    from .. import errors

    return (errors.LonnyMQError, CommandError, psycopg.Error, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else list(argv))
    debug = bool(args.debug or os.environ.get("LONNYMQ_DEBUG"))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `lonnymq peek q | head`
        sys.stderr.close()
        return 0
    except UsageError as e:
        print(f"lonnymq {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except _failures() as e:
        if debug:
            traceback.print_exc()
        print(f"lonnymq: {describe(e, args)}", file=sys.stderr)
        return 1
