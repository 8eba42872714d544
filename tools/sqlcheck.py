"""The SQL core checked like code: plpgsql_check lint and plpgsql coverage of the test suite.

Runs against a throwaway PostgreSQL 15 cluster from Debian's binaries (``tools/pgcluster.py``), with
``postgresql-15-plpgsql-check`` installed on demand.  Subcommands:

    .venv/bin/python tools/sqlcheck.py check
        migrate a fresh schema, run every plpgsql function through plpgsql_check_function_tb with
        performance, extra and security warnings; print ``schema.function:line: level: message``;
        exit 1 on any finding.
    .venv/bin/python tools/sqlcheck.py coverage [--min-statements 95 --min-branches 85] [-- PYTEST ARGS]
        run the test suite against a cluster with the plpgsql_check profiler on, then print per-function
        statement and branch coverage and the uncovered statements; exit 1 below the bar.
    .venv/bin/python tools/sqlcheck.py report FILE.jsonl [--min-statements ... --min-branches ...]
        print the coverage report of an earlier run's data again.
    .venv/bin/python tools/sqlcheck.py start
        start a cluster, print its DSN and keep it until Ctrl-C.
    .venv/bin/python tools/sqlcheck.py run -- COMMAND...
        run COMMAND with LONNYMQ_TEST_DSN pointing at a fresh cluster.

Every subcommand that needs a server accepts ``--dsn`` to use an existing one instead (it must have
plpgsql_check in shared_preload_libraries; for coverage also ``plpgsql_check.profiler = on``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # sql_coverage: the shared record format and the merge
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pgcluster  # noqa: E402

import sql_coverage  # noqa: E402

DEFAULT_SCHEMAS = ["lonnymq"]
COVERAGE_ENV = sql_coverage.ENV_VAR

# Profiles of every session go to shared memory (plpgsql_check is preloaded); each test schema adds
# ~60 functions, and the test hook resets their profiles once read, so the default chunk count is ample.
PROFILER_SETTINGS = {
    "plpgsql_check.profiler": "on",
    "plpgsql_check.profiler_max_shared_chunks": "15000",
}


@contextmanager
def server(dsn: str | None, settings: dict[str, str] | None = None) -> Iterator[str]:
    """The given DSN, or a fresh throwaway cluster's DSN for the duration of the block."""
    if dsn:
        yield dsn
        return
    with pgcluster.temporary_cluster(settings) as cluster:
        yield cluster.dsn


# -- check -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    function: str  # schema.name
    signature: str  # schema.name(args), for the reader who must tell overloads apart
    lineno: int | None
    level: str
    message: str
    detail: str | None
    hint: str | None
    statement: str | None

    def __str__(self) -> str:
        line = f"{self.function}:{self.lineno if self.lineno is not None else '-'}: {self.level}: "
        line += self.message
        extra = [f"    {k}: {v}" for k, v in (("detail", self.detail), ("hint", self.hint)) if v]
        return "\n".join([line, *extra])


FUNCTIONS_QUERY = """
SELECT p.oid, n.nspname, p.proname, p.oid::regprocedure::text,
       p.prorettype = 'trigger'::regtype AS is_trigger,
       p.prorettype = 'event_trigger'::regtype AS is_event_trigger,
       (SELECT min(t.tgrelid::regclass::text) FROM pg_trigger t WHERE t.tgfoid = p.oid) AS relation
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
JOIN pg_language l ON l.oid = p.prolang
WHERE n.nspname = ANY (%s) AND l.lanname = 'plpgsql'
ORDER BY n.nspname, p.proname, p.oid
"""

CHECK_QUERY = """
SELECT lineno, level, message, detail, hint, statement
FROM plpgsql_check_function_tb(
    %(oid)s::regprocedure, relid => coalesce(%(relation)s::regclass, 0),
    fatal_errors => false, other_warnings => true, performance_warnings => true,
    extra_warnings => true, security_warnings => true)
"""


def check_functions(conn: psycopg.Connection[tuple[Any, ...]], schemas: Sequence[str]) -> list[Finding]:
    """Every plpgsql function of ``schemas`` through plpgsql_check; in-comment options and pragmas in
    a function's source are honoured by plpgsql_check itself (use_incomment_options defaults to on)."""
    findings: list[Finding] = []
    rows = conn.execute(FUNCTIONS_QUERY, (list(schemas),)).fetchall()
    for oid, nspname, proname, signature, is_trigger, is_event_trigger, relation in rows:
        name = f"{nspname}.{proname}"
        if is_event_trigger:
            continue  # plpgsql_check cannot check event trigger functions
        if is_trigger and relation is None:
            findings.append(
                Finding(name, str(signature), None, "error", "trigger function on no table: cannot be checked",
                        None, None, None)
            )  # fmt: skip
            continue
        for lineno, level, message, detail, hint, statement in conn.execute(
            CHECK_QUERY, {"oid": oid, "relation": relation}
        ):
            findings.append(
                Finding(name, str(signature), lineno, str(level), str(message), detail, hint, statement)
            )
    return findings


def migrate(dsn: str, schemas: Sequence[str], pgmq: bool = False) -> None:
    """Install ``schemas``; with ``pgmq``, the pgmq facade (schema pgmq) over the first one too."""
    from lonnymq import Client

    for i, schema in enumerate(schemas):
        with Client(dsn, schema=schema, pool_size=1) as client:
            client.migrate(pgmq=pgmq and i == 0)


def cmd_check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    schemas: list[str] = args.schema or DEFAULT_SCHEMAS
    # The pgmq facade (one schema "pgmq" per database) is checked on a throwaway server only.
    pgmq = not args.dsn
    checked = [*schemas, *(["pgmq"] if pgmq else []), *(args.also_check or [])]
    with server(args.dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
            existing = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = ANY (%s)", (schemas,)
            ).fetchall()
            if existing:  # only on a server given by --dsn: never check (or drop) someone's schema
                print(f"sqlcheck: schema(s) already exist: {[r[0] for r in existing]}; pass other --schema names",
                      file=sys.stderr)  # fmt: skip
                return 2
        try:
            migrate(dsn, schemas, pgmq)
            with psycopg.connect(dsn, autocommit=True) as conn:
                (nfunctions,) = conn.execute(
                    "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
                    " WHERE p.pronamespace::regnamespace::text = ANY (%s) AND l.lanname = 'plpgsql'",
                    (checked,),
                ).fetchone() or (0,)
                findings = check_functions(conn, checked)
        finally:
            if args.dsn:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for schema in schemas:
                        conn.execute(
                            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                        )
    for f in findings:
        print(f)
    nfuncs = len({f.signature for f in findings})
    print(
        f"sqlcheck: {len(findings)} finding(s) in {nfuncs} of {nfunctions} plpgsql function(s)"
        f" of schema(s) {', '.join(checked)} ({time.monotonic() - started:.1f}s)",
        file=sys.stderr,
    )
    return 1 if findings else 0


# -- coverage --------------------------------------------------------------------------------------


def cmd_coverage(args: argparse.Namespace) -> int:
    started = time.monotonic()
    data = (
        Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="lonnymq-sqlcov-")) / "coverage.jsonl"
    )
    data.parent.mkdir(parents=True, exist_ok=True)
    for old in sql_coverage.data_files(data):
        old.unlink()
    pytest_args = list(args.pytest_args)
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    with server(args.dsn, PROFILER_SETTINGS) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
            (profiler,) = conn.execute("SHOW plpgsql_check.profiler").fetchone() or ("off",)
            if profiler != "on":
                print("sqlcheck: plpgsql_check.profiler is off on that server", file=sys.stderr)
                return 2
        env = {**os.environ, "LONNYMQ_TEST_DSN": dsn, COVERAGE_ENV: str(data)}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args]
        print(f"sqlcheck: {' '.join(cmd)} (LONNYMQ_TEST_DSN={dsn})", file=sys.stderr, flush=True)
        tests_rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    print(f"sqlcheck: test run took {time.monotonic() - started:.0f}s, exit {tests_rc}", file=sys.stderr)
    if not sql_coverage.data_files(data):
        print(f"sqlcheck: no coverage data was written to {data}", file=sys.stderr)
        return 1
    rc = report(data, args)
    if tests_rc != 0:
        print(f"sqlcheck: the test suite failed (exit {tests_rc})", file=sys.stderr)
        return rc if args.ignore_test_failures else tests_rc
    return rc


def report(data: Path, args: argparse.Namespace) -> int:
    cov = sql_coverage.merge(sql_coverage.read_records(data))
    print(sql_coverage.format_report(cov, show_uncovered=not args.no_uncovered))
    stmts, branches = cov.totals()
    ok = True
    if stmts.percent < args.min_statements:
        print(f"sqlcheck: statement coverage {stmts.percent:.1f}% < {args.min_statements}%", file=sys.stderr)
        ok = False
    if branches.percent < args.min_branches:
        print(f"sqlcheck: branch coverage {branches.percent:.1f}% < {args.min_branches}%", file=sys.stderr)
        ok = False
    print(f"sqlcheck: coverage data in {data}", file=sys.stderr)
    return 0 if ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    return report(Path(args.data), args)


# -- start / run -----------------------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    with server(None, PROFILER_SETTINGS if args.profiler else None) as dsn:
        print(dsn, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("sqlcheck run: give a command after --", file=sys.stderr)
        return 2
    with server(None, PROFILER_SETTINGS if args.profiler else None) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        return subprocess.run(command, env={**os.environ, "LONNYMQ_TEST_DSN": dsn}).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sqlcheck", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("check", help="plpgsql_check every plpgsql function; exit 1 on any finding")
    p.add_argument("--dsn", help="use this server instead of a throwaway PostgreSQL 15 cluster")
    p.add_argument(
        "--schema",
        action="append",
        help="schema to install with Client(dsn, schema=...).migrate() and check (repeatable; default lonnymq)",
    )
    p.add_argument(
        "--also-check",
        action="append",
        metavar="SCHEMA",
        help="a schema the migration creates besides its own (e.g. a pgmq-compatible one) to check too",
    )
    p.set_defaults(func=cmd_check)

    def bars(p: argparse.ArgumentParser) -> None:
        p.add_argument("--min-statements", type=float, default=95.0, help="statement coverage bar, %% (95)")
        p.add_argument("--min-branches", type=float, default=85.0, help="branch coverage bar, %% (85)")
        p.add_argument("--no-uncovered", action="store_true", help="do not list the uncovered statements")

    p = sub.add_parser("coverage", help="run the test suite with the profiler on, then report SQL coverage")
    p.add_argument("--dsn", help="use this server (profiler on, plpgsql_check preloaded) instead")
    p.add_argument("--data", help="JSONL file for the raw coverage records (default: a temp file)")
    p.add_argument(
        "--ignore-test-failures",
        action="store_true",
        help="exit with the coverage verdict even when the test suite fails (default: pytest's status)",
    )
    bars(p)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then arguments for pytest")
    p.set_defaults(func=cmd_coverage)

    p = sub.add_parser("report", help="print the coverage report of an earlier run's JSONL data")
    p.add_argument("data")
    bars(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("start", help="start a throwaway cluster, print its DSN, keep it until Ctrl-C")
    p.add_argument("--profiler", action="store_true", help="with plpgsql_check.profiler = on")
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("run", help="run a command with LONNYMQ_TEST_DSN set to a throwaway cluster")
    p.add_argument("--profiler", action="store_true", help="with plpgsql_check.profiler = on")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_run)

    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
    except pgcluster.ClusterError as e:
        print(f"sqlcheck: {e}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
