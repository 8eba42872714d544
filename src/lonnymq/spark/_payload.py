"""Typed payloads: JSON payloads decoded into Spark types on read (``payloadSchema``), and the
time bounds of pushed-down filters.

Decoding follows Spark's JSON reader where it is exact and refuses where it would guess: a
field missing from the JSON object, or JSON null, is null; a value of the wrong JSON type, a
number that does not fit the column (an int out of range, a decimal needing rounding), an
unparsable timestamp or a payload that is not a JSON object is a *mismatch*. A mismatched row
gets a null payload and its raw text in ``_corrupt`` (``mode`` PERMISSIVE, the default) or
fails the task with the message id and the field (``mode`` FAILFAST) — never a silent null.
Decimals are read exactly (from JSON numbers or strings, as lonnymq's serializer writes
them); timestamps from ISO 8601 strings (a string without offset is UTC).
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import decimal
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
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
from ._conf import option

CORRUPT = "_corrupt"
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_INT_RANGE = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


def payload_ddl(options: Mapping[str, str]) -> str | None:
    """The ``payloadSchema`` option as a Spark DDL type: a field list (``"a long, b string"``)
    becomes ``struct<...>``; a ``StructType`` JSON (``df.schema.json()``) is converted."""
    raw = option(options, "payloadSchema")
    if raw is None:
        return None
    text = raw.strip()
    if text.startswith("{"):
        try:
            dtype = StructType.fromJson(json.loads(text))
        except (ValueError, KeyError, TypeError) as e:
            raise errors.InvalidArgument(f"option payloadSchema is not a StructType JSON: {e}") from None
        return ddl(dtype)
    if not text:
        raise errors.InvalidArgument("option payloadSchema is empty")
    if text.lower().startswith("struct<"):
        return text
    return f"struct<{text}>"


def ddl(dtype: DataType) -> str:
    """A Spark DDL type string for ``dtype``, field names quoted."""
    if isinstance(dtype, StructType):
        fields = ", ".join(
            f"`{f.name.replace('`', '``')}`: {ddl(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
            for f in dtype.fields
        )
        return f"struct<{fields}>"
    if isinstance(dtype, ArrayType):
        return f"array<{ddl(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"map<{ddl(dtype.keyType)}, {ddl(dtype.valueType)}>"
    return dtype.simpleString()


class Mismatch(Exception):
    """A JSON value does not fit the payload schema at ``path``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or '$'}: {message}")


Convert = Callable[[Any, str], Any]


def converter(dtype: DataType) -> Convert:
    """A function (JSON value, path) -> the value pyarrow builds ``dtype`` from; raises
    :class:`Mismatch`. Maps come out as lists of (key, value) pairs."""

    def fail(v: Any, path: str) -> Mismatch:
        return Mismatch(path, f"expected {dtype.simpleString()}, got {json.dumps(v, default=str)[:60]}")

    if isinstance(dtype, StringType):

        def conv(v: Any, path: str) -> Any:
            if isinstance(v, str):
                return v
            raise fail(v, path)

    elif isinstance(dtype, BooleanType):

        def conv(v: Any, path: str) -> Any:
            if isinstance(v, bool):
                return v
            raise fail(v, path)

    elif isinstance(dtype, (ByteType, ShortType, IntegerType, LongType)):
        bits = _INT_RANGE[type(dtype)]

        def conv(v: Any, path: str) -> Any:
            if isinstance(v, decimal.Decimal) and v == v.to_integral_value():
                v = int(v)
            if isinstance(v, int) and not isinstance(v, bool) and -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
                return v
            raise fail(v, path)

    elif isinstance(dtype, (FloatType, DoubleType)):

        def conv(v: Any, path: str) -> Any:
            if isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool):
                return float(v)
            raise fail(v, path)

    elif isinstance(dtype, DecimalType):
        quantum = decimal.Decimal(1).scaleb(-dtype.scale)
        limit = decimal.Decimal(10) ** (dtype.precision - dtype.scale)

        def conv(v: Any, path: str) -> Any:
            try:
                d = decimal.Decimal(v) if isinstance(v, (str, int, decimal.Decimal)) else None
            except decimal.InvalidOperation:
                d = None
            if d is None or isinstance(v, bool) or not d.is_finite():
                raise fail(v, path)
            q = d.quantize(quantum, context=decimal.Context(prec=100))
            if q != d or abs(q) >= limit:
                raise Mismatch(path, f"{v} does not fit {dtype.simpleString()} exactly")
            return q

    elif isinstance(dtype, (TimestampType, TimestampNTZType)):
        ntz = isinstance(dtype, TimestampNTZType)

        def conv(v: Any, path: str) -> Any:
            try:
                t = _dt.datetime.fromisoformat(v) if isinstance(v, str) else None
            except ValueError:
                t = None
            if t is None:
                raise fail(v, path)
            if ntz:
                return (
                    t.replace(tzinfo=None) if t.tzinfo is None else t.astimezone(_dt.UTC).replace(tzinfo=None)
                )
            return t if t.tzinfo is not None else t.replace(tzinfo=_dt.UTC)

    elif isinstance(dtype, DateType):

        def conv(v: Any, path: str) -> Any:
            try:
                if isinstance(v, str):
                    return _dt.date.fromisoformat(v)
            except ValueError:
                pass
            raise fail(v, path)

    elif isinstance(dtype, BinaryType):

        def conv(v: Any, path: str) -> Any:
            try:
                if isinstance(v, str):
                    return base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                pass
            raise fail(v, path)

    elif isinstance(dtype, ArrayType):
        item = converter(dtype.elementType)
        nulls = dtype.containsNull

        def conv(v: Any, path: str) -> Any:
            if not isinstance(v, list):
                raise fail(v, path)
            return [_nullable(item, x, f"{path}[{i}]", nulls) for i, x in enumerate(v)]

    elif isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType):
        value = converter(dtype.valueType)
        nulls = dtype.valueContainsNull

        def conv(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                raise fail(v, path)
            return [(k, _nullable(value, x, f"{path}.{k}", nulls)) for k, x in v.items()]

    elif isinstance(dtype, StructType):
        fields = [(f.name, converter(f.dataType), f.nullable) for f in dtype.fields]

        def conv(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                raise fail(v, path)
            return {name: _nullable(c, v.get(name), f"{path}.{name}", n) for name, c, n in fields}

    else:
        raise errors.InvalidArgument(f"payloadSchema: lonnymq cannot decode JSON into {dtype.simpleString()}")
    return conv


def _nullable(conv: Convert, v: Any, path: str, nullable: bool) -> Any:
    if v is None:
        if not nullable:
            raise Mismatch(path, "null in a NOT NULL field")
        return None
    return conv(v, path)


class PayloadDecoder:
    """Decodes JSON payload bodies into ``dtype`` (see the module docstring)."""

    def __init__(self, dtype: DataType, *, failfast: bool) -> None:
        self.convert = converter(dtype)
        self.failfast = failfast

    def decode(self, body: bytes) -> Any:
        try:
            value = json.loads(body, parse_float=decimal.Decimal)
        except (ValueError, UnicodeDecodeError) as e:
            raise Mismatch("$", f"not JSON ({e})") from None
        return self.convert(value, "$")

    def decode_all(
        self, bodies: Sequence[bytes | None], queues: Sequence[str], ids: Sequence[int]
    ) -> tuple[list[Any], list[str | None]]:
        """(payload values, _corrupt texts) for a batch of rows."""
        values: list[Any] = []
        corrupt: list[str | None] = []
        for body, queue, id_ in zip(bodies, queues, ids, strict=True):
            if body is None:
                values.append(None)
                corrupt.append(None)
                continue
            try:
                values.append(self.decode(body))
                corrupt.append(None)
            except Mismatch as e:
                if self.failfast:
                    raise errors.InvalidArgument(
                        f"lonnymq (mode FAILFAST): message {id_} of queue {queue!r} does not match"
                        f" payloadSchema at {e}"
                    ) from None
                values.append(None)
                corrupt.append(bytes(body).decode("utf-8", "replace"))
        return values, corrupt


def _us(value: Any) -> int | None:
    """Microseconds since the epoch of a pushed-down timestamp literal (naive = UTC)."""
    if isinstance(value, _dt.datetime):
        t = value if value.tzinfo is not None else value.replace(tzinfo=_dt.UTC)
        return (t - _EPOCH) // _dt.timedelta(microseconds=1)
    return None


def to_ms_bounds(f: Filter) -> tuple[int | None, int | None] | None:
    """Inclusive epoch-ms bounds (lo, hi) on a column stored in ms that a comparison with a
    timestamp (microseconds) implies exactly, or None if ``f`` is not such a comparison."""
    us = _us(getattr(f, "value", None))
    if us is None:
        return None
    floor, ceil = us // 1000, -(-us // 1000)
    if isinstance(f, EqualTo):
        return ceil, floor
    if isinstance(f, GreaterThan):
        return floor + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return ceil, None
    if isinstance(f, LessThan):
        return None, ceil - 1
    if isinstance(f, LessThanOrEqual):
        return None, floor
    return None
