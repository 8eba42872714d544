"""Bulk enqueue: Spark's ``df.write.format("lonnymq")`` versus the plain client's send_batch,
on the same server, same payloads (an order event of ~200 bytes of JSON).

    python benchmarks/spark_enqueue.py [--dsn URI] [-n 200000] [--batch 1000] [--master local[*]]

Runs on a throwaway embedded PostgreSQL unless --dsn is given, in a fresh schema that is
dropped afterwards. The DataFrame is generated and cached before timing, so the Spark numbers
are the write alone (stage with COPY in parallel tasks + one commit transaction).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import psycopg
from lonnymq_bench.server import dsn_or_temporary as server
from psycopg import sql

from lonnymq import Client, Envelope


def event(i: int) -> dict[str, object]:
    return {
        "order_id": i,
        "customer": f"c-{i % 50_000:06d}",
        "status": "created",
        "amount": round((i % 997) * 1.37, 2),
        "currency": "EUR",
        "items": [{"sku": f"SKU-{i % 313}", "qty": 1 + i % 3}],
        "region": ("eu", "us", "apac")[i % 3],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn")
    ap.add_argument("-n", type=int, default=200_000, help="messages per run")
    ap.add_argument("--batch", type=int, default=1000, help="client send_batch size")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--partitions", type=int, default=0, help="DataFrame partitions (default: cores)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    with server(args.dsn) as dsn:
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            with Client(dsn, schema=schema, pool_size=1) as c:
                c.migrate()
                for q in ("client", "spark_json", "spark_rows", "warmup"):
                    c.create_queue(q)
                results = [("client send_batch", run_client(c, args))]
                results += run_spark(dsn, schema, args)
            with psycopg.connect(dsn) as conn:
                counts = conn.execute(
                    sql.SQL(
                        "SELECT q.name, count(*) FROM {s}.message m JOIN {s}.queue q"
                        " ON q.id = m.queue_id GROUP BY 1"
                    ).format(s=sql.Identifier(schema))
                )
                got: dict[str, int] = dict(counts.fetchall())
                got.pop("warmup")
                assert got == dict.fromkeys(("client", "spark_json", "spark_rows"), args.n), got
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"\nlonnymq bulk enqueue, {args.n:,} messages ({dsn.split('@')[-1]}, {os.cpu_count()} cores)")
    for name, (seconds, note) in results:
        print(f"  {name:<44} {args.n / seconds:>10,.0f} msg/s  ({seconds:6.2f} s) {note}")


def run_client(c: Client, args: argparse.Namespace) -> tuple[float, str]:
    envs = [Envelope(event(i), channel=("eu", "us", "apac")[i % 3], priority=i % 3) for i in range(args.n)]
    t = time.perf_counter()
    for lo in range(0, args.n, args.batch):
        c.send_batch("client", envs[lo : lo + args.batch])
    return time.perf_counter() - t, f"(one process, batches of {args.batch})"


def run_spark(dsn: str, schema: str, args: argparse.Namespace) -> list[tuple[str, tuple[float, str]]]:
    from pyspark.sql import SparkSession

    import lonnymq.spark

    spark = (
        SparkSession.builder.master(args.master)
        .appName("lonnymq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lonnymq.spark.register(spark)
    parts = args.partitions or spark.sparkContext.defaultParallelism
    events = (
        spark.range(args.n, numPartitions=parts)
        .selectExpr(
            "id AS order_id",
            "format_string('c-%06d', id % 50000) AS customer",
            "'created' AS status",
            "round((id % 997) * 1.37, 2) AS amount",
            "'EUR' AS currency",
            "array(named_struct('sku', concat('SKU-', id % 313), 'qty', 1 + id % 3)) AS items",
            "element_at(array('eu', 'us', 'apac'), CAST(id % 3 AS INT) + 1) AS region",
            "CAST(id % 3 AS INT) AS priority",
        )
        .cache()
    )
    events.count()
    # Warm up: the first job of a session starts the Python workers (seconds, not the write).
    (
        events.where("order_id % 1000 = 0")
        .selectExpr("order_id")
        .write.format("lonnymq")
        .option("dsn", dsn)
        .option("schema", schema)
        .option("queue", "warmup")
        .mode("append")
        .save()
    )
    out = []
    try:
        # The payload built by Spark (to_json in the JVM); the data source copies strings.
        as_json = events.selectExpr(
            "to_json(struct(order_id, customer, status, amount, currency, items, region)) AS payload",
            "region AS channel",
            "priority",
        )
        # No payload column: every other column becomes the JSON payload, built in Python.
        as_rows = events.withColumn("channel", events.region)
        runs = [
            ("spark write, payload=to_json(...) column", as_json, "spark_json", {"payloadFormat": "json"}),
            ("spark write, all columns as JSON", as_rows, "spark_rows", {}),
        ]
        for name, df, queue, extra in runs:
            t = time.perf_counter()
            (
                df.write.format("lonnymq")
                .option("dsn", dsn)
                .option("schema", schema)
                .option("queue", queue)
                .options(**extra)
                .mode("append")
                .save()
            )
            out.append((name, (time.perf_counter() - t, f"({parts} tasks, {args.master})")))
    finally:
        spark.stop()
    return out


if __name__ == "__main__":
    main()
