"""Shared helpers of the CLI commands: the server to use, the connection and client, output
(rich tables that wrap, JSON, times), confirmation."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..client.config import connect_timeout, libpq_timeout
from . import CommandError, UsageError

if TYPE_CHECKING:
    from ..client import Client
    from ..models import Message

_PIPE_WIDTH = 200


def schema(args: argparse.Namespace) -> str:
    from ..migrations import DEFAULT_SCHEMA

    return getattr(args, "schema", None) or getattr(args, "default_schema", None) or DEFAULT_SCHEMA


def resolve(args: argparse.Namespace) -> str:
    """The DSN to use (see :func:`lonnymq.embedded.locate_server`); says so on stderr when it is
    the development server, which is only used if nobody configured anything."""
    from ..embedded import DEV_SERVER, locate_server

    dsn, source = locate_server(args.dsn)
    check_dsn(dsn)
    if source == DEV_SERVER:
        print(
            f"lonnymq: using the development server at {where(dsn)} (nothing else configured)",
            file=sys.stderr,
        )
    return dsn


def where(dsn: str) -> str:
    """Where a DSN points, without its password: ``user@host:port/dbname``."""
    from ..client.config import location

    return location(dsn)


def check_dsn(dsn: str) -> str:
    """``dsn`` if libpq can parse it, else a one-line error saying what a DSN looks like (the DSN
    itself is not repeated: it may hold a password)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        reason = " ".join(str(e).split())
        raise CommandError(
            f"invalid DSN ({reason}): a DSN is a URI, postgresql://USER@HOST:PORT/DBNAME,"
            " or key=value pairs, host=HOST dbname=DBNAME"
        ) from e
    return dsn


def connect_to(dsn: str, args: argparse.Namespace) -> psycopg.Connection[Any]:
    """An autocommit connection to ``dsn`` (from :func:`resolve`, which checked it) within the
    connect timeout; failures as one readable line."""
    timeout = connect_timeout(getattr(args, "connect_timeout", None))
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=libpq_timeout(timeout))
    except psycopg.OperationalError as e:
        reason = " ".join(str(e).split())
        raise CommandError(f"cannot connect to {where(dsn)}: {reason}") from e


@contextlib.contextmanager
def connection(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    conn = connect_to(resolve(args), args)
    with conn:
        yield conn


@contextlib.contextmanager
def client(args: argparse.Namespace) -> Iterator[Client]:
    """A client on one autocommit connection to the configured server (each call its own
    transaction unless the command opens one)."""
    from ..client import Client

    with connection(args) as conn, Client(conn, schema=schema(args)) as c:
        yield c


# -- output ------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if "body" in out:  # show the decoded payload, not raw bytes
            del out["body"]
            out["payload"] = jsonable(getattr(value, "payload"))  # noqa: B009 - only Message has it
        return out
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def print_json(value: Any) -> None:
    json.dump(jsonable(value), sys.stdout, default=str)
    sys.stdout.write("\n")


def emit(
    args: argparse.Namespace,
    rows: Sequence[Any],
    columns: Sequence[str],
    title: str | None = None,
    *,
    times: Sequence[str] = (),
) -> None:
    """Print ``rows`` (dataclasses or dicts) as a table whose cells wrap (nothing is cut on a
    narrow terminal), or as a JSON array with ``--json``. Columns in ``times`` hold epoch ms and
    are shown as ISO 8601 local time (UTC with ``--utc``); JSON keeps the numbers."""
    data = [jsonable(r) for r in rows]
    if args.json:
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=_PIPE_WIDTH)  # a file or pipe: lines are not limited to 80
    cells = [[when(row.get(c), args) if c in times else cell(row.get(c)) for c in columns] for row in data]
    table = Table(title=title)
    for c in columns:
        table.add_column(c, overflow="fold", min_width=min(len(c), 12))
    for values in cells:
        table.add_row(*values)
    # Each column at its minimum width plus padding and a border ("│ x "), and the last border.
    if sum(min(len(c), 12) + 3 for c in columns) + 1 <= console.width:
        console.print(table)
        return
    # Too narrow for the columns: one block per row, "column: value" lines that wrap.
    from rich.text import Text

    if title:
        console.print(Text(title, style="bold"))
    for values in cells:
        console.rule()
        for c, v in zip(columns, values, strict=True):
            if v:
                console.print(Text(f"{c}: ", style="bold") + Text(v), overflow="fold")


def done(args: argparse.Namespace, text: str, **data: Any) -> None:
    """What a command did: ``text`` for people, ``data`` as a JSON object with ``--json``."""
    if args.json:
        print_json(data)
    else:
        print(text)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def when(ms: Any, args: argparse.Namespace) -> str:
    """Epoch milliseconds as ISO 8601, local time with its offset (``--utc``: UTC)."""
    if ms is None:
        return ""
    moment = datetime.fromtimestamp(int(ms) / 1000, UTC)
    return (moment if args.utc else moment.astimezone()).isoformat(timespec="seconds")


def state(m: Message, now_ms: int) -> str:
    """What a message is doing now: leased (someone holds it), scheduled (not due yet) or ready."""
    if m.lease_until is not None and m.lease_until > now_ms:
        return "leased"
    return "scheduled" if m.scheduled_at > now_ms else "ready"


def db_now_ms(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def confirm(args: argparse.Namespace, question: str) -> bool:
    """Ask ``question`` on the terminal unless ``--yes``; refuse without a terminal to ask on."""
    if getattr(args, "yes", False):
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: not confirmed (stdin is not a terminal): add --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    return answer in ("y", "yes")


def parse_payload(text: str) -> Any:
    """A payload given on the command line: JSON if it parses, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
