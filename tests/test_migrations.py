"""Install and upgrade: versioned migrations, the advisory lock, concurrency, idempotency, the
printed SQL script and "fresh install equals replay"."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from core_helpers import catalog, drop_schema, fresh_schema_name, pg_program
from lonnymq import Client, errors
from lonnymq.migrations import all_migrations, latest_version, lock_query, script

ALL = [m.version for m in all_migrations()]


@pytest.fixture
def new_schema(dsn: str) -> Iterator[str]:
    """A schema name nothing has been installed into yet (dropped afterwards)."""
    name = fresh_schema_name()
    yield name
    drop_schema(dsn, name)


def test_every_migration_is_recorded_in_the_version_table(conn: psycopg.Connection, schema: str) -> None:
    rows = conn.execute(
        sql.SQL("SELECT version, name FROM {}.migration ORDER BY version").format(sql.Identifier(schema))
    ).fetchall()
    assert rows == [(m.version, m.name) for m in all_migrations()]
    assert ALL[0] == 1 and rows[-1][0] == latest_version()


def test_migrate_waits_for_the_advisory_lock(dsn: str, new_schema: str) -> None:
    result: list[int] = []
    with psycopg.connect(dsn) as holder:
        holder.execute(lock_query(new_schema))  # held until this transaction ends
        with Client(dsn, schema=new_schema, pool_size=1) as c:
            t = threading.Thread(target=lambda: result.extend(c.migrate()))
            t.start()
            try:
                deadline = time.monotonic() + 10
                waiting = 0
                while time.monotonic() < deadline and not waiting:
                    with psycopg.connect(dsn, autocommit=True) as probe:
                        waiting = probe.execute(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                            " AND pid <> %s",
                            (holder.info.backend_pid,),
                        ).fetchone()[0]
                    time.sleep(0.05)
                assert waiting == 1, "migrate() did not queue behind the advisory lock"
                assert t.is_alive() and result == []
            finally:
                holder.rollback()
                t.join(30)
    assert result == ALL


def test_concurrent_migrators_apply_each_migration_once(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    n = 4
    barrier = threading.Barrier(n)
    results: list[list[int] | BaseException] = [[] for _ in range(n)]

    def migrate(i: int) -> None:
        try:
            with Client(dsn, schema=new_schema, pool_size=1) as c:
                c.open()
                barrier.wait(10)
                results[i] = c.migrate()
        except BaseException as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=migrate, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(results, key=len) == [[]] * (n - 1) + [ALL]
    assert catalog(conn, new_schema) == catalog(conn, schema)


def test_second_migrate_returns_nothing_and_changes_nothing(
    client: Client, conn: psycopg.Connection, schema: str
) -> None:
    before = catalog(conn, schema)
    applied_before = conn.execute(
        sql.SQL("SELECT version, applied_at FROM {}.migration ORDER BY 1").format(sql.Identifier(schema))
    ).fetchall()
    assert client.migrate() == []
    assert client.migrate(target=1) == []
    assert catalog(conn, schema) == before
    assert (
        conn.execute(
            sql.SQL("SELECT version, applied_at FROM {}.migration ORDER BY 1").format(sql.Identifier(schema))
        ).fetchall()
        == applied_before
    )


@pytest.mark.parametrize("first", ALL[:-1] or ALL)
def test_replaying_migrations_equals_a_fresh_install(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection, first: int
) -> None:
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate(target=first) == [v for v in ALL if v <= first]
        partial = conn.execute(
            sql.SQL("SELECT max(version) FROM {}.migration").format(sql.Identifier(new_schema))
        ).fetchone()[0]
        assert partial == first
        assert c.migrate() == [v for v in ALL if v > first]
    assert catalog(conn, new_schema) == catalog(conn, schema)


def test_printed_sql_applied_with_psql_equals_migrate(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    psql = pg_program("psql")
    if psql is None:
        pytest.skip("no psql binary")
    printed = subprocess.run(
        [sys.executable, "-m", "lonnymq", "migrate", "--print-sql", "--schema", new_schema],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert printed == script(new_schema)
    subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
        input=printed,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert catalog(conn, new_schema) == catalog(conn, schema)
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate() == []  # the script recorded its versions


def test_script_applied_with_psycopg_equals_migrate(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    conn.execute(script(new_schema))  # no parameters: simple protocol, many statements
    assert catalog(conn, new_schema) == catalog(conn, schema)


def test_script_up_to_a_target_then_migrate(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    conn.execute(script(new_schema, target=1))
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate() == ALL[1:]
    assert catalog(conn, new_schema) == catalog(conn, schema)


def _pg_dump(dsn: str, schema: str) -> str:
    pg_dump = pg_program("pg_dump")
    assert pg_dump is not None
    out = subprocess.run(
        [pg_dump, "--schema-only", "--no-owner", "-n", schema, "-d", dsn],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    out = out.replace(f'"{schema}"', "<schema>").replace(schema, "<schema>")
    return "\n".join(
        line
        for line in out.splitlines()
        if line
        and not line.startswith(("--", "\\restrict", "\\unrestrict"))
        and "pg_attver=" not in line  # a per-server column option some PostgreSQL builds add
    )


def test_pg_dump_of_fresh_install_equals_replay(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    pg_dump = pg_program("pg_dump")
    if pg_dump is None:
        pytest.skip("no pg_dump binary")
    version = subprocess.run([pg_dump, "--version"], capture_output=True, text=True, check=True).stdout
    client_major = int(re.search(r"(\d+)\.", version)[1])  # type: ignore[index]
    if client_major < conn.info.server_version // 10000:
        pytest.skip(f"pg_dump {client_major} is older than the server")
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate(target=1)
        c.migrate()
    replayed, fresh = _pg_dump(dsn, new_schema), _pg_dump(dsn, schema)
    assert "CREATE FUNCTION <schema>.take(" in fresh
    assert replayed == fresh


def test_unknown_applied_version_is_refused(client: Client, conn: psycopg.Connection, schema: str) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {}.migration (version, name) VALUES (9999, 'from_the_future')").format(
            sql.Identifier(schema)
        )
    )
    with pytest.raises(errors.MigrationError, match="9999"):
        client.migrate()


def test_bad_target_and_bad_schema_names(client: Client, dsn: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        client.migrate(target=latest_version() + 1)
    with pytest.raises(errors.InvalidArgument):
        client.migrate(target=-1)
    for bad in ("Bad", "a;drop schema public", "", "x" * 64, 'q"'):
        with pytest.raises(errors.InvalidArgument):
            Client(dsn, schema=bad)
        with pytest.raises(errors.InvalidArgument):
            script(bad)


def test_calls_on_a_schema_without_lonnymq_raise_not_installed(dsn: str, new_schema: str) -> None:
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        with pytest.raises(errors.NotInstalled):
            c.create_queue("q")
        with pytest.raises(errors.NotInstalled):
            c.send("q", b"x")


def test_catalog_comparison_sees_small_differences(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    """The comparisons above are only worth something if a one-word change shows up."""
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate()
    base = catalog(conn, schema)
    assert len(base["functions"]) >= 20 and len(base["indexes"]) >= 5 and base["types"]
    assert catalog(conn, new_schema) == base
    s = sql.Identifier(new_schema)
    for change in (
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}.now_ms() RETURNS bigint LANGUAGE sql VOLATILE PARALLEL SAFE"
            " AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1 $$"
        ).format(s),
        sql.SQL("ALTER TABLE {}.queue ALTER COLUMN lease_ms SET DEFAULT 1").format(s),
        sql.SQL("CREATE INDEX extra ON {}.archive (archived_at)").format(s),
    ):
        with conn.transaction(force_rollback=True):
            conn.execute(change)
            assert catalog(conn, new_schema) != base, change.as_string(conn)
