"""Filter pushdown of batch reads (``BatchReader.pushFilters``), without Spark: which filters
PostgreSQL takes, which stay with Spark, the rows the generated SQL returns, and that its plan
uses the indexes (EXPLAIN of exactly what ``read`` runs, with realistic data and with
enable_seqscan off). The same filters through a real Spark session: tests/spark/test_spark.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, Envelope

pytest.importorskip("pyspark")

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringStartsWith,
)
from pyspark.sql.types import StructField, StructType

from lonnymq.spark._payload import to_ms_bounds
from lonnymq.spark._read import COLUMNS, BatchReader, IdRange

Conn = psycopg.Connection[Any]
SCHEMA = StructType([StructField(n, t) for n, t in COLUMNS])
N = 6000


def reader(dsn: str, schema: str, queue: str, *filters: Any, **options: str) -> tuple[BatchReader, list[Any]]:
    r = BatchReader({"dsn": dsn, "schema": schema, "queue": queue, **options}, SCHEMA, {})
    left = list(r.pushFilters(list(filters)))
    return r, left


def rows(conn: Conn, r: BatchReader) -> list[tuple[Any, ...]]:
    out = []
    for p in r.partitions():
        if p.lo < p.hi:
            query, params = r.query(p)
            out += conn.execute(query, params).fetchall()
    return out


TIME_PARAMS = ["p_enqueued_lo", "p_enqueued_hi", "p_scheduled_lo", "p_scheduled_hi"]


def plan_nodes(conn: Conn, schema: str, r: BatchReader) -> list[dict[str, Any]]:
    """Every node of the plan of the query the read function EXECUTEs for the first partition
    (_spark_read_sql's text, planned with the values, as RETURN QUERY EXECUTE ... USING does)."""
    [part] = r.partitions()
    _, p = r.query(part)
    messages = r.table == "messages"
    last = ["p_dequeue_lo", "p_dequeue_hi"] if messages else ["p_archived_lo", "p_archived_hi"]
    s = sql.Identifier(schema)
    [(text,)] = conn.execute(
        sql.SQL("SELECT {}._spark_read_sql(%s, %s, %s, %s, %s, %s, %s, %s::bigint[])").format(s),
        (
            r.table,
            p.get("p_status"),
            p["p_keys"],
            p["p_key_prefix"],
            p["p_channels"],
            p["p_kinds"],
            p["p_statuses"],
            [p[k] for k in TIME_PARAMS + last],
        ),
    ).fetchall()
    fourth = ("bigint", int(datetime.now(UTC).timestamp() * 1000)) if messages else ("text", p["p_status"])
    types = ["text", "bigint", "bigint", fourth[0], "text[]", "text", "text[]", "text[]", "text[]"] + [
        "bigint"
    ] * 6
    values = [p["p_queue"], p["p_lo"], p["p_hi"], fourth[1]] + [
        p[k] for k in ["p_keys", "p_key_prefix", "p_channels", "p_kinds", "p_statuses", *TIME_PARAMS, *last]
    ]
    conn.execute(f"PREPARE lq_plan ({', '.join(types)}) AS {text}")
    try:
        cur = psycopg.ClientCursor(conn)  # literal values: the plan the EXECUTE ... USING gets
        cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE lq_plan ({', '.join(['%s'] * len(values))})", values)
        [(doc,)] = cur.fetchall()
    finally:
        conn.execute("DEALLOCATE lq_plan")
    doc = doc if isinstance(doc, list) else json.loads(doc)
    nodes, todo = [], [doc[0]["Plan"]]
    while todo:
        n = todo.pop()
        nodes.append(n)
        todo += n.get("Plans", [])
    return nodes


def index_conds(nodes: list[dict[str, Any]]) -> str:
    return " ".join(f"{n.get('Index Name')}: {n.get('Index Cond')}" for n in nodes if "Index Cond" in n)


@pytest.fixture
def loaded(client: Client, conn: Conn, schema: str) -> dict[str, Any]:
    """A queue of N messages (keys k00000.., 6 channels, 3 kinds), a tenth archived (acked), and
    a second queue, analysed."""
    client.create_queue("q", archive=True)
    client.create_queue("other")
    client.send_batch("other", [{"n": i} for i in range(200)])
    sent = client.send_batch(
        "q",
        [
            Envelope({"n": i}, key=f"k{i:05d}", channel=f"c{i % 6}", kind=("a", "b", "c")[i % 3])
            for i in range(N)
        ],
    )
    client.ack(client.take("q", N // 10))
    conn.execute(sql.SQL("ANALYZE {}.message").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("ANALYZE {}.archive").format(sql.Identifier(schema)))
    return {"ids": [r.id for r in sent]}


def test_supported_filters_are_taken_and_the_rest_stay_with_spark(
    dsn: str, schema: str, client: Client
) -> None:
    client.create_queue("q")
    t = datetime(2030, 1, 1, tzinfo=UTC)
    taken = [
        GreaterThan(("id",), 5),
        LessThanOrEqual(("id",), 50),
        EqualTo(("key",), "a"),
        In(("channel",), ("x", "y")),
        EqualTo(("kind",), "k"),
        In(("status",), ("ready", "leased")),
        StringStartsWith(("key",), "a"),
        GreaterThanOrEqual(("enqueued_at",), t),
        LessThan(("scheduled_at",), t),
        EqualTo(("dequeue_at",), t),
    ]
    unsupported = [
        Not(EqualTo(("key",), "a")),  # negations
        IsNotNull(("key",)),
        StringContains(("key",), "x"),  # not an index range
        EqualNullSafe(("id",), 3),
        In(("id",), (1, 2)),
        EqualTo(("priority",), 3),  # no index; Spark filters it
        EqualTo(("archived_at",), t),  # not a column of live messages
        EqualTo(("payload", "a"), 1),  # nested
        GreaterThan(("id",), 1.5),  # not an integer
        In(("channel",), ("x", None)),
    ]
    r, left = reader(dsn, "public", "q", *taken, *unsupported)
    assert left == unsupported and all(a is b for a, b in zip(left, unsupported, strict=True))
    assert (r.pushed.id_lo, r.pushed.id_hi) == (6, 51)
    ms = int(t.timestamp() * 1000)
    assert r.pushed.times == {
        "enqueued_at": (ms, None),
        "scheduled_at": (None, ms - 1),
        "dequeue_at": (ms, ms),
    }
    # On the archive, archived_at is a time column and dequeue_at is not.
    _, left = reader(
        dsn, "public", "q", EqualTo(("archived_at",), t), EqualTo(("dequeue_at",), t), table="dead"
    )
    assert left == [EqualTo(("dequeue_at",), t)]


def test_timestamp_bounds_are_exact_at_microseconds() -> None:
    t = datetime(2030, 1, 1, 0, 0, 0, 1500, tzinfo=UTC)  # 1.5 ms past a whole ms
    ms = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert to_ms_bounds(GreaterThan(("x",), t)) == (ms + 2, None)  # 1 ms < 1.5 ms
    assert to_ms_bounds(GreaterThanOrEqual(("x",), t)) == (ms + 2, None)
    assert to_ms_bounds(LessThan(("x",), t)) == (None, ms + 1)
    assert to_ms_bounds(LessThanOrEqual(("x",), t)) == (None, ms + 1)
    assert to_ms_bounds(EqualTo(("x",), t)) == (ms + 2, ms + 1)  # no whole ms equals it: empty
    naive = datetime(2030, 1, 1)  # naive literals are UTC
    assert to_ms_bounds(EqualTo(("x",), naive)) == (ms, ms)
    assert to_ms_bounds(EqualTo(("x",), "2030-01-01")) is None


def test_pushed_filters_return_exactly_the_matching_rows(
    dsn: str, schema: str, conn: Conn, client: Client, loaded: dict[str, Any]
) -> None:
    ids = loaded["ids"]
    r, _ = reader(dsn, schema, "q", GreaterThanOrEqual(("id",), ids[100]), LessThan(("id",), ids[200]))
    assert sorted(row[1] for row in rows(conn, r)) == [
        i for i in ids[100:200] if i not in set(ids[: N // 10])
    ]
    r, _ = reader(dsn, schema, "q", EqualTo(("key",), "k05555"))
    assert [row[6] for row in rows(conn, r)] == ["k05555"]
    r, _ = reader(dsn, schema, "q", StringStartsWith(("key",), "k0555"), In(("channel",), ("c1", "c2")))
    got = sorted(row[6] for row in rows(conn, r))
    assert got == [f"k0555{d}" for d in range(10) if int(f"555{d}") % 6 in (1, 2)]
    r, _ = reader(dsn, schema, "q", EqualTo(("kind",), "b"), EqualTo(("status",), "ready"))
    assert len(rows(conn, r)) == len([i for i in range(N // 10, N) if i % 3 == 1])
    r, _ = reader(dsn, schema, "q", EqualTo(("status",), "leased"))
    assert rows(conn, r) == []
    # Contradictions read nothing, without asking the server for ranges.
    r, _ = reader(dsn, schema, "q", EqualTo(("key",), "a"), EqualTo(("key",), "b"))
    assert r.partitions() == [IdRange(0, 0)]
    r, _ = reader(dsn, schema, "q", StringStartsWith(("key",), "a"), StringStartsWith(("key",), "b"))
    assert r.partitions() == [IdRange(0, 0)]
    r, _ = reader(dsn, schema, "q", GreaterThan(("id",), ids[-1]))
    assert r.partitions() == [IdRange(0, 0)]
    # Time ranges on the archive.
    archived = client.metrics("q")
    assert archived.ready == N - N // 10
    now = datetime.now(UTC)
    r, _ = reader(dsn, schema, "q", GreaterThan(("archived_at",), now - timedelta(hours=1)), table="archive")
    assert len(rows(conn, r)) == N // 10
    r, _ = reader(dsn, schema, "q", LessThan(("archived_at",), now - timedelta(hours=1)), table="archive")
    assert rows(conn, r) == []
    r, _ = reader(dsn, schema, "q", EqualTo(("key",), "k00003"), table="archive")
    assert [(row[2], row[6]) for row in rows(conn, r)] == [("acked", "k00003")]


@pytest.mark.parametrize("seqscan", ["on", "off"])
def test_the_plan_uses_the_indexes(
    dsn: str, schema: str, conn: Conn, loaded: dict[str, Any], seqscan: str
) -> None:
    conn.execute(f"SET enable_seqscan = {seqscan}")
    ids = loaded["ids"]
    r, _ = reader(dsn, schema, "q", EqualTo(("key",), "k04321"), numPartitions="1")
    assert "key = ANY ('{k04321}'::text[])" in index_conds(plan_nodes(conn, schema, r))
    r, _ = reader(
        dsn,
        schema,
        "q",
        GreaterThanOrEqual(("id",), ids[3000]),
        LessThan(("id",), ids[3010]),
        numPartitions="1",
    )
    conds = index_conds(plan_nodes(conn, schema, r))
    assert f"id >= '{ids[3000]}'" in conds and f"id < '{ids[3010]}'" in conds
    r, _ = reader(dsn, schema, "q", EqualTo(("channel",), "c4"), numPartitions="1")
    assert "channel = ANY ('{c4}'::text[])" in index_conds(plan_nodes(conn, schema, r))
    since = datetime.now(UTC) - timedelta(minutes=5)
    r, _ = reader(
        dsn,
        schema,
        "q",
        GreaterThan(("archived_at",), since),
        EqualTo(("status",), "dead"),  # selective: nothing is dead
        table="archive",
        numPartitions="1",
    )
    conds = index_conds(plan_nodes(conn, schema, r))
    assert "status = ANY ('{dead}'::text[])" in conds and "archived_at >" in conds
    # Filters off: nothing but the id range and the queue reaches an index.
    r, _ = reader(dsn, schema, "q", numPartitions="1")
    assert "key = " not in index_conds(plan_nodes(conn, schema, r))
