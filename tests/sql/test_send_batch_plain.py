"""The plain batch (issue 13): a send_batch without keys, channels or send key writes what the
same batch with a send key writes and returns the same ords and outcomes, ids in input order;
a bad plain batch writes nothing, not even its queue_stat row. A guard for any lean path of the
plain batch (one that returned the ids from the insert itself, measured and dropped, was caught
by the first test when it lost the headers)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from lonnymq import Client

COLUMNS = (
    "gen, dequeue_at, scheduled_at, enqueued_at, attempts, deliveries, leased, priority, key, channel,"
    " kind, content_type, headers, payload"
)
BATCH = sql.SQL(
    "SELECT ord, id, outcome FROM {}.send_batch(%s, %s::bytea[], p_kinds => %s::text[],"
    " p_content_types => %s::text[], p_headers => %s::jsonb[], p_at_ms => %s::bigint[],"
    " p_delays_ms => %s::bigint[], p_priorities => %s::int2[], p_now => %s, p_send_key => %s)"
)
NOW = 1_000_000_000


def _args(queue: str, bad: bool = False) -> list[Any]:
    payloads: list[bytes | None] = [b"a", b"bb", b"c", b"d", b"e"]
    priorities = [0, 5, -3, None, 100 if not bad else 101]
    return [
        queue,
        payloads,
        ["k1", None, "k3", None, None],
        [None, "text/plain", None, None, "application/json"],
        [Jsonb({"a": 1}), None, None, Jsonb({}), None],
        [None, None, NOW - 5, None, None],
        [None, 2000, None, 0, None],
        priorities,
        NOW,
    ]


def test_the_plain_batch_writes_what_the_keyed_call_writes(client: Client, conn: Any, schema: str) -> None:
    s = sql.Identifier(schema)
    client.create_queue("lean", priority_step=2)
    client.create_queue("general", priority_step=2)
    lean = conn.execute(BATCH.format(s), [*_args("lean"), None]).fetchall()
    general = conn.execute(
        BATCH.format(s), [*_args("general"), "00000000-0000-0000-0000-000000000001"]
    ).fetchall()
    lean.sort()
    general.sort()
    assert [r[0] for r in lean] == [1, 2, 3, 4, 5]
    assert [(r[0], r[2]) for r in lean] == [(r[0], r[2]) for r in general]
    for rows in (lean, general):  # ids in input order: the batch is FIFO
        ids = [r[1] for r in rows]
        assert ids == sorted(ids)
    stored = {
        name: conn.execute(
            sql.SQL("SELECT " + COLUMNS + " FROM {s}.message WHERE id = ANY(%s) ORDER BY id").format(s=s),  # type: ignore[operator]
            ([r[1] for r in rows],),
        ).fetchall()
        for name, rows in (("lean", lean), ("general", general))
    }
    assert len(stored["lean"]) == 5
    assert stored["lean"] == stored["general"]
    sent = conn.execute(
        sql.SQL(
            "SELECT q.name, sum(st.sent), count(*) FROM {s}.queue_stat st JOIN {s}.queue q ON q.id = st.queue_id"
            " GROUP BY q.name ORDER BY q.name"
        ).format(s=s)
    ).fetchall()
    assert sent == [("general", 5, 1), ("lean", 5, 1)]


def test_a_bad_plain_batch_writes_nothing(client: Client, conn: Any, schema: str) -> None:
    s = sql.Identifier(schema)
    client.create_queue("lean")
    with pytest.raises(psycopg.Error, match=r"message 5 priority 101 is outside -100\.\.100"):
        conn.execute(BATCH.format(s), [*_args("lean", bad=True), None])
    conn.rollback()
    counts = conn.execute(
        sql.SQL("SELECT (SELECT count(*) FROM {s}.message), (SELECT count(*) FROM {s}.queue_stat)").format(
            s=s
        )
    ).fetchone()
    assert counts == (0, 0)
