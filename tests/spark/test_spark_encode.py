"""How the Spark writer turns DataFrame columns into staged messages: pure Python (PySpark's
types and Arrow, no JVM)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

pytest.importorskip("pyspark")
import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lonnymq import errors
from lonnymq.spark._write import Encoder, Plan


def encode(
    fields: list[tuple[str, Any]], columns: dict[str, pa.Array], **options: str
) -> list[dict[str, Any]]:
    schema = StructType([StructField(n, t) for n, t in fields])
    plan = Plan.build(schema, options)
    batch = pa.RecordBatch.from_pydict(columns)
    names = ["part", "seq", *(c for c, _ in plan.copy_columns())]
    # The content type is not staged: the commit gets it once per write (Plan.content_type).
    return [
        {**dict(zip(names, row, strict=True)), "content_type": plan.content_type}
        for row in Encoder(plan).rows(batch, 9, 100)
    ]


def test_all_columns_become_a_json_payload_and_meta_columns_are_taken_out() -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    rows = encode(
        [
            ("order_id", LongType()),
            ("when", DateType()),
            ("priority", IntegerType()),
            ("at", TimestampType()),
            ("channel", StringType()),
        ],
        {
            "order_id": pa.array([1, 2]),
            "when": pa.array([dt.date(2024, 6, 1), None]),
            "priority": pa.array([5, None], pa.int32()),
            "at": pa.array([at, None], pa.timestamp("us", tz="UTC")),
            "channel": pa.array(["eu", None]),
        },
    )
    assert [(r["part"], r["seq"]) for r in rows] == [(9, 100), (9, 101)]
    assert json.loads(rows[0]["payload"]) == {"order_id": 1, "when": "2024-06-01"}
    assert rows[0]["content_type"] == "application/json"
    assert rows[0]["at_ms"] == int(at.timestamp() * 1000) and rows[1]["at_ms"] is None
    assert (rows[0]["priority"], rows[0]["channel"], rows[1]["priority"]) == (5, "eu", None)


def test_payload_column_kinds() -> None:
    text = encode([("payload", StringType())], {"payload": pa.array(["héllo"])})
    assert (text[0]["payload"], text[0]["content_type"]) == ("héllo".encode(), "text/plain; charset=utf-8")
    js = encode([("payload", StringType())], {"payload": pa.array(['{"a":1}'])}, payloadFormat="json")
    assert (js[0]["payload"], js[0]["content_type"]) == (b'{"a":1}', "application/json")
    raw = encode([("payload", BinaryType())], {"payload": pa.array([b"\x00\x01"])})
    assert (raw[0]["payload"], raw[0]["content_type"]) == (b"\x00\x01", None)
    nested = encode(
        [("payload", MapType(StringType(), DoubleType()))],
        {"payload": pa.array([[("x", 1.5)]], pa.map_(pa.string(), pa.float64()))},
    )
    assert json.loads(nested[0]["payload"]) == {"x": 1.5}
    # A map inside the row: a JSON object too, not a list of pairs.
    inner = encode(
        [("n", LongType()), ("tags", MapType(StringType(), StringType()))],
        {"n": pa.array([1]), "tags": pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string()))},
    )
    assert json.loads(inner[0]["payload"]) == {"n": 1, "tags": {"k": "v"}}


def test_headers_from_maps_and_json_strings() -> None:
    rows = encode(
        [("payload", StringType()), ("headers", MapType(StringType(), StringType()))],
        {
            "payload": pa.array(["p"]),
            "headers": pa.array([[("trace", "t1")]], pa.map_(pa.string(), pa.string())),
        },
    )
    assert rows[0]["headers"] == {"trace": "t1"}
    rows = encode(
        [("payload", StringType()), ("headers", StringType())],
        {"payload": pa.array(["p", "q"]), "headers": pa.array(['{"a": [1]}', None])},
    )
    assert [r["headers"] for r in rows] == [{"a": [1]}, None]


@pytest.mark.parametrize(
    ("fields", "columns", "options", "match"),
    [
        ([("payload", StringType())], {"payload": pa.array(["ok", None])}, {}, "null payload"),
        (
            [("payload", StringType())],
            {"payload": pa.array(["{nope"])},
            {"payloadFormat": "json"},
            "is not JSON",
        ),
        (
            [("payload", StringType()), ("headers", StringType())],
            {"payload": pa.array(["p"]), "headers": pa.array(["[1, 2]"])},
            {},
            "headers must be a JSON object",
        ),
        (
            [("payload", StringType()), ("headers", StringType())],
            {"payload": pa.array(["p"]), "headers": pa.array(["not json"])},
            {},
            "headers must be a JSON object",
        ),
        (
            [("n", LongType()), ("priority", IntegerType())],
            {"n": pa.array([1]), "priority": pa.array([-101], pa.int32())},
            {},
            "outside -100..100",
        ),
        (
            [("n", LongType()), ("delay", DoubleType())],
            {"n": pa.array([1]), "delay": pa.array([-1.0])},
            {},
            "delay",
        ),
        (
            [("n", LongType()), ("delay", DoubleType()), ("at", TimestampType())],
            {
                "n": pa.array([1]),
                "delay": pa.array([1.0]),
                "at": pa.array([dt.datetime(2030, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")),
            },
            {},
            "both delay and at",
        ),
        ([("n", LongType()), ("key", StringType())], {"n": pa.array([1]), "key": pa.array([""])}, {}, "key"),
    ],
)
def test_bad_rows_are_refused_with_the_column_named(
    fields: list[tuple[str, Any]], columns: dict[str, pa.Array], options: dict[str, str], match: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=match):
        encode(fields, columns, **options)


@pytest.mark.parametrize(
    ("fields", "options", "match"),
    [
        ([("payload", StringType()), ("priority", StringType())], {}, "priority"),
        ([("n", LongType())], {"payloadColumn": "body"}, "no column 'body'"),
        ([("n", LongType())], {"keyColumn": "k"}, "no column 'k'"),
        ([("payload", BinaryType())], {"payloadFormat": "json"}, "binary payload"),
        ([("key", StringType())], {}, "no column to make a payload of"),
        ([("payload", StringType())], {"onConflict": "merge"}, "onConflict"),
    ],
)
def test_bad_plans_are_refused_before_any_task_runs(
    fields: list[tuple[str, Any]], options: dict[str, str], match: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=match):
        Plan.build(StructType([StructField(n, t) for n, t in fields]), options)
