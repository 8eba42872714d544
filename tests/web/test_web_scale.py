"""The dashboard at many queues (issue 19 item 3): a queue's page reads that queue's rows and an
overview page reads its page of queues, whatever the number of queues. Every page is requested
through the app on the dashboard's own session settings with generic plans (what PL/pgSQL and
prepared statements settle on), in one transaction whose statistics (pg_stat_xact_user_tables)
count the queue rows each page read."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from core_helpers import Sql
from lonnymq import AsyncClient
from lonnymq.web import create_app
from lonnymq.web.app import reader_conninfo

QUEUES = 2_000
PAGE = 50


async def _queue_rows_read(conn: psycopg.AsyncConnection[Any], schema: str) -> int:
    cur = await conn.execute(
        "SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = %s AND relname = 'queue'",
        (schema,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _reads(dsn: str, schema: str, paths: list[str]) -> dict[str, int]:
    """{path: queue rows its request read}, each page requested twice first (plans cached)."""
    params = conninfo_to_dict(reader_conninfo(dsn))
    params["options"] = f"{params['options']} -c plan_cache_mode=force_generic_plan"
    conn = await psycopg.AsyncConnection.connect(make_conninfo("", **params))
    try:
        app = create_app(client=AsyncClient(conn, schema=schema))
        read: dict[str, int] = {}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dashboard"
        ) as http:
            for path in paths:
                for _ in range(2):
                    assert (await http.get(path)).status_code == 200, path
                before = await _queue_rows_read(conn, schema)
                r = await http.get(path)
                assert r.status_code == 200, (path, r.text[:300])
                read[path] = await _queue_rows_read(conn, schema) - before
        await conn.rollback()
        return read
    finally:
        await conn.close()


def test_a_queue_page_and_an_overview_page_read_their_queues_only(dsn: str, schema: str) -> None:
    """Among 2,000 queues, a queue's page (settings, counts, minutes, totals) reads a few queue
    rows, where it read all 2,000 twice (queue_list() whole for the settings, and stats_totals'
    generic plan); a page of 50 queues of the overview reads a few rows per queue listed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        Sql(conn, schema).q(
            "SELECT count({s}.queue_create('q' || lpad(i::text, 4, '0'))) FROM generate_series(1, %s) i",
            (QUEUES,),
        )
        Sql(conn, schema).q("SELECT {s}.send('q1500', '\\x01'::bytea)")
        conn.execute(sql.SQL("ANALYZE {}.queue").format(sql.Identifier(schema)))
    paths = ["/queues/q1500", "/api/queues/q1500", f"/api/queues?after=q1000&limit={PAGE}"]
    read = asyncio.run(_reads(dsn, schema, paths))
    assert read["/queues/q1500"] <= 10, read
    assert read["/api/queues/q1500"] <= 10, read
    assert read[f"/api/queues?after=q1000&limit={PAGE}"] <= 5 * PAGE, read
