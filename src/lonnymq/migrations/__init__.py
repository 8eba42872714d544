"""Versioned schema migrations shipped with the package.

Each ``NNNN_name.sql`` file is a template whose ``{schema}`` placeholder becomes the quoted schema
identifier and ``{schema_name}`` its string literal. Migrations are applied in order, each
recorded in ``<schema>.migration``, all under one transaction-scoped advisory lock, so running
them concurrently or twice is safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from psycopg import sql

from ..errors import InvalidArgument

DEFAULT_SCHEMA = "lonnymq"

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    template: str

    def render(self, schema: str) -> sql.Composed:
        """The migration's SQL for ``schema``, identifiers quoted by psycopg."""
        return sql.SQL(self.template).format(  # type: ignore[arg-type]
            schema=sql.Identifier(schema), schema_name=sql.Literal(schema)
        )


def check_schema(schema: str) -> str:
    """Return ``schema`` if it is a valid lonnymq schema name, else raise InvalidArgument."""
    if not isinstance(schema, str) or not _SCHEMA_RE.match(schema):
        raise InvalidArgument(
            f"invalid schema name {schema!r}: use 1-63 of a-z 0-9 _ starting with a letter or _"
        )
    return schema


@cache
def all_migrations() -> tuple[Migration, ...]:
    """Every migration shipped in the package, in version order."""
    found = []
    for entry in resources.files(__package__).iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version: {versions}")
    return tuple(found)


def latest_version() -> int:
    return all_migrations()[-1].version


def lock_query(schema: str) -> sql.Composed:
    """Serialises migrators of one schema until their transaction ends."""
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtext('lonnymq.migrate'), hashtext({}));").format(
        sql.Literal(schema)
    )


def bootstrap_query(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE SCHEMA IF NOT EXISTS {schema};\n"
        "CREATE TABLE IF NOT EXISTS {schema}.migration (\n"
        "    version integer PRIMARY KEY,\n"
        "    name text NOT NULL,\n"
        "    applied_at timestamptz NOT NULL DEFAULT now()\n"
        ");\n"
    ).format(schema=sql.Identifier(schema))


def applied_query(schema: str) -> sql.Composed:
    return sql.SQL("SELECT version FROM {}.migration ORDER BY version").format(sql.Identifier(schema))


def record_query(schema: str) -> sql.Composed:
    return sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(sql.Identifier(schema))


def pending(applied: set[int], target: int | None = None) -> list[Migration]:
    """The migrations still to apply to reach ``target`` (default: latest)."""
    from ..errors import MigrationError

    known = {m.version for m in all_migrations()}
    unknown = sorted(applied - known)
    if unknown:
        raise MigrationError(
            f"the database has migrations {unknown} that this lonnymq does not know: upgrade lonnymq"
        )
    top = latest_version() if target is None else target
    if top < 0 or top > latest_version():
        raise InvalidArgument(f"target version must be between 0 and {latest_version()}")
    return [m for m in all_migrations() if m.version not in applied and m.version <= top]


def script(schema: str = DEFAULT_SCHEMA, target: int | None = None) -> str:
    """The whole install as one SQL script, for users who run migrations with their own tool."""
    check_schema(schema)
    parts = ["BEGIN;", lock_query(schema).as_string()]
    parts.append(bootstrap_query(schema).as_string())
    for m in pending(set(), target):
        parts.append(f"-- migration {m.version:04d}_{m.name}")
        parts.append(m.render(schema).as_string())
        parts.append(
            sql.SQL("INSERT INTO {}.migration (version, name) VALUES ({}, {}) ON CONFLICT DO NOTHING;")
            .format(sql.Identifier(schema), sql.Literal(m.version), sql.Literal(m.name))
            .as_string()
        )
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
