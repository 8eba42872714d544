"""The fast paths of the Spark connector (issue 20), against real PostgreSQL, without a JVM:
the binary COPY data built from Arrow columns stages exactly what the row-by-row encoding
stages; the set-wise publish makes exactly the messages send_batch makes, refuses what it
refuses and enqueues nothing then; the packed reads return exactly what the row functions
return, page by page, for every column, the live messages, the archive and a stream's
deliveries. Throughput is measured by benchmarks/spark_jdbc.py, not here."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, Envelope

pytest.importorskip("pyspark")
import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lonnymq.spark import _read, _write
from lonnymq.spark._conf import Target

Conn = psycopg.Connection[Any]
ALL = StructType([StructField(n, t) for n, t in _read.COLUMNS])


def staged_rows(conn: Conn, schema: str, part: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL(
            "SELECT seq, payload, content_type, kind, key, channel, headers, at_ms, delay_ms, priority"
            " FROM {}.spark_stage WHERE part = %s ORDER BY seq"
        ).format(sql.Identifier(schema)),
        (part,),
    ).fetchall()


def test_copy_data_stages_what_the_rows_are(conn: Conn, client: Client, dsn: str, schema: str) -> None:
    """Every staging column, with and without NULLs, through the binary COPY data built from
    Arrow and through psycopg's own row-by-row binary COPY of Encoder.rows: the same rows."""
    client.create_queue("q")
    at = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    fields = [
        ("payload", StringType()),
        ("kind", StringType()),
        ("key", StringType()),
        ("channel", StringType()),
        ("headers", MapType(StringType(), StringType())),
        ("priority", IntegerType()),
        ("delay", DoubleType()),
        ("at", TimestampType()),
    ]
    plan = _write.Plan.build(StructType([StructField(n, t) for n, t in fields]), {})
    batch = pa.RecordBatch.from_pydict(
        {
            "payload": pa.array(["héllo", "", "x" * 3000]),
            "kind": pa.array(["k", None, "ü" * 255]),
            "key": pa.array([None, "k2", "k3"]),
            "channel": pa.array(["eu", None, None]),
            "headers": pa.array([[("t", "1")], None, []], pa.map_(pa.string(), pa.string())),
            "priority": pa.array([5, None, -100], pa.int32()),
            "delay": pa.array([None, 1.2345, None]),
            "at": pa.array([None, None, at], pa.timestamp("us", tz="UTC")),
        }
    )
    target = Target(dsn, schema, "q")
    # Two Arrow batches of one task: seq goes on across them.
    staged = _write.stage(target, plan, str(uuid.uuid4()), iter([batch, batch.slice(1)]))
    assert staged.rows == 5
    encoder = _write.Encoder(plan)
    expected = [*encoder.rows(batch, 7, 0), *encoder.rows(batch.slice(1), 7, 3)]
    copy = sql.SQL("COPY {}.spark_stage (part, seq, {}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(schema), sql.SQL(", ").join(sql.Identifier(c) for c, _ in plan.copy_columns())
    )
    with conn.cursor() as cur, cur.copy(copy) as cp:
        cp.set_types(["int8", "int4", *(t for _, t in plan.copy_columns())])
        for row in expected:
            cp.write_row(row)
    assert staged_rows(conn, schema, staged.part) == staged_rows(conn, schema, 7)
    # No content type staged: the commit gives it once per write.
    assert staged_rows(conn, schema, 7)[1][1:] == (b"", None, None, "k2", None, None,
                                                   None, 1234, None)  # fmt: skip
    # A binary payload without a content type, and an empty Arrow batch in between.
    raw = _write.Plan.build(StructType([StructField("payload", BinaryType())]), {})
    one = pa.RecordBatch.from_pydict({"payload": pa.array([b"\x00\xff"], pa.binary())})
    staged = _write.stage(target, raw, str(uuid.uuid4()), iter([one.slice(0, 0), one]))
    assert staged_rows(conn, schema, staged.part) == [
        (0, b"\x00\xff", None, None, None, None, None, None, None, None)
    ]


def test_set_wise_publish_makes_what_send_batch_makes(
    conn: Conn, client: Client, dsn: str, schema: str
) -> None:
    """The same rows through a Spark write (set-wise publish) and through send_batch, at one
    instant: the same messages, columns, order and counters."""
    for q in ("spark", "send"):
        client.create_queue(q, priority_step=2)
    now = 1_900_000_000_000
    rows = [
        Envelope({"n": 0}),
        Envelope({"n": 1}, kind="k", headers={"h": [1]}, priority=7),
        Envelope({"n": 2}, delay=1.5, priority=-3),
        Envelope({"n": 3}, at=now + 60_000, priority=4),
        Envelope({"n": 4}, at=now - 60_000, priority=100),
    ]
    s = sql.Identifier(schema)
    send = sql.SQL(
        "SELECT count(*) FROM {}.send_batch(p_queue => 'send', p_payloads => %s::bytea[], p_kinds => %s::text[],"
        " p_content_types => %s::text[], p_headers => %s::jsonb[], p_at_ms => %s::bigint[],"
        " p_delays_ms => %s::bigint[], p_priorities => %s::smallint[], p_now => %s)"
    ).format(s)
    columns = (
        [json.dumps(e.payload).encode() for e in rows],
        [e.kind for e in rows],
        ["application/json"] * len(rows),
        [None if e.headers is None else json.dumps(e.headers) for e in rows],
        [e.at for e in rows],
        [None if e.delay is None else round(e.delay * 1000) for e in rows],
        [e.priority for e in rows],
    )
    assert conn.execute(send, (*columns, now)).fetchone() == (5,)
    run = uuid.uuid4()
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (1, %s, 'spark'), (2, %s, 'spark')"
        ).format(s),
        (run, run),
    )
    staged = list(zip(*columns, strict=True))
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {}.spark_stage (part, seq, payload, kind, content_type, headers, at_ms, delay_ms,"
                " priority) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s)"
            ).format(s),
            # part 2 first in the commit: its rows get the lower ids
            [(2 if i >= 3 else 1, i, *r) for i, r in enumerate(staged)],
        )
    commit = sql.SQL(
        "SELECT * FROM {}.spark_write_commit(p_queue => 'spark', p_run => %s, p_parts => %s::bigint[],"
        " p_counts => %s::bigint[], p_now => %s)"
    ).format(s)
    assert conn.execute(commit, (run, [2, 1], [2, 3], now)).fetchone() == (5, 0, 0, False, now, 5)

    def messages(queue: str) -> list[tuple[Any, ...]]:
        return conn.execute(
            sql.SQL(
                "SELECT m.gen, m.dequeue_at, m.scheduled_at, m.enqueued_at, m.attempts, m.deliveries, m.leased,"
                " m.priority, m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error,"
                " m.payload, m.superseded_by FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
                " WHERE q.name = %s ORDER BY m.id"
            ).format(s=s),
            (queue,),
        ).fetchall()

    sent = messages("send")
    assert messages("spark") == sent[3:] + sent[:3]
    for q in ("spark", "send"):
        m = client.metrics(q)
        assert (m.ready + m.scheduled, m.total_sent) == (5, 5)
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.spark_stage").format(s)).fetchone() == (0,)


def test_publish_refuses_what_send_refuses_and_enqueues_nothing(
    conn: Conn, client: Client, schema: str
) -> None:
    client.create_queue("q", max_payload_bytes=10)
    s = sql.Identifier(schema)

    def commit(
        payload: bytes, priority: int | None = None, delay: int | None = None, headers: str | None = None
    ) -> None:
        run = uuid.uuid4()
        part = uuid.uuid4().int >> 66
        conn.execute(
            sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (%s, %s, 'q')").format(s),
            (part, run),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.spark_stage (part, seq, payload, priority, delay_ms, headers)"
                " VALUES (%s, 0, 'ok', NULL, NULL, NULL), (%s, 1, %s, %s, %s, %s::jsonb)"
            ).format(s),
            (part, part, payload, priority, delay, headers),
        )
        conn.execute(
            sql.SQL(
                "SELECT * FROM {}.spark_write_commit(p_queue => 'q', p_run => %s, p_parts => %s::bigint[],"
                " p_counts => '{{2}}')"
            ).format(s),
            (run, [part]),
        )

    for args, state, match in [
        ((b"x" * 11,), "LQ003", "message 2 payload is 11 bytes; queue 'q' allows at most 10"),
        ((b"x", 101), "LQ002", "message 2 priority 101 is outside -100..100"),
        ((b"x", None, -1), "LQ002", "message 2 delay must be >= 0"),
        ((b"x", None, None, "[1]"), "LQ002", "message 2 headers must be a JSON object"),
    ]:
        with pytest.raises(psycopg.Error, match=match) as e:
            commit(*args)
        assert e.value.sqlstate == state
        assert client.metrics("q").ready == 0
    with pytest.raises(psycopg.Error, match="on_conflict must be"):
        conn.execute(
            sql.SQL(
                "SELECT * FROM {}.spark_write_commit(p_queue => 'q', p_run => gen_random_uuid(),"
                " p_parts => '{{}}', p_counts => '{{}}', p_on_conflict => 'merge')"
            ).format(s)
        )


def _expected(conn: Conn, reader: _read.BatchReader) -> list[dict[str, Any]]:
    """What a read returns, from the row function (spark_read_messages / spark_read_archive), in
    id order: the packed read pages by id, the row function promises no order (a small table is
    read sequentially, where a leased message's new version sits after the others)."""
    out = []
    for p in reader.partitions():
        if p.lo < p.hi:
            query, params = reader.query(p)
            for row in sorted(conn.execute(query, params).fetchall(), key=lambda r: r[1]):
                d = dict(zip([n for n, _ in _read.COLUMNS], row, strict=True))
                d["payload"] = bytes(d["payload"]).decode("utf-8", "replace")
                d["headers"] = _read._headers(d["headers"])
                for t in ("enqueued_at", "scheduled_at", "dequeue_at", "archived_at"):
                    if d[t] is not None:
                        d[t] = dt.datetime.fromtimestamp(d[t] / 1000, dt.UTC)
                out.append(d)
    return out


def _read_all(reader: _read.BatchReader) -> list[dict[str, Any]]:
    rows = []
    for p in reader.partitions():
        for b in reader.read(p):
            for r in b.to_pylist():
                for t in ("enqueued_at", "scheduled_at", "dequeue_at", "archived_at"):
                    if r.get(t) is not None:
                        r[t] = r[t].astimezone(dt.UTC)
                rows.append(r)
    return rows


@pytest.mark.parametrize("page", [(20_000, 8 << 20), (3, 1), (7, 50)])
def test_packed_reads_return_what_the_row_functions_return(
    conn: Conn, client: Client, dsn: str, schema: str, page: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every column, NULLs, statuses, a payload that is not UTF-8, the archive and dead
    letters, with pages of every size (down to one row: the byte budget)."""
    monkeypatch.setattr(_read, "_FIRST_PAGE", page[0])
    monkeypatch.setattr(_read, "_PAGE_ROWS", page[0])
    monkeypatch.setattr(_read, "_PAGE_BYTES", page[1])
    # Priorities move dequeue_at by 10 ms a step (not 1 s): a status ("scheduled" until then) must
    # not change between the packed read and the row function's, seconds apart on a loaded machine.
    client.create_queue("q", archive=True, max_attempts=1, priority_step=0.01)
    client.send_batch(
        "q",
        [
            Envelope(
                {"n": i},
                kind=("a", None)[i % 2],
                key=f"k{i}",
                channel=("c1", None, "c2")[i % 3],
                headers=({"h": i, "s": "x"} if i % 4 == 0 else None),
                priority=i % 5 - 2,
                delay=(3600 if i % 7 == 0 else None),
            )
            for i in range(40)
        ],
    )
    client.send("q", b"\xff\xfe not utf-8 \xc3")
    taken = client.take("q", 6)
    client.ack(taken[:2])
    client.nack(taken[2:4], error="boom", state={"step": 2})  # max_attempts 1: dead, archived
    opts = {"dsn": dsn, "schema": schema, "queue": "q", "numPartitions": "3"}
    for table in ("messages", "archive", "dead"):
        reader = _read.BatchReader({**opts, "table": table}, ALL, {})
        got, want = _read_all(reader), _expected(conn, reader)
        assert got == want and len(got) == {"messages": 37, "archive": 4, "dead": 2}[table], table
    # A schema of a few columns, in another order, with casts (priority as long).
    few = StructType([StructField("priority", LongType()), StructField("id", LongType()),
                      StructField("payload", BinaryType()), StructField("queue", StringType())])  # fmt: skip
    reader = _read.BatchReader(opts, few, {})
    assert reader.columns == ["priority", "id", "payload"]
    got = _read_all(reader)
    assert [r["id"] for r in got] == sorted(r["id"] for r in got) and len(got) == 37
    assert {r["queue"] for r in got} == {"q"} and got[-1]["payload"] == b"\xff\xfe not utf-8 \xc3"


def test_packed_stream_read_returns_what_spark_stream_read_returns(
    conn: Conn, client: Client, dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_read, "_PAGE_ROWS", 4)
    client.create_queue("q")
    client.create_queue("other")
    client.send_batch("q", [Envelope({"n": i}, headers={"i": i}, priority=i % 3) for i in range(25)])
    s = sql.Identifier(schema)
    stream = uuid.uuid4()
    conn.execute(
        sql.SQL("SELECT {}.spark_stream_next(%s, 'q', 0, 25, 10)").format(s), (stream,)
    )  # chunks of 10, 10 and 5, in delivery order (priority first)
    reader = _read.StreamReader({"dsn": dsn, "schema": schema, "queue": "q"}, ALL, {})
    chunks = _read.StreamChunks(str(stream), [(1, 0), (1, 1), (1, 2)])
    rows = [r for b in reader.read(chunks) for r in b.to_pylist()]
    want = [
        r
        for c in range(3)
        for r in conn.execute(sql.SQL("SELECT * FROM {}.spark_stream_read(%s, 1, %s)").format(s), (stream, c))
    ]
    assert [r["id"] for r in rows] == [r[1] for r in want] and len(want) == 25
    for r in rows:
        assert r["status"] == "leased" and r["headers"] == [("i", str(json.loads(r["payload"])["n"]))]
    # Another queue's reader reads nothing of this stream.
    other = _read.StreamReader({"dsn": dsn, "schema": schema, "queue": "other"}, ALL, {})
    assert list(other.read(chunks)) == []


def _scans(plan: dict[str, Any], relation: str) -> int:
    """How many times the plan's scans of ``relation`` ran (EXPLAIN ANALYZE's loops)."""
    own = plan.get("Actual Loops", 0) if plan.get("Relation Name") == relation else 0
    return own + sum(_scans(p, relation) for p in plan.get("Plans", []))


def test_a_stream_page_probes_only_its_own_rows(conn: Conn, client: Client, schema: str) -> None:
    """A page of a stream chunk looks up only the messages it returns: the chunk's positions
    are sorted before the join, so the page's LIMIT stops the lookups (joined first and sorted
    after, a page of 5 looked up all 30 messages of its chunk)."""
    client.create_queue("q")
    client.send_batch("q", [{"n": i} for i in range(30)])
    s = sql.Identifier(schema)
    stream = uuid.uuid4()
    conn.execute(sql.SQL("SELECT {}.spark_stream_next(%s, 'q', 0, NULL, 30)").format(s), (stream,))
    [(text,)] = conn.execute(
        sql.SQL("SELECT {s}._spark_pack_sql({s}._spark_stream_sql(true) || ' LIMIT $5', 'ord', %s)").format(
            s=s
        ),
        (["id", "payload"],),
    ).fetchall()
    conn.execute(sql.SQL("PREPARE page (uuid, bigint, integer, bigint, integer) AS ") + sql.SQL(text))
    conn.execute("SET enable_seqscan = off")  # 30 rows: a scan of them all would be the cheapest
    for after, limit, rows in ((0, 5, 5), (5, 5, 5), (25, 10, 5)):
        [(plan,)] = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE page({}, 1, 0, {}, {})").format(
                str(stream), after, limit
            )
        ).fetchall()
        assert _scans(plan[0]["Plan"], "message_logged") == rows
    [(n, last, packed)] = conn.execute(sql.SQL("EXECUTE page({}, 1, 0, 5, 5)").format(str(stream))).fetchall()
    assert (n, last) == (5, 10) and len(packed[0]) == 5 * 8


def test_default_partitions_follow_the_cores_and_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert _read.default_partitions(1) == 1
    assert _read.default_partitions(25_000) == 3  # not below 10,000 ids each
    assert _read.default_partitions(200_000) == 4  # one per core
    assert _read.default_partitions(1_000_000) == 10  # at most 100,000 each
    assert _read.default_partitions(10**12) == 10_000


def test_rows_with_a_key_or_a_channel_go_through_send_batch(conn: Conn, client: Client, schema: str) -> None:
    """The commit's other path: keys are de-duplicated (onConflict), channels booked, and a
    part that lost rows still fails with LQ101 before anything is sent."""
    client.create_queue("q")
    client.send("q", {"n": -1}, key="k1")
    s = sql.Identifier(schema)

    def commit(rows: list[tuple[str, str | None, str | None]], counts: list[int] | None = None) -> Any:
        run = uuid.uuid4()
        conn.execute(
            sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (5, %s, 'q')").format(s),
            (run,),
        )
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {}.spark_stage (part, seq, payload, content_type, key, channel)"
                    " VALUES (5, %s, %s, 'application/json', %s, %s)"
                ).format(s),
                [(i, p.encode(), k, c) for i, (p, k, c) in enumerate(rows)],
            )
        return conn.execute(
            sql.SQL(
                "SELECT * FROM {}.spark_write_commit(p_queue => 'q', p_run => %s, p_parts => '{{5}}',"
                " p_counts => %s::bigint[])"
            ).format(s),
            (run, counts or [len(rows)]),
        ).fetchone()

    row = commit(
        [
            ('{"n": 0}', "k1", None),
            ('{"n": 1}', "k2", None),
            ('{"n": 2}', "k2", "eu"),
            ('{"n": 3}', None, "eu"),
        ]
    )
    assert row[:4] == (2, 0, 2, False)  # k1 exists, k2's second row loses to its first
    assert sorted((m.payload["n"], m.key, m.channel) for m in client.peek("q", 10)) == [
        (-1, "k1", None),
        (1, "k2", None),
        (3, None, "eu"),
    ]
    assert [c.name for c in client.channels("q")] == ["eu"]
    with pytest.raises(psycopg.Error, match="part 5 staged 3 rows but 1 are left") as e:
        commit([('{"n": 4}', "k4", None)], [3])
    assert e.value.sqlstate == "LQ101"
    conn.execute(sql.SQL("DELETE FROM {}.spark_stage").format(s))


def test_packed_reads_refuse_bad_arguments(conn: Conn, client: Client, schema: str) -> None:
    client.create_queue("q")
    s = sql.Identifier(schema)
    for args, match in [
        ("p_table => 'messages', p_columns => '{nope}'", "a packed read has no column 'nope'"),
        ("p_table => 'messages', p_columns => '{queue}'", "a packed read has no column 'queue'"),
        ("p_table => 'other', p_columns => '{id}'", "table must be messages, archive or dead"),
        ("p_table => 'messages', p_columns => '{id}', p_limit => 0", "a page is 1 to 1,000,000 rows"),
    ]:
        query = sql.SQL("SELECT * FROM {}.spark_read_packed(p_queue => 'q', p_lo => 0, p_hi => 10, {})")
        with pytest.raises(psycopg.Error, match=match) as e:
            conn.execute(query.format(s, sql.SQL(args)))  # type: ignore[arg-type]
        assert e.value.sqlstate == "LQ002"
    with pytest.raises(psycopg.Error, match="the key of a packed read is id or ord"):
        conn.execute(sql.SQL("SELECT {}._spark_pack_sql('SELECT 1', 'x', '{{id}}')").format(s))
