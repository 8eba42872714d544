"""The optional pgmq facade (``migrations/pgmq.sql``): a ``pgmq`` schema with pgmq 1.x's SQL API
over the queues of a LonnyMQ schema. Not part of a plain migrate: ``migrate(pgmq=True)`` or
``lonnymq migrate --pgmq`` installs it after the LonnyMQ schema is up to date (docs/pgmq.md)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from psycopg import sql

_MARK = "LonnyMQ pgmq facade over schema "


@cache
def _template() -> str:
    return resources.files(__package__).joinpath("pgmq.sql").read_text(encoding="utf-8")


def marker(schema: str) -> str:
    """The comment on the ``pgmq`` schema that this package's facade over ``schema`` sets."""
    checksum = hashlib.sha256(f"{schema}\n{_template()}".encode()).hexdigest()
    return f"{_MARK}{schema}; sha256 {checksum}"


def install_query(schema: str) -> sql.Composed:
    """(Re)create the ``pgmq`` schema over LonnyMQ schema ``schema``. Raises (SQLSTATE 55000)
    when the pgmq extension is installed or a ``pgmq`` schema exists that is not this facade."""
    return sql.SQL(_template()).format(
        schema=sql.Identifier(schema),
        schema_name=sql.Literal(schema),
        checksum=sql.Literal(marker(schema).rpartition(" ")[2]),
    )


def installed_query() -> sql.Composed:
    """The comment of the ``pgmq`` schema (no row when there is none): equal to
    :func:`marker` when this very facade is installed."""
    return sql.SQL(
        "SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') FROM pg_catalog.pg_namespace n"
        " WHERE n.nspname = 'pgmq'"
    ).format()


def uninstall_query(schema: str) -> sql.Composed:
    """Drop the ``pgmq`` schema if it is this facade over ``schema``; LonnyMQ's own schema, its
    queues and messages are untouched. Raises (SQLSTATE 55000) for any other ``pgmq`` schema."""
    return sql.SQL(
        "DO $uninstall$\n"
        "DECLARE v_comment text;\n"
        "BEGIN\n"
        "    SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') INTO v_comment\n"
        "      FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgmq';\n"
        "    IF NOT FOUND THEN\n"
        "        RETURN;\n"
        "    END IF;\n"
        "    IF pg_catalog.split_part(coalesce(v_comment, ''), '; sha256 ', 1) IS DISTINCT FROM {mark} THEN\n"
        "        RAISE EXCEPTION 'schema pgmq is not LonnyMQ''s pgmq facade over schema %; not dropping it',\n"
        "            {schema_name} USING ERRCODE = '55000';\n"
        "    END IF;\n"
        "    DROP SCHEMA pgmq CASCADE;\n"
        "END $uninstall$;\n"
    ).format(mark=sql.Literal(_MARK + schema), schema_name=sql.Literal(schema))
