"""Writing DataFrames and streams into a queue, exactly once.

Tasks never write to the queue. Each task attempt COPYs its rows into ``spark_stage`` under a
fresh random part id (registered with the write's run id in the same transaction) and reports
``(part, rows)`` to the driver. The driver's commit moves exactly the reported parts into the
queue in one PostgreSQL transaction, through the core ``send_batch`` (every send rule applies:
payload limits, priorities, keys), and deletes everything the run staged, including the parts
of failed or duplicate task attempts that Spark never reported. So a retried task cannot
duplicate messages, a failed job enqueues nothing, and abort plus a sweeper clear leftovers.
Streaming writes add a commit record per (sink, batch) in that same transaction, so a batch
Spark replays after a restart is skipped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import logging
import math
import secrets
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from psycopg import sql
from psycopg.types.json import set_json_dumps
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
from ..client.ops import check_text
from ..models import JSON, TEXT
from ._conf import Target, choice_option, describe_dsn, float_option, option

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

    def copy_columns(self) -> list[tuple[str, str]]:
        """(staging column, type) written for this plan, after part and seq."""
        cols = [("payload", "bytea"), ("content_type", "text")]
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


class Encoder:
    """Arrow batches -> staging rows (part, seq, payload, content_type, ...)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.ctype = {"text": TEXT, "json_text": JSON, "binary": None, "json": JSON, "row_json": JSON}[
            plan.mode
        ]

    def payloads(self, batch: pa.RecordBatch) -> list[bytes]:
        plan = self.plan
        if plan.mode == "row_json":
            rows = batch.select(list(plan.row_columns)).to_pylist(maps_as_pydicts="strict")
            return [_dumps(r) for r in rows]
        values: list[Any] = batch.column(plan.payload).to_pylist(maps_as_pydicts="strict")
        if None in values:
            raise errors.InvalidArgument(f"column {plan.payload!r}: a row has a null payload")
        if plan.mode == "text":
            return [v.encode() for v in values]
        if plan.mode == "binary":
            return values
        if plan.mode == "json":
            return [_dumps(v) for v in values]
        out = []
        for v in values:  # json_text: the text must be JSON, or consumers could not decode it
            try:
                json.loads(v)
            except ValueError as e:
                raise errors.InvalidArgument(
                    f"column {plan.payload!r} is not JSON: {e}: {v[:80]!r}"
                ) from None
            out.append(v.encode())
        return out

    def column(self, batch: pa.RecordBatch, name: str) -> list[Any]:
        plan = self.plan
        col = plan.columns[name]
        arr = batch.column(col)
        if name == "at":
            ints = arr.cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()
            return [None if v is None else v // 1000 for v in ints]
        values: list[Any] = arr.to_pylist(maps_as_pydicts="strict")
        if name in ("kind", "key", "channel"):
            limit = _KIND_MAX if name == "kind" else _KEY_MAX
            for v in values:
                check_text(v, f"column {col!r} ({name})", limit)
            return values
        if name == "headers":
            headers: list[dict[str, Any] | None] = []
            for v in values:
                try:
                    h = json.loads(v) if plan.headers_string and v is not None else v
                except ValueError:
                    h = v  # not JSON: refused just below
                if h is not None and not (isinstance(h, dict) and all(isinstance(k, str) for k in h)):
                    raise errors.InvalidArgument(f"column {col!r}: headers must be a JSON object")
                headers.append(h)
            return headers
        if name == "priority":
            for v in values:
                if v is not None and not -100 <= v <= 100:
                    raise errors.InvalidArgument(f"column {col!r}: priority {v} is outside -100..100")
            return values
        if name == "delay":
            delays: list[int | None] = []
            for v in values:
                if v is None:
                    delays.append(None)
                    continue
                f = float(v)
                if not math.isfinite(f) or f < 0:
                    raise errors.InvalidArgument(f"column {col!r}: delay must be finite and >= 0, got {v}")
                delays.append(round(f * 1000))
            return delays
        raise AssertionError(name)

    def rows(self, batch: pa.RecordBatch, part: int, seq: int) -> Iterator[tuple[Any, ...]]:
        n = batch.num_rows
        cols: list[list[Any]] = [self.payloads(batch), [self.ctype] * n]
        names = [c for c, _ in self.plan.copy_columns()[2:]]
        meta = {"at_ms": "at", "delay_ms": "delay"}
        for c in names:
            cols.append(self.column(batch, meta.get(c, c)))
        if "at" in self.plan.columns and "delay" in self.plan.columns:
            at, delay = cols[2 + names.index("at_ms")], cols[2 + names.index("delay_ms")]
            if any(a is not None and d is not None for a, d in zip(at, delay, strict=True)):
                raise errors.InvalidArgument("a row gives both delay and at: give one")
        for i, values in enumerate(zip(*cols, strict=True)):
            yield (part, seq + i, *values)


# -- staging and commit --------------------------------------------------------------------------


@dataclass
class Staged(WriterCommitMessage):
    """What one task attempt staged: ``rows`` rows under ``part`` (0 rows: nothing staged)."""

    run: str
    part: int
    rows: int
    sink: str | None = None


def stage(
    target: Target, plan: Plan, run: str, batches: Iterator[pa.RecordBatch], sink: str | None = None
) -> Staged:
    """COPY a task's rows into staging in one transaction; nothing is visible to the commit
    unless the whole task's rows are."""
    encoder = Encoder(plan)
    cols = plan.copy_columns()
    copy = sql.SQL("COPY {}.spark_stage (part, seq, {}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(target.schema), sql.SQL(", ").join(sql.Identifier(c) for c, _ in cols)
    )
    register = sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (%s, %s, %s)").format(
        sql.Identifier(target.schema)
    )
    part = secrets.randbits(62) + 1
    n = 0
    first = next(batches, None)
    if first is None:
        return Staged(run, 0, 0, sink)
    with target.connect() as conn:
        # Headers from structs may hold dates or decimals: dump them like payloads.
        set_json_dumps(_json_text, context=conn)
        conn.execute(register, (part, run, target.queue))
        with conn.cursor() as cur, cur.copy(copy) as cp:
            cp.set_types(["int8", "int4", *(t for _, t in cols)])
            batch: pa.RecordBatch | None = first
            while batch is not None:
                for row in encoder.rows(batch, part, n):
                    cp.write_row(row)
                n += batch.num_rows
                batch = next(batches, None)
        conn.commit()
    return Staged(run, part, n, sink)


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
) -> CommitResult:
    """Move the reported parts into the queue in one transaction (see ``spark_write_commit``).
    A replay of a committed sink batch or write id enqueues nothing and is logged."""
    staged = [m for m in messages if isinstance(m, Staged) and m.rows > 0]
    with target.connect() as conn:
        [row] = target.call(
            conn,
            "spark_write_commit",
            "%s::text, %s::uuid, %s::bigint[], %s::bigint[], %s::text, %s::text, %s::bigint, %s::bigint",
            (
                target.queue,
                run,
                [m.part for m in staged],
                [m.rows for m in staged],
                on_conflict,
                sink,
                batch_id,
                retention_ms,
            ),
        )
        conn.commit()
    created, updated, ignored, duplicate, committed_at, count = row
    result = CommitResult(
        int(created), int(updated), int(ignored), bool(duplicate), int(committed_at), int(count)
    )
    if result.duplicate:
        what = (
            f"write id {sink[6:]!r}"
            if sink and sink.startswith("write:")
            else f"sink {sink!r} batch {batch_id}"
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
    return result


def abort(target: Target, run: str, messages: list[Any]) -> None:
    parts = [m.part for m in messages if isinstance(m, Staged) and m.rows > 0]
    with target.connect() as conn:
        target.call(conn, "spark_write_abort", "%s::uuid, %s::bigint[]", (run, parts))
        conn.commit()


def retention_ms(options: Mapping[str, str]) -> int:
    """``writeIdRetention`` (seconds, default 7 days): how long a committed write id or sink
    batch is remembered (reruns within it are no-ops; maintain() forgets it after)."""
    return round(float_option(options, "writeIdRetention", 7 * 86400.0) * 1000)


def _writer_checks(target: Target) -> None:
    """Fail at planning, with a clear error, if the queue or the Spark migration is missing."""
    with target.connect(autocommit=True) as conn:
        target.call(conn, "spark_queue_check", "%s::text", (target.queue,))


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("lonnymq").mode("append")``: enqueue a DataFrame exactly once.

    With ``writeId``, the write is also idempotent across jobs: a second job with the same id
    (e.g. a rerun after the first one's commit succeeded but the driver died) enqueues nothing.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.plan = Plan.build(schema, options)
        self.retention_ms = retention_ms(options)
        # Pickled once: the same in every task and in commit/abort.
        self.run = str(uuid.uuid4())
        write_id = option(options, "writeId")
        self.sink = None if write_id is None else f"write:{write_id}"
        _writer_checks(self.target)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        return stage(self.target, self.plan, self.run, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit(
            self.target,
            self.run,
            list(messages),
            self.plan.on_conflict,
            self.sink,
            None if self.sink is None else 0,
            self.retention_ms,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort(self.target, self.run, list(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("lonnymq")``: each micro-batch is enqueued exactly once, also when
    Spark replays it after a restart from the same checkpoint.

    The sink's identity is ``sinkId`` if given, else the streaming query id (stable across
    restarts from one checkpoint, new for a new checkpoint). Keep ``sinkId`` unique per query
    and per checkpoint: batches of a reused sink id at or below its last commit are skipped.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, conf: Mapping[str, str]) -> None:
        self.target = Target.from_options(options, conf)
        self.plan = Plan.build(schema, options)
        self.retention_ms = retention_ms(options)
        self.sink_id = option(options, "sinkId")
        _writer_checks(self.target)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        ctx = TaskContext.get()
        assert ctx is not None
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if batch is None or (query is None and not self.sink_id):
            raise errors.InvalidArgument("lonnymq: no streaming query/batch id in this task; give sinkId")
        sink = self.sink_id or f"query:{query}"
        run = str(uuid.uuid5(uuid.NAMESPACE_URL, f"lonnymq-sink:{sink}:{batch}"))
        return stage(self.target, self.plan, run, iterator, sink)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = [m for m in messages if isinstance(m, Staged)]
        if not staged:
            return
        commit(
            self.target,
            staged[0].run,
            list(staged),
            self.plan.on_conflict,
            staged[0].sink,
            batchId,
            self.retention_ms,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = [m for m in messages if isinstance(m, Staged)]
        if staged:
            abort(self.target, staged[0].run, list(staged))
