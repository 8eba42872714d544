"""The pgmq facade (migrations/pgmq.sql): pgmq's SQL API over LonnyMQ queues, driven by direct SQL
and by the official ``pgmq`` Python client, unchanged (``PGMQueue(init_extension=False)``).

The facade is one ``pgmq`` schema per database, so each test gets its own database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from lonnymq import Client

pytest.importorskip("pgmq")


def test_result_types_have_pgmq_columns(pg: psycopg.Connection[dict[str, Any]]) -> None:
    def cols(t: str) -> list[str]:
        rows = pg.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 ORDER BY a.attnum",
            (t,),
        ).fetchall()
        return [r["attname"] for r in rows]

    assert cols("pgmq.message_record") == [
        "msg_id", "read_ct", "enqueued_at", "last_read_at", "vt", "message", "headers"
    ]  # fmt: skip
    assert cols("pgmq.queue_record") == ["queue_name", "is_partitioned", "is_unlogged", "created_at"]
    assert cols("pgmq.metrics_result") == [
        "queue_name", "queue_length", "newest_msg_age_sec", "oldest_msg_age_sec", "total_messages",
        "scrape_time", "queue_visible_length", "default_partition_length",
    ]  # fmt: skip


def test_send_read_delete_archive_by_sql(pg: psycopg.Connection[dict[str, Any]]) -> None:
    pg.execute("SELECT pgmq.create('jobs')")
    pg.execute("SELECT pgmq.create('jobs')")  # idempotent, like pgmq
    a = pg.execute("""SELECT pgmq.send('jobs', '{"n": 1}') AS id""").fetchone()
    b = pg.execute("""SELECT pgmq.send('jobs', '{"n": 2}', '{"h": "x"}'::jsonb) AS id""").fetchone()
    assert a is not None and b is not None and a["id"] < b["id"]
    later = pg.execute("""SELECT pgmq.send('jobs', '{"n": 3}', 3600) AS id""").fetchone()
    assert later is not None
    rows = pg.execute("SELECT * FROM pgmq.read('jobs', 600, 10)").fetchall()  # leased below
    assert [(r["msg_id"], r["read_ct"], r["message"], r["headers"]) for r in rows] == [
        (a["id"], 1, {"n": 1}, None),
        (b["id"], 1, {"n": 2}, {"h": "x"}),
    ]
    vt = rows[0]["vt"] - rows[0]["last_read_at"]
    assert timedelta(seconds=599) < vt <= timedelta(seconds=600)
    assert pg.execute("SELECT * FROM pgmq.read('jobs', 30, 10)").fetchall() == []  # leased
    assert pg.execute("SELECT pgmq.delete('jobs', %s::bigint) AS ok", (a["id"],)).fetchone() == {"ok": True}
    assert pg.execute("SELECT pgmq.delete('jobs', %s::bigint) AS ok", (a["id"],)).fetchone() == {"ok": False}
    got = pg.execute(
        "SELECT pgmq.archive('jobs', %s::bigint[]) AS id", ([b["id"], later["id"], 999],)
    ).fetchall()
    assert [r["id"] for r in got] == [b["id"], later["id"]]
    m = pg.execute("SELECT * FROM pgmq.metrics('jobs')").fetchone()
    assert m is not None and (m["queue_length"], m["queue_visible_length"], m["total_messages"]) == (0, 0, 3)


def test_delay_timestamptz_batch_pop_set_vt(pg: psycopg.Connection[dict[str, Any]]) -> None:
    pg.execute("SELECT pgmq.create_unlogged('u')")
    future = datetime.now(UTC) + timedelta(hours=1)
    pg.execute("SELECT pgmq.send_batch('u', ARRAY['1', '2']::jsonb[], %s::timestamptz)", (future,))
    ids = [r["id"] for r in pg.execute("SELECT pgmq.send_batch('u', ARRAY['3', '4', '5']::jsonb[]) AS id")]
    assert len(ids) == 3
    popped = pg.execute("SELECT * FROM pgmq.pop('u', 2)").fetchall()
    assert [r["message"] for r in popped] == [3, 4]
    [r] = pg.execute("SELECT * FROM pgmq.read('u', 60, 5)").fetchall()
    assert r["message"] == 5
    # set_vt to now makes it visible again without counting a read
    [s] = pg.execute("SELECT * FROM pgmq.set_vt('u', %s::bigint, 0)", (r["msg_id"],)).fetchall()
    assert s["msg_id"] == r["msg_id"]
    [again] = pg.execute("SELECT * FROM pgmq.read('u', 1, 5)").fetchall()
    assert (again["msg_id"], again["read_ct"]) == (r["msg_id"], 2)
    [ext] = pg.execute("SELECT * FROM pgmq.set_vt('u', %s::bigint, 120)", (r["msg_id"],)).fetchall()
    assert ext["vt"] > datetime.now(UTC) + timedelta(seconds=100)
    [q] = pg.execute("SELECT * FROM pgmq.list_queues()").fetchall()
    assert (q["queue_name"], q["is_unlogged"], q["is_partitioned"]) == ("u", True, False)
    assert pg.execute("SELECT pgmq.purge_queue('u') AS n").fetchone() == {"n": 3}
    assert pg.execute("SELECT pgmq.drop_queue('u') AS ok").fetchone() == {"ok": True}
    assert pg.execute("SELECT pgmq.drop_queue('u') AS ok").fetchone() == {"ok": False}


def test_errors(pg: psycopg.Connection[dict[str, Any]]) -> None:
    with pytest.raises(psycopg.Error, match="does not exist"):
        pg.execute("SELECT pgmq.send('nope', '1')")
    with pytest.raises(psycopg.Error, match="too long"):
        pg.execute("SELECT pgmq.create(%s)", ("q" * 48,))
    with pytest.raises(psycopg.Error, match="invalid characters"):
        pg.execute("SELECT pgmq.validate_queue_name('a;b')")
    pg.execute("SELECT pgmq.create_partitioned('p', '1 day', '7 days')")
    with pytest.raises(psycopg.Error, match="premake"):
        pg.execute("SELECT pgmq.create_partitioned('p2', '1 day', '7 days', 0)")


def test_interoperates_with_lonnymq_both_ways(pg: psycopg.Connection[dict[str, Any]], lq: Client) -> None:
    lq.create_queue("native")
    lq.send("native", {"from": "lonnymq"}, headers={"k": "v"})
    [r] = pg.execute("SELECT * FROM pgmq.read('native', 30, 5)").fetchall()
    assert (r["message"], r["headers"]) == ({"from": "lonnymq"}, {"k": "v"})
    assert pg.execute("SELECT pgmq.delete('native', %s::bigint) AS ok", (r["msg_id"],)).fetchone() == {
        "ok": True
    }

    pg.execute("SELECT pgmq.create('facade')")
    pg.execute("""SELECT pgmq.send('facade', '{"from": "pgmq"}', '{"h": 1}'::jsonb)""")
    assert "facade" in [q.name for q in lq.list_queues()]
    [m] = lq.take("facade", 5)
    assert (m.payload, m.headers) == ({"from": "pgmq"}, {"h": 1})
    lq.ack(m)
    assert lq.take("facade", 5) == []


# pgmq 1.x's client warns on every list_queues() call that its result type changed.
@pytest.mark.filterwarnings("ignore:list_queues\\(\\) now returns:UserWarning")
def test_official_client(pgmq_client: Any) -> None:
    q = pgmq_client
    q.create_queue("orders")
    q.create_queue("fast", unlogged=True)
    assert {r.queue_name for r in q.list_queues()} == {"orders", "fast"}
    assert q.validate_queue_name("orders") is not False
    one = q.send("orders", {"id": 1})
    two = q.send("orders", {"id": 2}, headers={"t": "a"})
    batch = q.send_batch("orders", [{"id": 3}, {"id": 4}])
    q.send("orders", {"id": 5}, delay=3600)
    assert len(batch) == 2
    m = q.read("orders", vt=30)
    assert m is not None and (m.msg_id, m.message, m.read_ct) == (one, {"id": 1}, 1)
    assert q.delete("orders", m.msg_id) is True
    msgs = q.read_batch("orders", vt=30, batch_size=10)
    assert [x.message for x in msgs] == [{"id": 2}, {"id": 3}, {"id": 4}]
    assert msgs[0].headers == {"t": "a"}
    assert q.archive("orders", two) is True
    assert q.delete_batch("orders", batch) == batch
    met = q.metrics("orders")
    assert (met.queue_name, met.queue_length, met.total_messages) == ("orders", 1, 5)
    assert {x.queue_name for x in q.metrics_all()} == {"orders", "fast"}
    q.send("fast", {"p": 1})
    popped = q.pop("fast")
    assert popped is not None and popped.message == {"p": 1}
    assert q.read_with_poll("fast", vt=30, qty=1, max_poll_seconds=1, poll_interval_ms=50) == []
    q.send("fast", {"p": 2})
    [r] = q.read_with_poll("fast", vt=30, qty=1, max_poll_seconds=1, poll_interval_ms=50)
    back = q.set_vt("fast", r.msg_id, 0)
    assert back.msg_id == r.msg_id
    assert q.purge("orders") == 1
    assert q.drop_queue("orders") is True
    assert [r.queue_name for r in q.list_queues()] == ["fast"]


def test_refuses_foreign_schema_and_uninstalls_cleanly(
    db_dsn: str, pg: psycopg.Connection[dict[str, Any]]
) -> None:
    pg.execute("SELECT pgmq.create('keep')")
    pg.execute("SELECT pgmq.send('keep', '1')")
    with Client(db_dsn, pool_size=1) as c:
        oid = "SELECT oid FROM pg_namespace WHERE nspname = 'pgmq'"
        before = pg.execute(oid).fetchone()
        c.migrate(pgmq=True)  # already current: left alone
        assert pg.execute(oid).fetchone() == before
        pg.execute("COMMENT ON SCHEMA pgmq IS 'LonnyMQ pgmq facade over schema lonnymq; sha256 old'")
        c.migrate(pgmq=True)  # an older facade is replaced
        assert pg.execute(oid).fetchone() != before
        c.uninstall_pgmq()
        assert pg.execute("SELECT count(*) AS n FROM pg_namespace WHERE nspname = 'pgmq'").fetchone() == {
            "n": 0
        }
        [m] = c.take("keep", 5)  # LonnyMQ's queues and messages are intact
        assert m.payload == 1
        c.uninstall_pgmq()  # nothing to drop
        pg.execute("CREATE SCHEMA pgmq")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="refusing"):
            c.migrate(pgmq=True)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.uninstall_pgmq()


def test_privileges_follow_lonnymq_roles(pg: psycopg.Connection[dict[str, Any]]) -> None:
    pg.execute("SELECT pgmq.create('jobs')")
    pg.execute("SET ROLE lonnymq_producer")
    try:
        assert pg.execute("SELECT pgmq.send('jobs', '1') AS id").fetchone() is not None
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="take"):
            pg.execute("SELECT * FROM pgmq.read('jobs', 30, 1)")
    finally:
        pg.execute("RESET ROLE")
    pg.execute("SET ROLE lonnymq_consumer")
    try:
        [r] = pg.execute("SELECT * FROM pgmq.read('jobs', 30, 1)").fetchall()
        assert r["message"] == 1
    finally:
        pg.execute("RESET ROLE")


def test_official_async_client(db_dsn: str) -> None:
    from pgmq.async_queue import PGMQueue as AsyncPGMQueue

    info = conninfo_to_dict(db_dsn)

    async def main() -> None:
        q = AsyncPGMQueue(
            host=str(info.get("host", "localhost")),
            port=str(info.get("port", "5432")),
            database=str(info["dbname"]),
            username=str(info.get("user", "postgres")),
            password=str(info.get("password", "")),
            init_extension=False,
        )
        await q.init()
        try:
            await q.create_queue("aq")
            ids = await q.send_batch("aq", [{"a": 1}, {"a": 2}], headers=[{"h": 1}, {"h": 2}])
            one = await q.send("aq", {"a": 3}, delay=0)
            msgs = await q.read_batch("aq", vt=30, batch_size=5)
            assert [(m.msg_id, m.message, m.headers) for m in msgs] == [
                (ids[0], {"a": 1}, {"h": 1}),
                (ids[1], {"a": 2}, {"h": 2}),
                (one, {"a": 3}, None),
            ]
            assert await q.delete_batch("aq", ids) == ids
            assert await q.archive("aq", one) is True
            assert (await q.metrics("aq")).queue_length == 0
            assert await q.drop_queue("aq") is True
        finally:
            await q.close()

    asyncio.run(main())


def test_cli(tmp_path: Path, dsn: str) -> None:
    name = f"pgmq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(dsn, dbname=name)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LONNYMQ"))}
        env["LONNYMQ_DATA_DIR"] = str(tmp_path / "no-server")
        return subprocess.run(
            [sys.executable, "-m", "lonnymq", "--dsn", url, "--json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        printed = cli("migrate", "--print-sql", "--pgmq")
        assert printed.returncode == 0, printed.stderr
        assert "CREATE FUNCTION pgmq.read(" in printed.stdout
        assert cli("migrate", "--pgmq").returncode == 0
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pgmq.create('x')")
            assert c.execute("SELECT pgmq.send('x', '1')").fetchall() == [(1,)]
        dropped = cli("migrate", "--uninstall-pgmq")
        assert dropped.returncode == 0, dropped.stderr
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'").fetchall() == []
            assert c.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'lonnymq'").fetchall() == [(1,)]
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
