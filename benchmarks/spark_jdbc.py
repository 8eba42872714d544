"""Spark throughput: LonnyMQ's data source next to Spark's own JDBC connector, in one run.

    python benchmarks/spark_jdbc.py --dsn postgresql://root@127.0.0.1:5432/postgres [-n 200000]
        [--reps 3] [--master local[2]] [--jar /usr/share/java/postgresql.jar] [--quick] [--profile]
        [--only write,read,stream]

The same DataFrame (n rows, a ``payload`` column of ~200 bytes of JSON, generated and cached
before anything is timed) goes, on the same server and Spark session:

* **batch write**: into a queue with ``df.write.format("lonnymq")`` (exactly once: staging COPY
  in the tasks, one publishing commit), and into a bare table ``(id bigint identity primary
  key, payload text)`` with ``df.write.jdbc`` (``batchsize`` 10,000, ``reWriteBatchedInserts``);
  the queue once as text (what JDBC stores) and once with ``payloadFormat=json`` (validated);
  next to them the write's floor, the exactly-once design with nothing else (``floor_sink``:
  tasks COPY ``(part, seq, payload)`` into a bare unlogged staging table, the commit moves
  the reported parts into a copy of the message table, indexes included, with one bare
  ``INSERT ... SELECT`` per part in one transaction), and the same floor whose commit inserts
  through the real ``message`` table instead, as the rows of a queue of its own (``q_floor``,
  created before ours), next to the other queues' rows (``write floor into message``);
* **batch read** of ``id, payload``: ``spark.read.format("lonnymq")`` with its default
  partitions, and ``spark.read.jdbc`` partitioned on ``id`` (``numPartitions`` = the session's
  default parallelism, ``fetchsize`` 10,000), both into Spark's ``noop`` sink, and the read's
  floor for any Python data source (``read_floor_source``: our partitions, each fetched with a
  bare binary ``COPY ... TO STDOUT`` and handed to Spark as Arrow batches of as many rows and
  bytes, without decoding them);
* **streaming consumption**: ``spark.readStream.format("lonnymq")`` with ``ack=delete``,
  ``trigger(availableNow=True)`` into the ``noop`` sink: messages consumed *and acknowledged*
  per second, end to end (query start to the queue's last ack), next to our own batch read,
  and next to its floor, measured in the same repetition: the same rows read by a streaming
  source that neither leases nor acks (our batch reader's partitions in one micro-batch: Spark's
  and the Python data source's own cost of a micro-batch, plus the read), plus one bare
  lock + ``UPDATE`` (the lease) and one bare ``DELETE`` (the ack) of a copy of the rows, the
  least SQL a stream that leases and acks must run. Their seconds add up to the floor.

``--only`` times some of the three phases (the rows the reads and the stream need are then
written untimed). Repetitions interleave the sides (ABBA), with VACUUM ANALYZE and CHECKPOINT before every
timed phase (a server with autovacuum off would otherwise penalise whoever runs later). Medians
and the ratios are printed; ``--out FILE`` writes them as JSON too.

``--profile`` adds the pieces outside Spark, in this process (where the time goes, and the
floors): building the COPY data from Arrow, the staging COPY, the commit's publish, a bare COPY
and a bare ``INSERT ... SELECT`` of the same rows, and reading them back into Arrow.

JDBC needs a server on TCP and Debian's driver (``apt-get install libpostgresql-jdbc-java``,
``/usr/share/java/postgresql.jar``). Without --dsn a throwaway embedded server is used. Works in
a fresh schema that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from lonnymq import Client
from lonnymq.models import TEXT

JAR = "/usr/share/java/postgresql.jar"
#: The write floor whose commit inserts through the real message table (a queue of its own).
FLOOR_MESSAGE = "write floor into message"
# ~200 bytes of JSON per row, built by Spark (to_json runs in the JVM).
PAYLOAD_SQL = (
    "to_json(named_struct('order_id', id, 'customer', format_string('c-%06d', id % 50000),"
    " 'status', 'created', 'amount', round((id % 997) * 1.37, 2), 'currency', 'EUR',"
    " 'items', array(named_struct('sku', concat('SKU-', id % 313), 'qty', 1 + id % 3)),"
    " 'region', element_at(array('eu', 'us', 'apac'), CAST(id % 3 AS INT) + 1),"
    " 'created_at', '2024-06-01T12:34:56.789Z', 'source', 'checkout-service'))"
)


def payload(i: int) -> str:
    """The payload of row ``i`` as Spark builds it (for --profile, which runs without Spark)."""
    return json.dumps(
        {
            "order_id": i,
            "customer": f"c-{i % 50000:06d}",
            "status": "created",
            "amount": round((i % 997) * 1.37, 2),
            "currency": "EUR",
            "items": [{"sku": f"SKU-{i % 313}", "qty": 1 + i % 3}],
            "region": ("eu", "us", "apac")[i % 3],
            "created_at": "2024-06-01T12:34:56.789Z",
            "source": "checkout-service",
        },
        separators=(",", ":"),
    )


class Bench:
    def __init__(self, dsn: str, schema: str, args: argparse.Namespace) -> None:
        self.dsn, self.schema, self.args, self.n = dsn, schema, args, args.n
        self.s = sql.Identifier(schema)
        self.results: dict[str, list[float]] = {}

    def sql(self, text: str, *params: Any, autocommit: bool = True) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=autocommit) as conn:
            cur = conn.execute(sql.SQL(text).format(s=self.s), params or None)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def settle(self, *tables: str) -> None:
        """VACUUM ANALYZE (hint bits, visibility map, statistics) and a CHECKPOINT before a phase."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for t in tables:
                conn.execute(sql.SQL("VACUUM ANALYZE {s}.{t}").format(s=self.s, t=sql.Identifier(t)))
            conn.execute("CHECKPOINT")

    def record(self, name: str, seconds: float) -> float:
        self.results.setdefault(name, []).append(self.n / seconds)
        print(f"    {name:<38} {self.n / seconds:>10,.0f} rows/s  ({seconds:5.2f} s)", flush=True)
        return seconds

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        out = fn()
        self.record(name, time.perf_counter() - t)
        return out


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    d = conninfo_to_dict(dsn)
    host = str(d.get("host") or d.get("hostaddr") or "127.0.0.1")
    if host.startswith("/"):
        raise SystemExit("spark_jdbc: JDBC needs a TCP server: give --dsn with host=...")
    url = f"jdbc:postgresql://{host}:{d.get('port') or 5432}/{d.get('dbname') or 'postgres'}"
    props = {
        "user": str(d.get("user") or os.environ.get("USER", "postgres")),
        "driver": "org.postgresql.Driver",
    }
    if d.get("password"):
        props["password"] = str(d["password"])
    return url, props


def floor_source(name: str, method: str, reader: Callable[[dict[str, str], Any], Any]) -> Any:
    """A data source ``name`` of ``id long, payload string`` whose ``method`` (``reader``,
    ``streamReader``) is ``reader(options, schema)``: what the floors' sources share."""
    from pyspark.sql.datasource import DataSource

    def make(self: Any, schema: Any) -> Any:
        return reader(dict(self.options), schema)

    return type(
        "FloorSource",
        (DataSource,),
        {
            "name": classmethod(lambda cls: name),
            "schema": lambda self: "id long, payload string",
            method: make,
        },
    )


def read_floor_source() -> Any:
    """The batch read's floor in Spark: a Python data source with our reader's partitions whose
    tasks fetch the bytes of their rows from PostgreSQL the cheapest way there is (a bare binary
    ``COPY (SELECT id, payload ...) TO STDOUT`` of the partition's id range) and hand Spark
    Arrow batches of as many rows and bytes, without decoding the bytes (the batches are built
    from zeros): what any Python data source pays to move these rows, less turning them into
    Arrow arrays."""
    from pyspark.sql.datasource import DataSourceReader

    from lonnymq.spark._read import BatchReader, IdRange

    class FloorReader(DataSourceReader):
        def __init__(self, options: dict[str, str], schema: Any) -> None:
            self.batch = BatchReader(options, schema, {})
            self.dsn, self.s = options["dsn"], sql.Identifier(options["schema"])
            self.width = int(options["width"])

        def partitions(self) -> list[Any]:
            return self.batch.partitions()

        def read(self, partition: Any) -> Iterator[Any]:
            assert isinstance(partition, IdRange)
            copy = sql.SQL(
                "COPY (SELECT id, payload FROM {s}.message WHERE queue_id = (SELECT id FROM {s}.queue"
                " WHERE name = %s) AND id >= %s AND id < %s ORDER BY id) TO STDOUT (FORMAT BINARY)"
            ).format(s=self.s)
            size, step = 0, 10_000 * (18 + self.width)  # a binary COPY row: 18 bytes + the payload
            with psycopg.connect(self.dsn) as conn, conn.cursor() as cur:
                with cur.copy(copy, (self.batch.target.queue, partition.lo, partition.hi)) as cp:
                    for chunk in cp:
                        size += len(chunk)
                        while size >= step:
                            size -= step
                            yield self.arrow(10_000)
                if size > 21:  # the rest, less the COPY header and trailer
                    yield self.arrow((size - 21) // (18 + self.width))

        def arrow(self, n: int) -> Any:
            import pyarrow as pa

            offsets = pa.py_buffer(np.arange(0, (n + 1) * self.width, self.width, dtype=np.int32))
            text = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(bytes(n * self.width))])
            return pa.RecordBatch.from_arrays([pa.array(np.arange(n)), text], names=["id", "payload"])

    return floor_source("lonnymq_read_floor", "reader", FloorReader)


def no_lease_source() -> Any:
    """The stream's floor in Spark: a Python streaming source that reads the queue's rows with
    our batch reader's partitions in one micro-batch, and neither leases nor acks anything
    (Spark's and the Python data source's own cost of a micro-batch, plus the read)."""
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow

    from lonnymq.spark._read import BatchReader

    class NoLeaseReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: dict[str, str], schema: Any) -> None:
            self.batch = BatchReader(options, schema, {})

        def initialOffset(self) -> dict[str, int]:
            return {"batch": 0}

        def getDefaultReadLimit(self) -> ReadLimit:
            return ReadAllAvailable()

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
            return {"batch": 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return self.batch.partitions() if end["batch"] > start["batch"] else []

        def read(self, partition: Any) -> Iterator[Any]:
            yield from self.batch.read(partition)

        def commit(self, end: dict[str, int]) -> None:
            pass

    return floor_source("lonnymq_no_lease", "streamReader", NoLeaseReader)


def floor_sink() -> Any:
    """The write's floor in Spark: a Python data source whose tasks COPY ``(part, seq,
    payload)`` of their rows (binary COPY data built from the Arrow column, as our writer builds
    it) into a bare unlogged staging table, and whose commit moves the reported parts into a copy
    of the message table (with its indexes) with one bare ``INSERT ... SELECT`` per part, in
    one transaction: the exactly-once design without any of its checks or bookkeeping. With the
    option ``queue``, the commit inserts into the real ``message`` table instead, as that
    queue's rows (in the current generation), next to the other queues' rows."""
    import secrets

    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    from lonnymq.spark._write import COPY_SIGNATURE, COPY_TRAILER, _binary, _CopyRows

    class Part(WriterCommitMessage):
        def __init__(self, part: int) -> None:
            self.part = part

    class FloorWriter(DataSourceArrowWriter):
        def __init__(self, options: dict[str, str]) -> None:
            self.dsn, self.s = options["dsn"], sql.Identifier(options["schema"])
            self.queue = options.get("queue")

        def write(self, iterator: Iterator[Any]) -> Part:
            part, seq = secrets.randbits(62) + 1, 0
            copy = sql.SQL("COPY {s}.wfloor_stage (part, seq, payload) FROM STDIN (FORMAT BINARY)")
            with (
                psycopg.connect(self.dsn) as conn,
                conn.cursor() as cur,
                cur.copy(copy.format(s=self.s)) as cp,
            ):
                cp.write(COPY_SIGNATURE)
                for batch in iterator:
                    n = batch.num_rows
                    rows = _CopyRows(n, 3)
                    rows.fixed(">i8", part)
                    rows.fixed(">i4", np.arange(seq, seq + n, dtype=np.int64))
                    rows.var(_binary(batch.column("payload")))
                    cp.write(rows.finish())
                    seq += n
                cp.write(COPY_TRAILER)
            return Part(part)

        def commit(self, messages: list[Any]) -> None:
            insert = sql.SQL(
                "INSERT INTO {s}.{t} (queue_id, id, dequeue_at, scheduled_at, enqueued_at, gen,"
                " content_type, payload)"
                " SELECT %s, nextval('{s}.message_id_seq'), 0, 0, 0, {gen}, %s, payload FROM {s}.wfloor_stage"
                " WHERE part = %s ORDER BY seq"
            )
            with psycopg.connect(self.dsn) as conn:
                if self.queue is None:
                    qid, gen, table = 1, sql.SQL("0"), "wfloor_msg"
                else:
                    q = sql.SQL("SELECT id FROM {s}.queue WHERE name = %s").format(s=self.s)
                    [(qid,)] = conn.execute(q, (self.queue,)).fetchall()
                    gen = sql.SQL("(SELECT last_value FROM {s}.message_gen_seq)").format(s=self.s)
                    table = "message"
                query = insert.format(s=self.s, t=sql.Identifier(table), gen=gen)
                for m in messages:  # the same rows as the queue's: with their content type
                    conn.execute(query, (qid, TEXT, m.part))

    class FloorSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "lonnymq_write_floor"

        def writer(self, schema: Any, overwrite: bool) -> FloorWriter:
            return FloorWriter(dict(self.options))

    return FloorSink


def run_spark(b: Bench) -> None:
    from pyspark.sql import SparkSession

    import lonnymq.spark

    args = b.args
    only = set(args.only.split(","))
    spark = (
        SparkSession.builder.master(args.master)
        .appName("lonnymq-spark-jdbc")
        .config("spark.jars", args.jar)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lonnymq.spark.register(spark)
    spark.dataSource.register(no_lease_source())
    spark.dataSource.register(floor_sink())
    spark.dataSource.register(read_floor_source())
    parallelism = spark.sparkContext.defaultParallelism
    url, props = jdbc_url(b.dsn)
    table = f'"{b.schema}".bare'
    ours = {"dsn": b.dsn, "schema": b.schema}
    df = spark.range(b.n, numPartitions=parallelism).selectExpr(f"{PAYLOAD_SQL} AS payload").cache()
    size = df.selectExpr("avg(length(payload))").first()[0]
    print(f"  {b.n:,} rows of {size:.0f}-byte JSON, {args.master} ({parallelism} tasks), {args.reps} reps")

    def jdbc_write() -> None:
        df.write.jdbc(
            url,
            table,
            mode="append",
            properties={**props, "batchsize": "10000", "reWriteBatchedInserts": "true"},
        )

    def our_write(queue: str, **options: str) -> Callable[[], None]:
        def go() -> None:
            df.write.format("lonnymq").options(**ours, queue=queue, **options).mode("append").save()

        return go

    def floor_write() -> None:
        df.write.format("lonnymq_write_floor").options(**ours).mode("append").save()

    def floor_write_message() -> None:
        df.write.format("lonnymq_write_floor").options(**ours, queue="q_floor").mode("append").save()

    # A read returns its DataFrame: its partitions are counted after the timing (counting
    # them plans the query again, which is not part of a read).
    def jdbc_read() -> Any:
        [(lo, hi)] = b.sql("SELECT min(id), max(id) FROM {s}.bare")
        reader = spark.read.jdbc(
            url,
            table,
            column="id",
            lowerBound=lo,
            upperBound=hi + 1,
            numPartitions=parallelism,
            properties={**props, "fetchsize": "10000"},
        )
        reader.write.format("noop").mode("overwrite").save()
        return reader

    def our_read() -> Any:
        reader = (
            spark.read.format("lonnymq").options(**ours, queue="q").schema("id long, payload string").load()
        )
        reader.write.format("noop").mode("overwrite").save()
        return reader

    def floor_read() -> Any:
        reader = (
            spark.read.format("lonnymq_read_floor")
            .options(**ours, queue="q", width=str(round(size)))
            .schema("id long, payload string")
            .load()
        )
        reader.write.format("noop").mode("overwrite").save()
        return reader

    def stream(name: str, fmt: str, **options: str) -> None:
        """Time a stream of the queue into the noop sink. A query whose Python worker did not
        start within Spark's 10 s (a loaded machine) failed before it read anything, and runs
        again, at most twice; only the run that worked is timed."""
        from pyspark.errors import StreamingQueryException

        for attempt in (1, 2, 3):
            with tempfile.TemporaryDirectory() as checkpoint:
                t = time.perf_counter()
                query = (
                    spark.readStream.format(fmt)
                    .options(**ours, queue="q", **options)
                    .schema("id long, payload string")
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start()
                )
                try:
                    query.awaitTermination()
                except StreamingQueryException as e:
                    if "failed to connect back" not in str(e) or attempt == 3:
                        raise
                    print(f"    ({name}: Python worker did not start in time, again)", flush=True)
                    continue
                b.record(name, time.perf_counter() - t)
                return

    def bare_lease_and_ack() -> None:
        """The least SQL a stream that leases and acks must run, on a copy of the queue's rows:
        one bare lock + UPDATE of all of them (the lease), one bare DELETE (the ack)."""
        b.sql("TRUNCATE {s}.floor_msg")
        b.sql("INSERT INTO {s}.floor_msg SELECT * FROM {s}.message_logged WHERE queue_id = %s", qid)
        b.settle("floor_msg")
        ids = b.timed(
            "floor: bare lease (lock + UPDATE)",
            lambda: b.sql(
                "WITH c AS (SELECT id FROM {s}.floor_msg WHERE queue_id = %s AND channel IS NULL"
                " AND dequeue_at <= {s}.now_ms() ORDER BY dequeue_at, id FOR UPDATE SKIP LOCKED)"
                " UPDATE {s}.floor_msg m SET dequeue_at = {s}.now_ms() + 600000, attempts = m.attempts + 1,"
                " deliveries = m.deliveries + 1, leased = true FROM c WHERE m.queue_id = %s AND m.id = c.id"
                " RETURNING m.id",
                qid,
                qid,
            ),
        )
        b.timed(
            "floor: bare ack (DELETE)",
            lambda: b.sql(
                "DELETE FROM {s}.floor_msg WHERE queue_id = %s AND id = ANY (%s)", qid, [i for (i,) in ids]
            ),
        )

    # Warm up: the first jobs of a session start the Python workers and load the JDBC driver.
    warm = spark.range(1000).selectExpr(f"{PAYLOAD_SQL} AS payload")
    warm.write.format("lonnymq").options(**ours, queue="warmup").mode("append").save()
    warm.write.jdbc(url, f'"{b.schema}".warmup', mode="append", properties=props)
    [(qid,)] = b.sql("SELECT id FROM {s}.queue WHERE name = 'q'")
    b.sql("CREATE TABLE {s}.floor_msg (LIKE {s}.message_logged INCLUDING DEFAULTS INCLUDING INDEXES)")
    # The write's floor: a bare staging table like spark_stage's (unlogged, the (part, seq)
    # index that gives the publish its order without a sort), a copy of the message table.
    b.sql(
        "CREATE UNLOGGED TABLE {s}.wfloor_stage (part bigint NOT NULL, seq int NOT NULL, payload bytea NOT NULL)"
    )
    b.sql("CREATE INDEX ON {s}.wfloor_stage (part, seq)")
    b.sql("CREATE TABLE {s}.wfloor_msg (LIKE {s}.message_logged INCLUDING DEFAULTS INCLUDING INDEXES)")
    spark.read.format("lonnymq").options(**ours, queue="warmup").load().write.format("noop").mode(
        "overwrite"
    ).save()

    try:
        for rep in range(args.reps):
            print(f"  rep {rep + 1}", flush=True)
            b.sql("TRUNCATE {s}.bare RESTART IDENTITY")
            with Client(b.dsn, schema=b.schema, pool_size=1) as c:
                c.purge_queue("q")
                c.purge_queue("q_json")
                c.purge_queue("q_floor")
            b.sql("TRUNCATE {s}.spark_stage")
            # The floor's tables start each repetition as the queue's do: staging truncated,
            # the message table's rows deleted (purge_queue), then vacuumed by settle.
            b.sql("TRUNCATE {s}.wfloor_stage")
            b.sql("DELETE FROM {s}.wfloor_msg")
            writes: list[tuple[str, Callable[[], None], tuple[str, ...]]] = [
                ("write jdbc (bare table)", jdbc_write, ("bare",)),
                ("write lonnymq (text)", our_write("q"), ("message_logged", "spark_stage")),
                ("write floor (COPY + INSERT ... SELECT)", floor_write, ("wfloor_stage", "wfloor_msg")),
                (FLOOR_MESSAGE, floor_write_message, ("wfloor_stage", "message_logged")),
                (
                    "write lonnymq (payloadFormat=json)",
                    our_write("q_json", payloadFormat="json"),
                    ("message_logged", "spark_stage"),
                ),
            ]
            if "write" not in only:  # the reads and the stream need the rows: write them, untimed
                jdbc_write()
                our_write("q")()
            else:
                for name, fn, tables in writes if rep % 2 == 0 else writes[::-1]:
                    b.settle(*tables)
                    b.timed(name, fn)
                assert b.sql("SELECT count(*) FROM {s}.wfloor_msg") == [(b.n,)]
                assert b.sql(
                    "SELECT count(*) FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
                    " WHERE q.name = 'q_floor'"
                ) == [(b.n,)]
                with Client(b.dsn, schema=b.schema, pool_size=1) as c:
                    assert c.metrics("q_json").ready == b.n
            assert b.sql("SELECT count(*) FROM {s}.bare") == [(b.n,)]
            with Client(b.dsn, schema=b.schema, pool_size=1) as c:
                assert c.metrics("q").ready == b.n
            reads: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
                ("read jdbc (partitioned)", jdbc_read, ("bare",)),
                ("read lonnymq", our_read, ("message_logged",)),
                ("read floor (COPY bytes + Arrow)", floor_read, ("message_logged",)),
            ]
            if "read" not in only:
                reads = []
            for name, fn, tables in reads if rep % 2 == 0 else reads[::-1]:
                b.settle(*tables)
                parts = b.timed(name, fn).rdd.getNumPartitions()
                print(f"      ({parts} partitions)")
            if "stream" not in only:
                continue
            bare_lease_and_ack()
            b.settle("message_logged")
            stream("readStream, no lease nor ack", "lonnymq_no_lease")
            b.settle("message_logged")
            stream("readStream lonnymq + ack", "lonnymq", ack="delete")
            with Client(b.dsn, schema=b.schema, pool_size=1) as c:
                m = c.metrics("q")
                assert m.ready + m.leased + m.scheduled == 0, m
    finally:
        spark.stop()


# -- --profile: the pieces, outside Spark --------------------------------------------------------


def batches(n: int, size: int = 10_000) -> Iterator[Any]:
    import pyarrow as pa

    for lo in range(0, n, size):
        yield pa.RecordBatch.from_pydict(
            {"payload": pa.array([payload(i) for i in range(lo, min(n, lo + size))])}
        )


def run_profile(b: Bench) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from lonnymq.spark import _read, _write
    from lonnymq.spark._conf import Target

    print("  profile (one process, no Spark):")
    data = list(batches(b.n))
    schema = StructType([StructField("payload", StringType())])
    target = Target(b.dsn, b.schema, "p")
    with Client(b.dsn, schema=b.schema, pool_size=1) as c:
        c.create_queue("p")
    for fmt in ("text", "json"):
        encoder = _write.Encoder(_write.Plan.build(schema, {"payloadFormat": fmt}))
        b.timed(f"encode Arrow -> COPY data ({fmt})", lambda e=encoder: [e.copy_data(x, 1, 0) for x in data])
    plan = _write.Plan.build(schema, {"payloadFormat": "json"})
    b.settle("spark_stage", "message_logged")
    run = str(uuid.uuid4())
    staged = b.timed("stage: encode + COPY (json)", lambda: _write.stage(target, plan, run, iter(data)))
    b.timed(
        "commit: publish staged rows",
        lambda: _write.commit(target, run, [staged], "ignore", content_type=plan.content_type),
    )
    # Floors: the same rows into a bare table by COPY, and a bare set-wise publish.
    b.sql("CREATE TABLE {s}.floor_bare (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text)")
    b.sql("CREATE UNLOGGED TABLE {s}.floor_stage (part bigint, seq int, payload bytea)")
    b.sql("CREATE INDEX ON {s}.floor_stage (part, seq)")

    def copy_bare() -> None:
        with psycopg.connect(b.dsn) as conn, conn.cursor() as cur:
            q = sql.SQL("COPY {s}.floor_bare (payload) FROM STDIN").format(s=b.s)
            with cur.copy(q) as cp:
                for x in data:  # the payloads hold no tab, newline or backslash: text format as is
                    cp.write("\n".join(x.column(0).to_pylist()) + "\n")

    b.timed("floor: COPY text into a bare table", copy_bare)

    def stage_bare() -> None:
        with psycopg.connect(b.dsn) as conn, conn.cursor() as cur:
            q = sql.SQL("COPY {s}.floor_stage (part, seq, payload) FROM STDIN (FORMAT BINARY)").format(s=b.s)
            with cur.copy(q) as cp:
                cp.set_types(["int8", "int4", "bytea"])
                seq = 0
                for x in data:
                    for v in x.column(0).to_pylist():
                        cp.write_row((1, seq, v.encode()))
                        seq += 1

    b.timed("floor: COPY rows into a bare staging", stage_bare)
    b.settle("floor_stage")
    b.sql("CREATE TABLE {s}.floor_msg (LIKE {s}.message_logged INCLUDING DEFAULTS INCLUDING INDEXES)")
    b.timed(
        "floor: bare INSERT ... SELECT publish",
        lambda: b.sql(
            "INSERT INTO {s}.floor_msg (queue_id, id, dequeue_at, scheduled_at, enqueued_at, gen, payload)"
            " SELECT 1, nextval('{s}.message_id_seq'), 0, 0, 0, 0, payload FROM {s}.floor_stage"
            " WHERE part = 1 ORDER BY seq"
        ),
    )
    b.timed("floor: DELETE the staged rows", lambda: b.sql("DELETE FROM {s}.floor_stage WHERE part = 1"))

    # Reads: our partition reader into Arrow, and the raw bytes of a binary COPY of the rows.
    b.settle("message_logged")
    reader = _read.BatchReader(
        {"dsn": b.dsn, "schema": b.schema, "queue": "p"},
        StructType([StructField("id", LongType()), StructField("payload", StringType())]),
        {},
    )
    whole = _read.IdRange(0, 2**62)
    b.timed("read: one partition into Arrow", lambda: sum(x.num_rows for x in reader.read(whole)))

    def copy_out() -> int:
        n = 0
        with psycopg.connect(b.dsn) as conn, conn.cursor() as cur:
            q = sql.SQL("COPY (SELECT id, payload FROM {s}.message) TO STDOUT (FORMAT BINARY)").format(s=b.s)
            with cur.copy(q) as cp:
                for chunk in cp:
                    n += len(chunk)
        return n

    b.timed("floor: COPY id, payload TO STDOUT", copy_out)

    # Streaming consumption: the leases (core take, logged) and the acks (core ack) of the
    # stream's SQL, and their floor: one bare UPDATE of the same rows, one bare DELETE.
    stream = uuid.uuid4()
    b.settle("message_logged")
    b.timed(
        "stream: plan = take all (SQL)",
        lambda: b.sql("SELECT * FROM {s}.spark_stream_next(%s, 'p', 0, NULL, 10000)", stream),
    )
    b.timed(
        "stream: commit = ack all (SQL)",
        lambda: b.sql("SELECT {s}.spark_stream_commit(%s, 1, false)", stream),
    )
    b.settle("floor_msg")
    ids = b.timed(
        "floor: bare lock + UPDATE (lease)",
        lambda: b.sql(
            "WITH c AS (SELECT id FROM {s}.floor_msg WHERE queue_id = 1 AND channel IS NULL AND dequeue_at <= 1"
            " ORDER BY dequeue_at, id FOR UPDATE SKIP LOCKED)"
            " UPDATE {s}.floor_msg m SET dequeue_at = 600000, attempts = m.attempts + 1,"
            " deliveries = m.deliveries + 1, leased = true FROM c WHERE m.queue_id = 1 AND m.id = c.id"
            " RETURNING m.id"
        ),
    )
    b.timed(
        "floor: bare DELETE (ack)",
        lambda: b.sql("DELETE FROM {s}.floor_msg WHERE queue_id = 1 AND id = ANY (%s)", [i for (i,) in ids]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", help="server (TCP, for JDBC); default: a throwaway embedded one")
    ap.add_argument("-n", type=int, default=200_000, help="rows (default 200,000)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--jar", default=JAR, help=f"the PostgreSQL JDBC driver (default {JAR})")
    ap.add_argument("--quick", action="store_true", help="20,000 rows, one repetition")
    ap.add_argument("--profile", action="store_true", help="also time the pieces outside Spark")
    ap.add_argument("--no-spark", action="store_true", help="only --profile")
    ap.add_argument(
        "--only",
        default="write,read,stream",
        help="the Spark phases to time, comma-separated among write,read,stream (default: all;"
        " without write, the rows are written untimed)",
    )
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.n, args.reps = 20_000, 1
    if not args.no_spark and not Path(args.jar).exists():
        raise SystemExit(
            f"spark_jdbc: no JDBC driver at {args.jar} (apt-get install libpostgresql-jdbc-java)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    with server(args.dsn) as dsn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        b = Bench(dsn, schema, args)
        try:
            with Client(dsn, schema=schema, pool_size=1) as c:
                c.migrate()
                for q in ("q_floor", "q", "q_json", "warmup"):  # the floor's queue id is below ours
                    c.create_queue(q)
            b.sql(
                "CREATE TABLE {s}.bare (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, payload text NOT NULL)"
            )
            print(f"lonnymq Spark data source vs Spark JDBC ({dsn.split('@')[-1]}, {os.cpu_count()} cores)")
            if not args.no_spark:
                run_spark(b)
            if args.profile:
                run_profile(b)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    report(b)


def report(b: Bench) -> None:
    med = {k: statistics.median(v) for k, v in b.results.items()}
    print("\nmedians (rows/s):")
    for k, v in med.items():
        print(f"  {k:<38} {v:>10,.0f}")
    ratios = {}
    for name, ours, theirs in [
        ("batch write, text / JDBC", "write lonnymq (text)", "write jdbc (bare table)"),
        ("batch write, json / JDBC", "write lonnymq (payloadFormat=json)", "write jdbc (bare table)"),
        ("batch write, text / its floor", "write lonnymq (text)", "write floor (COPY + INSERT ... SELECT)"),
        ("write floor / JDBC", "write floor (COPY + INSERT ... SELECT)", "write jdbc (bare table)"),
        ("batch write, text / floor into message", "write lonnymq (text)", FLOOR_MESSAGE),
        ("floor into message / floor", FLOOR_MESSAGE, "write floor (COPY + INSERT ... SELECT)"),
        ("batch read / JDBC", "read lonnymq", "read jdbc (partitioned)"),
        ("batch read / its floor", "read lonnymq", "read floor (COPY bytes + Arrow)"),
        ("read floor / JDBC", "read floor (COPY bytes + Arrow)", "read jdbc (partitioned)"),
        ("readStream + ack / our batch read", "readStream lonnymq + ack", "read lonnymq"),
    ]:
        if ours in med and theirs in med:
            ratios[name] = med[ours] / med[theirs]
            print(f"  ratio {name:<34} {ratios[name]:5.2f}x")
    floor = ("readStream, no lease nor ack", "floor: bare lease (lock + UPDATE)", "floor: bare ack (DELETE)")
    if "readStream lonnymq + ack" in med and all(k in med for k in floor):
        # Seconds per row add up: the floor runs the no-lease stream, the bare lease and ack.
        ratios["readStream + ack / its floor"] = med["readStream lonnymq + ack"] * sum(
            1 / med[k] for k in floor
        )
        print(f"  ratio {'readStream + ack / its floor':<34} {ratios['readStream + ack / its floor']:5.2f}x")
        print(
            f"  (floor: {1 / sum(1 / med[k] for k in floor):,.0f} rows/s = the no-lease stream + bare lease + bare ack)"
        )
    if b.args.out:
        b.args.out.write_text(
            json.dumps({"n": b.n, "runs": b.results, "medians": med, "ratios": ratios}, indent=2)
        )


if __name__ == "__main__":
    main()
