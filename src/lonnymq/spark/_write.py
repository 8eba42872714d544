"""Writing DataFrames and streams into a queue, exactly once.

Tasks never write to the queue. Each task attempt COPYs its rows into ``spark_stage`` under a
fresh random part id (registered with the write's run id in the same transaction) and reports
``(part, rows)`` to the driver. The COPY data (binary format) is built from the Arrow batches
Spark hands over, column by column, without a Python object per row (:class:`Encoder`). The
driver's commit moves exactly the reported parts into the queue in one PostgreSQL transaction
(``spark_write_commit``: set-wise, one INSERT ... SELECT per part, with every send rule:
payload limits, priorities, keys, channels) and drops everything the run staged (a TRUNCATE
when staging holds nothing else, else a DELETE), including the parts of failed or duplicate
task attempts that Spark never reported. So a retried task cannot duplicate messages, a failed
job enqueues nothing, and abort plus a sweeper clear leftovers. Streaming writes add a commit
record per (sink, batch) in that same transaction, so a batch Spark replays after a restart is
skipped. Given a shard router's DSN, all of this runs on the queue's shard; a partitioned
queue's rows are staged on their partitions' shards and published on every shard before any
shard commits, by two-phase commit where every shard allows prepared transactions
(:func:`stage_shards`, :func:`commit_shards`; docs/spark.md, "Sharded setups").
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
import logging
import secrets
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .. import errors
from ..client.direct import ShardMap, key_partition
from ..client.ops import Ops, check_text
from ..migrations import DEFAULT_SCHEMA, check_schema
from ..models import JSON, TEXT
from ._conf import ConnectFailed, Target, choice_option, describe_dsn, float_option, option
from ._conf import run as run_op
from ._lazy import LazyModule

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
    import pyarrow.compute as pc  # type: ignore[import-untyped]
else:  # Spark's planning processes import this module and never need them: _lazy.py
    np = LazyModule("numpy")
    pa = LazyModule("pyarrow")
    pc = LazyModule("pyarrow.compute")

log = logging.getLogger("lonnymq.spark")

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_NUMERIC = (*_INTEGRAL, FloatType, DoubleType, DecimalType)
_KEY_MAX = 512
_KIND_MAX = 255

#: Columns with a meaning besides the payload: (name, accepted Spark types, description).
META: tuple[tuple[str, tuple[type[DataType], ...], str], ...] = (
    ("key", (StringType,), "de-duplication key"),
    ("kind", (StringType,), "message kind"),
    ("channel", (StringType,), "channel"),
    ("headers", (MapType, StructType, StringType), "headers (a map, struct or JSON object string)"),
    ("priority", _INTEGRAL, "priority in -100..100"),
    ("delay", _NUMERIC, "delay in seconds"),
    ("at", (TimestampType, TimestampNTZType), "delivery time"),
)


@dataclass(frozen=True)
class Plan:
    """How a DataFrame's columns become messages; decided once on the driver."""

    payload: str | None  # the payload column, or None: all other columns as one JSON object
    mode: str  # text | json_text | binary | json | row_json
    row_columns: tuple[str, ...]  # the columns of a row_json payload
    columns: dict[str, str]  # meta name -> DataFrame column
    headers_string: bool  # headers column holds JSON text
    on_conflict: str

    @classmethod
    def build(cls, schema: StructType, options: Mapping[str, str]) -> Plan:
        fields = {f.name: f.dataType for f in schema.fields}
        columns: dict[str, str] = {}
        for name, types, what in META:
            col = option(options, f"{name}Column", name)
            assert col is not None
            if col not in fields:
                if option(options, f"{name}Column") is not None:
                    raise errors.InvalidArgument(f"option {name}Column: no column {col!r}")
                continue
            if not isinstance(fields[col], types):
                raise errors.InvalidArgument(
                    f"column {col!r} ({what}) cannot be {fields[col].simpleString()}"
                )
            columns[name] = col
        fmt = choice_option(options, "payloadFormat", ("auto", "json", "text"), "auto")
        payload = option(options, "payloadColumn", "payload")
        row_columns: tuple[str, ...] = ()
        if payload in fields:
            dtype = fields[payload]
            if isinstance(dtype, StringType):
                mode = "json_text" if fmt == "json" else "text"
            elif isinstance(dtype, BinaryType):
                if fmt != "auto":
                    raise errors.InvalidArgument("payloadFormat does not apply to a binary payload")
                mode = "binary"
            else:
                mode = "json"
        elif option(options, "payloadColumn") is not None:
            raise errors.InvalidArgument(f"option payloadColumn: no column {payload!r}")
        else:
            payload, mode = None, "row_json"
            row_columns = tuple(n for n in fields if n not in columns.values())
            if not row_columns:
                raise errors.InvalidArgument("the DataFrame has no column to make a payload of")
        on_conflict = choice_option(options, "onConflict", ("ignore", "replace", "error"), "ignore")
        headers_string = "headers" in columns and isinstance(fields[columns["headers"]], StringType)
        return cls(payload, mode, row_columns, columns, headers_string, on_conflict)

    @property
    def content_type(self) -> str | None:
        """The content type of every message of the write (None: a binary payload). Given to the
        commit once, not staged with every row."""
        return {"text": TEXT, "json_text": JSON, "binary": None, "json": JSON, "row_json": JSON}[self.mode]

    def copy_columns(self) -> list[tuple[str, str]]:
        """(staging column, type) written for this plan, after part and seq."""
        cols = [("payload", "bytea")]
        for name, typ in (
            ("kind", "text"),
            ("key", "text"),
            ("channel", "text"),
            ("headers", "jsonb"),
            ("at", "int8"),
            ("delay", "int8"),
            ("priority", "int2"),
        ):
            if name in self.columns:
                cols.append(({"at": "at_ms", "delay": "delay_ms"}.get(name, name), typ))
        return cols


def _json_default(value: Any) -> Any:
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"Decimal {value} is not a finite number")
        return str(value)  # exact digits, as lonnymq's serializer writes them
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise errors.InvalidArgument(f"payload is not JSON-serialisable: {e}") from None


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=_json_default)


def _json_loads() -> Any:
    """orjson's parser if installed (``lonnymq[orjson]``; 4-5x faster), else the json module's."""
    try:
        import orjson
    except ImportError:
        return json.loads
    return orjson.loads


_fast_loads = _json_loads()


def _check_json_texts(values: pa.Array, column: str) -> None:
    """Raise InvalidArgument unless every string is a JSON document, as ``json.loads`` decides
    (orjson first where installed; it is stricter, e.g. about NaN, so a text it refuses is
    judged again by ``json``)."""
    for v in values.to_pylist():
        try:
            _fast_loads(v)
        except ValueError:
            try:
                json.loads(v)
            except ValueError as e:
                raise errors.InvalidArgument(f"column {column!r} is not JSON: {e}: {v[:80]!r}") from None


def _first(mask: pa.Array) -> int:
    """The index of the first true value of a boolean array (nulls are false)."""
    return int(np.flatnonzero(mask.fill_null(False).to_numpy(zero_copy_only=False))[0])


def _binary(values: pa.Array) -> pa.Array:
    """String or binary values as ``binary`` (UTF-8 for strings): no copy of the bytes."""
    return values if values.type == pa.binary() else values.cast(pa.binary())


class Encoder:
    """Arrow batches -> staged rows, column by column. :meth:`columns` gives the values of each
    staging column as an Arrow array, checked as a send checks them (the column is named in the
    error); :meth:`copy_data` serialises them to PostgreSQL's binary COPY format with Arrow and
    numpy kernels, without a Python object per row. Only encodings that need Python per value
    make one: JSON payloads built from struct, map or array columns (or from all the columns),
    headers, and the check that JSON text columns hold JSON (``payloadFormat=json``)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def payloads(self, batch: pa.RecordBatch) -> pa.Array:
        plan = self.plan
        if plan.mode == "row_json":
            rows = batch.select(list(plan.row_columns)).to_pylist(maps_as_pydicts="strict")
            return pa.array([_dumps(r) for r in rows], pa.binary())
        column = plan.payload
        assert column is not None
        values = batch.column(column)
        if values.null_count:
            raise errors.InvalidArgument(f"column {column!r}: a row has a null payload")
        if plan.mode == "json":
            return pa.array([_dumps(v) for v in values.to_pylist(maps_as_pydicts="strict")], pa.binary())
        if plan.mode == "json_text":
            # the text must be JSON, or consumers could not decode it
            _check_json_texts(values, column)
        return _binary(values)

    def column(self, batch: pa.RecordBatch, name: str) -> pa.Array:
        """The values of meta column ``name`` (see :data:`META`) as staged: text as string,
        headers as JSON object text, priority as int16, delay and at as epoch-ms int64."""
        col = self.plan.columns[name]
        arr = batch.column(col)
        if name == "at":
            us = arr.cast(pa.timestamp("us")).cast(pa.int64())
            ms = np.floor_divide(us.fill_null(0).to_numpy(), 1000)
            return pa.array(ms, pa.int64(), mask=us.is_null().to_numpy(zero_copy_only=False))
        if name in ("kind", "key", "channel"):
            arr = arr.cast(pa.string())
            limit = _KIND_MAX if name == "kind" else _KEY_MAX
            length = pc.utf8_length(arr)
            bad = pc.or_(
                pc.or_(pc.less(length, 1), pc.greater(length, limit)), pc.match_substring(arr, "\x00")
            )
            if pc.any(bad).as_py():
                check_text(arr[_first(bad)].as_py(), f"column {col!r} ({name})", limit)
            return arr
        if name == "headers":
            return pa.array(
                [self._headers(v, col) for v in arr.to_pylist(maps_as_pydicts="strict")], pa.string()
            )
        if name == "priority":
            bad = pc.or_(pc.less(arr, -100), pc.greater(arr, 100))
            if pc.any(bad).as_py():
                v = arr[_first(bad)].as_py()
                raise errors.InvalidArgument(f"column {col!r}: priority {v} is outside -100..100")
            return arr.cast(pa.int16())
        if name == "delay":
            seconds = arr.cast(pa.float64())
            bad = pc.invert(pc.and_(pc.is_finite(seconds), pc.greater_equal(seconds, 0)))
            if pc.any(bad).as_py():
                v = arr[_first(bad)].as_py()
                raise errors.InvalidArgument(f"column {col!r}: delay must be finite and >= 0, got {v}")
            # round(seconds * 1000), as Python rounds: half to even
            ms = pc.round(pc.multiply(seconds, 1000.0), round_mode="half_to_even")
            try:
                return ms.cast(pa.int64())
            except pa.ArrowInvalid:
                raise errors.InvalidArgument(f"column {col!r}: a delay is too long") from None
        raise AssertionError(name)

    def _headers(self, value: Any, col: str) -> str | None:
        try:
            h = json.loads(value) if self.plan.headers_string and value is not None else value
        except ValueError:
            h = value  # not JSON: refused just below
        if h is None:
            return None
        if not (isinstance(h, dict) and all(isinstance(k, str) for k in h)):
            raise errors.InvalidArgument(f"column {col!r}: headers must be a JSON object")
        try:
            return _json_text(h)  # values from structs may be dates or decimals: as in payloads
        except (TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"column {col!r}: headers are not JSON-serialisable: {e}") from None

    def columns(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        """The staging columns after part and seq (:meth:`Plan.copy_columns`), checked."""
        out = {"payload": self.payloads(batch)}
        for staged, _ in self.plan.copy_columns()[1:]:
            out[staged] = self.column(batch, {"at_ms": "at", "delay_ms": "delay"}.get(staged, staged))
        if "at_ms" in out and "delay_ms" in out:
            both = pc.and_(out["at_ms"].is_valid(), out["delay_ms"].is_valid())
            if pc.any(both).as_py():
                raise errors.InvalidArgument("a row gives both delay and at: give one")
        return out

    def rows(self, batch: pa.RecordBatch, part: int, seq: int) -> Iterator[tuple[Any, ...]]:
        """The staged rows as Python values (headers as dicts), in :meth:`Plan.copy_columns`
        order after part and seq: what :meth:`copy_data` serialises, for tests and debugging."""
        cols = self.columns(batch)
        values: list[list[Any]] = [cols["payload"].to_pylist()]
        for staged, _ in self.plan.copy_columns()[1:]:
            v = cols[staged].to_pylist()
            values.append([None if h is None else json.loads(h) for h in v] if staged == "headers" else v)
        for i, row in enumerate(zip(*values, strict=True)):
            yield (part, seq + i, *row)

    def copy_data(self, batch: pa.RecordBatch, part: int, seq: int) -> pa.Buffer:
        """The rows of ``batch`` as binary COPY data for ``(part, seq, *copy_columns)`` (no
        header or trailer), rows numbered from ``seq``."""
        return self.copy_rows(self.columns(batch), batch.num_rows, part, seq)

    def copy_rows(self, cols: Mapping[str, pa.Array], n: int, part: int, seq: int) -> pa.Buffer:
        """:meth:`copy_data` of ``n`` rows' staging columns (:meth:`columns`)."""
        rows = _CopyRows(n, 2 + len(self.plan.copy_columns()))
        rows.fixed(">i8", part)
        rows.fixed(">i4", np.arange(seq, seq + n, dtype=np.int64))
        rows.var(cols["payload"])
        for staged, typ in self.plan.copy_columns()[1:]:
            if typ in _WIDTHS:
                rows.nullable_fixed(_WIDTHS[typ], cols[staged])
            else:  # text; jsonb's binary form is a version byte (1) and the text
                rows.var(_binary(cols[staged]), b"\x01" if typ == "jsonb" else b"")
        return rows.finish()


#: numpy's big-endian (network order) types of the fixed-width staging columns.
_WIDTHS = {"int8": ">i8", "int4": ">i4", "int2": ">i2"}
_NULL = b"\xff\xff\xff\xff"  # a NULL field: length -1
#: The header and the trailer of PostgreSQL's binary COPY format.
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"


class _CopyRows:
    """Binary COPY rows of ``n`` tuples, built field by field as whole columns. A run of
    fixed-width fields (the field count, lengths, fixed-width values, constants) becomes one
    numpy record array; a variable-length value is an Arrow binary array; the rows are the
    element-wise concatenation of these pieces (one Arrow kernel), whose data buffer is exactly
    the COPY data."""

    def __init__(self, n: int, fields: int) -> None:
        self.n = n
        self.pieces: list[pa.Array] = []
        self.dtypes: list[tuple[str, str]] = []
        self.values: list[Any] = []
        self._field(">i2", fields)

    def _field(self, dtype: str, value: Any) -> None:
        self.dtypes.append((f"f{len(self.dtypes)}", dtype))
        self.values.append(value)

    def _flush(self) -> None:
        if not self.dtypes:
            return
        records = np.empty(self.n, dtype=np.dtype(self.dtypes))
        for (name, _), value in zip(self.dtypes, self.values, strict=True):
            records[name] = value
        self.pieces.append(_fixed_binary(records.tobytes(), records.dtype.itemsize, self.n))
        self.dtypes, self.values = [], []

    def fixed(self, dtype: str, values: Any) -> None:
        self._field(">i4", np.dtype(dtype).itemsize)
        self._field(dtype, values)

    def constant(self, value: bytes | None) -> None:
        if value is None:
            self._field(">i4", -1)
        else:
            self._field(">i4", len(value))
            self._field(f"S{len(value)}", value)

    def var(self, values: pa.Array, prefix: bytes = b"") -> None:
        if prefix:  # before every value (a NULL stays NULL: it is a length of -1 only)
            values = pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), values, b"")
        self._field(">i4", pc.binary_length(values).fill_null(-1).to_numpy())
        self._flush()
        self.pieces.append(values.fill_null(b""))

    def nullable_fixed(self, dtype: str, values: pa.Array) -> None:
        if values.null_count == 0:
            self.fixed(dtype, values.to_numpy())
            return
        self._flush()
        records = np.empty(self.n, dtype=np.dtype([("len", ">i4"), ("value", dtype)]))
        records["len"] = np.dtype(dtype).itemsize
        records["value"] = values.fill_null(0).to_numpy()
        present = _fixed_binary(records.tobytes(), records.dtype.itemsize, self.n)
        self.pieces.append(pc.if_else(values.is_valid(), present, pa.scalar(_NULL, pa.binary())))

    def finish(self) -> pa.Buffer:
        self._flush()
        rows = self.pieces[0] if len(self.pieces) == 1 else pc.binary_join_element_wise(*self.pieces, b"")
        offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=rows.offset + self.n + 1)
        return rows.buffers()[2][offsets[rows.offset] : offsets[rows.offset + self.n]]


def _fixed_binary(data: bytes, width: int, n: int) -> pa.Array:
    """``n`` values of ``width`` bytes each, back to back in ``data``, as a binary array."""
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# -- staging and commit --------------------------------------------------------------------------


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: ``rows`` rows under ``part`` (0 rows: nothing staged), on
    the writer's ``target``-th server (the queue's partition on a shard router, see
    :func:`stage_shards`)."""

    run: str
    part: int
    rows: int
    sink: str | None = None
    target: int = 0


@dataclass
class StagedShards(WriterCommitMessage):
    """What one task attempt staged on each partition's shard of a partitioned queue."""

    staged: list[Staged]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.staged)


def _staged(messages: list[Any]) -> list[Staged]:
    """Every :class:`Staged` of the tasks' messages."""
    out: list[Staged] = []
    for m in messages:
        if isinstance(m, StagedShards):
            out += m.staged
        elif isinstance(m, Staged):
            out.append(m)
    return out


#: Arrow batches larger than this are staged in slices (Arrow's binary offsets are 32-bit).
_SLICE_BYTES = 256 << 20


def _slices(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    if batch.num_rows > 1 and batch.nbytes > _SLICE_BYTES:
        half = batch.num_rows // 2
        yield from _slices(batch.slice(0, half))
        yield from _slices(batch.slice(half))
    elif batch.num_rows:
        yield batch


class _Copy:
    """The rows written so far to one COPY into staging under ``part``."""

    def __init__(self, cp: Any, encoder: Encoder, part: int) -> None:
        self.cp, self.encoder, self.part, self.rows = cp, encoder, part, 0

    def write(self, batch: pa.RecordBatch) -> None:
        for piece in _slices(batch):
            self.write_rows(self.encoder.columns(piece), piece.num_rows)

    def write_rows(self, cols: Mapping[str, pa.Array], n: int) -> None:
        """``n`` rows' staging columns (:meth:`Encoder.columns`)."""
        self.cp.write(self.encoder.copy_rows(cols, n, self.part, self.rows))
        self.rows += n


@contextmanager
def _staging(target: Target, plan: Plan, run: str) -> Iterator[_Copy]:
    """A COPY into ``target``'s staging under a new part of ``run``, committed (with the
    part's registration, in one transaction) when the block ends without an error."""
    cols = plan.copy_columns()
    copy = sql.SQL("COPY {}.spark_stage (part, seq, {}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(target.schema), sql.SQL(", ").join(sql.Identifier(c) for c, _ in cols)
    )
    register = sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (%s, %s, %s)").format(
        sql.Identifier(target.schema)
    )
    part = secrets.randbits(62) + 1
    with target.connect() as conn:
        conn.execute(register, (part, run, target.queue))
        with conn.cursor() as cur, cur.copy(copy) as cp:
            cp.write(COPY_SIGNATURE)
            yield _Copy(cp, Encoder(plan), part)
            cp.write(COPY_TRAILER)
        conn.commit()


def stage(
    target: Target, plan: Plan, run: str, batches: Iterator[pa.RecordBatch], sink: str | None = None
) -> Staged:
    """COPY a task's rows into staging in one transaction; nothing is visible to the commit
    unless the whole task's rows are."""
    first = next(batches, None)
    if first is None:
        return Staged(run, 0, 0, sink)
    with _staging(target, plan, run) as copy:
        copy.write(first)
        for batch in batches:
            copy.write(batch)
    return Staged(run, copy.part, copy.rows, sink)


def partition_of(cols: Mapping[str, pa.Array], n: int, queue: str) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The partition (0..n-1) of each staged row of a queue of ``n`` partitions, as the router
    and a direct client send it (:func:`key_partition`): a row with a channel on its channel's
    partition (all of a channel's messages on one partition, whose shard enforces its limits),
    else a row with a key on its key's; a row with neither by the CRC-32 of its payload bytes,
    so the same rows go to the same partitions in every attempt and every rerun of a job (a
    replay finds what the first run committed where it left it). A row with both a channel and
    a key raises InvalidArgument, as the router refuses such a send."""
    if "key" in cols and "channel" in cols:
        both = pc.and_(cols["key"].is_valid(), cols["channel"].is_valid())
        if pc.any(both).as_py():
            i = _first(both)
            raise errors.InvalidArgument(
                f"queue {queue} is partitioned: a message goes to its channel's partition, so it"
                " cannot also have a key (get and cancel by key look in the key's partition); a row"
                f" has channel {cols['channel'][i].as_py()!r} and key {cols['key'][i].as_py()!r}:"
                " give each row a channel or a key"
            )
    payloads = cols["payload"]
    at = np.zeros(len(payloads), dtype=np.int64)
    named = [cols[c] for c in ("channel", "key") if c in cols]
    unnamed = np.ones(len(payloads), dtype=bool)
    if named:
        # Each distinct channel or key hashed once (a batch's rows often share a few channels).
        names = (pc.coalesce(*named) if len(named) > 1 else named[0]).dictionary_encode()
        distinct = names.dictionary.to_pylist()
        of_name = np.fromiter((key_partition(d, n) for d in distinct), dtype=np.int64, count=len(distinct))
        unnamed = names.indices.is_null().to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(~unnamed)
        at[rows] = of_name[names.indices.take(pa.array(rows)).to_numpy()]
    rest = np.flatnonzero(unnamed)
    if len(rest):
        bodies = payloads.take(pa.array(rest)).to_pylist()
        at[rest] = np.fromiter((zlib.crc32(p) % n for p in bodies), dtype=np.int64, count=len(rest))
    return at


def stage_shards(
    targets: tuple[Target, ...],
    plan: Plan,
    run: str,
    batches: Iterator[pa.RecordBatch],
    sink: str | None = None,
) -> Staged | StagedShards:
    """:func:`stage` into the queue's server, or, for a partitioned queue (``targets``: its
    partitions' shards), each row into its partition's shard (:func:`partition_of`), one COPY
    and transaction per shard."""
    if len(targets) == 1:
        return stage(targets[0], plan, run, batches, sink)
    encoder = Encoder(plan)
    n = len(targets)
    with ExitStack() as stack:
        copies: dict[int, _Copy] = {}
        for batch in batches:
            for piece in _slices(batch):
                cols = encoder.columns(piece)
                at = partition_of(cols, n, targets[0].queue)
                for k in (int(k) for k in np.unique(at)):
                    rows = pa.array(np.flatnonzero(at == k))
                    if k not in copies:
                        copies[k] = stack.enter_context(_staging(targets[k], plan, run))
                    copies[k].write_rows({c: v.take(rows) for c, v in cols.items()}, len(rows))
    staged = [Staged(run, c.part, c.rows, sink, k) for k, c in sorted(copies.items())]
    return StagedShards(staged or [Staged(run, 0, 0, sink)])


@dataclass(frozen=True)
class CommitResult:
    created: int
    updated: int
    ignored: int
    duplicate: bool  # the sink/write id was already committed: nothing enqueued
    committed_at: int  # of this commit, or of the one that made this a replay
    messages: int  # enqueued by this commit, or by the one that made this a replay


def commit(
    target: Target,
    run: str,
    messages: list[Any],
    on_conflict: str,
    sink: str | None = None,
    batch_id: int | None = None,
    retention_ms: int = 7 * 86_400_000,
    content_type: str | None = None,
) -> CommitResult:
    """Move the reported parts into the queue in one transaction (see ``spark_write_commit``),
    with ``content_type`` (:attr:`Plan.content_type`) on every message. A replay of a committed
    sink batch or write id enqueues nothing and is logged."""
    one = [replace(m, target=0) for m in messages if isinstance(m, Staged)]
    [result] = commit_shards((target,), run, one, on_conflict, sink, batch_id, retention_ms, content_type)
    return result


def _log_replay(target: Target, result: CommitResult, sink: str | None, batch_id: int | None) -> None:
    """The warning of a commit that was a replay (:attr:`CommitResult.duplicate`), if it was."""
    if not result.duplicate:
        return
    what = (
        f"write id {sink[6:]!r}" if sink and sink.startswith("write:") else f"sink {sink!r} batch {batch_id}"
    )
    when = _dt.datetime.fromtimestamp(result.committed_at / 1000, _dt.UTC).isoformat(timespec="seconds")
    log.warning(
        "lonnymq: %s was already committed to queue %r at %s (%d messages): skipped, nothing enqueued"
        " (server %s, schema %s)",
        what,
        target.queue,
        when,
        result.messages,
        describe_dsn(target.dsn),
        target.schema,
    )


def abort(target: Target, run: str, messages: list[Any]) -> None:
    parts = [m.part for m in messages if isinstance(m, Staged) and m.rows > 0]
    with target.connect() as conn:
        target.call(conn, "spark_write_abort", "%s::uuid, %s::bigint[]", (run, parts))
        conn.commit()


def commit_shards(
    targets: tuple[Target, ...],
    run: str,
    messages: list[Any],
    on_conflict: str,
    sink: str | None,
    batch_id: int | None,
    retention_ms: int,
    content_type: str | None,
) -> list[CommitResult]:
    """:func:`commit` on the queue's server, or, for a partitioned queue, on every partition's
    shard, each with the parts staged there. Each shard's ``spark_write_commit`` runs in its own
    transaction, in partition order, and those transactions are left open; only once every
    shard's succeeded do they end. So an error of a shard's publish (a key conflict with
    ``onConflict=error``, a payload over a limit, lost staging, the queue moved away, the shard
    unreachable when its turn comes) rolls back every shard's: the write enqueues nothing
    anywhere, and Spark's abort drops its staging.

    How they end: when every shard of the write allows prepared transactions
    (``max_prepared_transactions > 0``), by a two-phase commit (:func:`_two_phase`): atomic
    across the shards, a crash at any point is resolved by the next run of the same write id or
    sink batch (:func:`_recover`, which runs before anything else here). Otherwise (a warning
    says so, once per write) they are committed one after another, as before: if a shard fails
    between the COMMITs, the shards before it stay committed, and a rerun with the same write id
    or sink batch skips them and commits the rest. The open transactions hold each shard's
    locks of the publish (its keyed rows, and staging's when truncated) until every shard has
    published."""
    staged = [m for m in _staged(messages) if m.rows > 0]
    prefix = gid_prefix(targets[0], run, sink)
    with ExitStack() as stack:
        conns = [stack.enter_context(t.connect(autocommit=True)) for t in targets]
        two_phase = len(targets) > 1 and _recover(targets, conns, prefix)[0]
        if len(targets) > 1 and not two_phase:
            log.warning(
                "lonnymq: a shard of queue %r allows no prepared transactions (max_prepared_transactions"
                " = 0): this write commits its %d shards one after another, not atomically (docs/spark.md,"
                " Sharded setups)",
                targets[0].queue,
                len(targets),
            )
        opened: list[CommitResult] = []
        for i, (t, conn) in enumerate(zip(targets, conns, strict=True)):
            parts = [m for m in staged if m.target == i]
            conn.autocommit = False
            t.hold(conn)  # on a shard: behind the move fence (QueueNotFound if it moved away)
            if two_phase:  # a prepared transaction cannot have notified, nor should it truncate
                conn.execute(_DEFERRED)
            [row] = t.call(
                conn,
                "spark_write_commit",
                "%s::text, %s::uuid, %s::bigint[], %s::bigint[], %s::text, %s::text, %s::bigint,"
                " %s::bigint, p_content_type => %s::text",
                (
                    t.queue,
                    run,
                    [m.part for m in parts],
                    [m.rows for m in parts],
                    on_conflict,
                    sink,
                    batch_id,
                    retention_ms,
                    content_type,
                ),
            )
            created, updated, ignored, duplicate, committed_at, count = row
            opened.append(
                CommitResult(
                    int(created), int(updated), int(ignored), bool(duplicate), int(committed_at), int(count)
                )
            )  # its transaction left open until every shard's ran
        if two_phase:
            _two_phase(targets, conns, f"{prefix}{batch_id or 0}/")
            for t, conn, result in zip(targets, conns, opened, strict=True):
                if result.created or result.updated:
                    _notify(t, conn)
        else:
            for conn in conns:
                conn.commit()
    for t, result in zip(targets, opened, strict=True):
        _log_replay(t, result, sink, batch_id)
    return opened


# -- two-phase commit across shards --------------------------------------------------------------

#: The start of the global transaction id of every transaction the writer prepares:
#: ``lonnymq/spark/<queue>/<write>/<batch>/<partition>/<xid>`` (:func:`gid_prefix`).
GID_PREFIX = "lonnymq/spark/"

#: A publish to be prepared: no wake-up (a transaction that notified cannot be prepared: the
#: writer notifies after COMMIT PREPARED) and no truncate of staging (its lock would be held
#: while the transaction is prepared, stopping every write's staging there): sql/wait.sql,
#: sql/spark.sql.
_DEFERRED = (
    "SELECT set_config('lonnymq.wake', 'deferred', true), set_config('lonnymq.spark_unstage', 'delete', true)"
)

#: A fault injected by tests at a step of :func:`_two_phase`: called with ("prepare", k) before
#: partition k's PREPARE, ("prepared", n) once all n shards have prepared, and ("committed", k)
#: after partition k's COMMIT PREPARED.
_fault: Callable[[str, int], None] | None = None


class WriteInDoubt(errors.LonnyMQError):
    """A write's two-phase commit could not be finished: some of its shards' transactions are
    still prepared. A rerun of the same write id or sink batch finishes them (commits them if
    partition 0's committed, else rolls them back), as does :func:`resolve_in_doubt`."""


def gid_prefix(target: Target, run: str, sink: str | None) -> str:
    """The start of the gid of every transaction a write prepares: the queue, then a hash of the
    schema, queue and write id or sink (of the run without one: no rerun has the same), so a
    rerun of the write (or the replay of any batch of the sink) finds them."""
    ident = f"{target.schema}\0{target.queue}\0{sink if sink is not None else 'run:' + run}"
    return f"{GID_PREFIX}{target.queue}/{hashlib.sha256(ident.encode()).hexdigest()[:16]}/"


def _gid(prefix: str, k: int, xid0: str) -> str:
    return f"{prefix}{k}/{xid0}"


def _probe(conn: Any, prefix: str, min_age: float = 0.0) -> tuple[int, list[str]]:
    """A shard's max_prepared_transactions and the gids prepared in its database that start
    with ``prefix`` (and were prepared at least ``min_age`` seconds ago)."""
    row = conn.execute(
        "SELECT current_setting('max_prepared_transactions')::int, ARRAY(SELECT p.gid FROM"
        " pg_catalog.pg_prepared_xacts p WHERE p.database = current_database()"
        " AND starts_with(p.gid, %s) AND p.prepared <= now() - make_interval(secs => %s)"
        " ORDER BY p.gid)",
        (prefix, min_age),
    ).fetchone()
    return int(row[0]), list(row[1])


def _finish(conn: Any, gid: str, commit: bool) -> bool:
    """COMMIT or ROLLBACK PREPARED ``gid`` on ``conn`` (autocommit); False if no such prepared
    transaction is left (another run resolved it)."""
    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    try:
        conn.execute(sql.SQL(verb).format(sql.Literal(gid)))
    except psycopg.errors.UndefinedObject:
        return False
    return True


def _decision(conn0: Any, xid0: str) -> str | None:
    """What became of partition 0's transaction (the decision of the write): 'committed',
    'aborted', 'in progress' (still prepared), or None (too old for the server to know)."""
    row = conn0.execute("SELECT pg_xact_status(%s::xid8)", (xid0,)).fetchone()
    return None if row is None else row[0]


def _recover(
    targets: tuple[Target, ...], conns: list[Any], prefix: str, min_age: float = 0.0
) -> tuple[bool, list[Resolved]]:
    """Before a multi-shard commit: whether every shard allows prepared transactions, after
    resolving what an earlier run of the same write (same write id or sink; any batch) left
    prepared (``prefix``: :func:`gid_prefix`; a queue's :data:`GID_PREFIX` resolves every
    write's, :func:`resolve_in_doubt`). Partition 0's COMMIT PREPARED is the write's decision:
    a transaction of the write still prepared on partition 0's shard is rolled back (no decision
    was made, so none will be), then every other shard's follows partition 0's: committed if it
    committed, else rolled back."""
    probes = [_probe(conn, prefix, min_age) for conn in conns]
    left: dict[tuple[str, str], dict[int, str]] = {}  # (write/batch, xid0) -> partition -> gid
    for k, (_, gids) in enumerate(probes):
        for gid in gids:
            write, part, xid0 = gid.rsplit("/", 2)
            if int(part) == k:  # a shard holding two partitions lists both
                left.setdefault((write, xid0), {})[k] = gid
    done = [_resolve(targets, conns, found, xid0) for (_, xid0), found in sorted(left.items())]
    return all(mpt > 0 for mpt, _ in probes), done


@dataclass(frozen=True)
class Resolved:
    """A write's prepared transactions that :func:`_recover` finished, and how."""

    gids: list[str]
    committed: bool  # else rolled back


def _resolve(targets: tuple[Target, ...], conns: list[Any], gids: Mapping[int, str], xid0: str) -> Resolved:
    """Finish one write's prepared transactions ``gids`` (partition -> gid) as partition 0's
    decided (:func:`_recover`)."""
    if 0 in gids:
        _finish(conns[0], gids[0], commit=False)
    decision = _decision(conns[0], xid0)
    if decision not in ("committed", "aborted"):
        raise WriteInDoubt(
            f"lonnymq: prepared transactions {sorted(gids.values())} of queue {targets[0].queue!r}:"
            f" partition 0's transaction {xid0} is {decision or 'unknown to its server'}; resolve them"
            " by hand (COMMIT PREPARED or ROLLBACK PREPARED on each shard; docs/spark.md)"
        )
    for k, gid in sorted(gids.items()):
        if k:
            _finish(conns[k], gid, commit=decision == "committed")
    log.warning(
        "lonnymq: an earlier run of this write to queue %r left prepared transactions %s: %s",
        targets[0].queue,
        sorted(gids.values()),
        "committed (partition 0's had)" if decision == "committed" else "rolled back",
    )
    return Resolved(sorted(gids.values()), decision == "committed")


def _two_phase(targets: tuple[Target, ...], conns: list[Any], prefix: str) -> None:
    """End the open publish transactions ``conns`` by a two-phase commit: PREPARE TRANSACTION on
    every shard, in partition order, each named after the write, its partition and partition
    0's transaction id; then COMMIT PREPARED on partition 0's shard, which decides the write;
    then on the others. A failure before the decision rolls back every shard's (what a crash
    leaves prepared, the next run rolls back); after it, a shard whose connection failed is
    committed again over a new connection, and if that fails too, :class:`WriteInDoubt` (what
    is left prepared, the next run commits)."""
    [(xid0,)] = conns[0].execute("SELECT pg_current_xact_id()::text").fetchall()
    gids = [_gid(prefix, k, xid0) for k in range(len(conns))]
    prepared = 0
    try:
        for k, (conn, gid) in enumerate(zip(conns, gids, strict=True)):
            if _fault:
                _fault("prepare", k)
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
            prepared += 1
            conn.autocommit = True
        if _fault:
            _fault("prepared", len(conns))
    except Exception as e:
        # A connection lost in its PREPARE may have prepared: roll that one back too if it did.
        lost = prepared < len(conns) and isinstance(e, psycopg.OperationalError)
        for k in range(prepared + lost):
            _settle(targets[k], conns[k], gids[k], commit=False)
        raise
    try:
        decided = _finish(conns[0], gids[0], commit=True)
        failure: Exception | None = None
    except psycopg.Error as e:  # committed or not? Partition 0's server knows.
        decided, failure = False, e
    if not decided and not _decided_after_all(targets, gids[0], xid0):
        for k in range(1, len(conns)):
            _settle(targets[k], conns[k], gids[k], commit=False)
        if failure is not None:
            raise failure
        raise WriteInDoubt(f"lonnymq: {gids[0]} was rolled back by another run before its commit")
    if _fault:
        _fault("committed", 0)
    failed = []
    for k in range(1, len(conns)):
        if not _settle(targets[k], conns[k], gids[k], commit=True):
            failed.append(gids[k])
        elif _fault:
            _fault("committed", k)
    if failed:
        raise WriteInDoubt(
            f"lonnymq: the write to queue {targets[0].queue!r} is committed on partition 0's shard but"
            f" {failed} are still prepared: rerun it with the same write id or sink batch, or run"
            " lonnymq.spark.resolve_in_doubt (docs/spark.md)"
        )


def _decided_after_all(targets: tuple[Target, ...], gid0: str, xid0: str) -> bool:
    """After partition 0's COMMIT PREPARED failed or found nothing to commit: whether it is
    committed, asked over a new connection (its transaction, if still prepared, rolled back
    first: then no decision was made, and none will be). WriteInDoubt if the server cannot be
    reached (every transaction of the write stays prepared, for the next run)."""
    try:
        with targets[0].connect(autocommit=True) as conn0:
            _finish(conn0, gid0, commit=False)
            return _decision(conn0, xid0) == "committed"
    except (psycopg.Error, ConnectFailed) as e:
        raise WriteInDoubt(
            f"lonnymq: the commit of {gid0} failed and its server cannot say whether it happened ({e}):"
            " the write's transactions stay prepared; rerun it with the same write id or sink batch,"
            " or run lonnymq.spark.resolve_in_doubt (docs/spark.md)"
        ) from e


def _settle(target: Target, conn: Any, gid: str, commit: bool) -> bool:
    """:func:`_finish` of ``gid``, again over a new connection if ``conn``'s failed; False if
    both failed (it stays prepared)."""
    for attempt in range(2):
        try:
            if attempt == 0:
                _finish(conn, gid, commit)
            else:
                with target.connect(autocommit=True) as fresh:
                    _finish(fresh, gid, commit)
            return True
        except (psycopg.Error, ConnectFailed) as e:
            log.warning("lonnymq: %s PREPARED %s failed: %s", "COMMIT" if commit else "ROLLBACK", gid, e)
    return False


def _notify(target: Target, conn: Any) -> None:
    """Wake the queue's consumers on a shard after its COMMIT PREPARED (the publish deferred it)."""
    try:
        conn.execute("SELECT pg_notify(%s, %s)", (target.schema, target.queue))
    except psycopg.Error as e:  # committed already: a consumer's next poll finds the messages
        log.warning("lonnymq: waking queue %r's consumers on a shard failed: %s", target.queue, e)


def resolve_in_doubt(dsn: str, *, schema: str = DEFAULT_SCHEMA, min_age: float = 60.0) -> list[Resolved]:
    """Finish every Spark write's transactions left prepared on the shards of router ``dsn``
    (or on server ``dsn``) at least ``min_age`` seconds ago, as a rerun of each write would
    (:func:`_recover`): committed where the write's partition 0 committed, else rolled back.
    For writes no rerun will resolve: those without a write id, a stream not restarted. Run it
    as the role that wrote (or a superuser: only they may finish a prepared transaction).
    ``min_age`` keeps it off writes still committing (a live write's transactions are
    prepared for milliseconds)."""
    home = Target(dsn, check_schema(schema), "lonnymq")
    ops = Ops(home.schema)
    with home.connect(autocommit=True) as conn:
        servers = [dsn]
        if run_op(conn, ops.is_router()):
            shards = ShardMap(home.schema, ops.st)
            shards.load(*run_op(conn, shards.map_op()))
            servers = [shards.conninfo(i, dsn) for i in range(len(shards.shards))]
    queues: set[str] = set()
    for server in servers:
        with replace(home, dsn=server).connect(autocommit=True) as conn:
            queues |= {gid.split("/")[2] for gid in _probe(conn, GID_PREFIX, min_age)[1]}
    done: list[Resolved] = []
    for queue in sorted(queues):
        targets = replace(home, queue=queue).placed()
        with ExitStack() as stack:
            conns = [stack.enter_context(t.connect(autocommit=True)) for t in targets]
            done += _recover(targets, conns, f"{GID_PREFIX}{queue}/", min_age)[1]
    return done


def abort_shards(targets: tuple[Target, ...], run: str, messages: list[Any]) -> None:
    """:func:`abort` on every server of the write (:func:`commit_shards`)."""
    staged = _staged(messages)
    for i, t in enumerate(targets):
        abort(t, run, [m for m in staged if m.target == i])


def retention_ms(options: Mapping[str, str]) -> int:
    """``writeIdRetention`` (seconds, default 7 days): how long a committed write id or sink
    batch is remembered (reruns within it are no-ops; maintain() forgets it after)."""
    return round(float_option(options, "writeIdRetention", 7 * 86400.0) * 1000)


def _writer_checks(targets: tuple[Target, ...]) -> None:
    """Fail at planning, with a clear error, if the queue or the Spark migration is missing."""
    for target in targets:
        with target.connect(autocommit=True) as conn:
            target.call(conn, "spark_queue_check", "%s::text", (target.queue,))


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("lonnymq").mode("append")``: enqueue a DataFrame exactly once.

    With ``writeId``, the write is also idempotent across jobs: a second job with the same id
    (e.g. a rerun after the first one's commit succeeded but the driver died) enqueues nothing.

    Given a shard router, it writes straight to the queue's shard; to a partitioned queue, each
    row to its partition's shard (:func:`stage_shards`), published on every shard before any
    commits (:func:`commit_shards`: a two-phase commit where the shards allow it).
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.targets = self.target.placed()
        self.plan = Plan.build(schema, options)
        self.retention_ms = retention_ms(options)
        # Pickled once: the same in every task and in commit/abort.
        self.run = str(uuid.uuid4())
        write_id = option(options, "writeId")
        self.sink = None if write_id is None else f"write:{write_id}"
        _writer_checks(self.targets)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged | StagedShards:
        return stage_shards(self.targets, self.plan, self.run, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_shards(
            self.targets,
            self.run,
            list(messages),
            self.plan.on_conflict,
            self.sink,
            None if self.sink is None else 0,
            self.retention_ms,
            self.plan.content_type,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_shards(self.targets, self.run, list(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("lonnymq")``: each micro-batch is enqueued exactly once, also when
    Spark replays it after a restart from the same checkpoint.

    The sink's identity is ``sinkId`` if given, else the streaming query id (stable across
    restarts from one checkpoint, new for a new checkpoint). Keep ``sinkId`` unique per query
    and per checkpoint: batches of a reused sink id at or below its last commit are skipped.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.targets = self.target.placed()
        self.plan = Plan.build(schema, options)
        self.retention_ms = retention_ms(options)
        self.sink_id = option(options, "sinkId")
        _writer_checks(self.targets)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged | StagedShards:
        ctx = TaskContext.get()
        assert ctx is not None
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if batch is None or (query is None and not self.sink_id):
            raise errors.InvalidArgument("lonnymq: no streaming query/batch id in this task; give sinkId")
        sink = self.sink_id or f"query:{query}"
        run = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lonnymq-sink:{sink}:{batch}"))
        return stage_shards(self.targets, self.plan, run, iterator, sink)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = _staged(list(messages))
        if not staged:
            return
        commit_shards(
            self.targets,
            staged[0].run,
            list(staged),
            self.plan.on_conflict,
            staged[0].sink,
            batchId,
            self.retention_ms,
            self.plan.content_type,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = _staged(list(messages))
        if staged:
            abort_shards(self.targets, staged[0].run, staged)
