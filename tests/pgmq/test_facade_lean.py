"""The facade's lean paths (issue 13 item 5, docs/pgmq.md "Speed"): the one-id ``pgmq.delete``
does message_cancel's work for one message in one statement of its own, and the read, pop and
plain sends call LonnyMQ's functions directly. What they write is what the general paths write,
and the delete's statement finds its row through the primary key whatever the statistics."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from lonnymq import Client

Conn = psycopg.Connection[dict[str, Any]]


def _stat(pg: Conn, queue: str) -> dict[str, int]:
    row = pg.execute(
        "SELECT coalesce(sum(s.sent), 0) AS sent, coalesce(sum(s.acked), 0) AS acked,"
        " coalesce(sum(s.cancelled), 0) AS cancelled"
        " FROM lonnymq.queue_stat s JOIN lonnymq.queue q ON q.id = s.queue_id WHERE q.name = %s",
        (queue,),
    ).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def test_delete_of_one_id_writes_what_message_cancel_writes(pg: Conn, lq: Client) -> None:
    """A read message, a ready one and a scheduled one: each deleted and counted as cancelled,
    as LonnyMQ's message_cancel (the array form) does; an unknown id deletes nothing and counts
    nothing; an unknown queue raises pgmq's error."""
    pg.execute("SELECT pgmq.create('q')")
    ids = [
        r["id"]
        for r in pg.execute("SELECT pgmq.send_batch('q', ARRAY['{\"a\": 1}', '{\"a\": 2}']::jsonb[]) AS id")
    ]
    later = pg.execute("SELECT pgmq.send('q', '{\"a\": 3}', 3600) AS id").fetchone()
    assert later is not None
    [read] = pg.execute("SELECT * FROM pgmq.read('q', 30, 1)").fetchall()
    assert read["msg_id"] == ids[0]
    for msg_id in (ids[0], ids[1], later["id"]):
        assert pg.execute("SELECT pgmq.delete('q', %s::bigint) AS ok", (msg_id,)).fetchone() == {"ok": True}
    assert pg.execute("SELECT pgmq.delete('q', %s::bigint) AS ok", (ids[0],)).fetchone() == {"ok": False}
    assert pg.execute("SELECT count(*) AS n FROM pgmq.q_q").fetchone() == {"n": 0}
    assert _stat(pg, "q") == {"sent": 3, "acked": 0, "cancelled": 3}
    # The same through the array form (message_cancel), for comparison.
    more = [r["id"] for r in pg.execute("SELECT pgmq.send_batch('q', ARRAY['{}', '{}']::jsonb[]) AS id")]
    assert [r["id"] for r in pg.execute("SELECT pgmq.delete('q', %s::bigint[]) AS id", (more,))] == more
    assert _stat(pg, "q") == {"sent": 5, "acked": 0, "cancelled": 5}
    with pytest.raises(psycopg.Error, match="does not exist"):
        pg.execute("SELECT pgmq.delete('nope', 1::bigint)")
    assert lq.metrics("q").total_sent == 5


def test_delete_of_one_id_leaves_the_channel(pg: Conn, lq: Client) -> None:
    """A message of a LonnyMQ channel deleted through the one-id delete leaves its channel, as
    message_cancel's does: the channel's size and lease count go down, and the channel (not
    configured) goes once empty."""
    lq.create_queue("c")
    first = lq.send("c", {"n": 1}, channel="ch")
    second = lq.send("c", {"n": 2}, channel="ch")
    [taken] = lq.take("c", 1)
    assert taken.id == first.id

    def channel() -> dict[str, Any] | None:
        return pg.execute(
            "SELECT current_size, current_concurrency FROM lonnymq.channel"
            " WHERE name = 'ch' AND queue_id = (SELECT id FROM lonnymq.queue WHERE name = 'c')"
        ).fetchone()

    assert channel() == {"current_size": 2, "current_concurrency": 1}
    assert pg.execute("SELECT pgmq.delete('c', %s::bigint) AS ok", (first.id,)).fetchone() == {"ok": True}
    assert channel() == {"current_size": 1, "current_concurrency": 0}
    assert pg.execute("SELECT pgmq.delete('c', %s::bigint) AS ok", (second.id,)).fetchone() == {"ok": True}
    assert channel() is None
    assert _stat(pg, "c")["cancelled"] == 2


def _delete_statement(pg: Conn) -> str:
    """The statement of the one-id pgmq.delete, as installed, with queue_name, msg_id and v_now
    as $1-$3."""
    row = pg.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = 'pgmq.delete(text, bigint)'::regprocedure"
    ).fetchone()
    assert row is not None
    match = re.search(r"(WITH x AS \(\s+SELECT .*?DELETE .*?FROM d)\s*;", row["prosrc"], re.S)
    assert match, "the DELETE is not in pgmq.delete(text, bigint)"
    text = re.sub(r"\bINTO\s+v_channel,\s*v_leased\s+", " ", match[1])
    for name, param in {"queue_name": "$1", "msg_id": "$2", "v_now": "$3"}.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", param, text)
    unknown = re.findall(r"(?<![\w.])(?:p|v)_\w+|\bq\.\w+", text)
    assert not unknown, f"pgmq.delete's statement uses {unknown}: teach this test about them"
    return text


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("statistics", ["never analysed", "analysed"])
def test_plan_of_the_one_id_delete(db_dsn: str, lq: Client, statistics: str) -> None:
    """The generic plan the function keeps, made with the function's own settings (its SET
    clauses: force_generic_plan, enable_seqscan = off, as the core's entry points): the queue
    by name, the row by the primary key of the message table's partitions, never a sequential
    scan, whether the table's statistics were never taken or say the queue is large."""
    lq.create_queue("other")
    lq.create_queue("q")
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as pg:
        if statistics == "analysed":
            for _ in range(5):
                lq.send_batch("q", [b"x"] * 1000)
                lq.send_batch("other", [b"x"] * 1000)
            pg.execute("ANALYZE lonnymq.message")
        config = pg.execute(
            "SELECT proconfig FROM pg_proc WHERE oid = 'pgmq.delete(text, bigint)'::regprocedure"
        ).fetchone()
        assert config is not None
        settings = dict(c.split("=", 1) for c in config["proconfig"])
        assert settings["plan_cache_mode"] == "force_generic_plan" and settings["enable_seqscan"] == "off"
        for name, value in settings.items():
            if name != "search_path":
                pg.execute("SELECT set_config(%s, %s, false)", (name, value))
        pg.execute(f"PREPARE d(text, bigint, bigint) AS {_delete_statement(pg)}")  # type: ignore[arg-type]
        row = pg.execute("EXPLAIN (FORMAT JSON) EXECUTE d('q', 1, 0)").fetchone()
        assert row is not None
        plan = row["QUERY PLAN"][0]["Plan"]
        nodes = list(_nodes(plan))
        assert not [x for x in nodes if x["Node Type"] == "Seq Scan"], plan
        scans = [x for x in nodes if x.get("Relation Name", "").startswith("message_")]
        assert scans and all(
            x["Node Type"] == "Index Scan" and x["Index Name"].endswith("_pkey") for x in scans
        ), plan
