"""Reading queues into Spark: batch reads of the live messages, the archive and dead letters,
and the streaming source that consumes a queue."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .. import errors
from ._conf import Target, choice_option, float_option, int_option

#: Columns of every read, in the order the SQL read functions return them.
COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("queue", StringType()),
    ("id", LongType()),
    ("status", StringType()),
    ("payload", StringType()),
    ("content_type", StringType()),
    ("kind", StringType()),
    ("key", StringType()),
    ("channel", StringType()),
    ("headers", StringType()),
    ("priority", IntegerType()),
    ("attempts", IntegerType()),
    ("deliveries", IntegerType()),
    ("enqueued_at", TimestampType()),
    ("scheduled_at", TimestampType()),
    ("dequeue_at", TimestampType()),
    ("archived_at", TimestampType()),
    ("last_error", StringType()),
    ("state", StringType()),
)
_INDEX = {name: i for i, (name, _) in enumerate(COLUMNS)}
_FETCH = 10_000


def read_schema(options: Mapping[str, str]) -> StructType:
    """The default schema; ``payloadType=binary`` keeps payloads as raw bytes."""
    binary = choice_option(options, "payloadType", ("string", "binary"), "string") == "binary"
    return StructType(
        [
            StructField(name, BinaryType() if name == "payload" and binary else dtype, True)
            for name, dtype in COLUMNS
        ]
    )


def _decode(body: bytes | None) -> str | None:
    return None if body is None else body.decode("utf-8", "replace")


def _ms_to_us(values: Sequence[int | None]) -> list[int | None]:
    return [None if v is None else v * 1000 for v in values]


class _Arrow:
    """Turns rows of the SQL read functions into Arrow batches of the requested schema (any
    subset and order of :data:`COLUMNS`; types are cast, e.g. payload to BINARY)."""

    def __init__(self, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.picks = []
        for f in schema.fields:
            if f.name not in _INDEX:
                raise errors.InvalidArgument(
                    f"lonnymq cannot read a column {f.name!r}; columns are {', '.join(_INDEX)}"
                )
            self.picks.append(_INDEX[f.name])

    def batch(self, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
        columns = list(zip(*rows, strict=True))
        arrays = []
        for field, i in zip(self.arrow_schema, self.picks, strict=True):
            name, dtype = COLUMNS[i]
            values = columns[i]
            if name == "payload":
                if pa.types.is_binary(field.type):
                    arr = pa.array(values, pa.binary())
                else:
                    arr = pa.array([_decode(v) for v in values], pa.string())
            elif isinstance(dtype, TimestampType):
                arr = pa.array(_ms_to_us(values), pa.timestamp("us", tz="UTC"))
            elif isinstance(dtype, LongType):
                arr = pa.array(values, pa.int64())
            elif isinstance(dtype, IntegerType):
                arr = pa.array(values, pa.int32())
            else:
                arr = pa.array(values, pa.string())
            arrays.append(arr if arr.type == field.type else arr.cast(field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


def _fetch(
    target: Target, function: str, args: LiteralString, params: tuple[Any, ...], arrow: _Arrow
) -> Iterator[pa.RecordBatch]:
    """Stream a read function's rows through a server-side cursor, as Arrow batches."""
    query = target.query(function, args)
    with target.connect() as conn, conn.cursor(name="lonnymq_spark_read", binary=True) as cur:
        cur.itersize = _FETCH
        cur.execute(query, params)
        while rows := cur.fetchmany(_FETCH):
            yield arrow.batch(rows)


# -- batch reads ------------------------------------------------------------------------------


@dataclass
class IdRange(InputPartition):
    """Messages with lo <= id < hi."""

    lo: int
    hi: int


class BatchReader(DataSourceReader):
    """``spark.read.format("lonnymq")``: a queue's live messages (``table=messages``, without
    leasing them), its archive (``archive``) or its dead letters (``dead``), split into
    ``numPartitions`` id ranges read in parallel. Each partition reads its own snapshot; rows
    added after planning with ids above the planned range are not read."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.target = Target.from_options(options)
        self.table = choice_option(options, "table", ("messages", "archive", "dead"), "messages")
        self.num_partitions = int_option(options, "numPartitions", 4, high=10_000) or 4
        self.schema = schema

    def partitions(self) -> list[IdRange]:
        with self.target.connect(autocommit=True) as conn:
            [(lo, hi)] = self.target.call(
                conn, "spark_id_range", "%s::text, %s::text", (self.target.queue, self.table)
            )
        if lo is None:
            return [IdRange(0, 0)]
        hi += 1
        n = max(1, min(self.num_partitions, hi - lo))
        step = -(-(hi - lo) // n)
        return [IdRange(a, min(a + step, hi)) for a in range(lo, hi, step)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRange)
        if partition.lo >= partition.hi:
            return
        arrow = _Arrow(self.schema)
        t = self.target
        if self.table == "messages":
            yield from _fetch(
                t,
                "spark_read_messages",
                "%s::text, %s::bigint, %s::bigint",
                (t.queue, partition.lo, partition.hi),
                arrow,
            )
        else:
            status = "dead" if self.table == "dead" else None
            yield from _fetch(
                t,
                "spark_read_archive",
                "%s::text, %s::bigint, %s::bigint, %s::text",
                (t.queue, partition.lo, partition.hi, status),
                arrow,
            )


# -- streaming read ---------------------------------------------------------------------------


@dataclass
class StreamChunks(InputPartition):
    """Some chunks (batch_id, chunk) of a stream's delivery log."""

    stream: str
    chunks: list[tuple[int, int]]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("lonnymq")``: consumes a queue, at least once.

    Planning micro-batch N+1 leases up to ``maxRowsPerBatch`` ready messages with the core
    ``take`` (so delivery order, schedules, priorities and competing consumers work as for any
    consumer) and logs their (id, token) in the database under the stream's id, which lives in
    the offset: ``{"stream": <uuid>, "batch": N}``. Reading a batch reads exactly the logged
    deliveries, so a replay after a failure returns the same messages; ``commit`` acks them
    (delete, or archive with ``ack=archive``). Because offsets count batches, not message ids,
    a message whose sending transaction commits late is simply taken by a later batch.
    Leases (``lease`` seconds, default 600) are renewed while the query runs; if a query is
    stopped for longer, its uncommitted messages return to the queue.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.target = Target.from_options(options)
        self.max_rows = int_option(options, "maxRowsPerBatch", None, high=1_000_000)
        self.num_partitions = int_option(options, "numPartitions", 2, high=10_000) or 2
        self.lease_ms = round(float_option(options, "lease", 600.0) * 1000)
        ack = choice_option(options, "ack", ("queue", "delete", "archive"), "queue")
        self.archive: bool | None = None if ack == "queue" else ack == "archive"
        self.schema = schema
        self._initial: dict[str, Any] | None = None
        self._ready_at: int | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conn"] = None
        return state

    # The driver-side reader lives as long as the query: keep one connection, and reconnect
    # once if it broke (every call below is idempotent).
    def _call(self, function: str, args: LiteralString, params: tuple[Any, ...]) -> list[Any]:
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.target.dsn, autocommit=True, application_name="lonnymq-spark"
                )
            try:
                return self.target.call(self._conn, function, args, params)
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks more than once for a new query; the stream id must not change.
        if self._initial is None:
            self._initial = {"stream": str(uuid.uuid4()), "batch": 0}
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        [(now,)] = self._call("now_ms", "", ())
        self._ready_at = now

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        stream, after = start["stream"], int(start["batch"])
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # One chunk per task of a full batch (a chunk is read by one task), at most 10,000.
        chunk = 10_000 if max_rows is None else max(1, min(10_000, -(-max_rows // self.num_partitions)))
        [(batch, _n)] = self._call(
            "spark_stream_next",
            "%s::uuid, %s::text, %s::bigint, %s::int, %s::int, %s::bigint, %s::bigint",
            (stream, self.target.queue, after, max_rows, chunk, self.lease_ms, self._ready_at),
        )
        if batch == after and self._ready_at is not None and after > 0:
            # trigger(availableNow=True) stops here, and Spark commits a source's batch only
            # when it plans the next one, so the last batch would stay leased until the next
            # run. Spark runs one batch at a time and calls latestOffset(start) only once the
            # batch ending at `start` is in its commit log: ack it now, as commit(start) would.
            self.commit(start)
        return {"stream": stream, "batch": int(batch)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamChunks]:
        stream = end["stream"]
        rows = self._call(
            "spark_stream_chunks",
            "%s::uuid, %s::bigint, %s::bigint",
            (stream, int(start["batch"]), int(end["batch"])),
        )
        if not rows:
            return [StreamChunks(stream, [])]
        groups: list[list[tuple[int, int]]] = [[] for _ in range(min(self.num_partitions, len(rows)))]
        sizes = [0] * len(groups)
        for batch, chunk, n in rows:  # largest-first would balance better; chunks are equal-sized
            i = sizes.index(min(sizes))
            groups[i].append((int(batch), int(chunk)))
            sizes[i] += n
        return [StreamChunks(stream, g) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamChunks)
        arrow = _Arrow(self.schema)
        for batch, chunk in partition.chunks:
            yield from _fetch(
                self.target,
                "spark_stream_read",
                "%s::uuid, %s::bigint, %s::int",
                (partition.stream, batch, chunk),
                arrow,
            )

    def commit(self, end: dict[str, Any]) -> None:
        self._call(
            "spark_stream_commit",
            "%s::uuid, %s::bigint, %s::bool",
            (end["stream"], int(end["batch"]), self.archive),
        )

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
