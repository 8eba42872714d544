"""The Spark application of tests/spark/test_cluster.py (docs/spark.md, "Running on a cluster").

    cluster_job.py SESSION DSN SCHEMA WORKDIR [routes|lost|routes+lost]

SESSION is ``submit`` (the session spark-submit configured: client or cluster deploy mode) or
a Spark Connect URL (``sc://host:port``). The job uses PySpark and lonnymq only: lonnymq comes
from the driver's Python, or from ``--py-files`` when the driver runs on the cluster, and
reaches the executors through ``lonnymq.spark.ship(spark)``. It writes its report to
WORKDIR/report.json.

``routes`` (the default) runs the four modes: a batch write of 200 rows with keys to queue
``orders``, a batch read of them (and of four of them by key, the filter pushed down to
PostgreSQL), and ``readStream`` of queue ``events`` into ``writeStream`` to queue ``copies``
(availableNow, 100 rows a batch; the DSN from the ``spark.lonnymq.dsn`` conf). ``lost`` runs a
stream from queue ``held`` to ``held_copies`` whose tasks block while WORKDIR/hold exists, for
the test to kill the cluster's workers under it; ``routes+lost`` runs both in one application,
writing WORKDIR/routes.json in between (see test_client_mode_and_lost_executors).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(session: str, dsn: str, schema: str, workdir: str, job: str = "routes") -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if session.startswith("sc://"):
        spark = SparkSession.builder.remote(session).getOrCreate()
    else:
        spark = SparkSession.builder.getOrCreate()
    work = Path(workdir)
    report: dict[str, Any] = {"driver_python": sys.executable}

    # Before shipping: which Python the executors run, and whether it has lonnymq of its own.
    probe = F.udf(lambda _: f"{sys.executable} {importlib.util.find_spec('lonnymq') is not None}")
    report["executors"] = sorted({r.p for r in spark.range(4).select(probe("id").alias("p")).collect()})

    import lonnymq.spark

    report["lonnymq"] = lonnymq.__file__
    report["shipped"] = lonnymq.spark.ship(spark).name

    def opts(queue: str, **more: str) -> dict[str, str]:
        return {"dsn": dsn, "schema": schema, "queue": queue, **more}

    if job not in ("routes", "lost", "routes+lost"):
        raise SystemExit(f"unknown job {job!r}")
    if job.startswith("routes"):
        (
            spark.range(200)
            .select(
                F.to_json(F.struct(F.col("id").alias("n"))).alias("payload"),
                F.concat(F.lit("k"), F.col("id")).alias("key"),
            )
            .write.format("lonnymq")
            .options(**opts("orders", payloadFormat="json"))
            .mode("append")
            .save()
        )
        read = spark.read.format("lonnymq").options(**opts("orders", numPartitions="2")).load()
        n = "CAST(get_json_object(payload, '$.n') AS int) AS n"
        report["read"] = sorted(r.n for r in read.selectExpr(n).collect())
        # A filter on the key goes down to PostgreSQL: no Filter is left above the relation.
        pushed = read.where("key IN ('k6', 'k7', 'k8', 'k9')").selectExpr(n)
        with contextlib.redirect_stdout(io.StringIO()) as out:  # classic and Connect print it
            pushed.explain(extended=True)
        plan = out.getvalue()
        report["pushed"] = sorted(r.n for r in pushed.collect())
        report["pushed_plan"] = plan.split("== Optimized Logical Plan ==")[1].split("== Physical Plan ==")[0]
        # The server from a conf this time: register() again after setting it (it ships again).
        spark.conf.set("spark.lonnymq.dsn", dsn)
        lonnymq.spark.register(spark)
        query = (
            spark.readStream.format("lonnymq")
            .options(schema=schema, queue="events", maxRowsPerBatch="100")
            .load()
            .selectExpr("payload", "CAST(id AS string) AS key")
            .writeStream.format("lonnymq")
            .options(schema=schema, queue="copies", payloadFormat="json")
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            report["watch"] = lonnymq.spark.fail_without_executors(spark, query, timeout=600) is not None
        except lonnymq.errors.InvalidArgument:
            report["watch"] = "refused"  # Spark Connect: the client cannot see executors
        query.awaitTermination()
        report["stream_batches"] = [p.numInputRows for p in query.recentProgress]
        (work / "routes.json").write_text(json.dumps(report))
    if job.endswith("lost"):
        lost(spark, opts, work, report)
    (work / "report.json").write_text(json.dumps(report))
    print(json.dumps(report))
    spark.stop()


def lost(spark: Any, opts: Any, work: Path, report: dict[str, Any]) -> None:
    """A stream from ``held`` to ``held_copies`` whose tasks wait while WORKDIR/hold exists
    (having marked WORKDIR/task-running); failed by ``fail_without_executors`` once the test
    killed the workers. Then, once the test has restarted them and written WORKDIR/restart, a
    new query (a new checkpoint) consumes ``held`` until WORKDIR/stop appears."""
    from pyspark.sql import functions as F
    from pyspark.sql.utils import StreamingQueryException

    import lonnymq.spark

    hold, running = str(work / "hold"), str(work / "task-running")

    @F.udf("string")
    def held(payload: str) -> str:
        Path(running).touch()
        while os.path.exists(hold):
            time.sleep(0.2)
        return payload

    def start(checkpoint: str) -> Any:
        return (
            spark.readStream.format("lonnymq")
            .options(**opts("held", maxRowsPerBatch="20", lease="45"))
            .load()
            .select(held("payload").alias("payload"), F.col("id").cast("string").alias("key"))
            .writeStream.format("lonnymq")
            .options(**opts("held_copies", payloadFormat="json"))
            .option("checkpointLocation", str(work / checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )

    query = start("checkpoint-1")
    lonnymq.spark.fail_without_executors(spark, query, timeout=15)
    try:
        query.awaitTermination()
        report["error"] = None
    except StreamingQueryException as e:
        report["error"] = str(e)
    report["failed_at"] = time.time()
    (work / "failed").write_text(json.dumps(report))

    while not (work / "restart").exists():
        time.sleep(0.5)
    query = start("checkpoint-2")
    (work / "restarted").touch()
    while not (work / "stop").exists() and query.isActive:
        time.sleep(0.5)
    report["second_error"] = None if query.exception() is None else str(query.exception())
    query.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
