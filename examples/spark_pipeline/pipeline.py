"""The reference pipeline: Spark -> LonnyMQ -> workers -> Spark (an example, not part of the package;
run it with ``python examples/spark_pipeline/run.py``).

1. **Events**: a realistic order-event dataset of a marketplace (order lifecycle events over
   one simulated day, 48 merchants of skewed size in four regions, service tiers, some
   scheduled follow-ups), generated with Spark as Parquet, or read from Parquet you give.
2. **Bulk enqueue**: one ``df.write.format("lonnymq")`` job, exactly once (with a ``writeId``,
   a rerun enqueues nothing twice): payload = the event as JSON, kind = event type,
   channel = merchant (fair share per tenant), priority from the service tier, delays for
   scheduled follow-ups.
3. **Workers**: ``lonnymq.worker`` processes drain the queue. Some events fail: transient
   errors succeed on retry (exponential backoff), poison events are dead-lettered after
   ``max_attempts``. Each worker logs when it started every delivery (Parquet).
4. **Report**: a Spark job reads the queue's archive (``format("lonnymq")``,
   ``table=archive``) with the delivery log and writes throughput over time, pickup latency
   percentiles per priority and channel, and retry / dead-letter rates, as Parquet, PNG charts
   and an HTML page.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from lonnymq import Client

QUEUE = "orders"
#: Share of events that fail their first attempt (then succeed) and that always fail.
TRANSIENT_PER_MILLE = 30
POISON_PER_MILLE = 2
MAX_ATTEMPTS = 3
TIERS = {"express": 10, "standard": 0, "bulk": -10}
#: Seconds of head start per priority point: a message is served as if it had been sent
#: priority x PRIORITY_STEP seconds earlier (express: 10 s ahead; bulk: eligible 10 s late).
PRIORITY_STEP = 1.0
MERCHANTS = 48


#: The workers' retry policy (lonnymq.worker.Backoff arguments) and how often they poll without NOTIFY.
BACKOFF = {"base": 0.25, "factor": 2, "max": 2, "jitter": 0.5}
POLL_INTERVAL = 5.0


@dataclass
class Timings:
    """Wall-clock seconds of each stage, what they moved, and the parameters of the run."""

    events: int = 0
    stages: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    #: The failure rates the workers inject, as fractions (the report draws them as references).
    injected: dict[str, float] = field(
        default_factory=lambda: {
            "retry_rate": TRANSIENT_PER_MILLE / 1000,
            "dead_letter_rate": POISON_PER_MILLE / 1000,
        }
    )

    def stage(self, name: str, seconds: float) -> None:
        self.stages[name] = seconds


def spark_session(master: str = "local[*]") -> Any:
    """A local Spark session for the pipeline, with the lonnymq data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import warnings

    # PySpark 4.3 warns about pandas 3 when its Arrow helpers load; the pipeline uses no pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    from lonnymq.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("lonnymq-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


# -- 1. events --------------------------------------------------------------------------------


def generate_events(spark: Any, n: int, path: Path, *, seed: int = 7) -> Any:
    """Write ``n`` order events as Parquet at ``path`` (deterministic for a seed) and return
    them read back. About three events per order; regions, tiers and event types are skewed
    like real traffic; 10% are follow-ups scheduled 1-15 s after enqueueing."""
    from pyspark.sql import functions as F

    def u(salt: int) -> Any:  # a uniform [0, 1) per row, stable for the seed
        return F.pmod(F.xxhash64(F.col("id"), F.lit(seed * 1000 + salt)), F.lit(1_000_000)) / 1_000_000.0

    def pick(salt: int, weighted: list[tuple[str, float]]) -> Any:
        x, expr, acc = u(salt), None, 0.0
        for value, weight in weighted[:-1]:
            acc += weight
            expr = F.when(x < acc, value) if expr is None else expr.when(x < acc, value)
        assert expr is not None
        return expr.otherwise(weighted[-1][0])

    day = 86_400.0
    # Merchants are the queue's channels (fair share per tenant); a few big ones, many small.
    merchant = F.floor(F.pow(u(8), F.lit(1.5)) * MERCHANTS).cast("int")
    regions = F.array(*(F.lit(r) for r in ("eu", "us", "apac", "latam")))
    events = spark.range(n, numPartitions=max(2, spark.sparkContext.defaultParallelism)).select(
        F.format_string("evt-%010d", F.col("id")).alias("event_id"),
        (F.col("id") / 3).cast("long").alias("order_id"),
        F.format_string("cust-%06d", F.pmod(F.xxhash64(F.col("id") / 3, F.lit(seed)), F.lit(60_000))).alias(
            "customer_id"
        ),
        F.format_string("m-%02d", merchant).alias("merchant"),
        F.element_at(regions, F.pmod(merchant, F.lit(4)) + 1).alias("region"),
        pick(
            1,
            [("created", 0.34), ("paid", 0.30), ("shipped", 0.20), ("delivered", 0.13), ("cancelled", 0.03)],
        ).alias("event_type"),
        pick(3, [("express", 0.05), ("standard", 0.80), ("bulk", 0.15)]).alias("tier"),
        F.round(F.lit(4.99) + u(4) * 495, 2).alias("amount"),
        F.lit("EUR").alias("currency"),
        (F.lit(1) + F.floor(u(5) * 6)).cast("int").alias("items"),
        F.timestamp_seconds(F.lit(1_717_200_000) + F.col("id") * F.lit(day / max(n, 1))).alias("event_time"),
        F.when(u(6) < 0.10, F.lit(1) + F.floor(u(7) * 15)).cast("int").alias("follow_up_s"),
    )
    events.write.mode("overwrite").parquet(str(path))
    return spark.read.parquet(str(path))


# -- 2. enqueue -------------------------------------------------------------------------------


def enqueue(events: Any, dsn: str, schema: str, write_id: str) -> None:
    """Bulk-enqueue the events with one exactly-once Spark write."""
    from pyspark.sql import functions as F

    priority = F.coalesce(*(F.when(F.col("tier") == t, F.lit(p)) for t, p in TIERS.items()), F.lit(0))
    messages = events.select(
        F.to_json(
            F.struct(
                "event_id",
                "order_id",
                "customer_id",
                "merchant",
                "region",
                "event_type",
                "amount",
                "currency",
                "items",
                "event_time",
            )
        ).alias("payload"),
        F.col("event_type").alias("kind"),
        F.col("merchant").alias("channel"),
        priority.cast("int").alias("priority"),
        F.col("follow_up_s").cast("double").alias("delay"),
        F.create_map(F.lit("tier"), F.col("tier")).alias("headers"),
    )
    (
        messages.write.format("lonnymq")
        .option("dsn", dsn)
        .option("schema", schema)
        .option("queue", QUEUE)
        .option("payloadFormat", "json")
        .option("writeId", write_id)
        .mode("append")
        .save()
    )


# -- 3. workers -------------------------------------------------------------------------------


def fate(event_id: str) -> str:
    """What processing an event does, stable per event: 'poison' (always fails), 'transient'
    (fails its first attempt) or 'ok'."""
    h = zlib.crc32(event_id.encode()) % 1000
    if h < POISON_PER_MILLE:
        return "poison"
    if h < POISON_PER_MILLE + TRANSIENT_PER_MILLE:
        return "transient"
    return "ok"


def _worker_process(dsn: str, schema: str, log_path: str, stop: Any, ready: Any, concurrency: int) -> None:
    """One worker process: a lonnymq Worker with an async handler, until ``stop`` is set; then
    its delivery log is written as Parquet."""
    import logging

    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from lonnymq.worker import App, Backoff, Worker

    # The injected failures are expected: keep the worker's per-failure warnings quiet.
    logging.getLogger("lonnymq.worker").setLevel(logging.ERROR)

    app = App(retry=Backoff(**BACKOFF))
    log: dict[str, list[Any]] = {
        "id": [],
        "attempt": [],
        "started_at_ms": [],
        "handler_ms": [],
        "outcome": [],
        "worker": [],
    }
    me = os.getpid()

    def handle(job: Any) -> str:
        order = job.payload
        what = fate(order["event_id"])
        if what == "poison":
            raise ValueError(f"order {order['order_id']}: malformed event {order['event_id']}")
        if what == "transient" and job.attempt == 1:
            raise ConnectionError("payment service timed out")
        # The "work" itself is trivial here: this pipeline measures the queue, not a handler.
        return "ok"

    @app.handler(QUEUE)
    async def process(job: Any) -> None:
        # When the handler started (the end of the pickup wait) and how long it ran (handler time).
        log["id"].append(job.id)
        log["attempt"].append(job.attempt)
        log["started_at_ms"].append(time.time_ns() // 1_000_000)
        log["worker"].append(me)
        t = time.perf_counter()
        outcome = "error"
        try:
            outcome = handle(job)
        finally:
            log["handler_ms"].append((time.perf_counter() - t) * 1000)
            log["outcome"].append(outcome)

    async def main() -> None:
        worker = Worker(
            app, dsn, schema=schema, concurrency=concurrency, poll_interval=POLL_INTERVAL, cron=False
        )
        await worker.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await worker.stop()

    asyncio.run(main())
    table = pa.table(
        {
            "id": pa.array(log["id"], pa.int64()),
            "attempt": pa.array(log["attempt"], pa.int32()),
            "started_at_ms": pa.array(log["started_at_ms"], pa.int64()),
            "handler_ms": pa.array(log["handler_ms"], pa.float64()),
            "outcome": pa.array(log["outcome"], pa.string()),
            "worker": pa.array(log["worker"], pa.int64()),
        }
    )
    pq.write_table(table, log_path)


class Workers:
    """Worker processes (spawned: the parent runs a JVM, which must not be forked)."""

    def __init__(self, dsn: str, schema: str, log_dir: Path, n: int, concurrency: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.ready = [ctx.Event() for _ in range(n)]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = [
            ctx.Process(
                target=_worker_process,
                name=f"lonnymq-pipeline-worker-{i}",
                args=(
                    dsn,
                    schema,
                    str(log_dir / f"worker-{i}.parquet"),
                    self.stop,
                    self.ready[i],
                    concurrency,
                ),
            )
            for i in range(n)
        ]

    def start(self, timeout: float = 60) -> None:
        for p in self.procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p, ready in zip(self.procs, self.ready, strict=True):
            while not ready.wait(0.2):
                if not p.is_alive() or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"worker {p.name} did not start (exit code {p.exitcode})")

    def check(self) -> None:
        for p in self.procs:
            if not p.is_alive():
                raise RuntimeError(f"worker {p.name} died (exit code {p.exitcode})")

    def close(self, timeout: float = 60) -> None:
        self.stop.set()
        for p in self.procs:
            if p.pid is not None:
                p.join(timeout)
                if p.is_alive():
                    p.kill()
                    p.join()


def wait_drained(
    client: Client,
    workers: Workers,
    n: int,
    archive_count: Callable[[], int],
    timeout: float,
    progress: Callable[[int], None],
) -> None:
    """Until every message is settled: acked or dead, i.e. all n are in the archive."""
    deadline = time.monotonic() + timeout
    while True:
        done = archive_count()
        progress(done)
        if done >= n:
            m = client.metrics(QUEUE)
            if m.ready == m.scheduled == m.leased == 0:
                return
        workers.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers settled {done} of {n} messages in {timeout:.0f} s")
        time.sleep(0.5)


# -- the whole run ----------------------------------------------------------------------------


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def server(dsn: str) -> str:
    """Where ``dsn`` points, without its password: ``user@host:port/dbname``."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{user}{parts.get('host') or 'local socket'}{port}/{parts.get('dbname') or ''}"


def run(
    dsn: str,
    schema: str,
    out: Path,
    *,
    events: int = 200_000,
    input_path: Path | None = None,
    workers: int = 2,
    concurrency: int = 200,
    master: str = "local[*]",
    say: Callable[[str], None] = print,
    spark: Any = None,
) -> dict[str, Any]:
    """Run the pipeline in ``schema`` (dropped and recreated) and write the report to
    ``out``. Returns the report's summary (also in ``out/report/summary.json``). Uses (and
    leaves running) ``spark`` if given, else starts and stops a local session."""
    from report import write_report

    timings = Timings()
    timings.params = {
        "events": f"{events:,} generated (seed 7)" if input_path is None else f"read from {input_path}",
        "server": server(dsn),
        "schema": schema,
        "worker processes": workers,
        "handlers at once per worker": concurrency,
        "worker poll interval (s, when no NOTIFY)": POLL_INTERVAL,
        "priority (tier)": ", ".join(f"{t} {p:+d}" for t, p in TIERS.items())
        + f"; served as if sent priority x {PRIORITY_STEP:g} s earlier (queue priority_step)",
        "max attempts": MAX_ATTEMPTS,
        "retry delay after failed attempt n (s)": "min({max}, {base} x {factor}^(n-1)), shortened by up to"
        " {jitter:.0%} (jitter)".format(**BACKOFF),
        "injected transient failures (1st attempt)": f"{TRANSIENT_PER_MILLE / 10:.1f}% of events",
        "injected poison events (always fail)": f"{POISON_PER_MILLE / 10:.1f}% of events",
        "delayed follow-ups": "about 10% of events, due 1-15 s after enqueueing",
        "Spark master": master,
        "CPU cores": os.cpu_count(),
    }
    out.mkdir(parents=True, exist_ok=True)
    drop_schema(dsn, schema)
    t0 = time.perf_counter()
    with Client(dsn, schema=schema) as client:
        client.migrate()
        client.create_queue(
            QUEUE,
            archive=True,
            max_attempts=MAX_ATTEMPTS,
            lease=30,
            retention=30 * 86400,
            priority_step=PRIORITY_STEP,
        )

        t = time.perf_counter()
        own_session = spark is None
        if own_session:
            spark = spark_session(master)
        else:
            from lonnymq.spark import register

            register(spark)
        timings.stage("spark session", time.perf_counter() - t)
        try:
            t = time.perf_counter()
            if input_path is None:
                path = out / "events"
                df = generate_events(spark, events, path)
                say(f"generated {events:,} order events as Parquet in {path}")
            else:
                df = spark.read.parquet(str(input_path))
                say(f"read order events from {input_path}")
            n = df.count()
            timings.events = n
            timings.stage("events", time.perf_counter() - t)

            log_dir = out / "deliveries"
            shutil.rmtree(log_dir, ignore_errors=True)
            pool = Workers(dsn, schema, log_dir, workers, concurrency)
            t = time.perf_counter()
            pool.start()
            timings.stage("worker start", time.perf_counter() - t)
            try:
                t = time.perf_counter()
                enqueue(df, dsn, schema, write_id=f"pipeline-{n}")
                timings.stage("spark bulk enqueue", time.perf_counter() - t)
                say(
                    f"enqueued {n:,} messages with Spark in {timings.stages['spark bulk enqueue']:.1f} s "
                    f"({n / timings.stages['spark bulk enqueue']:,.0f} msg/s)"
                )

                t = time.perf_counter()
                count = sql.SQL("SELECT count(*) FROM {}.archive").format(sql.Identifier(schema))
                with psycopg.connect(dsn, autocommit=True) as conn:

                    def archived() -> int:
                        row = conn.execute(count).fetchone()
                        return int(row[0]) if row else 0

                    last = [0.0]

                    def progress(done: int) -> None:
                        if time.monotonic() - last[0] >= 5:
                            last[0] = time.monotonic()
                            say(f"  workers: {done:,} of {n:,} settled")

                    wait_drained(client, pool, n, archived, timeout=max(600.0, n / 500), progress=progress)
                timings.stage("workers drain", time.perf_counter() - t)
                say(
                    f"{workers} worker processes settled {n:,} messages in {timings.stages['workers drain']:.1f} s"
                )
            finally:
                pool.close()

            t = time.perf_counter()
            summary = write_report(spark, dsn, schema, QUEUE, out, log_dir, timings)
            timings.stage("spark report", time.perf_counter() - t)
        finally:
            if own_session:
                spark.stop()
    summary["stages_s"] = {k: round(v, 2) for k, v in timings.stages.items()}
    summary["total_s"] = round(time.perf_counter() - t0, 1)
    from report import write_summary

    write_summary(out, summary)
    return summary
