"""``lonnymq migrate``: install or upgrade the schema (versioned migrations, then the function
files that changed), or print the SQL of a fresh install for another migration tool."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import migrations
from ..migrations import pgmq
from . import _util, common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("migrate", help="install/upgrade the lonnymq schema")
    common(p)
    p.add_argument(
        "--print-sql",
        action="store_true",
        help="print the SQL of a fresh install (migrations, functions, the rows recording them) instead",
    )
    p.add_argument(
        "--target",
        type=int,
        help="migrate up to this version (default: latest; functions are applied at the latest only)",
    )
    p.add_argument(
        "--pgmq",
        action="store_true",
        help="also (re)install the pgmq facade: a pgmq schema with pgmq's SQL API over these queues (docs/pgmq.md)",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=migrations.MIGRATE_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="wait at most this long for a lock, then roll back and try again, so that the queues"
        f" never wait behind migrate waiting behind a long transaction (default {migrations.MIGRATE_LOCK_TIMEOUT:g})",
    )
    p.add_argument(
        "--attempts",
        type=int,
        default=migrations.MIGRATE_ATTEMPTS,
        help=f"attempts, {migrations.MIGRATE_RETRY_DELAY:g} s apart, before giving up (default {migrations.MIGRATE_ATTEMPTS})",
    )
    p.add_argument(
        "--uninstall-pgmq",
        action="store_true",
        help="drop the pgmq facade (the pgmq schema) and nothing else",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.print_sql:
        print(migrations.script(_util.schema(args), args.target), end="")
        if args.pgmq:
            print(
                "-- the pgmq facade (docs/pgmq.md)\n" + pgmq.install_query(_util.schema(args)).as_string(),
                end="",
            )
        return 0
    name = _util.schema(args)
    if args.uninstall_pgmq:
        with _util.client(args) as c:
            c.uninstall_pgmq()
        _util.done(
            args, "dropped the pgmq facade (schema pgmq), if it was installed", schema=name, applied=[]
        )
        return 0
    from ..client import Client

    with _util.connection(args) as conn, Client(conn, schema=name) as c:
        conn.add_notice_handler(_Warnings())
        applied = c.migrate(
            target=args.target, pgmq=args.pgmq, lock_timeout=args.lock_timeout, attempts=args.attempts
        )
    if applied:
        text = f"applied migrations {applied} to schema {name!r}"
    else:
        text = f"schema {name!r} is up to date (functions refreshed if they changed)"
    if args.pgmq:
        text += f"; the pgmq facade (schema pgmq) serves schema {name!r}"
    _util.done(args, text, schema=name, applied=applied, pgmq=args.pgmq)
    return 0


class _Warnings:
    """Print the migration's own warnings on stderr, once each (a retried attempt repeats them):
    e.g. a role that the installing user may not create, and what to run once a DBA has created
    it (docs/security.md, "Installing without CREATEROLE"). PostgreSQL's notices are dropped."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, diag: Any) -> None:
        text = diag.message_primary or ""
        if diag.severity_nonlocalized == "WARNING" and text.startswith("lonnymq: ") and text not in self.seen:
            self.seen.add(text)
            print(f"lonnymq migrate: warning: {text.removeprefix('lonnymq: ')}", file=sys.stderr)
