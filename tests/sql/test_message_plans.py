"""Plan tests of the message-level reads (issue 11) on a realistic archive: a page of
archive_list / dead_list is an index range scan (the primary key for keyset paging by id,
archive_status_idx for a time window), message_get one index lookup, and the repeat lookup of
ack reads settled by its hash index on id (migration 0021). Statements are taken verbatim from
the function bodies."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client
from lonnymq.sql import function_text

pytestmark = pytest.mark.slow

ROWS = 300_000


@pytest.fixture(scope="module")
def loaded(dsn: str) -> Iterator[tuple[psycopg.Connection, int, int]]:
    """Queue "q" with ROWS archived messages (acked, dead, cancelled, over a day), a second queue
    of the same size, ROWS settled rows; analysed. Yields (connection on the schema, queue id,
    now)."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue("other")
        c.create_queue("q")
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        qid = conn.execute("SELECT id FROM queue WHERE name = 'q'").fetchone()[0]  # type: ignore[index]
        now = conn.execute("SELECT now_ms()").fetchone()[0]  # type: ignore[index]
        for queue_id in (qid, qid - 1):
            conn.execute(
                "INSERT INTO archive (queue_id, id, status, archived_at, scheduled_at, enqueued_at,"
                " attempts, deliveries, priority, payload)"
                " SELECT %s, g * 2 + %s, (ARRAY['acked', 'dead', 'cancelled'])[1 + g %% 3],"
                "        %s - 86400000 + g * (86400000 / %s), 0, 0, 1, 1, 0, 'x'::bytea"
                "   FROM generate_series(1, %s) g",
                (queue_id, queue_id - qid + 1, now, ROWS, ROWS),
            )
        conn.execute(
            "INSERT INTO settled SELECT %s, g, 1, 'acked', %s FROM generate_series(1, %s) g", (qid, now, ROWS)
        )
        conn.execute("ANALYZE")
        yield conn, qid, now
    finally:
        conn.close()
        drop_schema(dsn, schema)


def _statements(function: str) -> list[str]:
    """The RETURN QUERY SELECTs of ``function`` with its variables as parameters."""
    body = function_text(function)
    found = re.findall(r"RETURN QUERY\s+(SELECT\s.*?);", body, re.S)
    assert found, f"no RETURN QUERY SELECT in {function}()"
    return found


def _plan(conn: psycopg.Connection, query: str, params: dict[str, object]) -> str:
    for name, value in params.items():
        query = re.sub(rf"\b{re.escape(name)}\b", value if isinstance(value, str) else repr(value), query)
    assert not re.findall(r"\b(?:p|v)_\w+", query), query
    query = query.replace("{schema}.", "")
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query).fetchall()
    return "\n".join(r[0] for r in rows)


def test_an_archive_page_by_id_is_a_primary_key_range_scan(
    loaded: tuple[psycopg.Connection, int, int],
) -> None:
    conn, qid, _ = loaded
    by_id, _ = _statements("archive_list")
    statuses = "ARRAY['acked', 'cancelled', 'dead']"
    for after in (0, ROWS):  # the first page and one in the middle
        plan = _plan(conn, by_id, {"q.id": qid, "p_after_id": after, "v_statuses": statuses, "p_limit": 100})
        assert "Index Scan using archive_pkey" in plan and "Sort" not in plan, plan
        assert re.search(r"Index Cond: \(\(queue_id = \d+\) AND \(id > ", plan), plan
        # The whole statement's buffers (the top node's line): a page, not the archive.
        top = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
        assert top is not None and int(top[1]) + int(top[2] or 0) < 200, plan


def test_an_archive_time_window_uses_the_status_index(loaded: tuple[psycopg.Connection, int, int]) -> None:
    conn, qid, now = loaded
    _, by_time = _statements("archive_list")
    plan = _plan(
        conn,
        by_time,
        {
            "q.id": qid,
            "p_after_id": 0,
            "v_statuses": "ARRAY['dead']",
            "p_since": now - 60_000,
            "p_until": "NULL::bigint",
            "p_limit": 100,
        },
    )
    assert (
        "Index Scan using archive_status_idx" in plan or "Bitmap Index Scan on archive_status_idx" in plan
    ), plan
    assert "archived_at >=" in plan and "Seq Scan" not in plan, plan


def test_message_get_and_the_ack_repeat_lookup_are_index_lookups(
    loaded: tuple[psycopg.Connection, int, int],
) -> None:
    conn, qid, now = loaded
    by_id, by_key = _statements("message_get")
    plan = _plan(conn, by_id, {"q.id": qid, "p_id": 5, "v_now": now})
    assert "Index Scan" in plan and "Seq Scan" not in plan, plan
    plan = _plan(conn, by_key, {"q.id": qid, "p_key": "'k'", "v_now": now})
    assert "message_" in plan and "Seq Scan" not in plan, plan
    repeat = re.search(r"EXISTS \((SELECT FROM \{schema\}\.settled s.*?)\)\s+OR", function_text("ack"), re.S)
    assert repeat is not None
    query = repeat[1].replace("t.id", "12345").replace("t.token", "1")
    plan = _plan(conn, query, {"q.id": qid})
    assert "Index Scan using settled_id_idx" in plan, plan
