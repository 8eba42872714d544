"""Installing and upgrading a schema: versioned migrations, then the repeatable function files.

Each ``NNNN_name.sql`` file here is a template whose ``{schema}`` placeholder becomes the quoted
schema identifier and ``{schema_name}`` its string literal. It holds stored data only (tables,
indexes, types, rows), is applied once, in order, and recorded in ``<schema>.migration``.

The functions live in :mod:`lonnymq.sql`, one file per concept. After the versioned migrations,
every function file whose rendered text's sha256 differs from the one recorded in
``<schema>.migration_repeatable`` is applied again (``CREATE OR REPLACE``), in
:data:`lonnymq.sql.FILES` order, and if anything changed ``_apply_privileges()`` re-applies the
security policy (replacing a function resets ``SECURITY DEFINER``). All of it runs in one
transaction under a transaction-scoped advisory lock, so running it concurrently or twice is safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from psycopg import sql

from ..errors import InvalidArgument
from ..sql import FunctionFile, function_files

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
        return sql.SQL(self.template).format(schema=sql.Identifier(schema), schema_name=sql.Literal(schema))


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


#: How long migrate waits for a lock (seconds) before it gives way and tries again: a migration
#: that alters a table needs its strongest lock, and while it waits for a long transaction that
#: holds the table (a forgotten ``BEGIN``, a Spark read, ``pg_dump``), every take and send of the
#: queue would wait behind it.
MIGRATE_LOCK_TIMEOUT = 1.0
#: Attempts migrate makes, :data:`MIGRATE_RETRY_DELAY` seconds apart, before raising MigrationBlocked.
MIGRATE_ATTEMPTS = 10
MIGRATE_RETRY_DELAY = 1.0


def lock_timeout_query(seconds: float) -> sql.Composed:
    """Sets lock_timeout for the rest of the migrating transaction (taken after :func:`lock_query`,
    so that migrators still queue behind one another)."""
    return sql.SQL("SET LOCAL lock_timeout = {};").format(sql.Literal(f"{max(1, round(seconds * 1000))}ms"))


def blockers_query(schema: str) -> sql.Composed:
    """The sessions, oldest transaction first, that hold a lock on one of ``schema``'s relations
    and whose transaction is older than this one's lock_timeout: (pid, state, seconds in the
    transaction, the start of their last statement)."""
    return sql.SQL(
        "SELECT a.pid, a.state, round(extract(epoch FROM clock_timestamp() - a.xact_start))::bigint,"
        "       left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60)"
        "  FROM pg_stat_activity a"
        " WHERE a.pid <> pg_backend_pid() AND a.xact_start < clock_timestamp() - %s::interval"
        "   AND EXISTS (SELECT FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        "                WHERE l.pid = a.pid AND l.granted AND c.relnamespace = {}::regnamespace)"
        " ORDER BY a.xact_start LIMIT 3"
    ).format(sql.Literal(schema))


def bootstrap_query(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE SCHEMA IF NOT EXISTS {schema};\n"
        "CREATE TABLE IF NOT EXISTS {schema}.migration (\n"
        "    version integer PRIMARY KEY,\n"
        "    name text NOT NULL,\n"
        "    applied_at timestamptz NOT NULL DEFAULT now()\n"
        ");\n"
        "CREATE TABLE IF NOT EXISTS {schema}.migration_repeatable (\n"
        "    name text PRIMARY KEY,\n"
        "    checksum text NOT NULL,\n"
        "    applied_at timestamptz NOT NULL DEFAULT now()\n"
        ");\n"
    ).format(schema=sql.Identifier(schema))


def applied_query(schema: str) -> sql.Composed:
    return sql.SQL("SELECT version FROM {}.migration ORDER BY version").format(sql.Identifier(schema))


def recorded_query(schema: str) -> sql.Composed:
    """(name, checksum) of every function file applied to ``schema``."""
    return sql.SQL("SELECT name, checksum FROM {}.migration_repeatable ORDER BY name").format(
        sql.Identifier(schema)
    )


def _record_version(schema: str, m: Migration) -> sql.Composed:
    return sql.SQL("INSERT INTO {}.migration (version, name) VALUES ({}, {}) ON CONFLICT DO NOTHING;").format(
        sql.Identifier(schema), sql.Literal(m.version), sql.Literal(m.name)
    )


def _record_file(schema: str, f: FunctionFile) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {}.migration_repeatable (name, checksum) VALUES ({}, {})\n"
        "    ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now();"
    ).format(sql.Identifier(schema), sql.Literal(f.name), sql.Literal(f.checksum(schema)))


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


def stale_files(schema: str, recorded: dict[str, str]) -> list[FunctionFile]:
    """The function files whose rendered text is not the one ``recorded`` (name -> checksum)."""
    return [f for f in function_files() if recorded.get(f.name) != f.checksum(schema)]


@dataclass(frozen=True)
class Step:
    """One statement of an upgrade; ``label`` becomes a comment in :func:`script`."""

    label: str
    query: sql.Composed


def upgrade(
    schema: str, applied: set[int], recorded: dict[str, str], target: int | None = None
) -> tuple[list[int], list[Step]]:
    """What takes ``schema`` (with versions ``applied`` and function files ``recorded``, name ->
    checksum) to ``target``: the versions to apply and the steps to run, in order, after the lock
    and the bootstrap. The function files are applied only when the versions reach the latest
    (they are written against the latest tables). Nothing to do gives ([], [])."""
    todo = pending(applied, target)
    steps: list[Step] = []
    for m in todo:
        steps.append(Step(f"migration {m.version:04d}_{m.name}", m.render(schema)))
        steps.append(Step("", _record_version(schema, m)))
    if target is None or target >= latest_version():
        for f in stale_files(schema, recorded):
            steps.append(Step(f"functions {f.name}", f.render(schema)))
            steps.append(Step("", _record_file(schema, f)))
        # Only with the functions in place: below the latest version there may be none, and
        # security_grant may name functions of a later version.
        if steps:
            steps.append(Step("privileges", privileges_query(schema)))
    return [m.version for m in todo], steps


def privileges_query(schema: str) -> sql.Composed:
    """(Re)applies the security policy to every function and table (sql/security.sql)."""
    return sql.SQL("SELECT {}._apply_privileges();").format(sql.Identifier(schema))


def script(schema: str = DEFAULT_SCHEMA, target: int | None = None) -> str:
    """The whole install as one SQL script (versioned migrations, function files, the rows that
    record them), for users who run migrations with their own tool. A strong lock is waited for
    at most :data:`MIGRATE_LOCK_TIMEOUT` seconds (then the script fails with SQLSTATE 55P03, having
    changed nothing: run it again)."""
    check_schema(schema)
    parts = ["BEGIN;", lock_query(schema).as_string(), lock_timeout_query(MIGRATE_LOCK_TIMEOUT).as_string()]
    parts.append(bootstrap_query(schema).as_string())
    for step in upgrade(schema, set(), {}, target)[1]:
        if step.label:
            parts.append(f"-- {step.label}")
        parts.append(step.query.as_string())
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
