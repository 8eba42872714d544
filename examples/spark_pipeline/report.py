"""The reference pipeline's report: a Spark job over a queue's archive (read with
``format("lonnymq")``) and the workers' delivery log, written as Parquet, PNG and HTML."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from typing import Any

PERCENTILES = (0.5, 0.9, 0.99)


def write_report(
    spark: Any, dsn: str, schema: str, queue: str, out: Path, log_dir: Path, timings: Any
) -> dict[str, Any]:
    """Compute the report tables with Spark, write them under ``out/report`` with charts and
    ``index.html``; return the summary."""
    from pyspark.sql import functions as F

    rep = out / "report"
    shutil.rmtree(rep, ignore_errors=True)
    rep.mkdir(parents=True)

    # Only the columns the report needs: the reader then skips decoding payloads.
    archive = (
        spark.read.format("lonnymq")
        .option("dsn", dsn)
        .option("schema", schema)
        .option("queue", queue)
        .option("table", "archive")
        .option("numPartitions", 4)
        .schema(
            "id BIGINT, status STRING, kind STRING, channel STRING, priority INT, attempts INT,"
            " headers STRING, scheduled_at TIMESTAMP, enqueued_at TIMESTAMP, archived_at TIMESTAMP"
        )
        .load()
    )
    deliveries = spark.read.parquet(str(log_dir))
    first = deliveries.where("attempt = 1").groupBy("id").agg(F.min("started_at_ms").alias("picked_ms"))

    def ms(col: str) -> Any:
        return (F.unix_micros(F.col(col)) / 1000).cast("long")

    settled = (
        archive.select(
            "id",
            "status",
            "kind",
            "channel",
            "priority",
            "attempts",
            F.get_json_object("headers", "$.tier").alias("tier"),
            ms("scheduled_at").alias("scheduled_ms"),
            ms("enqueued_at").alias("enqueued_ms"),
            ms("archived_at").alias("archived_ms"),
        )
        .join(first, "id", "left")
        .withColumn("pickup_ms", F.greatest(F.col("picked_ms") - F.col("scheduled_ms"), F.lit(0)))
        .withColumn("end_to_end_ms", F.col("archived_ms") - F.col("scheduled_ms"))
        .cache()
    )
    t0 = settled.agg(F.min("enqueued_ms")).first()[0]

    throughput = (
        settled.groupBy(F.floor((F.col("archived_ms") - F.lit(t0)) / 1000).cast("int").alias("second"))
        .agg(
            F.count(F.when(F.col("status") == "acked", 1)).alias("acked"),
            F.count(F.when(F.col("status") == "dead", 1)).alias("dead"),
        )
        .orderBy("second")
    )

    def latency(by: list[str]) -> Any:
        p = F.percentile_approx("pickup_ms", list(PERCENTILES), 10_000)
        return (
            settled.where(F.col("pickup_ms").isNotNull())
            .groupBy(*by)
            .agg(F.count(F.lit(1)).alias("messages"), p.alias("p"), F.max("pickup_ms").alias("max_ms"))
            .select(
                *by,
                "messages",
                *(F.col("p")[i].alias(f"p{round(q * 100)}_ms") for i, q in enumerate(PERCENTILES)),
                "max_ms",
            )
            .orderBy(*by)
            if by
            else settled.where(F.col("pickup_ms").isNotNull())
            .agg(F.count(F.lit(1)).alias("messages"), p.alias("p"), F.max("pickup_ms").alias("max_ms"))
            .select(
                "messages",
                *(F.col("p")[i].alias(f"p{round(q * 100)}_ms") for i, q in enumerate(PERCENTILES)),
                "max_ms",
            )
        )

    by_priority = latency(["priority", "tier"]).orderBy(F.col("priority").desc())
    by_channel = latency(["channel"])

    def rates(by: list[str]) -> Any:
        g = settled.groupBy(*by) if by else settled.groupBy()
        return (
            g.agg(
                F.count(F.lit(1)).alias("messages"),
                F.count(F.when(F.col("status") == "acked", 1)).alias("acked"),
                F.count(F.when((F.col("status") == "acked") & (F.col("attempts") > 1), 1)).alias("retried"),
                F.count(F.when(F.col("status") == "dead", 1)).alias("dead"),
                F.expr("percentile_approx(end_to_end_ms, 0.5, 10000)").alias("end_to_end_p50_ms"),
                F.expr("percentile_approx(end_to_end_ms, 0.99, 10000)").alias("end_to_end_p99_ms"),
            )
            .withColumn("retry_rate", F.col("retried") / F.col("messages"))
            .withColumn("dead_letter_rate", F.col("dead") / F.col("messages"))
        )

    outcomes = rates(["kind"]).orderBy("kind")
    outcomes_by_channel = rates(["channel"]).orderBy("channel")
    overall = rates([])

    tables = {
        "throughput": throughput,
        "latency_by_priority": by_priority,
        "latency_by_channel": by_channel,
        "outcomes_by_kind": outcomes,
        "outcomes_by_channel": outcomes_by_channel,
        "overall": overall,
    }
    # The tables are small: collect each once, and write the Parquet files from that.
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
    from pyspark.sql.pandas.types import to_arrow_schema

    rows: dict[str, list[dict[str, Any]]] = {}
    for name, df in tables.items():
        rows[name] = [r.asDict() for r in df.collect()]
        pq.write_table(
            pa.Table.from_pylist(rows[name], schema=to_arrow_schema(df.schema)), rep / f"{name}.parquet"
        )
    overall_p = latency([]).collect()[0].asDict()
    settled.unpersist()

    tot = rows["overall"][0]
    per_second = [r["acked"] + r["dead"] for r in rows["throughput"]]
    drain = timings.stages.get("workers drain")
    summary: dict[str, Any] = {
        "events": timings.events,
        "enqueue_msg_per_s": round(timings.events / timings.stages["spark bulk enqueue"]),
        "drain_s": round(drain, 1) if drain else None,
        "throughput_avg_msg_per_s": round(tot["messages"] / max(1, len(per_second))),
        "throughput_peak_msg_per_s": max(per_second, default=0),
        "pickup_p50_ms": overall_p["p50_ms"],
        "pickup_p90_ms": overall_p["p90_ms"],
        "pickup_p99_ms": overall_p["p99_ms"],
        "messages": tot["messages"],
        "acked": tot["acked"],
        "retried": tot["retried"],
        "dead": tot["dead"],
        "retry_rate": round(tot["retry_rate"], 5),
        "dead_letter_rate": round(tot["dead_letter_rate"], 5),
        "end_to_end_p50_ms": tot["end_to_end_p50_ms"],
        "end_to_end_p99_ms": tot["end_to_end_p99_ms"],
    }
    charts(rep, rows)
    page(rep, summary, timings, rows)
    return summary


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / "report" / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


# -- charts -----------------------------------------------------------------------------------


def charts(rep: Path, rows: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Seconds in which nothing was settled are zeros, not gaps.
    seen = {r["second"]: r for r in rows["throughput"]}
    tp = [
        seen.get(t, {"second": t, "acked": 0, "dead": 0})
        for t in range(min(seen, default=0), max(seen, default=-1) + 1)
    ]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot([r["second"] for r in tp], [r["acked"] for r in tp], label="acked", color="#2b7bba")
    ax.plot([r["second"] for r in tp], [r["dead"] for r in tp], label="dead-lettered", color="#d7301f")
    ax.set(
        title="Throughput: messages settled per second", xlabel="seconds since enqueue", ylabel="messages / s"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(rep / "throughput.png", dpi=110)
    plt.close(fig)

    def bars(name: str, labels: list[str], data: list[dict[str, Any]], title: str) -> None:
        fig, ax = plt.subplots(figsize=(9, 3.6))
        width = 0.8 / len(PERCENTILES)
        for i, q in enumerate(PERCENTILES):
            key = f"p{round(q * 100)}_ms"
            ax.bar(
                [x + i * width for x in range(len(labels))],
                [r[key] / 1000 for r in data],
                width,
                label=key.replace("_ms", ""),
            )
        ax.set_xticks([x + width for x in range(len(labels))], labels)
        ax.set(title=title, ylabel="seconds")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(rep / name, dpi=110)
        plt.close(fig)

    bp = rows["latency_by_priority"]
    bars(
        "latency_priority.png",
        [f"{r['tier']} ({r['priority']:+d})" for r in bp],
        bp,
        "Pickup latency by priority (first attempt, from due time)",
    )
    bc = sorted(rows["latency_by_channel"], key=lambda r: -r["messages"])
    fig, ax = plt.subplots(figsize=(11, 3.8))
    xs = range(len(bc))
    ax.bar([x - 0.2 for x in xs], [r["p50_ms"] / 1000 for r in bc], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [r["p99_ms"] / 1000 for r in bc], 0.4, label="p99")
    ax2 = ax.twinx()
    ax2.plot(list(xs), [r["messages"] for r in bc], color="#555", marker=".", lw=1, label="messages")
    ax2.set_ylabel("messages")
    ax.set_xticks(list(xs), [str(r["channel"]) for r in bc], rotation=90, fontsize=7)
    ax.set(title="Pickup latency by channel (merchant), largest first", ylabel="seconds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center")
    fig.tight_layout()
    fig.savefig(rep / "latency_channel.png", dpi=110)
    plt.close(fig)

    oc = rows["outcomes_by_kind"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    xs = range(len(oc))
    ax.bar(
        [x - 0.2 for x in xs],
        [100 * r["retry_rate"] for r in oc],
        0.4,
        label="retried, then acked",
        color="#fdae61",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [100 * r["dead_letter_rate"] for r in oc],
        0.4,
        label="dead-lettered",
        color="#d7301f",
    )
    ax.set_xticks(list(xs), [str(r["kind"]) for r in oc])
    ax.set(title="Retry and dead-letter rates by event type", ylabel="% of messages")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(rep / "outcomes.png", dpi=110)
    plt.close(fig)


# -- html -------------------------------------------------------------------------------------


def _table(data: list[dict[str, Any]]) -> str:
    if not data:
        return "<p>(none)</p>"
    cols = list(data[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 1 else f"{v:,.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c in cols) + "</tr>" for r in data)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(rep: Path, summary: dict[str, Any], timings: Any, rows: dict[str, list[dict[str, Any]]]) -> None:
    stages = [{"stage": k, "seconds": round(v, 2)} for k, v in timings.stages.items()]
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>LonnyMQ pipeline report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>LonnyMQ reference pipeline</h1>
<p>{summary["events"]:,} order events, bulk-enqueued with Spark (<code>format("lonnymq")</code>),
processed by <code>lonnymq.worker</code> processes with injected failures, then read back from the
queue's archive by a Spark job.</p>
<h2>Summary</h2>{_table([{"metric": k, "value": v} for k, v in summary.items()])}
<h2>Stages</h2>{_table(stages)}
<h2>Throughput</h2><img src="throughput.png" alt="throughput">
<h2>Pickup latency by priority</h2><img src="latency_priority.png" alt="latency by priority">
{_table(rows["latency_by_priority"])}
<h2>Pickup latency by channel</h2><img src="latency_channel.png" alt="latency by channel">
{_table(rows["latency_by_channel"])}
<h2>Retries and dead letters</h2><img src="outcomes.png" alt="outcomes">
{_table(rows["outcomes_by_kind"])}{_table(rows["outcomes_by_channel"])}
<p>Tables as Parquet next to this page: throughput, latency_by_priority, latency_by_channel,
outcomes_by_kind, outcomes_by_channel, overall; summary.json.</p>
</body></html>
"""
    (rep / "index.html").write_text(doc)
