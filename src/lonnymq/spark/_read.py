"""Reading queues into Spark: batch reads of the live messages, the archive and dead letters,
and the streaming source that consumes a queue.

Both read pages of rows that PostgreSQL packs column by column (``spark_read_packed``,
``spark_stream_read_packed``: big-endian numbers back to back, lengths and bytes of strings),
only the columns the schema asks for; :class:`_Arrow` makes Arrow arrays of them with numpy
views, without a Python object per row. Python touches single values only for ``headers`` as a
map and for a typed payload (``payloadSchema``), and a payload that is not UTF-8 read as a
string."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
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
from ..client.direct import STRIDE, key_partition
from ._conf import Target, choice_option, float_option, int_option
from ._lazy import LazyModule
from ._payload import CORRUPT, PayloadDecoder, payload_ddl, to_ms_bounds

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
else:  # Spark's planning processes import this module and never need them: _lazy.py
    np = LazyModule("numpy")
    pa = LazyModule("pyarrow")

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
#: Pages of a packed read: the first of a partition or chunk has _FIRST_PAGE rows; the next
#: are sized from the bytes per row seen so far to about _PAGE_BYTES, at most _PAGE_ROWS rows.
#: (A page is one value in PostgreSQL, at most 1 GB: one that fails as too large is asked again
#: with fewer rows.) About 2 MB is the fastest: the server builds a page in one buffer, copies
#: it into the function's result (a tuplestore, which spills to a temporary file above
#: ``work_mem``, 4 MB by default) and sends it; 8 MB pages read at about 0.7x the speed of 2 MB
#: ones (benchmarks/spark_jdbc.py, docs/spark.md "Throughput").
_FIRST_PAGE = 2_000
_PAGE_ROWS = 20_000
_PAGE_BYTES = 2 << 20
#: The packing of each column (sql/spark.sql, _spark_pack_sql): numpy's type of a fixed-width
#: column (a validity byte per row first where ``_NULLABLE``), else lengths and bytes.
_FIXED = {
    "id": ">i8",
    "enqueued_at": ">i8",
    "scheduled_at": ">i8",
    "dequeue_at": ">i8",
    "archived_at": ">i8",
    "priority": ">i2",
    "attempts": ">i4",
    "deliveries": ">i4",
}
_NULLABLE = ("dequeue_at", "archived_at")


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


def _headers(text: str | None) -> list[tuple[str, str]] | None:
    """A jsonb headers object as map<string,string> entries (non-string values as JSON text)."""
    if text is None:
        return None
    obj = json.loads(text)
    if not isinstance(obj, dict):
        return [("", text)]  # cannot happen through send (headers are objects); keep it visible
    return [(k, v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))) for k, v in obj.items()]


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
    """Arrow's validity bitmap of a boolean mask (None: no NULL)."""
    return None if valid.all() else pa.array(valid).buffers()[1]


def _strings(n: int, lengths: bytes, data: bytes | None, dtype: pa.DataType) -> pa.Array:
    """A string or binary array from packed lengths (-1: NULL) and the values' bytes."""
    lens = np.frombuffer(lengths, ">i4", n).astype(np.int32)
    valid = lens >= 0
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.where(valid, lens, 0), out=offsets[1:])
    buffers = [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(data or b"")]
    return pa.Array.from_buffers(dtype, n, buffers, null_count=int(n - valid.sum()))


def _payload_text(raw: pa.Array) -> pa.Array:
    """Payload bytes as strings; a payload that is not UTF-8 is decoded with replacement
    characters, as Python's ``decode("utf-8", "replace")``."""
    text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=raw.null_count)
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return pa.array(
            [None if b is None else b.decode("utf-8", "replace") for b in raw.to_pylist()], pa.string()
        )
    return text


class _Arrow:
    """Turns packed pages of the SQL read functions into Arrow batches of the requested schema
    (any subset and order of :data:`COLUMNS`, plus ``_corrupt``; types are cast, e.g. payload to
    BINARY). Only the requested columns are read (:attr:`wanted`); ``queue`` is the reader's
    constant. A struct ``payload`` is decoded from JSON by :class:`PayloadDecoder`."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.names: list[str] = []
        fields = {f.name: f.dataType for f in schema.fields}
        for f in schema.fields:
            if f.name != CORRUPT and f.name not in _INDEX:
                raise errors.InvalidArgument(
                    f"lonnymq cannot read a column {f.name!r}; columns are {', '.join(_INDEX)}, {CORRUPT}"
                )
            self.names.append(f.name)
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
        wanted = [n for n in self.names if n not in ("queue", CORRUPT)]
        if self.decoder is not None and "id" not in wanted:
            wanted.append("id")  # FAILFAST names the message
        #: The columns the SQL packs, in this order.
        self.wanted = wanted

    def batch(self, n: int, packed: Sequence[bytes | None], queue: str) -> pa.RecordBatch:
        blobs = iter(packed)
        raw: dict[str, pa.Array] = {}
        for name in self.wanted:
            if name in _FIXED:
                valid = np.frombuffer(next(blobs) or b"", np.uint8, n) == 1 if name in _NULLABLE else None
                values = np.frombuffer(next(blobs) or b"", _FIXED[name], n)
                dtype = dict(COLUMNS)[name]
                if isinstance(dtype, TimestampType):
                    raw[name] = pa.array(
                        values.astype(np.int64) * 1000,
                        pa.timestamp("us", tz="UTC"),
                        mask=None if valid is None else ~valid,
                    )
                else:
                    width = np.int64 if isinstance(dtype, LongType) else np.int32
                    raw[name] = pa.array(values.astype(width))
            else:
                lengths = next(blobs)
                assert lengths is not None
                raw[name] = _strings(
                    n, lengths, next(blobs), pa.binary() if name == "payload" else pa.string()
                )
        decoded: tuple[list[Any], list[str | None]] | None = None
        if self.decoder is not None:
            bodies = raw["payload"].to_pylist()
            decoded = self.decoder.decode_all(bodies, [queue] * n, raw["id"].to_pylist())
        arrays = []
        for field_, name in zip(self.arrow_schema, self.names, strict=True):
            if name == CORRUPT:
                arr = pa.array(decoded[1] if decoded is not None else [None] * n, pa.string())
            elif name == "queue":
                arr = pa.repeat(pa.scalar(queue, pa.string()), n)
            elif name == "payload" and decoded is not None:
                arr = pa.array(decoded[0], field_.type)
            elif name == "payload" and not pa.types.is_binary(field_.type):
                arr = _payload_text(raw[name])
            elif name == "headers" and not pa.types.is_string(field_.type):
                text = raw[name]  # JSON text; as a map unless the schema asks for the text
                map_type = pa.map_(pa.string(), pa.string())
                arr = (
                    pa.nulls(n, map_type)
                    if text.null_count == n
                    else pa.array([_headers(v) for v in text.to_pylist()], map_type)
                )
            else:
                arr = raw[name]
            arrays.append(arr if arr.type == field_.type else arr.cast(field_.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)


def _pages(
    target: Target,
    conn: psycopg.Connection[Any],
    query: sql.Composed,
    params: dict[str, Any],
    cursor: str,
    arrow: _Arrow,
    *,
    fenced: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The pages of a packed read as Arrow batches: the query is run again with parameter
    ``cursor`` past the last key of the page before, until a page is empty. Each page is a
    savepoint (a transaction on an autocommit connection), so one that PostgreSQL finds too
    large is asked again, smaller, in the same snapshot. A page of fewer rows than asked is the
    last: the query stops short of its LIMIT only when nothing is left after it (both keys, id
    and ord, are scanned to the end before a page comes back short), so no empty page is asked
    for after it. ``fenced`` (a stream's read, on an autocommit connection): each page's
    transaction first holds the queue (:meth:`Target.hold`), so a page never comes back empty
    from a shard the queue moved away from."""
    params["p_limit"] = min(_FIRST_PAGE, _PAGE_ROWS)
    with conn.cursor(binary=True) as cur:
        while True:
            try:
                with conn.transaction():
                    if fenced:
                        target.hold(conn)
                    row = cur.execute(query, params).fetchone()
            except psycopg.errors.ProgramLimitExceeded:
                if params["p_limit"] == 1:
                    raise
                params["p_limit"] = max(1, params["p_limit"] // 8)
                continue
            if row is None or not row[0]:
                return
            n, last, packed = row
            yield arrow.batch(n, packed, target.queue)
            if n < params["p_limit"]:
                return
            size = sum(len(b) for b in packed if b)
            params["p_limit"] = max(1, min(_PAGE_ROWS, _PAGE_BYTES * n // max(size, 1)))
            params[cursor] = last + 1 if cursor == "p_lo" else last


# -- batch reads ------------------------------------------------------------------------------


@dataclass
class IdRange(InputPartition):
    """Messages with lo <= id < hi, on the reader's ``target``-th server (the queue's
    partition on a shard router; 0: the only one unless the queue is partitioned)."""

    lo: int
    hi: int
    target: int = 0


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
    ``numPartitions`` id ranges read in parallel (default: :func:`default_partitions`). Each
    partition reads its own snapshot (its pages are one REPEATABLE READ transaction); rows added
    after planning with ids above the planned range are not read. Given a shard router, it
    reads the queue's shard, or every partition's shard of a partitioned queue (the union; at
    least one id range per shard, ``numPartitions`` shared out between them).

    Filters on id, key (equality, IN, prefix), channel, kind, status and the time columns are
    evaluated by PostgreSQL (:meth:`pushFilters`), as index conditions where an index exists;
    Spark evaluates the rest."""

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.targets = self.target.placed()
        self.table = choice_option(options, "table", ("messages", "archive", "dead"), "messages")
        self.num_partitions = int_option(options, "numPartitions", None, high=10_000)
        self.schema = schema
        self.options = dict(options)
        self.pushed = Pushed()
        self.columns = _Arrow(schema, options).wanted  # refuse a bad schema/mode at planning

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
        n = len(self.targets)
        targets = list(range(n))
        if n > 1 and "key" in p.sets:  # a key's messages are all on its partition
            targets = sorted({key_partition(str(k), n) for k in p.sets["key"]})
        return [r for i in targets for r in self._ranges(i)] or [IdRange(0, 0)]

    def _ranges(self, target: int) -> list[IdRange]:
        """The id ranges of the ``target``-th server's rows (none: it has none)."""
        p = self.pushed
        t = self.targets[target]
        with t.connect(autocommit=True) as conn:
            [(lo, hi)] = t.call(conn, "spark_id_range", "%s::text, %s::text", (t.queue, self.table))
        if lo is None:
            return []
        hi += 1
        lo = lo if p.id_lo is None else max(lo, p.id_lo)
        hi = hi if p.id_hi is None else min(hi, p.id_hi)
        if lo >= hi:
            return []
        # A router's shards number their ids i mod STRIDE: a span of STRIDE ids is one message.
        wanted = self.num_partitions and -(-self.num_partitions // len(self.targets))
        n = max(1, min(wanted or default_partitions((hi - lo) // (STRIDE if t.shard else 1)), hi - lo))
        step = -(-(hi - lo) // n)
        return [IdRange(a, min(a + step, hi), target) for a in range(lo, hi, step)]

    def query(self, partition: IdRange) -> tuple[sql.Composed, dict[str, Any]]:
        """The rows of a partition, one per message, all columns: spark_read_messages or
        spark_read_archive with the pushed filters. :meth:`read` runs the same query
        (``_spark_read_sql``) through :meth:`packed_query`; tests read and EXPLAIN this one."""
        t = self.targets[partition.target]
        params: dict[str, Any] = {"p_queue": t.queue, "p_lo": partition.lo, "p_hi": partition.hi}
        if self.table == "messages":
            function = "spark_read_messages"
            params.update(self.pushed.params(_TIMES["messages"]))
        else:
            function = "spark_read_archive"
            params["p_status"] = "dead" if self.table == "dead" else None
            params.update(self.pushed.params(_TIMES["archive"]))
        return _call(t, function, params), params

    def packed_query(self, partition: IdRange) -> tuple[sql.Composed, dict[str, Any]]:
        """What :meth:`read` runs for a partition: spark_read_packed, a page at a time from
        ``p_lo`` (advanced past each page), only the columns of the schema."""
        t = self.targets[partition.target]
        params: dict[str, Any] = {
            "p_queue": t.queue,
            "p_table": self.table,
            "p_columns": self.columns,
            "p_lo": partition.lo,
            "p_hi": partition.hi,
            "p_limit": _FIRST_PAGE,
            **self.pushed.params(_TIMES["messages" if self.table == "messages" else "archive"]),
        }
        return _call(t, "spark_read_packed", params), params

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRange)
        if partition.lo >= partition.hi:
            return
        query, params = self.packed_query(partition)
        t = self.targets[partition.target]
        with t.connect() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with conn.transaction():  # one snapshot; each page is a savepoint in it
                # On a shard: this snapshot's, so the partition reads the queue as it was before a
                # move, whole, or raises QueueNotFound (its pages alone would read nothing).
                t.check(conn)
                yield from _pages(t, conn, query, params, "p_lo", _Arrow(self.schema, self.options))


#: Below this many rows per partition, :func:`default_partitions` does not split further to
#: keep the cores busy; above this many, it splits even when there are enough partitions.
_MIN_PARTITION_ROWS = 10_000
_MAX_PARTITION_ROWS = 100_000


def default_partitions(span: int) -> int:
    """The default ``numPartitions`` of a batch read of ``span`` ids: one per core (the
    planning machine's: in local mode, Spark's), but not below 10,000 ids each, and more when
    they would exceed 100,000 each (at most 10,000 partitions)."""
    cores = os.cpu_count() or 1
    by_size = -(-span // _MAX_PARTITION_ROWS)
    by_cores = min(cores, -(-span // _MIN_PARTITION_ROWS))
    return max(1, min(10_000, max(by_size, by_cores)))


def _call(target: Target, function: str, params: Mapping[str, Any]) -> sql.Composed:
    """``SELECT * FROM <schema>.<function>(p_x => %(p_x)s::<type>, ...)`` for ``params``."""
    args = sql.SQL(", ").join(
        sql.SQL("{} => {}::{}").format(sql.Identifier(k), sql.Placeholder(k), sql.SQL(_TYPES[k]))
        for k in params
    )
    return sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(target.schema), sql.Identifier(function), args
    )


_TYPES: dict[str, LiteralString] = {
    "p_queue": "text",
    "p_table": "text",
    "p_columns": "text[]",
    "p_limit": "integer",
    "p_stream": "uuid",
    "p_batch": "bigint",
    "p_chunk": "integer",
    "p_after": "bigint",
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
    """Some chunks (batch_id, chunk) of a stream's delivery log on the reader's ``target``-th
    server (the queue's partition on a shard router; 0: the only one unless partitioned)."""

    stream: str
    chunks: list[tuple[int, int]]
    target: int = 0


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

    Given a shard router, it consumes the queue on its shard, straight. A partitioned queue is
    one stream on each partition's shard (same id, each with its own delivery log): the offset
    holds a batch number per partition (``{"stream": <uuid>, "batch": [N0, N1, ...]}``), a
    micro-batch leases up to ``maxRowsPerBatch / partitions`` (at least 1) on each, then what
    short partitions left over from those that filled their share (:meth:`latestOffset`),
    reads them in parallel and acks each partition's on its shard. On a shard its calls and pages are behind
    the move fence (:meth:`Target.hold`): after a move of the queue they raise QueueNotFound.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.targets = Target.from_options(options, conf).placed()
        self.target = self.targets[0]
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
        self._conns: dict[int, psycopg.Connection[Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conns"] = {}
        return state

    # The driver-side reader lives as long as the query: keep one connection per server, and
    # reconnect once if it broke (every call below is idempotent).
    def _call(
        self, function: str, args: LiteralString, params: tuple[Any, ...], target: int = 0
    ) -> list[Any]:
        t = self.targets[target]
        for attempt in (1, 2):
            conn = self._conns.get(target)
            if conn is None or conn.closed:
                conn = self._conns[target] = t.open(autocommit=True)
            try:
                if t.shard is None:
                    return t.call(conn, function, args, params)
                with conn.transaction():  # behind the move fence (Target.hold)
                    t.hold(conn)
                    return t.call(conn, function, args, params)
            except psycopg.OperationalError:
                conn.close()
                del self._conns[target]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _offset(self, stream: str, batches: list[int]) -> dict[str, Any]:
        return {"stream": stream, "batch": batches if len(self.targets) > 1 else batches[0]}

    @staticmethod
    def _batches(offset: Mapping[str, Any]) -> list[int]:
        """The batch number of each partition (one: a queue of one server) in an offset."""
        batch = offset["batch"]
        return [int(b) for b in batch] if isinstance(batch, list) else [int(batch)]

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks more than once for a new query; the stream id must not change.
        if self._initial is None:
            self._initial = self._offset(str(uuid.uuid4()), [0] * len(self.targets))
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        [(now,)] = self._call("now_ms", "", ())
        self._ready_at = now

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        stream, after = start["stream"], self._batches(start)
        total = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # Shared out between the partitions; what a short partition leaves goes to the others.
        max_rows = None if total is None else max(1, total // len(after))
        # One chunk per task of a full batch (a chunk is read by one task), at most 10,000.
        chunk = 10_000 if max_rows is None else max(1, min(10_000, -(-max_rows // self.num_partitions)))
        batches = list(after)
        counts = [self._lease(stream, batches, i, max_rows, chunk) for i in range(len(after))]
        if total is not None and max_rows is not None and len(after) > 1:
            left = total - sum(counts)
            more = [i for i, n in enumerate(counts) if n >= max_rows]  # full: may hold more
            while left > 0 and more:
                ask = max(1, left // len(more))
                full = []
                for i in more:
                    if left <= 0:
                        break
                    asked = min(ask, left)
                    n = self._lease(stream, batches, i, asked, chunk)
                    left -= n
                    if n >= asked:
                        full.append(i)
                more = full
        if batches == after and self._ready_at is not None and any(after):
            # trigger(availableNow=True) stops here, and Spark commits a source's batch only
            # when it plans the next one, so the last batch would stay leased until the next
            # run. Spark runs one batch at a time and calls latestOffset(start) only once the
            # batch ending at `start` is in its commit log: ack it now, as commit(start) would.
            self.commit(start)
        return self._offset(stream, batches)

    def _lease(self, stream: str, batches: list[int], i: int, limit: int | None, chunk: int) -> int:
        """Lease up to ``limit`` ready messages of partition ``i`` as its batch after
        ``batches[i]`` (spark_stream_next; idempotent: a replay finds the batch logged before),
        which then becomes ``batches[i]``. Returns how many it holds (0: nothing was ready)."""
        [(batch, n)] = self._call(
            "spark_stream_next",
            "%s::uuid, %s::text, %s::bigint, %s::int, %s::int, %s::bigint, %s::bigint",
            (stream, self.target.queue, batches[i], limit, chunk, self.lease_ms, self._ready_at),
            i,
        )
        batches[i] = int(batch)
        return int(n)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamChunks]:
        stream = end["stream"]
        first, last = self._batches(start), self._batches(end)
        per_target = -(-self.num_partitions // len(last))
        out: list[StreamChunks] = []
        for i in range(len(last)):
            rows = self._call(
                "spark_stream_chunks", "%s::uuid, %s::bigint, %s::bigint", (stream, first[i], last[i]), i
            )
            if not rows:
                continue
            groups: list[list[tuple[int, int]]] = [[] for _ in range(min(per_target, len(rows)))]
            sizes = [0] * len(groups)
            for batch, chunk, n in rows:  # largest-first would balance better; chunks are equal-sized
                g = sizes.index(min(sizes))
                groups[g].append((int(batch), int(chunk)))
                sizes[g] += n
            out += [StreamChunks(stream, g, i) for g in groups]
        return out or [StreamChunks(stream, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The logged deliveries of the partition's chunks, packed (spark_stream_read_packed),
        on one connection."""
        assert isinstance(partition, StreamChunks)
        if not partition.chunks:
            return
        arrow = _Arrow(self.schema, self.options)
        t = self.targets[partition.target]
        with t.connect(autocommit=True) as conn:
            for batch, chunk in partition.chunks:
                params: dict[str, Any] = {
                    "p_queue": t.queue,
                    "p_stream": partition.stream,
                    "p_batch": batch,
                    "p_chunk": chunk,
                    "p_columns": arrow.wanted,
                    "p_after": 0,
                    "p_limit": _FIRST_PAGE,
                }
                query = _call(t, "spark_stream_read_packed", params)
                yield from _pages(t, conn, query, params, "p_after", arrow, fenced=True)

    def commit(self, end: dict[str, Any]) -> None:
        for i, batch in enumerate(self._batches(end)):
            self._call(
                "spark_stream_commit",
                "%s::uuid, %s::bigint, %s::bool",
                (end["stream"], batch, self.archive),
                i,
            )

    def stop(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
