"""Shared helpers of the CLI commands: the client, tables and JSON output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from ..client import Client


def client(args: argparse.Namespace) -> Client:
    """A client for ``--dsn``/``--schema`` (embedded server when no DSN is configured)."""
    return Client(args.dsn, schema=args.schema, pool_size=2)


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


def emit(
    args: argparse.Namespace, rows: Sequence[Any], columns: Sequence[str], title: str | None = None
) -> None:
    """Print ``rows`` (dataclasses or dicts) as a rich table, or as JSON with ``--json``."""
    data = [jsonable(r) for r in rows]
    if getattr(args, "json", False):
        json.dump(data, sys.stdout, indent=None, default=str)
        sys.stdout.write("\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for row in data:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    Console().print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


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
