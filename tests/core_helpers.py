"""Helpers shared by the queue-core tests (test_migrations, test_send, test_take, ...).

``Sql`` calls the plpgsql functions directly with named arguments, so tests can pass ``p_now``
and control time exactly instead of sleeping. ``catalog`` is a normalised dump of everything a
migration creates in a schema, for "fresh install equals replay" comparisons.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from lonnymq import Message

# The SQL type of every parameter name the core functions use, for explicit casts.
_TYPES = {
    "p_name": "text",
    "p_queue": "text",
    "p_now": "bigint",
    "p_limit": "int",
    "p_cap": "int",
    "p_lease_ms": "bigint",
    "p_max_attempts": "int",
    "p_dead_letter_queue": "text",
    "p_archive": "bool",
    "p_retention_ms": "bigint",
    "p_unlogged": "bool",
    "p_max_payload_bytes": "int",
    "p_priority_step_ms": "bigint",
    "p_if_not_exists": "bool",
    "p_if_exists": "bool",
    "p_payloads": "bytea[]",
    "p_kinds": "text[]",
    "p_content_types": "text[]",
    "p_headers": "jsonb[]",
    "p_at_ms": "bigint[]",
    "p_delays_ms": "bigint[]",
    "p_priorities": "int2[]",
    "p_keys": "text[]",
    "p_channels": "text[]",
    "p_on_conflict": "text",
    "p_ids": "bigint[]",
    "p_tokens": "int[]",
    "p_ack_ids": "bigint[]",
    "p_ack_tokens": "int[]",
    "p_errors": "text[]",
    "p_states": "jsonb[]",
    "p_count_attempt": "bool",
    "p_after_id": "bigint",
    "p_id": "bigint",
    "p_key": "text",
}


class Sql:
    """Direct calls of ``<schema>.<function>(p_x => ...)`` returning dict rows."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.s = sql.Identifier(schema)

    def q(self, text: str, params: Any = ()) -> list[dict[str, Any]]:
        """Run ``text`` with ``{s}`` standing for the schema; dict rows (or [])."""
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(sql.SQL(text).format(s=self.s), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []

    def call(self, func: str, **args: Any) -> list[dict[str, Any]]:
        names = list(args)
        parts = [
            sql.SQL("{} => %s::{}").format(sql.Identifier(n), sql.SQL(_TYPES[n]))  # type: ignore[arg-type]
            for n in names
        ]
        query = sql.SQL("SELECT * FROM {}.{}({})").format(
            self.s, sql.Identifier(func), sql.SQL(", ").join(parts)
        )
        values = [
            [None if x is None else Jsonb(x) for x in v] if n in ("p_headers", "p_states") and v else v
            for n, v in args.items()
        ]
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(query, values)
        return cur.fetchall()

    # Shorthands for the calls tests make most.
    def now(self) -> int:
        return int(self.q("SELECT {s}.now_ms() AS n")[0]["n"])

    def send(self, queue: str, payloads: list[bytes], now: int, **kw: Any) -> list[dict[str, Any]]:
        return self.call("send_batch", p_queue=queue, p_payloads=payloads, p_now=now, **kw)

    def take(self, queue: str, n: int, now: int, **kw: Any) -> list[dict[str, Any]]:
        return self.call("take", p_queue=queue, p_limit=n, p_now=now, **kw)

    def queue_id(self, name: str) -> int:
        return int(self.q("SELECT id FROM {s}.queue WHERE name = %s", (name,))[0]["id"])

    def row(self, queue: str, msg_id: int) -> dict[str, Any] | None:
        rows = self.q(
            "SELECT m.* FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
            " WHERE q.name = %s AND m.id = %s",
            (queue, msg_id),
        )
        return rows[0] if rows else None

    def count(self, queue: str) -> int:
        return int(
            self.q(
                "SELECT count(*) AS n FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
                " WHERE q.name = %s",
                (queue,),
            )[0]["n"]
        )

    def archive(self, queue: str) -> list[dict[str, Any]]:
        return self.q(
            "SELECT a.* FROM {s}.archive a JOIN {s}.queue q ON q.id = a.queue_id"
            " WHERE q.name = %s ORDER BY a.id",
            (queue,),
        )


def as_message(queue: str, row: dict[str, Any]) -> Message:
    """The client's Message for a delivery row returned by the SQL take()."""
    return Message(
        queue,
        row["id"],
        row["token"],
        row["attempt"],
        row["lease_until"],
        row["scheduled_at"],
        row["enqueued_at"],
        row["priority"],
        row["key"],
        row["channel"],
        row["kind"],
        row["content_type"],
        row["headers"],
        row["state"],
        row["last_error"],
        bytes(row["payload"]),
    )


def fresh_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def drop_schema(dsn: str, schema: str) -> None:
    if os.environ.get("LONNYMQ_SQL_COVERAGE"):  # tools/sqlcheck.py coverage: read profiles before DROP
        from sql_coverage import record_schema

        with psycopg.connect(dsn, autocommit=True) as conn:
            exists = conn.execute("SELECT FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if exists is not None:
            record_schema(dsn, schema, os.environ["LONNYMQ_SQL_COVERAGE"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class CountingConnection(psycopg.Connection[Any]):
    """A connection that counts the statements executed on it (each is one round trip): through
    ``execute()`` or a cursor of its own (the client makes its cursor, then executes on it)."""

    executed: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cursor_factory = _CountingCursor


class _CountingCursor(psycopg.Cursor[Any]):
    def execute(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        cast(CountingConnection, self.connection).executed += 1
        return super().execute(*args, **kwargs)


# -- catalog dumps ---------------------------------------------------------------------------

_CATALOG_QUERIES = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.relispartition, c.relrowsecurity,
               coalesce(c.relacl::text, '') AS acl, coalesce(obj_description(c.oid), '') AS comment,
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) ELSE '' END AS partkey
          FROM pg_class c WHERE c.relnamespace = %(ns)s
         ORDER BY c.relname""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
               a.attnotnull, a.attidentity, a.attgenerated,
               coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS def,
               coalesce(col_description(c.oid, a.attnum), '') AS comment
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = %(ns)s AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY c.relname, a.attnum""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relnamespace = %(ns)s ORDER BY c.relname""",
    "constraints": """
        SELECT conname, conrelid::regclass::text AS rel, contype, pg_get_constraintdef(oid) AS def
          FROM pg_constraint WHERE connamespace = %(ns)s ORDER BY rel, conname""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
               pg_get_function_result(p.oid) AS result, p.prokind, p.provolatile, p.proparallel,
               p.prosecdef, p.proisstrict, coalesce(p.proconfig::text, '') AS config,
               coalesce(p.proacl::text, '') AS acl, l.lanname, md5(p.prosrc) AS src,
               pg_get_function_arguments(p.oid) AS full_args
          FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
         WHERE p.pronamespace = %(ns)s ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype,
               coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod),
                                           ', ' ORDER BY a.attnum)
                           FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0), '')
                 AS attrs,
               coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                           FROM pg_enum e WHERE e.enumtypid = t.oid), '') AS labels
          FROM pg_type t WHERE t.typnamespace = %(ns)s ORDER BY t.typname""",
    "triggers": """
        SELECT tg.tgname, pg_get_triggerdef(tg.oid) AS def
          FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
         WHERE c.relnamespace = %(ns)s AND NOT tg.tgisinternal ORDER BY 1""",
    "policies": """
        SELECT pol.polname, pol.polrelid::regclass::text AS rel, pol.polcmd, pol.polpermissive,
               coalesce(pg_get_expr(pol.polqual, pol.polrelid), '') AS qual,
               coalesce(pg_get_expr(pol.polwithcheck, pol.polrelid), '') AS chk
          FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid
         WHERE c.relnamespace = %(ns)s ORDER BY 1, 2""",
    "sequences": """
        SELECT c.relname, s.seqtypid::regtype::text AS type, s.seqstart, s.seqincrement, s.seqcycle
          FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
         WHERE c.relnamespace = %(ns)s ORDER BY 1""",
    "schema": """
        SELECT coalesce(n.nspacl::text, '') AS acl, coalesce(obj_description(n.oid), '') AS comment
          FROM pg_namespace n WHERE n.oid = %(ns)s""",
    "migrations": "SELECT version, name FROM {s}.migration ORDER BY version",
    "function_files": "SELECT name FROM {s}.migration_repeatable ORDER BY name",
}


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything the migrations define in ``schema``, with the schema name normalised, so two
    schemas installed differently can be compared with ``==``."""
    ns = conn.execute("SELECT %s::regnamespace::oid", (schema,)).fetchone()[0]  # type: ignore[index]
    quoted = sql.Identifier(schema).as_string(conn)

    def norm(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(quoted, "<schema>").replace(schema, "<schema>")
        return value

    out: dict[str, list[tuple[Any, ...]]] = {}
    for what, query in _CATALOG_QUERIES.items():
        q = sql.SQL(query).format(s=sql.Identifier(schema))  # type: ignore[arg-type]
        if what == "functions":
            # prosrc contains the schema name; hash it after normalising instead of before.
            q = sql.SQL(query.replace("md5(p.prosrc)", "p.prosrc"))  # type: ignore[arg-type]
        rows = conn.execute(q, {"ns": ns}).fetchall()
        out[what] = [tuple(norm(v) for v in r) for r in rows]
    return out


# -- PostgreSQL client programs ----------------------------------------------------------------


def pg_program(name: str) -> str | None:
    """Path of a PostgreSQL client program: pgserver's own (same major as the embedded
    server), else one on PATH."""
    spec = importlib.util.find_spec("pgserver")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "pginstall" / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


# -- consumer processes (importable by multiprocessing's spawn) --------------------------------


def lease_consumer(dsn: str, schema: str, queue: str, batch: int, barrier: Any, out: Any) -> None:
    """Take batches with a long lease and ack them until the queue is empty; report
    (id, token, attempt) of every delivery and the ids each ack confirmed."""
    from lonnymq import Client

    delivered: list[tuple[int, int, int]] = []
    acked: list[int] = []
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.open()
        barrier.wait(180)  # spawned processes start slowly on a loaded machine
        while messages := c.take(queue, batch, lease=600):
            delivered += [(m.id, m.token, m.attempt) for m in messages]
            acked += sorted(c.ack(messages))
    out.put((delivered, acked))


def tx_consumer(dsn: str, schema: str, queue: str, batch: int, barrier: Any, out: Any) -> None:
    """Take batches with take_tx, one transaction each, until the queue is empty."""
    from lonnymq import Client

    delivered: list[tuple[int, int, int]] = []
    with psycopg.connect(dsn) as conn:
        c = Client(conn, schema=schema)
        barrier.wait(180)  # spawned processes start slowly on a loaded machine
        while True:
            with conn.transaction():
                messages = c.take_tx(queue, batch, conn=conn)
            if not messages:
                break
            delivered += [(m.id, m.token, m.attempt) for m in messages]
    out.put((delivered, [m[0] for m in delivered]))


#: rotate()'s p_max_moves in the frozen-backlog tests: a queue with more rows than this in the
#: generation leaving the window keeps them there, frozen (sql/generations.sql).
FREEZE_MAX_MOVES = 5


def force_rotation(db: Sql, now: int) -> None:
    """A rotation now, due or not, moving at most FREEZE_MAX_MOVES rows of a queue."""
    db.q("SELECT {s}.rotate(p_force => true, p_max_moves => %s, p_now => %s)", (FREEZE_MAX_MOVES, now))


def freeze_backlog(db: Sql, queue: str, now: int, n: int = 20) -> list[int]:
    """``n`` messages in ``queue`` (its ids returned), then rotations until their generation is
    frozen for it: the frozen list's one row, of one generation."""
    sent = [r["id"] for r in db.send(queue, [b"%d" % i for i in range(n)], now)]
    for _ in range(4):
        force_rotation(db, now)
    frozen = db.q("SELECT f.gens FROM {s}.message_gen_frozen f")
    assert len(frozen) == 1 and len(frozen[0]["gens"]) == 1, frozen
    return sent


def table_scans(db: Sql, table: str, *, index_only: bool = False) -> int:
    """The scans of ``db``'s table ``table`` so far in the current transaction: sequential and by
    index, or by index only (pg_stat_xact_user_tables; 0 while it has none)."""
    column = "coalesce(idx_scan, 0)" if index_only else "coalesce(seq_scan, 0) + coalesce(idx_scan, 0)"
    rows = db.q(
        f"SELECT {column} AS n FROM pg_stat_xact_user_tables WHERE schemaname = %s AND relname = %s",
        (db.schema, table),
    )
    return int(rows[0]["n"]) if rows else 0
