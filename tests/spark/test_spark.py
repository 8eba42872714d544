"""The lonnymq PySpark data source against real PostgreSQL, in Spark local mode: batch write,
batch read, streaming read and streaming write, with injected failures and restarts."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, Envelope
from spark_fixtures import spark_session  # noqa: F401 - provides the `spark` fixture

pytestmark = [
    pytest.mark.once,
    pytest.mark.spark,
    # PySpark 4.3 warns about pandas 3 when its Arrow helpers load; nothing here uses pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def opts(dsn: str, schema: str, queue: str, **more: Any) -> dict[str, str]:
    return {"dsn": dsn, "schema": schema, "queue": queue, **{k: str(v) for k, v in more.items()}}


def staged_rows(conn: psycopg.Connection[Any], schema: str) -> int:
    q = sql.SQL("SELECT (SELECT count(*) FROM {s}.spark_stage) + (SELECT count(*) FROM {s}.spark_stage_part)")
    row = conn.execute(q.format(s=sql.Identifier(schema))).fetchone()
    assert row is not None
    return int(row[0])


def all_messages(client: Client, queue: str) -> list[Any]:
    return client.peek(queue, 100_000)


# -- batch write ------------------------------------------------------------------------------


def test_batch_write_columns_become_messages(
    spark: Any, dsn: str, schema: str, client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("orders", priority_step=1)
    at = datetime(2030, 1, 1, tzinfo=UTC)
    df = spark.createDataFrame(
        [
            (1, "ada", 2.5, "k1", "created", "eu", 5, None, None),
            (2, "bob", 1.0, "k2", "paid", None, 0, 30.0, None),
            (3, "cy", 9.0, "k1", "created", "us", -3, None, at),  # duplicate key: ignored
            (4, "dee", 4.0, None, None, None, None, None, None),
        ],
        "order_id long, customer string, amount double, key string, kind string, channel string,"
        " priority int, delay double, at timestamp",
    )
    df.coalesce(1).write.format("lonnymq").options(**opts(dsn, schema, "orders")).mode("append").save()

    msgs = {m.payload["order_id"]: m for m in all_messages(client, "orders")}
    assert sorted(msgs) == [1, 2, 4]
    assert msgs[1].payload == {"order_id": 1, "customer": "ada", "amount": 2.5}
    assert (msgs[1].key, msgs[1].kind, msgs[1].channel, msgs[1].priority) == ("k1", "created", "eu", 5)
    assert msgs[1].content_type == "application/json"
    assert msgs[2].scheduled_at - msgs[2].enqueued_at == 30_000
    assert msgs[4].key is None and msgs[4].priority == 0 and msgs[4].scheduled_at == msgs[4].enqueued_at
    # All rows of one write are enqueued in one transaction: one enqueue time.
    assert len({m.enqueued_at for m in msgs.values()}) == 1
    assert staged_rows(conn, schema) == 0

    # A payload column: text as text, JSON text as JSON (payloadFormat=json), structs as JSON.
    client.create_queue("texts")
    spark.createDataFrame([("hello",), ("wörld",)], "payload string").write.format("lonnymq").options(
        **opts(dsn, schema, "texts")
    ).mode("append").save()
    assert sorted(m.payload for m in all_messages(client, "texts")) == ["hello", "wörld"]
    client.create_queue("jsons")
    spark.createDataFrame([('{"a": 1}',)], "payload string").write.format("lonnymq").options(
        **opts(dsn, schema, "jsons", payloadFormat="json")
    ).mode("append").save()
    spark.sql(
        "SELECT named_struct('x', 1, 'tags', array('a', 'b')) AS payload, map('trace', 't-1') AS headers"
    ).write.format("lonnymq").options(**opts(dsn, schema, "jsons")).mode("append").save()
    got = sorted((json.dumps(m.payload, sort_keys=True), m.headers) for m in all_messages(client, "jsons"))
    assert got == [('{"a": 1}', None), ('{"tags": ["a", "b"], "x": 1}', {"trace": "t-1"})]


def test_batch_write_bad_rows_fail_the_job_and_enqueue_nothing(
    spark: Any, dsn: str, schema: str, client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("orders")
    df = spark.range(100).selectExpr("id", "CAST(CASE WHEN id = 77 THEN 101 ELSE 0 END AS INT) AS priority")
    with pytest.raises(Exception, match=r"priority 101 is outside -100\.\.100"):
        df.repartition(3).write.format("lonnymq").options(**opts(dsn, schema, "orders")).mode("append").save()
    assert client.metrics("orders").ready == 0
    with pytest.raises(Exception, match="only appends"):
        df.write.format("lonnymq").options(**opts(dsn, schema, "orders")).mode("overwrite").save()
    with pytest.raises(Exception, match="does not exist"):
        df.write.format("lonnymq").options(**opts(dsn, schema, "nope")).mode("append").save()


@pytest.mark.slow
def test_batch_write_retried_task_enqueues_exactly_n(
    spark: Any, dsn: str, schema: str, client: Client, conn: psycopg.Connection[Any]
) -> None:
    """Partition 1's first attempt stages its rows and then fails; Spark retries it. The
    commit must move only the successful attempt's rows: exactly N messages, each once."""
    client.create_queue("orders")
    n = 3000
    df = spark.range(n).selectExpr("id AS order_id").repartition(3)
    (
        df.write.format("lonnymq_flaky")
        .options(**opts(dsn, schema, "orders", failPartition=1))
        .mode("append")
        .save()
    )
    ids = Counter(m.payload["order_id"] for m in all_messages(client, "orders"))
    assert len(ids) == n and set(ids.values()) == {1}
    assert staged_rows(conn, schema) == 0  # the failed attempt's staging is gone too


@pytest.mark.slow
def test_batch_write_failed_job_enqueues_nothing_and_cleans_up(
    spark: Any, dsn: str, schema: str, client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("orders")
    df = spark.range(3000).selectExpr("id AS order_id").repartition(3)
    with pytest.raises(Exception, match="injected task failure"):
        (
            df.write.format("lonnymq_flaky")
            .options(**opts(dsn, schema, "orders", failPartition=1, failAttempts=99))
            .mode("append")
            .save()
        )
    assert client.metrics("orders").ready == 0
    # abort is best effort: a task the failed job cancelled may still commit its staging after
    # the abort (and after a first sweep); the sweeper gets whatever is left, however late.
    from lonnymq.spark import sweep

    deadline = time.monotonic() + 60
    while True:
        sweep(dsn, schema=schema, stage_ttl=0)
        left = staged_rows(conn, schema)
        if left == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == 0
    assert client.metrics("orders").ready == 0


def test_batch_write_with_write_id_is_idempotent_across_jobs(
    spark: Any, dsn: str, schema: str, client: Client
) -> None:
    client.create_queue("orders")
    df = spark.range(500).selectExpr("id AS order_id").repartition(2)
    for _ in range(2):  # e.g. a rerun after the driver died just after committing
        df.write.format("lonnymq").options(**opts(dsn, schema, "orders", writeId="orders-2024-06-01")).mode(
            "append"
        ).save()
    assert client.metrics("orders").ready == 500


# -- batch read -------------------------------------------------------------------------------


def test_batch_read_queue_archive_and_dead_letters(spark: Any, dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", archive=True, max_attempts=1)
    client.send_batch(
        "jobs",
        [
            Envelope({"n": i}, kind="job", channel=f"c{i % 3}", priority=i % 5, headers={"i": str(i), "n": i})
            for i in range(40)
        ],
    )
    client.ack(client.take("jobs", 10))  # 10 acked -> archive
    client.nack(client.take("jobs", 5), error="boom")  # 5 dead (max_attempts 1)
    client.send("jobs", b"\x00\xffraw")
    client.send("jobs", "plain text", delay=3600)

    def load(table: str, **more: Any) -> Any:
        return (
            spark.read.format("lonnymq")
            .options(**opts(dsn, schema, "jobs", table=table, numPartitions=3, **more))
            .load()
        )

    live = load("messages")
    assert live.rdd.getNumPartitions() == 3
    rows = live.collect()
    assert len(rows) == 27
    assert Counter(r.status for r in rows) == {"ready": 26, "scheduled": 1}
    by_id = {r.id: r for r in rows}
    assert sorted(by_id) == sorted(m.id for m in all_messages(client, "jobs"))
    text = next(r for r in rows if r.content_type and r.content_type.startswith("text/"))
    assert text.payload == "plain text" and text.status == "scheduled"
    some = next(r for r in rows if r.kind == "job")
    assert 0 <= json.loads(some.payload)["n"] < 40 and some.channel == f"c{json.loads(some.payload)['n'] % 3}"
    assert isinstance(some.enqueued_at, datetime)
    n = json.loads(some.payload)["n"]
    assert some.headers == {"i": str(n), "n": str(n)}  # map<string,string>: other JSON values as text

    raw = load("messages", payloadType="binary").where("content_type IS NULL").collect()
    assert [bytes(r.payload) for r in raw] == [b"\x00\xffraw"]

    archive = load("archive").collect()
    assert Counter(r.status for r in archive) == {"acked": 10, "dead": 5}
    dead = load("dead").collect()
    assert len(dead) == 5 and {r.last_error for r in dead} == {"boom"}
    assert all(r.archived_at is not None for r in dead)

    # A column subset in another order, via a user schema.
    (hdr,) = (
        spark.read.format("lonnymq")
        .schema("headers string, id long")  # headers as JSON text, as before they were a map
        .options(**opts(dsn, schema, "jobs", table="dead"))
        .load()
        .limit(1)
        .collect()
    )
    assert json.loads(hdr.headers)["i"] == str(json.loads(hdr.headers)["n"])
    ids = (
        spark.read.format("lonnymq")
        .schema("id long, queue string")
        .options(**opts(dsn, schema, "jobs", table="dead"))
        .load()
        .collect()
    )
    assert sorted(r.id for r in ids) == sorted(r.id for r in dead) and {r.queue for r in ids} == {"jobs"}


# -- streaming read ---------------------------------------------------------------------------


class BatchLog:
    """A foreachBatch sink that records (batch_id, message id) in a PostgreSQL table and can
    crash once, after writing, in a chosen batch."""

    def __init__(self, dsn: str, schema: str, crash_in_batch: int | None = None) -> None:
        self.dsn, self.crash_in_batch = dsn, crash_in_batch
        self.table = sql.Identifier(schema, "spark_test_sink")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (run int, batch_id bigint, id bigint, payload text)"
                ).format(self.table)
            )
        self.run = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("id", "payload").collect()
        with psycopg.connect(self.dsn, autocommit=True) as c, c.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(self.table),
                [(self.run, batch_id, r.id, r.payload) for r in rows],
            )
        if self.crash_in_batch == batch_id:
            self.crash_in_batch = None
            raise RuntimeError(f"injected crash in batch {batch_id}, after its rows were written")

    def rows(self) -> list[tuple[int, int, int]]:
        with psycopg.connect(self.dsn) as c:
            return c.execute(
                sql.SQL("SELECT run, batch_id, id FROM {} ORDER BY run, batch_id, id").format(self.table)
            ).fetchall()


#: The streaming tests and the documentation's examples: a second JVM on another test process
#: (the module's other tests take as long again).
STREAMING = pytest.mark.xdist_group("test_spark_streaming")


def run_stream(spark: Any, options: dict[str, str], sink: BatchLog, checkpoint: Path) -> Any:
    q = (
        spark.readStream.format("lonnymq")
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination()
    finally:
        sink.run += 1
    return q


@STREAMING
def test_stream_read_admission_control_available_now_and_archive(
    spark: Any, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("events")
    sent = client.send_batch("events", [{"i": i} for i in range(25)])
    sink = BatchLog(dsn, schema)
    q = run_stream(
        spark, opts(dsn, schema, "events", maxRowsPerBatch=10, ack="archive"), sink, tmp_path / "ckpt"
    )
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 10, 5]
    got = Counter(i for _, _, i in sink.rows())
    assert set(got) == {r.id for r in sent} and set(got.values()) == {1}
    # Every batch was acked (archived), the last one when availableNow finished.
    m = client.metrics("events")
    assert (m.ready, m.scheduled, m.leased) == (0, 0, 0)
    archived = spark.read.format("lonnymq").options(**opts(dsn, schema, "events", table="archive")).load()
    assert archived.where("status = 'acked'").count() == 25
    # Nothing new: a second run reads nothing and leaves no state behind.
    q = run_stream(spark, opts(dsn, schema, "events", maxRowsPerBatch=10), sink, tmp_path / "ckpt")
    assert sum(p["numInputRows"] for p in q.recentProgress) == 0


@STREAMING
@pytest.mark.slow
def test_stream_read_crash_and_restart_loses_and_skips_nothing(
    spark: Any, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("events")
    sent = {r.id for r in client.send_batch("events", [{"i": i} for i in range(40)])}
    sink = BatchLog(dsn, schema, crash_in_batch=1)
    options = opts(dsn, schema, "events", maxRowsPerBatch=10)
    with pytest.raises(Exception, match="injected crash in batch 1"):
        run_stream(spark, options, sink, tmp_path / "ckpt")
    first = sink.rows()
    crashed_batch = {i for run, b, i in first if b == 1}
    assert len(crashed_batch) == 10
    # More messages arrive while the query is down; the restart replays batch 1 and goes on.
    sent |= {r.id for r in client.send_batch("events", [{"i": i} for i in range(40, 55)])}
    run_stream(spark, options, sink, tmp_path / "ckpt")
    rows = sink.rows()
    seen = Counter(i for _, _, i in rows)
    assert set(seen) == sent  # none lost, none skipped
    duplicated = {i for i, n in seen.items() if n > 1}
    assert duplicated == crashed_batch  # only the replayed batch
    replayed = {i for run, b, i in rows if run == 1 and b == 1}
    assert replayed == crashed_batch  # replay = same messages
    m = client.metrics("events")
    assert (m.ready, m.leased) == (0, 0)


@STREAMING
def test_stream_read_does_not_skip_a_late_committing_transaction(
    spark: Any, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    """Message ids are assigned at insert but transactions commit out of order: while a slow
    sender's transaction is open, messages with higher ids commit and are consumed. An offset
    of max(id) would now skip the slow message forever; the stream must still deliver it."""
    client.create_queue("events")
    early = {r.id for r in client.send_batch("events", list(range(5)))}
    sink = BatchLog(dsn, schema)
    options = opts(dsn, schema, "events")
    with psycopg.connect(dsn) as slow:  # a transaction held open
        late = client.send("events", "late", conn=slow)
        later = {r.id for r in client.send_batch("events", list(range(5, 10)))}
        run_stream(spark, options, sink, tmp_path / "ckpt")
        assert {i for _, _, i in sink.rows()} == early | later
        assert late.id is not None and late.id < max(later)  # max(id) is past the late one
        slow.commit()
    run_stream(spark, options, sink, tmp_path / "ckpt")
    rows = sink.rows()
    assert [i for run, _, i in rows if run == 1] == [late.id]
    assert Counter(i for _, _, i in rows) == Counter(early | later | {late.id})


# -- streaming write --------------------------------------------------------------------------


@STREAMING
@pytest.mark.slow
def test_stream_write_restart_after_commit_writes_each_batch_once(
    spark: Any, dsn: str, schema: str, client: Client, tmp_path: Path, conn: psycopg.Connection[Any]
) -> None:
    """Queue to queue: batch 0 has a task that fails after staging (retried), and the driver
    dies right after batch 1's database commit, before Spark records it. The restart replays
    batch 1 from the source; the sink must recognise it: every message arrives exactly once."""
    client.create_queue("in")
    client.create_queue("out")
    client.send_batch("in", [{"i": i} for i in range(30)])
    flag = tmp_path / "crash.flag"
    flag.touch()
    options = opts(
        dsn,
        schema,
        "out",
        payloadFormat="json",
        failPartition=0,
        failBatch=0,
        crashAfterCommit=1,
        crashFlag=flag,
    )

    def run() -> None:
        q = (
            spark.readStream.format("lonnymq")
            .options(**opts(dsn, schema, "in", maxRowsPerBatch=10))
            .load()
            .selectExpr("payload", "channel", "priority")
            .writeStream.format("lonnymq_flaky")
            .options(**options)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    with pytest.raises(Exception, match="injected crash after committing batch 1"):
        run()
    assert not flag.exists()
    assert client.metrics("out").ready == 20
    client.send_batch("in", [{"i": i} for i in range(30, 35)])
    run()
    got = Counter(m.payload["i"] for m in all_messages(client, "out"))
    assert set(got) == set(range(35)) and set(got.values()) == {1}
    assert client.metrics("in").ready == 0
    assert staged_rows(conn, schema) == 0
    commits = conn.execute(
        sql.SQL("SELECT batch_id, messages FROM {}.spark_sink_commit ORDER BY 1").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    assert commits == [(0, 10), (1, 10), (2, 10), (3, 5)]


@STREAMING
def test_stream_write_sink_id_and_timestamps(
    spark: Any, dsn: str, schema: str, client: Client, tmp_path: Path
) -> None:
    """A rate-source stream into a queue with an explicit sinkId; `at` schedules delivery."""
    client.create_queue("ticks")
    start = datetime.now(UTC)
    q = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .selectExpr("value AS n", "timestamp + INTERVAL 1 HOUR AS at")
        .writeStream.format("lonnymq")
        .options(**opts(dsn, schema, "ticks", sinkId="ticks-v1"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        # Until 20 are in: a streaming query starting on a loaded CI machine may take minutes.
        deadline = datetime.now(UTC) + timedelta(seconds=300)
        while client.metrics("ticks").scheduled < 20 and datetime.now(UTC) < deadline:
            q.awaitTermination(1)
    finally:
        q.stop()
    msgs = all_messages(client, "ticks")
    ns = [m.payload["n"] for m in msgs]
    assert len(ns) >= 20 and len(ns) == len(set(ns))
    assert all(m.scheduled_at - start.timestamp() * 1000 > 3_000_000 for m in msgs)


# -- the documentation --------------------------------------------------------------------------


@STREAMING
def test_docs_spark_examples_run(
    spark: Any, dsn: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/spark.md's python blocks, in order, in one namespace, against a fresh database."""
    import re
    import uuid

    from psycopg.conninfo import make_conninfo

    page = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
    blocks = re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 5
    name = f"docs_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    monkeypatch.setenv("LONNYMQ_DSN", make_conninfo(dsn, dbname=name))
    namespace: dict[str, Any] = {"__name__": "docs_spark"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/spark.md[python block {i + 1}]", "exec"), namespace)
    finally:
        if "mq" in namespace:
            namespace["mq"].close()
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


# -- issue 15: pushdown, typed payloads, write ids, registration and secrets ----------------------


def test_filters_are_pushed_down_and_the_rest_stay_in_spark(
    spark: Any, dsn: str, schema: str, client: Client
) -> None:
    client.create_queue("jobs")
    sent = client.send_batch(
        "jobs", [Envelope({"n": i}, key=f"k{i:03d}", channel=f"c{i % 3}", priority=i % 5) for i in range(300)]
    )
    ids = [r.id for r in sent]
    df = spark.read.format("lonnymq").options(**opts(dsn, schema, "jobs")).load()
    q = df.where(
        (df.id >= ids[10])
        & (df.id < ids[200])
        & df.key.startswith("k1")
        & (df.channel == "c1")
        & (df.priority > 2)
    )
    got = sorted(r.key for r in q.collect())
    assert got == [f"k{i:03d}" for i in range(100, 200) if i % 3 == 1 and i % 5 > 2]
    # Only the priority comparison (no index) is left for Spark; id, key prefix and channel went down.
    left = q._jdf.queryExecution().optimizedPlan().toString().splitlines()[0]
    assert "> 2)" in left and "priority" in left
    assert "= c1" not in left and "StartsWith" not in left and ">=" not in left
    since = datetime.now(UTC) - timedelta(minutes=10)
    assert df.where(df.enqueued_at > since).where("status = 'ready'").count() == 300
    assert df.where(df.enqueued_at < since).count() == 0
    off = spark.read.format("lonnymq").options(**opts(dsn, schema, "jobs", pushFilters="false")).load()
    assert off.where(off.key == "k007").count() == 1


def test_typed_payloads_round_trip_and_bad_rows(spark: Any, dsn: str, schema: str, client: Client) -> None:
    from decimal import Decimal

    client.create_queue("typed")
    at = datetime(2030, 5, 17, 8, 30, 0, 123000, tzinfo=UTC)
    df = spark.sql(
        "SELECT named_struct('order_id', 7L, 'amount', CAST('12345678901234.56' AS DECIMAL(16,2)),"
        " 'at', TIMESTAMP'2030-05-17 08:30:00.123Z', 'tags', array('a', 'b'), 'attrs', map('x', 1)) AS payload,"
        " map('trace', 't-1') AS headers"
    )
    df.write.format("lonnymq").options(**opts(dsn, schema, "typed")).mode("append").save()
    client.send("typed", {"order_id": "not a number", "amount": "1.00"})  # a bad row
    ddl = "order_id long, amount decimal(16,2), at timestamp, tags array<string>, attrs map<string,int>"
    read = spark.read.format("lonnymq").options(**opts(dsn, schema, "typed", payloadSchema=ddl)).load()
    rows = sorted(read.select("id", "payload", "headers", "_corrupt").collect(), key=lambda r: r.id)
    good, bad = rows
    assert good.payload.amount == Decimal("12345678901234.56")  # exact, not a float
    assert good.payload.at.replace(tzinfo=UTC) == at and good.payload.order_id == 7
    assert good.payload.tags == ["a", "b"] and good.payload.attrs == {"x": 1}
    assert good.headers == {"trace": "t-1"} and good._corrupt is None
    assert bad.payload is None and json.loads(bad._corrupt)["order_id"] == "not a number"
    # StructType JSON works the same; FAILFAST names the message.
    as_json = spark.createDataFrame([], ddl).schema.json()
    strict = (
        spark.read.format("lonnymq")
        .options(**opts(dsn, schema, "typed", payloadSchema=as_json, mode="FAILFAST"))
        .load()
    )
    with pytest.raises(
        Exception, match=rf"message {bad.id} of queue 'typed' does not match payloadSchema at \$\.order_id"
    ):
        strict.collect()
    # A stream decodes the same way.
    seen: list[Any] = []
    q = (
        spark.readStream.format("lonnymq")
        .options(**opts(dsn, schema, "typed", payloadSchema=ddl))
        .load()
        .writeStream.foreachBatch(lambda b, _: seen.extend(b.select("payload.amount", "_corrupt").collect()))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    assert sorted((r.amount, r._corrupt is None) for r in seen if r.amount is not None) == [
        (Decimal("12345678901234.56"), True)
    ]
    assert len(seen) == 2


def test_write_ids_are_per_queue_and_a_skipped_rerun_says_so(
    spark: Any, dsn: str, schema: str, client: Client
) -> None:
    from lonnymq.spark import write_status

    client.create_queue("a")
    client.create_queue("b")
    df = spark.range(10).selectExpr("id AS n")
    for queue in ("a", "b", "a"):  # the same id on another queue is another write; the rerun on a is skipped
        df.write.format("lonnymq").options(**opts(dsn, schema, queue, writeId="w1")).mode("append").save()
    assert client.metrics("a").ready == 10 and client.metrics("b").ready == 10
    st = write_status(dsn, "a", "w1", schema=schema)
    assert st is not None and (st.messages, st.skipped) == (10, 1) and st.last_skipped_at is not None
    assert st.expires_at - st.committed_at == 7 * 86_400_000
    short = opts(dsn, schema, "b", writeId="w2", writeIdRetention=60)
    df.write.format("lonnymq").options(**short).mode("append").save()
    st = write_status(dsn, "b", "w2", schema=schema)
    assert st is not None and st.expires_at - st.committed_at == 60_000
    assert write_status(dsn, "b", "never", schema=schema) is None


def test_commit_logs_a_skipped_rerun(
    dsn: str, schema: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver-side commit (run in the driver's Python worker) logs the skip; here called
    directly so the log line can be captured."""
    from lonnymq.spark._conf import Target
    from lonnymq.spark._write import commit

    client.create_queue("q")
    target = Target.from_options(opts(make_password_dsn(dsn), schema, "q"))
    first = commit(target, str(__import__("uuid").uuid4()), [], "ignore", "write:nightly", 0)
    assert not first.duplicate
    with caplog.at_level("WARNING", logger="lonnymq.spark"):
        again = commit(target, str(__import__("uuid").uuid4()), [], "ignore", "write:nightly", 0)
    assert again.duplicate and again.committed_at == first.committed_at
    [record] = caplog.records
    assert "write id 'nightly' was already committed to queue 'q'" in record.getMessage()
    assert "skipped, nothing enqueued" in record.getMessage() and PASSWORD not in record.getMessage()


PASSWORD = "s3cr3t-Pa55"


def make_password_dsn(dsn: str, **more: Any) -> str:
    """The test DSN with a password (ignored by trust authentication, shown nowhere)."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, password=PASSWORD, **more)


def test_the_dsn_stays_secret_and_can_come_from_conf_or_env(
    spark: Any, dsn: str, schema: str, client: Client
) -> None:
    import lonnymq.spark
    from lonnymq.spark.source import LonnyMQDataSource
    from spark_fixtures import DSN_ENV

    client.create_queue("q")
    client.send("q", "hello")
    secret = make_password_dsn(dsn)
    df = spark.read.format("lonnymq").options(**opts(secret, schema, "q")).load().where("key IS NULL")
    assert df.count() == 1
    for mode in ("simple", "extended", "codegen", "cost", "formatted"):
        assert PASSWORD not in df._jdf.queryExecution().explainString(
            spark._jvm.org.apache.spark.sql.execution.ExplainMode.fromString(mode)
        )
    assert PASSWORD not in repr(LonnyMQDataSource({"dsn": secret, "queue": "q"}))
    # A server that cannot be reached: the error names it, without the password.
    bad = make_password_dsn(dsn, host="127.0.0.1", port=1)
    with pytest.raises(Exception, match="cannot connect to") as e:
        spark.read.format("lonnymq").options(**opts(bad, schema, "q")).load().collect()
    assert PASSWORD not in str(e.value)
    with pytest.raises(Exception, match="cannot connect to") as e2:
        spark.createDataFrame([("x",)], "payload string").write.format("lonnymq").options(
            **opts(bad, schema, "q")
        ).mode("append").save()
    assert PASSWORD not in str(e2.value)

    # dsnEnv: the name of an environment variable of the driver.
    env = {"schema": schema, "queue": "q", "dsnEnv": DSN_ENV}
    assert spark.read.format("lonnymq").options(**env).load().count() == 1
    # The Spark conf, captured by register(); the password in a conf of its own.
    spark.conf.set("spark.lonnymq.dsn", dsn)
    spark.conf.set("spark.lonnymq.password", PASSWORD)
    try:
        lonnymq.spark.register(spark)
        assert spark.read.format("lonnymq").options(schema=schema, queue="q").load().count() == 1
    finally:
        spark.conf.unset("spark.lonnymq.dsn")
        spark.conf.unset("spark.lonnymq.password")
        lonnymq.spark.register(spark)
    with pytest.raises(Exception, match="give the server"):
        spark.read.format("lonnymq").options(schema=schema, queue="q").load().collect()


def test_importing_lonnymq_spark_registers_with_the_active_session(spark: Any) -> None:
    """``import lonnymq.spark`` registers (re-run here with reload: the module is imported
    already); registering turns Python filter pushdown on, which Spark 4 leaves off."""
    import importlib

    import lonnymq.spark

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    importlib.reload(lonnymq.spark)
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
