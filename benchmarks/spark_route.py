"""The cost of routing a Spark write's rows to a partitioned queue's partitions, in CPU time.

    python benchmarks/spark_route.py [-n 200000] [--reps 5] [--shape row_json|text] [--distinct K]
        [--out FILE.json]

No database and no Spark: one process builds an Arrow batch of ``n`` rows as a write task gets
it (a JSON payload of about 70 bytes per row, built from two columns (``--shape row_json``) or
given as a string column (``--shape text``), and a ``key`` column: ``--keyed`` of the rows
with a key of their own, or one of ``--distinct`` keys, the rest without) and times, with
``time.process_time`` (this process's CPU, medians of ``--reps``):

* ``encode``: :meth:`Encoder.columns`, the checks and conversions every write does per batch;
* ``copy_data``: :meth:`Encoder.copy_rows`, the binary COPY data of the batch, as one shard's;
* ``route``: :func:`partition_of` for a queue of 2 partitions (what a partitioned queue's write
  adds: the SHA-256 of each key, the CRC-32 of each unkeyed payload) plus the ``take`` of each
  partition's rows (``stage_shards``).

``--dsn`` is accepted and ignored (the benchmark scripts share that option).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lonnymq.spark._write import Encoder, Plan, partition_of


def timed(fn: Callable[[], Any], reps: int) -> float:
    """The median CPU seconds of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", help="ignored (no database is used)")
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--keyed", type=float, default=0.5, help="the share of rows with a key")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--distinct",
        type=int,
        default=0,
        help="the keyed rows share this many keys, as rows share a few channels (0: a key each)",
    )
    ap.add_argument(
        "--shape",
        choices=("row_json", "text"),
        default="row_json",
        help="row_json: the payload is the JSON of the columns order_id and note (Python per row);"
        " text: a string column payload holds it (no Python per row)",
    )
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    n = args.n
    keyed = int(n * args.keyed)
    notes = [f"order {i} of customer c-{i % 50000:06d}, region eu" for i in range(n)]
    names = args.distinct or n
    keys = pa.array([f"order-{i % names}" if i < keyed else None for i in range(n)])
    if args.shape == "row_json":
        batch = pa.record_batch({"order_id": pa.array(np.arange(n)), "note": pa.array(notes), "key": keys})
        fields = [StructField("order_id", LongType()), StructField("note", StringType())]
    else:
        payloads = [json.dumps({"order_id": i, "note": t}) for i, t in enumerate(notes)]
        batch = pa.record_batch({"payload": pa.array(payloads), "key": keys})
        fields = [StructField("payload", StringType())]
    schema = StructType([*fields, StructField("key", StringType())])
    plan = Plan.build(schema, {})
    enc = Encoder(plan)
    cols = enc.columns(batch)

    def route() -> None:
        at = partition_of(cols, 2, "q")
        for k in (int(k) for k in np.unique(at)):
            rows = pa.array(np.flatnonzero(at == k))
            {c: v.take(rows) for c, v in cols.items()}

    result = {
        "shape": args.shape,
        "rows": n,
        "keyed": keyed,
        "distinct": args.distinct,
        "reps": args.reps,
        "cpu_s": {
            "encode": timed(lambda: enc.columns(batch), args.reps),
            "copy_data": timed(lambda: enc.copy_rows(cols, n, 1, 0), args.reps),
            "route": timed(route, args.reps),
        },
    }
    result["us_per_row"] = {k: round(v / n * 1e6, 3) for k, v in result["cpu_s"].items()}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
