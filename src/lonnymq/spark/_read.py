"""Reading queues into Spark: batch reads of the live messages, the archive and dead letters,
and the streaming source that consumes a queue."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from psycopg import sql
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
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
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from .. import errors
from ._conf import Target, choice_option, float_option, int_option
from ._payload import CORRUPT, PayloadDecoder, payload_ddl, to_ms_bounds

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
    ("headers", MapType(StringType(), StringType())),
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


def read_schema(options: Mapping[str, str]) -> str:
    """The default schema, as DDL (Spark parses it; the planner's Python has no JVM):
    ``payloadType=binary`` keeps payloads as raw bytes, ``payloadSchema`` decodes JSON payloads
    into a struct (plus ``_corrupt`` for rows that do not match, in ``mode`` PERMISSIVE)."""
    binary = choice_option(options, "payloadType", ("string", "binary"), "string") == "binary"
    typed = payload_ddl(options)
    if typed is not None and binary:
        raise errors.InvalidArgument("payloadType=binary and payloadSchema exclude each other")
    cols = []
    for name, dtype in COLUMNS:
        ddl = dtype.simpleString()
        if name == "payload":
            ddl = typed or ("binary" if binary else "string")
        cols.append(f"`{name}` {ddl}")
    if (
        typed is not None
        and choice_option(options, "mode", ("permissive", "failfast"), "permissive") == "permissive"
    ):
        cols.append(f"`{CORRUPT}` string")
    return ", ".join(cols)


def _decode(body: bytes | None) -> str | None:
    return None if body is None else body.decode("utf-8", "replace")


def _ms_to_us(values: Sequence[int | None]) -> list[int | None]:
    return [None if v is None else v * 1000 for v in values]


def _headers(text: str | None) -> list[tuple[str, str]] | None:
    """A jsonb headers object as map<string,string> entries (non-string values as JSON text)."""
    if text is None:
        return None
    obj = json.loads(text)
    if not isinstance(obj, dict):
        return [("", text)]  # cannot happen through send (headers are objects); keep it visible
    return [(k, v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))) for k, v in obj.items()]


class _Arrow:
    """Turns rows of the SQL read functions into Arrow batches of the requested schema (any
    subset and order of :data:`COLUMNS`, plus ``_corrupt``; types are cast, e.g. payload to
    BINARY). A struct ``payload`` is decoded from JSON by :class:`PayloadDecoder`."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.picks: list[int] = []
        fields = {f.name: f.dataType for f in schema.fields}
        for f in schema.fields:
            if f.name == CORRUPT:
                self.picks.append(-1)
                continue
            if f.name not in _INDEX:
                raise errors.InvalidArgument(
                    f"lonnymq cannot read a column {f.name!r}; columns are {', '.join(_INDEX)}, {CORRUPT}"
                )
            self.picks.append(_INDEX[f.name])
        mode = choice_option(options, "mode", ("permissive", "failfast"), "permissive")
        payload_type = fields.get("payload")
        self.decoder: PayloadDecoder | None = None
        if payload_type is not None and not isinstance(payload_type, (StringType, BinaryType)):
            if mode == "permissive" and not isinstance(fields.get(CORRUPT), StringType):
                raise errors.InvalidArgument(
                    f"a typed payload in mode PERMISSIVE needs a `{CORRUPT} string` column for the rows"
                    " that do not match (or use mode FAILFAST)"
                )
            self.decoder = PayloadDecoder(payload_type, failfast=mode == "failfast")

    def batch(self, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
        columns = list(zip(*rows, strict=True))
        decoded: tuple[list[Any], list[str | None]] | None = None
        if self.decoder is not None:
            decoded = self.decoder.decode_all(
                columns[_INDEX["payload"]], columns[_INDEX["queue"]], columns[_INDEX["id"]]
            )
        arrays = []
        for field_, i in zip(self.arrow_schema, self.picks, strict=True):
            if i == -1:
                corrupt = decoded[1] if decoded is not None else [None] * len(rows)
                arrays.append(pa.array(corrupt, pa.string()))
                continue
            name, dtype = COLUMNS[i]
            values = columns[i]
            if name == "payload":
                if decoded is not None:
                    arr = pa.array(decoded[0], field_.type)
                elif pa.types.is_binary(field_.type):
                    arr = pa.array(values, pa.binary())
                else:
                    arr = pa.array([_decode(v) for v in values], pa.string())
            elif name == "headers" and pa.types.is_string(field_.type):
                arr = pa.array(values, pa.string())  # a schema asking for JSON text (before 0.2)
            elif name == "headers":
                arr = pa.array([_headers(v) for v in values], pa.map_(pa.string(), pa.string()))
            elif isinstance(dtype, TimestampType):
                arr = pa.array(_ms_to_us(values), pa.timestamp("us", tz="UTC"))
            elif isinstance(dtype, LongType):
                arr = pa.array(values, pa.int64())
            elif isinstance(dtype, IntegerType):
                arr = pa.array(values, pa.int32())
            else:
                arr = pa.array(values, pa.string())
            arrays.append(arr if arr.type == field_.type else arr.cast(field_.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


def _stream(target: Target, query: sql.Composed, params: Any, arrow: _Arrow) -> Iterator[pa.RecordBatch]:
    """Stream a query's rows through a server-side cursor, as Arrow batches."""
    with target.connect() as conn, conn.cursor(name="lonnymq_spark_read", binary=True) as cur:
        cur.itersize = _FETCH
        cur.execute(query, params)
        while rows := cur.fetchmany(_FETCH):
            yield arrow.batch(rows)


def _fetch(
    target: Target, function: str, args: LiteralString, params: tuple[Any, ...], arrow: _Arrow
) -> Iterator[pa.RecordBatch]:
    """Stream a read function's rows, as Arrow batches."""
    yield from _stream(target, target.query(function, args), params, arrow)


# -- batch reads ------------------------------------------------------------------------------


@dataclass
class IdRange(InputPartition):
    """Messages with lo <= id < hi."""

    lo: int
    hi: int


#: Time columns a filter may bound, per table ("messages" or "archive"), with their parameter.
_TIMES = {
    "messages": {"enqueued_at": "enqueued", "scheduled_at": "scheduled", "dequeue_at": "dequeue"},
    "archive": {"enqueued_at": "enqueued", "scheduled_at": "scheduled", "archived_at": "archived"},
}
_CMP = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
_SETS = {"key": "keys", "channel": "channels", "kind": "kinds", "status": "statuses"}


@dataclass
class Pushed:
    """The filters a batch read evaluates in PostgreSQL (see ``BatchReader.pushFilters``): an id
    range, sets of accepted values (None: any) and inclusive epoch-ms bounds per time column."""

    id_lo: int | None = None
    id_hi: int | None = None  # exclusive
    sets: dict[str, frozenset[str]] = field(default_factory=dict)
    key_prefix: str | None = None
    times: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    empty: bool = False  # contradictory filters: nothing can match

    def id_bound(self, f: Filter) -> bool:
        v = getattr(f, "value", None)
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        lo, hi = {
            EqualTo: (v, v + 1),
            GreaterThan: (v + 1, None),
            GreaterThanOrEqual: (v, None),
            LessThan: (None, v),
            LessThanOrEqual: (None, v + 1),
        }[type(f)]
        if lo is not None:
            self.id_lo = lo if self.id_lo is None else max(self.id_lo, lo)
        if hi is not None:
            self.id_hi = hi if self.id_hi is None else min(self.id_hi, hi)
        return True

    def time_bound(self, column: str, f: Filter) -> bool:
        bounds = to_ms_bounds(f)
        if bounds is None:
            return False
        lo, hi = self.times.get(column, (None, None))
        if bounds[0] is not None:
            lo = bounds[0] if lo is None else max(lo, bounds[0])
        if bounds[1] is not None:
            hi = bounds[1] if hi is None else min(hi, bounds[1])
        self.times[column] = (lo, hi)
        return True

    def restrict(self, column: str, values: Sequence[Any]) -> bool:
        if not values or not all(isinstance(v, str) for v in values):
            return False
        old = self.sets.get(column)
        self.sets[column] = frozenset(values) if old is None else old & frozenset(values)
        return True

    def prefix(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        p = self.key_prefix
        if p is None or value.startswith(p):
            self.key_prefix = value
        elif not p.startswith(value):
            self.empty = True
        return True

    def params(self, times: Mapping[str, str]) -> dict[str, Any]:
        """The filter parameters of spark_read_messages / spark_read_archive."""
        out: dict[str, Any] = {f"p_{param}": None for param in _SETS.values()}
        out["p_key_prefix"] = self.key_prefix
        for column, values in self.sets.items():
            out[f"p_{_SETS[column]}"] = sorted(values)
        for param in times.values():
            out[f"p_{param}_lo"] = out[f"p_{param}_hi"] = None
        for column, (lo, hi) in self.times.items():
            out[f"p_{times[column]}_lo"], out[f"p_{times[column]}_hi"] = lo, hi
        return out


class BatchReader(DataSourceReader):
    """``spark.read.format("lonnymq")``: a queue's live messages (``table=messages``, without
    leasing them), its archive (``archive``) or its dead letters (``dead``), split into
    ``numPartitions`` id ranges read in parallel. Each partition reads its own snapshot; rows
    added after planning with ids above the planned range are not read.

    Filters on id, key (equality, IN, prefix), channel, kind, status and the time columns are
    evaluated by PostgreSQL (:meth:`pushFilters`), as index conditions where an index exists;
    Spark evaluates the rest."""

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.table = choice_option(options, "table", ("messages", "archive", "dead"), "messages")
        self.num_partitions = int_option(options, "numPartitions", 4, high=10_000) or 4
        self.schema = schema
        self.options = dict(options)
        self.pushed = Pushed()
        _Arrow(schema, options)  # refuse a bad schema/mode at planning, not in every task

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keep what PostgreSQL can evaluate; yield the rest back to Spark."""
        times = _TIMES["messages" if self.table == "messages" else "archive"]
        p = self.pushed
        for f in filters:
            attr: tuple[str, ...] = getattr(f, "attribute", ())
            column = attr[0] if len(attr) == 1 else None
            value: Any = getattr(f, "value", None)
            ok = False
            if column == "id" and type(f) in _CMP:
                ok = p.id_bound(f)
            elif column in times and type(f) in _CMP:
                ok = p.time_bound(column, f)
            elif column in _SETS and isinstance(f, EqualTo):
                ok = p.restrict(column, [value])
            elif column in _SETS and isinstance(f, In):
                ok = p.restrict(column, list(f.value))
            elif column == "key" and isinstance(f, StringStartsWith):
                ok = p.prefix(value)
            if not ok:
                yield f

    def partitions(self) -> list[IdRange]:
        p = self.pushed
        if p.empty or any(not v for v in p.sets.values()):
            return [IdRange(0, 0)]
        if any(lo is not None and hi is not None and lo > hi for lo, hi in p.times.values()):
            return [IdRange(0, 0)]
        with self.target.connect(autocommit=True) as conn:
            [(lo, hi)] = self.target.call(
                conn, "spark_id_range", "%s::text, %s::text", (self.target.queue, self.table)
            )
        if lo is None:
            return [IdRange(0, 0)]
        hi += 1
        lo = lo if p.id_lo is None else max(lo, p.id_lo)
        hi = hi if p.id_hi is None else min(hi, p.id_hi)
        if lo >= hi:
            return [IdRange(0, 0)]
        n = max(1, min(self.num_partitions, hi - lo))
        step = -(-(hi - lo) // n)
        return [IdRange(a, min(a + step, hi)) for a in range(lo, hi, step)]

    def query(self, partition: IdRange) -> tuple[sql.Composed, dict[str, Any]]:
        """The SQL and parameters :meth:`read` runs for a partition (tests EXPLAIN it)."""
        t = self.target
        params: dict[str, Any] = {"p_queue": t.queue, "p_lo": partition.lo, "p_hi": partition.hi}
        if self.table == "messages":
            function = "spark_read_messages"
            params.update(self.pushed.params(_TIMES["messages"]))
        else:
            function = "spark_read_archive"
            params["p_status"] = "dead" if self.table == "dead" else None
            params.update(self.pushed.params(_TIMES["archive"]))
        args = sql.SQL(", ").join(
            sql.SQL("{} => {}::{}").format(sql.Identifier(k), sql.Placeholder(k), sql.SQL(_TYPES[k]))
            for k in params
        )
        query = sql.SQL("SELECT * FROM {}.{}({})").format(
            sql.Identifier(t.schema), sql.Identifier(function), args
        )
        return query, params

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRange)
        if partition.lo >= partition.hi:
            return
        query, params = self.query(partition)
        yield from _stream(self.target, query, params, _Arrow(self.schema, self.options))


_TYPES: dict[str, LiteralString] = {
    "p_queue": "text",
    "p_lo": "bigint",
    "p_hi": "bigint",
    "p_status": "text",
    "p_keys": "text[]",
    "p_key_prefix": "text",
    "p_channels": "text[]",
    "p_kinds": "text[]",
    "p_statuses": "text[]",
    **{
        f"p_{t}_{b}": "bigint" for t in ("enqueued", "scheduled", "dequeue", "archived") for b in ("lo", "hi")
    },
}


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

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.options = dict(options)
        _Arrow(schema, options)  # refuse a bad schema/mode at planning
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
                self._conn = self.target.open(autocommit=True)
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
        arrow = _Arrow(self.schema, self.options)
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
