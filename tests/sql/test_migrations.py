"""Install and upgrade: versioned migrations, the repeatable function files (lonnymq/sql/), the
advisory lock, concurrency, idempotency, the printed SQL script and "fresh install equals
upgrade"."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from core_helpers import catalog, drop_schema, fresh_schema_name, pg_program
from lonnymq import Client, errors, migrations
from lonnymq.migrations import (
    all_migrations,
    applied_query,
    bootstrap_query,
    latest_version,
    lock_query,
    script,
)
from lonnymq.sql import FILES, FunctionFile, defined_functions, function_files

ALL = [m.version for m in all_migrations()]
SQL_DIR = Path(migrations.__file__).parent.parent / "sql"
MIGRATIONS_DIR = Path(migrations.__file__).parent


@pytest.fixture
def new_schema(dsn: str) -> Iterator[str]:
    """A schema name nothing has been installed into yet (dropped afterwards)."""
    name = fresh_schema_name()
    yield name
    drop_schema(dsn, name)


def _files_recorded(conn: psycopg.Connection, schema: str) -> list[tuple[str, str, object]]:
    return conn.execute(
        sql.SQL("SELECT name, checksum, applied_at FROM {}.migration_repeatable ORDER BY name").format(
            sql.Identifier(schema)
        )
    ).fetchall()


def _expected_files(schema: str) -> list[tuple[str, str]]:
    return sorted((f.name, f.checksum(schema)) for f in function_files())


def _install_baseline_only(conn: psycopg.Connection, schema: str) -> None:
    """What a database holds after the versioned migrations alone: the tables, no functions."""
    with conn.transaction():
        conn.execute(bootstrap_query(schema))
        for m in all_migrations():
            conn.execute(m.render(schema))
            conn.execute(
                sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(schema)
                ),
                (m.version, m.name),
            )


def _functions(conn: psycopg.Connection, schema: str) -> list[tuple[str, bool, str, str]]:
    """Signature (schema name removed), SECURITY DEFINER, settings and grants of each function."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.prosecdef, coalesce(p.proconfig::text, ''),"
        "       coalesce(p.proacl::text, '')"
        "  FROM pg_proc p WHERE p.pronamespace = %s::regnamespace ORDER BY 1",
        (schema,),
    ).fetchall()
    return sorted(
        (sig.replace(schema, "<schema>"), definer, config, acl) for sig, definer, config, acl in rows
    )


def test_every_migration_and_function_file_is_recorded(conn: psycopg.Connection, schema: str) -> None:
    rows = conn.execute(
        sql.SQL("SELECT version, name FROM {}.migration ORDER BY version").format(sql.Identifier(schema))
    ).fetchall()
    assert rows == [(m.version, m.name) for m in all_migrations()]
    assert ALL[0] == 1 and rows[-1][0] == latest_version()
    assert [r[:2] for r in _files_recorded(conn, schema)] == _expected_files(schema)
    assert [f.name for f in function_files()] == [f"{n}.sql" for n in FILES]


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
                            # This schema's migrate lock only: other tests on the same server
                            # (the coverage pass shares one) wait on advisory locks of their own.
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                            " AND pid <> %s AND database = (SELECT oid FROM pg_database"
                            " WHERE datname = current_database()) AND objsubid = 2"
                            " AND classid = hashtext('lonnymq.migrate')::oid AND objid = hashtext(%s)::oid",
                            (holder.info.backend_pid, new_schema),
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
                barrier.wait(60)  # four clients opening on a loaded machine
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
    files_before = _files_recorded(conn, schema)
    assert client.migrate() == []
    assert client.migrate(target=1) == []
    assert client.migrate(target=0) == []
    assert catalog(conn, schema) == before
    assert (
        conn.execute(
            sql.SQL("SELECT version, applied_at FROM {}.migration ORDER BY 1").format(sql.Identifier(schema))
        ).fetchall()
        == applied_before
    )
    assert _files_recorded(conn, schema) == files_before


@pytest.mark.parametrize("first", [0, *ALL[:-1]])
def test_migrating_step_by_step_equals_a_fresh_install(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection, first: int
) -> None:
    """Up to ``first`` (the function files wait for the latest version), then the rest."""
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate(target=first) == [v for v in ALL if v <= first]
        partial = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migration").format(sql.Identifier(new_schema))
        ).fetchone()[0]
        assert partial == first
        assert _files_recorded(conn, new_schema) == []
        assert c.migrate() == [v for v in ALL if v > first]
    assert catalog(conn, new_schema) == catalog(conn, schema)


def test_versioned_migrations_then_function_files_equal_a_fresh_install(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    """A database that has every versioned migration but none of the function files (as after
    an upgrade whose migrations ran by another tool) gets all of them from migrate()."""
    _install_baseline_only(conn, new_schema)
    assert _functions(conn, new_schema) == []
    assert catalog(conn, new_schema) != catalog(conn, schema)
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate() == []
    assert catalog(conn, new_schema) == catalog(conn, schema)
    assert [r[:2] for r in _files_recorded(conn, new_schema)] == _expected_files(new_schema)


def test_a_function_file_with_an_old_checksum_is_applied_again(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection
) -> None:
    """An upgrade from a release whose take.sql differed: the database holds the old take()
    and the old checksum. migrate() re-applies that file alone, and the privileges with it
    (CREATE OR REPLACE drops SECURITY DEFINER); the result equals a fresh install."""
    s = sql.Identifier(new_schema)
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate()
        fresh = catalog(conn, schema)
        take = next(f for f in function_files() if f.name == "take.sql")
        old = FunctionFile(take.name, take.template.replace("-- The general path:", "-- Old general path:"))
        with conn.transaction():
            conn.execute(old.render(new_schema))  # resets SECURITY DEFINER of take, take_tx, ...
            conn.execute(
                sql.SQL("UPDATE {}.migration_repeatable SET checksum = %s WHERE name = 'take.sql'").format(s),
                (old.checksum(new_schema),),
            )
        assert catalog(conn, new_schema) != fresh
        before = {r[0]: r for r in _files_recorded(conn, new_schema)}
        assert c.migrate() == []
    assert catalog(conn, new_schema) == fresh
    after = {r[0]: r for r in _files_recorded(conn, new_schema)}
    changed = sorted(name for name in after if after[name] != before[name])
    assert changed == ["take.sql"]
    assert [r[:2] for r in after.values()] == _expected_files(new_schema)


def test_an_edited_function_file_is_applied_by_the_next_migrate(
    dsn: str, new_schema: str, schema: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new release whose settle.sql changed: migrate() applies it (and the privileges) once;
    the release after that (here: the current files again) is applied the same way."""
    fresh = catalog(conn, schema)
    files = function_files()
    edited = tuple(
        FunctionFile(f.name, f.template.replace("END $$;", "    -- edited\nEND $$;", 1))
        if f.name == "settle.sql"
        else f
        for f in files
    )
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate()
        monkeypatch.setattr(migrations, "function_files", lambda: edited)
        assert c.migrate() == []
        now = catalog(conn, new_schema)
        assert {k for k in now if now[k] != fresh[k]} == {"functions"}
        differ = [a for a, b in zip(now["functions"], fresh["functions"], strict=True) if a != b]
        assert [f[0] for f in differ] == ["_ack"]  # the first function of settle.sql, its body only
        assert _functions(conn, new_schema) == _functions(conn, schema)  # definer, grants kept
        assert ("settle.sql", edited[FILES.index("settle")].checksum(new_schema)) in [
            r[:2] for r in _files_recorded(conn, new_schema)
        ]
        recorded = _files_recorded(conn, new_schema)
        assert c.migrate() == [] and _files_recorded(conn, new_schema) == recorded
        monkeypatch.setattr(migrations, "function_files", lambda: files)
        assert c.migrate() == []
    assert catalog(conn, new_schema) == fresh


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
    conn.execute(script(new_schema, target=0))  # the version tables only
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate() == ALL
    assert catalog(conn, new_schema) == catalog(conn, schema)


def test_script_records_what_migrate_would_apply(dsn: str, new_schema: str, conn: psycopg.Connection) -> None:
    conn.execute(script(new_schema))
    recorded = _files_recorded(conn, new_schema)
    assert [r[:2] for r in recorded] == _expected_files(new_schema)
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        assert c.migrate() == []
    assert _files_recorded(conn, new_schema) == recorded


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
    _install_baseline_only(conn, new_schema)
    with Client(dsn, schema=new_schema, pool_size=1) as c:
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


# -- one definition per function -----------------------------------------------------------------


def test_every_function_is_defined_exactly_once() -> None:
    """Across sql/ and migrations/, each function is created by one statement: the one that runs
    today. Function files hold functions only, each CREATE OR REPLACE (they are re-applied)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(SQL_DIR.glob("*.sql")) + sorted(MIGRATIONS_DIR.glob("*.sql")):
        for name in defined_functions(path.read_text(encoding="utf-8")):
            seen.setdefault(name, []).append(f"{path.parent.name}/{path.name}")
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert twice == {}
    assert len(seen) >= 50
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        assert defined_functions(path.read_text(encoding="utf-8")) == [], f"{path.name} defines functions"
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        creates = re.findall(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(\w+)", text, re.M | re.I)
        assert creates and set(creates) == {"FUNCTION"}, f"{path.name} creates {set(creates)}"
        assert len(re.findall(r"^CREATE OR REPLACE FUNCTION ", text, re.M)) == len(creates), path.name


def test_the_catalog_holds_exactly_the_functions_of_sql(conn: psycopg.Connection, schema: str) -> None:
    """No overload left over from an older signature, no function the files do not define."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = %s::regnamespace ORDER BY 1", (schema,)
        ).fetchall()
    ]
    defined = sorted(n for f in function_files() for n in defined_functions(f.template))
    assert names == defined


def test_the_duplicate_check_sees_a_second_definition() -> None:
    text = "CREATE FUNCTION {schema}.a(x int)\n;\n  create or replace function {schema}.b (\n"
    assert defined_functions(text) == ["a", "b"]


def test_0006_moves_every_message_of_a_populated_database(dsn: str, new_schema: str) -> None:
    """Upgrading from a partition per queue (0005) to the shared message table (0006) keeps
    every message with its id, lease, token and attempts, moves UNLOGGED queues to negative ids
    with their channels, archive and dead-letter links, and the next ids continue."""
    s = sql.Identifier(new_schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        Client(conn, schema=new_schema).migrate(target=5, conn=conn)
        # What 0005's queue_create did: a queue row and its own partition.
        for name, unlogged, dlq in (("dlq", True, None), ("plain", False, "dlq"), ("fast", True, None)):
            [(qid,)] = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.queue (name, unlogged, dead_letter_queue_id)"
                    " VALUES (%s, %s, (SELECT id FROM {}.queue WHERE name = %s)) RETURNING id"
                ).format(s, s),
                (name, unlogged, dlq),
            ).fetchall()
            conn.execute(
                sql.SQL("CREATE {} TABLE {} PARTITION OF {}.message FOR VALUES IN ({})").format(
                    sql.SQL("UNLOGGED" if unlogged else ""),
                    sql.Identifier(new_schema, f"message_{qid}"),
                    s,
                    sql.Literal(qid),
                )
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.message (queue_id, dequeue_at, scheduled_at, enqueued_at, attempts,"
                    " deliveries, leased, channel, key, payload)"
                    " SELECT %s, 1000 + i, 0, 0, i %% 3, i %% 4, i %% 2 = 0, CASE WHEN i %% 5 = 0 THEN 'c' END,"
                    "        'k' || i, convert_to(%s || i, 'UTF8') FROM generate_series(1, 50) i"
                ).format(s),
                (qid, name),
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.channel (queue_id, name, current_size, turn) VALUES (%s, 'c', 10, 1)"
                ).format(s),
                (qid,),
            )
        before = conn.execute(
            sql.SQL(
                "SELECT q.name, m.id, m.dequeue_at, m.attempts, m.deliveries, m.leased, m.channel, m.key, m.payload"
                " FROM {}.message m JOIN {}.queue q ON q.id = m.queue_id ORDER BY m.id"
            ).format(s, s)
        ).fetchall()
        [(top,)] = conn.execute(sql.SQL("SELECT max(id) FROM {}.message").format(s)).fetchall()
        Client(conn, schema=new_schema).migrate(conn=conn)
        after = conn.execute(
            sql.SQL(
                "SELECT q.name, m.id, m.dequeue_at, m.attempts, m.deliveries, m.leased, m.channel, m.key, m.payload"
                " FROM {}.message m JOIN {}.queue q ON q.id = m.queue_id ORDER BY m.id"
            ).format(s, s)
        ).fetchall()
        assert len(before) == 150 and after == before
        ids = dict(conn.execute(sql.SQL("SELECT name, id FROM {}.queue").format(s)).fetchall())
        assert ids["plain"] > 0 and ids["dlq"] < 0 and ids["fast"] < 0
        assert conn.execute(
            sql.SQL("SELECT d.name FROM {}.queue q JOIN {}.queue d ON d.id = q.dead_letter_queue_id").format(
                s, s
            )
        ).fetchall() == [("dlq",)]
        assert sorted(
            conn.execute(sql.SQL("SELECT queue_id FROM {}.channel").format(s)).fetchall()
        ) == sorted((i,) for i in ids.values())
        parts = conn.execute(
            sql.SQL(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = {}::regclass ORDER BY 1"
            ).format(sql.Literal(f'"{new_schema}".message'))
        ).fetchall()
        assert parts == [("message_logged",), ("message_unlogged",)]
        client = Client(conn, schema=new_schema)
        new_id = client.send("fast", b"new", conn=conn).id
        assert new_id is not None and new_id > top
        assert client.metrics("fast", conn=conn).ready >= 1


def _with_a_migration_locking_the_queue_table(monkeypatch: pytest.MonkeyPatch) -> int:
    """The next release has a migration that needs the strongest lock on a table every send and
    take reads (as ALTER TABLE does); returns its version."""
    version = latest_version() + 1
    shipped = all_migrations()
    extra = migrations.Migration(version, "lock_test", "LOCK TABLE {schema}.queue IN ACCESS EXCLUSIVE MODE;")
    monkeypatch.setattr(migrations, "all_migrations", lambda: (*shipped, extra))
    return version


def _forgotten_begin(dsn: str, schema: str) -> psycopg.Connection:
    """A session left idle in a transaction that has read the queue table (a forgotten BEGIN in
    psql): it holds the table's weakest lock until it ends."""
    holder = psycopg.connect(dsn)
    holder.execute(sql.SQL("SELECT count(*) FROM {}.queue").format(sql.Identifier(schema)))
    return holder


def test_migrate_gives_way_to_a_long_transaction_while_the_queue_runs(
    dsn: str, new_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that needs a strong lock while a forgotten transaction holds the table: it
    never makes the queue's traffic wait behind it for longer than its lock_timeout, keeps
    trying, and is applied once the transaction ends. Without the timeout every take would
    wait for the forgotten transaction (the takes below fail on their statement_timeout)."""
    with Client(dsn, schema=new_schema, pool_size=2) as c:
        c.migrate()
        c.create_queue("q")
        c.send_batch("q", list(range(5000)))
        version = _with_a_migration_locking_the_queue_table(monkeypatch)
        holder = _forgotten_begin(dsn, new_schema)
        result: list[list[int] | BaseException] = []

        def migrate() -> None:
            try:
                with Client(dsn, schema=new_schema, pool_size=1) as m:
                    result.append(m.migrate(lock_timeout=0.2, attempts=1000, retry_delay=0.05))
            except BaseException as e:  # reported below
                result.append(e)

        t = threading.Thread(target=migrate)
        t.start()
        try:
            taken, slowest = 0, 0.0
            with psycopg.connect(dsn, options="-c statement_timeout=5s") as tconn:
                # 3 s of traffic and at least 10 takes (a loaded CI machine takes fewer in 3 s).
                end, deadline = time.monotonic() + 3, time.monotonic() + 60
                while (time.monotonic() < end or taken < 10) and time.monotonic() < deadline:
                    start = time.monotonic()
                    ds = c.take("q", 1, conn=tconn)
                    if ds:  # (never empty, unless the machine drains 5,000 in 3 s)
                        c.ack(ds, conn=tconn)
                    tconn.commit()
                    slowest = max(slowest, time.monotonic() - start)
                    taken += len(ds)
            # A take waiting behind the migration beyond its 0.2 s lock_timeout would wait for the
            # forgotten transaction: statement_timeout (5 s) fails it. Below that, room for load.
            assert taken >= 10 and slowest < 4, (taken, slowest)
            assert t.is_alive() and result == [], result  # still trying, nothing applied
            applied = {r[0] for r in holder.execute(applied_query(new_schema)).fetchall()}
            assert version not in applied
        finally:
            holder.rollback()
            holder.close()
            t.join(30)
        assert result == [[version]]


def test_migrate_gives_up_with_the_blocking_session_named(
    dsn: str, new_schema: str, monkeypatch: pytest.MonkeyPatch, conn: psycopg.Connection
) -> None:
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate()
        version = _with_a_migration_locking_the_queue_table(monkeypatch)
        holder = _forgotten_begin(dsn, new_schema)
        try:
            with pytest.raises(errors.MigrationBlocked) as raised:
                c.migrate(lock_timeout=0.1, attempts=3, retry_delay=0.05)
            message = str(raised.value)
            assert f"pid {holder.info.backend_pid} (idle in transaction" in message, message
            assert "after 3 attempt(s)" in message and "0.1 s" in message
            assert isinstance(raised.value, errors.MigrationError)
            assert version not in {r[0] for r in conn.execute(applied_query(new_schema)).fetchall()}
        finally:
            holder.close()
        assert c.migrate() == [version]
        with pytest.raises(errors.InvalidArgument):
            c.migrate(attempts=0)
