"""Migrated test schemas, reset and handed to the next test instead of migrated anew.

Migrating a schema (every versioned migration, every function file, the privileges) costs about
a second on a loaded 2-core machine, and the suite's ~1,000 tests each want a fresh one: that
was over half of the suite's time. A schema a test has finished with is returned to a fresh
state instead, in tens of milliseconds, when nothing but its rows changed:

* when it was migrated, :meth:`SchemaPool.acquire` records its catalog's fingerprint (tables,
  columns, defaults, constraints, indexes, triggers, types, functions with their bodies,
  settings and privileges, the schema's own privileges) and its initial data (the rows the
  migrations inserted, copied out with ``COPY``, and every sequence's position);
* :meth:`SchemaPool.release` compares the fingerprint: if a test changed anything in the
  catalog (a replaced function, a grant, an added trigger, a dropped table), the schema is
  dropped, as every schema used to be. Otherwise one transaction truncates all its tables,
  copies the initial rows back (triggers off) and sets every sequence back; if that cannot get
  its locks within a few seconds (a test left a session behind), the schema is dropped.

So each test still starts from exactly what ``migrate()`` produces; only how it gets there
changed. State outside the schema (roles, database settings, other schemas) was never reset by
the old drop either.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from lonnymq import Client

# One md5 over every catalog entry of the schema a test could change. Row counts, statistics and
# relation file numbers are left out: they are data, which the reset restores or TRUNCATE renews.
_FINGERPRINT = """
WITH ns AS (SELECT %(schema)s::regnamespace AS oid)
SELECT md5(coalesce(string_agg(x, E'\\n' ORDER BY x), '')) FROM (
    SELECT concat_ws('|', 'n', n.nspacl, n.nspowner)
      FROM pg_namespace n, ns WHERE n.oid = ns.oid
    UNION ALL
    SELECT concat_ws('|', 'c', c.relname, c.relkind, c.relpersistence, c.relowner, c.relnatts,
                     c.relhastriggers, c.relrowsecurity, c.reloptions, c.relacl,
                     pg_get_expr(c.relpartbound, c.oid),
                     CASE WHEN c.relkind IN ('i', 'I') THEN pg_get_indexdef(c.oid) END)
      FROM pg_class c, ns WHERE c.relnamespace = ns.oid
    UNION ALL
    SELECT concat_ws('|', 'a', c.relname, a.attname, a.atttypid, a.attnotnull, a.attidentity,
                     a.attgenerated, pg_get_expr(d.adbin, d.adrelid), a.attacl)
      FROM pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      JOIN ns ON c.relnamespace = ns.oid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT concat_ws('|', 'k', con.conname, pg_get_constraintdef(con.oid))
      FROM pg_constraint con, ns WHERE con.connamespace = ns.oid
    UNION ALL
    SELECT concat_ws('|', 't', t.tgname, c.relname, t.tgenabled, pg_get_triggerdef(t.oid))
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns ON c.relnamespace = ns.oid
    UNION ALL
    SELECT concat_ws('|', 'r', r.rulename, c.relname, r.ev_enabled)
      FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN ns ON c.relnamespace = ns.oid
    UNION ALL
    SELECT concat_ws('|', 'y', t.typname, t.typtype, t.typowner, t.typacl)
      FROM pg_type t, ns WHERE t.typnamespace = ns.oid
    UNION ALL
    SELECT concat_ws('|', 'p', p.oid::regprocedure, md5(p.prosrc), p.provolatile, p.proisstrict,
                     p.prosecdef, p.proowner, p.prorettype, p.proconfig, p.proacl)
      FROM pg_proc p, ns WHERE p.pronamespace = ns.oid
) entries(x)
"""

_TABLES = """
SELECT c.oid::regclass::text, c.relkind::text,
       array_agg(quote_ident(a.attname) ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '')
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p')
 GROUP BY c.oid
"""

_SEQUENCES = """
SELECT c.oid::regclass::text FROM pg_class c
 WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind = 'S'
"""


@dataclass
class _Pristine:
    """What a schema looked like right after ``migrate()``."""

    fingerprint: str
    rows: dict[str, tuple[list[str], bytes, str]]  # non-empty table -> columns, COPY data, md5
    sequences: list[tuple[str, int, bool]]  # (sequence, last_value, is_called)
    referenced_by: dict[str, set[str]]  # table -> the tables whose foreign keys reference it


@dataclass
class SchemaPool:
    """Migrated schemas of one server (one per test process), handed out one test at a time."""

    dsn: str
    free: list[str] = field(default_factory=list)
    pristine: dict[str, _Pristine] = field(default_factory=dict)
    _conn: psycopg.Connection[tuple[object, ...]] | None = None

    def connection(self) -> psycopg.Connection[tuple[object, ...]]:
        """The pool's own session, kept between tests (autocommit, idle in between: it holds no
        snapshot or lock). A new session for each reset cost the server a backend with cold
        catalog caches for the fingerprint's catalog joins each time (docs/testing.md). One the
        server ended since (a test restarted it or terminated backends) is replaced first."""
        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("SELECT 1")
                return self._conn
            except psycopg.OperationalError:
                self._conn.close()
        self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn

    def acquire(self, name: str) -> str:
        """A schema in its just-migrated state: a reset one, else ``name`` migrated now."""
        if self.free:
            return self.free.pop()
        with Client(self.dsn, schema=name, pool_size=1) as c:
            c.migrate()
        self.pristine[name] = _capture(self.connection(), name)
        return name

    def release(self, name: str) -> None:
        """Reset ``name`` for the next test, or drop it if its catalog changed or it is busy."""
        pristine = self.pristine.pop(name, None)
        conn = self.connection()
        if pristine is not None and _reset(conn, name, pristine):
            self.pristine[name] = pristine
            self.free.append(name)
            return
        _drop(conn, name)

    def close(self) -> None:
        """Drop every pooled schema (end of the test session)."""
        conn = self.connection()
        for name in self.free:
            _drop(conn, name)
        conn.close()
        self.free.clear()
        self.pristine.clear()


def _fingerprint(conn: psycopg.Connection[tuple[object, ...]], name: str) -> str | None:
    if conn.execute("SELECT to_regnamespace(%s)", (name,)).fetchone() == (None,):
        return None
    row = conn.execute(_FINGERPRINT, {"schema": name}).fetchone()
    assert row is not None
    return str(row[0])


_FOREIGN_KEYS = """
SELECT confrelid::regclass::text, conrelid::regclass::text FROM pg_constraint
 WHERE contype = 'f' AND connamespace = %(schema)s::regnamespace
"""

_SIZES = """
SELECT c.oid::regclass::text, pg_relation_size(c.oid) > 0 FROM pg_class c
 WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind = 'r'
"""


def _content_md5(conn: psycopg.Connection[tuple[object, ...]], table: str) -> str:
    query = sql.SQL("SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t")
    row = conn.execute(query.format(sql.SQL(table))).fetchone()  # a regclass text: quoted already
    assert row is not None
    return str(row[0])


def _capture(conn: psycopg.Connection[tuple[object, ...]], name: str) -> _Pristine:
    fingerprint = _fingerprint(conn, name)
    assert fingerprint is not None
    rows: dict[str, tuple[list[str], bytes, str]] = {}
    for table, kind, columns in conn.execute(_TABLES, {"schema": name}).fetchall():
        if kind != "r":  # a partitioned table's rows are its partitions'
            continue
        cols = sql.SQL(", ").join(sql.SQL(c) for c in columns)  # quote_ident()ed by the catalog
        data = io.BytesIO()
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(cols, sql.SQL(table))
        with conn.cursor().copy(query) as copy:
            for chunk in copy:
                data.write(chunk)
        if data.tell():
            rows[table] = (columns, data.getvalue(), _content_md5(conn, table))
    sequences = []
    for (seq,) in conn.execute(_SEQUENCES, {"schema": name}).fetchall():
        query = sql.SQL("SELECT last_value, is_called FROM {}").format(sql.SQL(seq))
        last_value, is_called = conn.execute(query).fetchone() or (1, False)
        sequences.append((seq, int(last_value), bool(is_called)))
    referenced_by: dict[str, set[str]] = {}
    for referenced, referencing in conn.execute(_FOREIGN_KEYS, {"schema": name}).fetchall():
        referenced_by.setdefault(referenced, set()).add(referencing)
    return _Pristine(fingerprint, rows, sequences, referenced_by)


def _dirty(conn: psycopg.Connection[tuple[object, ...]], name: str, pristine: _Pristine) -> list[str]:
    """The tables to truncate: every table with storage that was empty after migrate() (a
    freshly truncated table has none: any row written since, live or dead, gives it a page), the
    initially filled ones whose content changed, and what references them by foreign key."""
    dirty = set()
    for table, used in conn.execute(_SIZES, {"schema": name}).fetchall():
        if table in pristine.rows:
            if _content_md5(conn, table) != pristine.rows[table][2]:
                dirty.add(table)
        elif used:
            dirty.add(table)
    todo = list(dirty)
    while todo:  # TRUNCATE wants every table whose foreign key references one it truncates
        for other in pristine.referenced_by.get(todo.pop(), ()):
            if other not in dirty:
                dirty.add(other)
                todo.append(other)
    return sorted(dirty)


def _reset(conn: psycopg.Connection[tuple[object, ...]], name: str, pristine: _Pristine) -> bool:
    """Put the schema's data back to ``pristine``; False if the catalog changed or locks wait."""
    if _fingerprint(conn, name) != pristine.fingerprint:
        return False
    try:
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '3s'")
            conn.execute("SET LOCAL session_replication_role = replica")  # no triggers on restore
            dirty = _dirty(conn, name, pristine)
            if dirty:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(sql.SQL(t) for t in dirty)))
            for table in dirty:
                if table not in pristine.rows:
                    continue
                columns, data, _ = pristine.rows[table]
                cols = sql.SQL(", ").join(sql.SQL(c) for c in columns)
                query = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.SQL(table), cols)
                with conn.cursor().copy(query) as copy:
                    copy.write(data)
            conn.execute(
                "SELECT setval(s::regclass, v, c) FROM unnest(%s::text[], %s::bigint[], %s::bool[]) x(s, v, c)",
                ([q[0] for q in pristine.sequences], [q[1] for q in pristine.sequences],
                 [q[2] for q in pristine.sequences]),
            )  # fmt: skip
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def _drop(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    with conn.transaction():  # the pool's session is kept: the setting ends with the drop
        conn.execute("SET LOCAL lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
