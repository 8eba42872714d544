"""``lonnymq migrate``: install or upgrade the schema (versioned migrations, then the function
files that changed), or print the SQL of a fresh install for another migration tool."""

from __future__ import annotations

import argparse

from .. import migrations
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.print_sql:
        print(migrations.script(_util.schema(args), args.target), end="")
        return 0
    with _util.client(args) as c:
        applied = c.migrate(target=args.target)
    name = _util.schema(args)
    if applied:
        text = f"applied migrations {applied} to schema {name!r}"
    else:
        text = f"schema {name!r} is up to date (functions refreshed if they changed)"
    _util.done(args, text, schema=name, applied=applied)
    return 0
