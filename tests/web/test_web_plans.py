"""No dashboard page scans a big table (issue 16 item 6): every page and API route is requested
through the app on ONE connection, in one transaction, against 100 queues and a queue of
300,000 messages (ready, scheduled, leased, in channels) with 100,000 dead ones in the archive
and an hour of counters, analysed; then the transaction's own statistics
(pg_stat_xact_user_tables) must show no sequential scan of the message partitions, the archive
or the counter table: each page is index ranges and capped counts, whatever the queue's size."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from web_helpers import add_schedule, beat

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import AsyncClient, Client
from lonnymq.web import create_app
from lonnymq.web.app import reader_conninfo

pytestmark = pytest.mark.slow

BIG = 300_000
DEAD = 100_000
QUEUES = 100
GEN = 1  # the generation of a fresh schema's writes (sql/generations.sql)


@pytest.fixture(scope="module")
def loaded(dsn: str) -> Iterator[tuple[str, int]]:
    """Yields (schema, the id of a live keyed message of queue "big")."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("big", max_attempts=1)
        for i in range(QUEUES):
            c.create_queue(f"q{i:03d}")
        c.set_channel("big", "tenant-0", max_concurrency=2)
        c.set_channel("big", "tenant-1", max_size=10_000_000)
        for i in range(20):
            c.send(f"q{i:03d}", {"n": i})
        add_schedule(c, "nightly", "big")
        beat(c, "w-1", ["big"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        qid = conn.execute(sql.SQL("SELECT id FROM {}.queue WHERE name = 'big'").format(s)).fetchone()[0]  # type: ignore[index]
        now = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchone()[0]  # type: ignore[index]
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, attempts,
                                           deliveries, leased, key, channel, payload)
                   SELECT %(q)s, %(gen)s,
                          CASE i %% 4 WHEN 0 THEN %(now)s + 3600000 + i   -- scheduled
                                     WHEN 1 THEN %(now)s + 30000 + i     -- leased
                                     ELSE %(now)s - %(n)s + i END,       -- ready
                          %(now)s - %(n)s + i, %(now)s - %(n)s + i,
                          (i %% 4 = 1)::int, (i %% 4 = 1)::int, i %% 4 = 1,
                          CASE WHEN i %% 10 = 0 THEN 'key-' || i END,
                          CASE WHEN i %% 50 = 7 THEN 'tenant-' || (i %% 2) END,
                          convert_to('{{"i": ' || i || '}}', 'UTF8')
                     FROM generate_series(1, %(n)s) i"""
            ).format(s),
            {"q": qid, "now": now, "n": BIG, "gen": GEN},
        )
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.archive (queue_id, id, status, archived_at, scheduled_at, enqueued_at,
                                           attempts, deliveries, priority, last_error, payload)
                   SELECT %s, %s + g, CASE WHEN g %% 3 = 0 THEN 'acked' ELSE 'dead' END,
                          %s - g, 0, 0, 1, 1, 0, 'boom ' || g, 'x'::bytea
                     FROM generate_series(1, %s) g"""
            ).format(s),
            (qid, 10 * BIG, now, DEAD),
        )
        conn.execute(
            sql.SQL(
                """INSERT INTO {s}.queue_stat (queue_id, minute, sent, acked, nacked, dead)
                   SELECT q.id, %s / 60000 - m, 10, 9, 1, 0
                     FROM {s}.queue q, generate_series(0, 59) m, generate_series(1, 5) r"""
            ).format(s=s),
            (now,),
        )
        key_id = conn.execute(
            sql.SQL("SELECT id FROM {}.message WHERE queue_id = %s AND key = 'key-1000'").format(s), (qid,)
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(sql.SQL("ANALYZE {}.message").format(s))
        conn.execute(sql.SQL("ANALYZE {}.archive").format(s))
        conn.execute(sql.SQL("ANALYZE {}.queue_stat").format(s))
    yield schema, key_id
    drop_schema(dsn, schema)


def _paths(key_id: int) -> list[str]:
    pages = [
        "/",
        "/?limit=500",
        "/?after=q050",
        "/queues/big",
        "/queues/big/messages",
        "/queues/big/messages?status=ready",
        "/queues/big/messages?status=scheduled",
        "/queues/big/messages?status=leased",
        f"/queues/big/messages?after={BIG // 2}",
        f"/queues/big/messages/{key_id}",
        "/queues/big/messages?key=key-1000",
        f"/queues/big/messages?id={key_id}",
        "/queues/big/dead",
        f"/queues/big/dead?after={10 * BIG + DEAD // 2}",
        "/queues/big/archive",
        "/queues/big/archive?status=acked",
        "/queues/big/channels",
        "/cron",
        "/workers",
        "/healthz",
    ]
    return pages + ["/api" + p for p in pages if p.startswith("/queues")] + ["/api/queues", "/api/cron"]


BIG_TABLES = ("message_logged", "archive", "queue_stat")


async def _seq_scans(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[str, int]:
    cur = await conn.execute(
        "SELECT relname, seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = %s", (schema,)
    )
    return {r[0]: r[1] for r in await cur.fetchall()}


async def _drive(dsn: str, schema: str, key_id: int) -> tuple[dict[str, dict[str, int]], dict[str, float]]:
    """{path: {table: sequential scans it made}} for every page, and each table's row count."""
    # The dashboard's own connections (reader_conninfo), not in autocommit: every call in one
    # transaction, whose statistics tell what the pages read.
    conn = await psycopg.AsyncConnection.connect(reader_conninfo(dsn))
    try:
        app = create_app(client=AsyncClient(conn, schema=schema))
        transport = httpx.ASGITransport(app=app)
        per_path: dict[str, dict[str, int]] = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://dashboard") as http:
            before = await _seq_scans(conn, schema)
            for path in _paths(key_id):
                r = await http.get(path, follow_redirects=False)
                assert r.status_code in (200, 303), (path, r.status_code, r.text[:300])
                after = await _seq_scans(conn, schema)
                per_path[path] = {t: after.get(t, 0) - before.get(t, 0) for t in after}
                before = after
        cur = await conn.execute(
            "SELECT c.relname, c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        )
        sizes = {r[0]: float(r[1]) for r in await cur.fetchall()}
        await conn.rollback()
        return per_path, sizes
    finally:
        await conn.close()


def test_no_page_scans_a_big_table(dsn: str, loaded: tuple[str, int]) -> None:
    schema, key_id = loaded
    per_path, sizes = asyncio.run(_drive(dsn, schema, key_id))
    big = {name for name, rows in sizes.items() if rows >= 10_000}
    assert set(BIG_TABLES) <= big, sizes
    scanned = {path: {t: n for t, n in d.items() if t in big and n} for path, d in per_path.items()}
    assert {path: d for path, d in scanned.items() if d} == {}
    # The pages did read them (through their indexes): the statistics are live.
    assert set().union(*per_path.values()) >= set(BIG_TABLES)
