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

    # pickup_ms: the message's due time to the start of its first handler run (backlog wait
    # and fetch delay, not handler time); end_to_end_ms: due time to archived (acked or dead).
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
    t0, t_last = settled.agg(F.min("enqueued_ms"), F.max("archived_ms")).first()

    throughput = (
        settled.groupBy(F.floor((F.col("archived_ms") - F.lit(t0)) / 1000).cast("int").alias("second"))
        .agg(
            F.count(F.when(F.col("status") == "acked", 1)).alias("acked"),
            F.count(F.when(F.col("status") == "dead", 1)).alias("dead"),
        )
        .orderBy("second")
    )

    def latency(by: list[str], where: Any = None) -> Any:
        p = F.percentile_approx("pickup_ms", list(PERCENTILES), 10_000)
        picked = settled.where(F.col("pickup_ms").isNotNull() if where is None else where)
        g = picked.groupBy(*by) if by else picked.groupBy()
        out = g.agg(
            F.count(F.lit(1)).alias("messages"), p.alias("p"), F.max("pickup_ms").alias("max_ms")
        ).select(
            *by,
            "messages",
            *(F.col("p")[i].alias(f"p{round(q * 100)}_ms") for i, q in enumerate(PERCENTILES)),
            "max_ms",
        )
        return out.orderBy(*by) if by else out

    by_priority = latency(["priority", "tier"]).orderBy(F.col("priority").desc())
    by_channel = latency(["channel"])
    # Fairness between merchants, compared within one tier (priority shifts pickup by design).
    by_channel_standard = latency(["channel"], F.col("pickup_ms").isNotNull() & (F.col("priority") == 0))

    # The whole distributions, as 101 quantiles: pickup wait (first attempts) and handler time
    # (every attempt), for the chart that shows where the waiting is.
    grid = [i / 100 for i in range(101)]
    pickup_q = settled.agg(F.percentile_approx("pickup_ms", grid, 10_000)).first()[0] or []
    handler_q = deliveries.agg(F.percentile_approx("handler_ms", grid, 10_000)).first()[0] or []
    distribution = spark.createDataFrame(
        [(q, float(p), float(h)) for q, p, h in zip(grid, pickup_q, handler_q, strict=False)],
        "quantile DOUBLE, pickup_ms DOUBLE, handler_ms DOUBLE",
    )

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
        "latency_by_channel_standard": by_channel_standard,
        "latency_distribution": distribution,
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
    handler_p = deliveries.agg(
        F.percentile_approx("handler_ms", [0.5, 0.99], 10_000).alias("p"), F.max("handler_ms").alias("max")
    ).first()
    settled.unpersist()

    tot = rows["overall"][0]
    per_second = [r["acked"] + r["dead"] for r in rows["throughput"]]
    drain = timings.stages.get("workers drain")
    summary: dict[str, Any] = {
        "events": timings.events,
        "enqueue_msg_per_s": round(timings.events / timings.stages["spark bulk enqueue"]),
        "drain_s": round(drain, 1) if drain else None,
        "throughput_avg_msg_per_s": round(tot["messages"] / max(1.0, (t_last - t0) / 1000)),
        "throughput_peak_msg_per_s": max(per_second, default=0),
        "pickup_p50_ms": overall_p["p50_ms"],
        "pickup_p90_ms": overall_p["p90_ms"],
        "pickup_p99_ms": overall_p["p99_ms"],
        "pickup_max_ms": overall_p["max_ms"],
        "handler_p50_ms": round(handler_p["p"][0], 3),
        "handler_p99_ms": round(handler_p["p"][1], 3),
        "handler_max_ms": round(handler_p["max"], 3),
        "messages": tot["messages"],
        "acked": tot["acked"],
        "retried": tot["retried"],
        "dead": tot["dead"],
        "retry_rate": round(tot["retry_rate"], 5),
        "dead_letter_rate": round(tot["dead_letter_rate"], 5),
        "end_to_end_p50_ms": tot["end_to_end_p50_ms"],
        "end_to_end_p99_ms": tot["end_to_end_p99_ms"],
    }
    charts(rep, rows, injected=getattr(timings, "injected", {}))
    page(rep, summary, timings, rows)
    summary["parameters"] = dict(timings.params)
    return summary


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / "report" / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


# -- charts -----------------------------------------------------------------------------------

# Legends sit outside the plot, right of it; savefig(bbox_inches="tight") keeps them in the image.
_OUTSIDE: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "frameon": False}
_ACKED, _DEAD, _RETRIED = "#2b7bba", "#d7301f", "#fdae61"
_PCT_COLORS = {"p50": "#9ecae1", "p90": "#4292c6", "p99": "#08519c"}


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def charts(rep: Path, rows: dict[str, list[dict[str, Any]]], injected: dict[str, float]) -> None:
    """One PNG per question a reader of the report has; titles are the questions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 1. How fast did the workers drain the queue? Seconds without settlements are zeros, not gaps.
    seen = {r["second"]: r for r in rows["throughput"]}
    tp = [
        seen.get(t, {"second": t, "acked": 0, "dead": 0})
        for t in range(min(seen, default=0), max(seen, default=-1) + 1)
    ]
    secs = [r["second"] for r in tp]
    fig, (ax, ax_dead) = plt.subplots(
        2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 1], "hspace": 0.15}
    )
    ax.bar(secs, [r["acked"] for r in tp], width=1.0, align="edge", color=_ACKED, label="acked")
    ax.set(ylabel="acked / s", ylim=(0, None))
    ax.set_title("How many messages did the workers settle each second?", loc="left")
    ax_dead.bar(secs, [r["dead"] for r in tp], width=1.0, align="edge", color=_DEAD, label="dead-lettered")
    top = max((r["dead"] for r in tp), default=0)
    ax_dead.set(
        ylabel="dead / s", ylim=(0, max(1, top) * 1.15), xlabel="seconds since the Spark write committed"
    )
    ax_dead.set_xlim(left=0)
    for a in (ax, ax_dead):
        a.grid(axis="y", alpha=0.3)
        a.legend(**_OUTSIDE)
    _save(fig, rep / "throughput.png")

    # 2. Where does the time go: waiting for a worker, or in the handler?
    dist = rows["latency_distribution"]
    floor = 0.001  # ms: a log axis has no zero; shorter times are drawn at this floor
    fig, ax = plt.subplots(figsize=(9, 3.8))
    share = [100 * r["quantile"] for r in dist]
    ax.plot(
        [max(r["pickup_ms"], floor) for r in dist],
        share,
        color=_ACKED,
        lw=2,
        label="pickup wait (first attempt)",
    )
    ax.plot(
        [max(r["handler_ms"], floor) for r in dist],
        share,
        color="#31a354",
        lw=2,
        label="handler time (every attempt)",
    )
    ax.set_xscale("log")
    ax.set(xlabel="milliseconds (log scale)", ylabel="% of messages at most this", ylim=(0, 100))
    ax.set_title("How long did messages wait for a worker, and how long did handlers run?", loc="left")
    ax.grid(alpha=0.3, which="both")
    ax.legend(**_OUTSIDE)
    _save(fig, rep / "pickup_distribution.png")

    def percentile_bars(ax: Any, labels: list[str], data: list[dict[str, Any]]) -> None:
        width = 0.8 / len(PERCENTILES)
        for i, q in enumerate(PERCENTILES):
            name = f"p{round(q * 100)}"
            ax.bar(
                [x - 0.4 + (i + 0.5) * width for x in range(len(labels))],
                [r[f"{name}_ms"] / 1000 for r in data],
                width,
                label=name,
                color=_PCT_COLORS[name],
            )
        ax.set(ylabel="pickup wait (s)", ylim=(0, None))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(**_OUTSIDE)

    # 3. Does priority work?
    bp = rows["latency_by_priority"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    percentile_bars(ax, [r["tier"] for r in bp], bp)
    ax.set_xticks(
        list(range(len(bp))),
        [f"{r['tier']} (priority {r['priority']:+d})\n{r['messages']:,} msgs" for r in bp],
    )
    ax.set_title("Do higher-priority tiers get picked up sooner? (pickup wait by tier)", loc="left")
    _save(fig, rep / "latency_priority.png")

    # 4. Does fair share per channel keep small merchants from waiting behind big ones?
    bc = sorted(rows["latency_by_channel_standard"], key=lambda r: -r["messages"])
    xs = list(range(len(bc)))
    fig, (ax_n, ax) = plt.subplots(
        2, 1, figsize=(11, 5.2), sharex=True, gridspec_kw={"height_ratios": [1, 2], "hspace": 0.1}
    )
    ax_n.bar(xs, [r["messages"] for r in bc], color="#969696", label="messages\n(standard tier)")
    ax_n.set(ylabel="messages", ylim=(0, None))
    ax_n.grid(axis="y", alpha=0.3)
    ax_n.legend(**_OUTSIDE)
    ax_n.set_title(
        "Do small merchants wait longer than big ones? (standard tier; channels = merchants, largest first)",
        loc="left",
    )
    percentile_bars(ax, [str(r["channel"]) for r in bc], bc)
    ax.set_xticks(xs, [str(r["channel"]) for r in bc], rotation=90, fontsize=7)
    ax.set_xlabel("merchant (channel)")
    _save(fig, rep / "latency_channel.png")

    # 5. Which event types fail, and does that match the failures injected?
    oc = rows["outcomes_by_kind"]
    xs = list(range(len(oc)))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for offset, key, label, color in (
        (-0.2, "retry_rate", "retried, then acked", _RETRIED),
        (0.2, "dead_letter_rate", "dead-lettered", _DEAD),
    ):
        values = [100 * r[key] for r in oc]
        bars = ax.bar([x + offset for x in xs], values, 0.4, label=label, color=color)
        ax.bar_label(bars, [f"{v:.1f}%" for v in values], fontsize=7, padding=2)
        if key in injected:
            ax.axhline(
                100 * injected[key],
                color=color,
                ls="--",
                lw=1,
                label=f"{label}: injected {100 * injected[key]:.1f}%",
            )
    ax.set_xticks(xs, [f"{r['kind']}\n{r['messages']:,} msgs" for r in oc])
    ax.set(ylabel="% of messages", ylim=(0, None))
    ax.margins(y=0.15)
    ax.set_title("Which event types were retried or dead-lettered, and how often?", loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(**_OUTSIDE)
    _save(fig, rep / "outcomes.png")


# -- html -------------------------------------------------------------------------------------

#: What each number of the report means (shown on the page, next to the numbers).
DEFINITIONS = {
    "due time": "when a message may first be delivered: the commit of the Spark write that enqueued it,"
    " or later for a delayed follow-up (its scheduled_at).",
    "pickup wait (pickup_*_ms)": "from a message's due time to the start of its first handler run. It"
    " includes the backlog wait (queued behind other ready messages while every handler slot is busy)"
    " and the time until a worker fetches it (NOTIFY, else its poll interval); it does not include"
    " handler time. First attempts only: retries wait their backoff on purpose (see end-to-end).",
    "priority": "a head start in time: a message is served as if it had been sent priority x the"
    " queue's priority_step earlier, so a negative priority makes it wait that long on purpose"
    " (bulk, -10 x 1 s: at least 10 s of pickup wait) and a positive one overtakes older messages.",
    "handler time (handler_*_ms)": "how long the handler function ran, per attempt (timed inside the"
    " worker). This pipeline's handler is trivial on purpose: it measures the queue, not the work.",
    "end-to-end (end_to_end_*_ms)": "from the due time to the message's settlement (acked or"
    " dead-lettered, when it reached the archive): pickup wait, handler time and settling, plus every"
    " retry and its backoff.",
    "throughput": "messages settled (acked or dead-lettered) per second of wall time. Average: messages"
    " / seconds from the commit of the Spark write to the last settlement; peak: the busiest second.",
    "enqueue_msg_per_s": "events / wall time of the Spark write job (Spark's job overhead included).",
    "drain_s": "wall time from the end of the Spark write until every message was settled.",
    "retry_rate": "share of messages acked after more than one attempt.",
    "dead_letter_rate": "share of messages dead-lettered after max attempts.",
    "p50 / p90 / p99": "percentiles: half, 90% and 99% of the messages took at most this long"
    " (Spark's percentile_approx, accuracy 10,000).",
    "clocks": "due and settlement times come from PostgreSQL's clock, handler start times from the"
    " worker's host clock; on one machine they agree.",
}


def _table(data: list[dict[str, Any]]) -> str:
    if not data:
        return "<p>(none)</p>"
    cols = list(data[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 1 else f"{v:,.1f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c in cols) + "</tr>" for r in data)
    return f"<table><tr>{head}</tr>{body}</table>"


def _chart(png: str, question: str, reading: str, *tables: list[dict[str, Any]]) -> str:
    return (
        f"<h2>{html.escape(question)}</h2><p>{html.escape(reading)}</p>"
        f'<img src="{png}" alt="{html.escape(question)}">' + "".join(_table(t) for t in tables)
    )


def page(rep: Path, summary: dict[str, Any], timings: Any, rows: dict[str, list[dict[str, Any]]]) -> None:
    stages = [{"stage": k, "seconds": round(v, 2)} for k, v in timings.stages.items()]
    params = [{"parameter": k, "value": v} for k, v in getattr(timings, "params", {}).items()]
    definitions = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in DEFINITIONS.items()
    )
    numbers = [{"metric": k, "value": v} for k, v in summary.items() if not isinstance(v, dict)]
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>LonnyMQ pipeline report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }} img {{ max-width: 100%; }}
dt {{ font-weight: 600; margin-top: 0.5em; }} dd {{ margin-left: 1.5em; }}
</style></head><body>
<h1>LonnyMQ reference pipeline</h1>
<p>{summary["events"]:,} order events, bulk-enqueued with Spark (<code>format("lonnymq")</code>),
processed by <code>lonnymq.worker</code> processes with injected failures, then read back from the
queue's archive by a Spark job.</p>
<h2>Run parameters</h2>{_table(params)}
<h2>What the numbers mean</h2><dl>{definitions}</dl>
<h2>Summary</h2>{_table(numbers)}
<h2>Stages (wall time)</h2>{_table(stages)}
{
        _chart(
            "throughput.png",
            "Throughput: how many messages did the workers settle each second?",
            "Acked (top) and dead-lettered (bottom, its own scale) per second since the Spark write"
            " committed. The spike at 10 s is the bulk tier coming due (priority -10 x 1 s); the tail"
            " is delayed follow-ups coming due and retries after their backoff.",
        )
    }
{
        _chart(
            "pickup_distribution.png",
            "Where does the time go: waiting for a worker, or in the handler?",
            "Each curve reads: this % of messages waited (or ran) at most x milliseconds. A step in"
            " the pickup curve is a group of messages that waited the same extra time: here the bulk"
            " tier's 10 s priority delay.",
        )
    }
{
        _chart(
            "latency_priority.png",
            "Pickup latency by priority: do higher-priority tiers get picked up sooner?",
            "Pickup wait percentiles per service tier. Priority is a head start in time (see"
            " 'priority' above): express overtakes the backlog, bulk waits out its 10 s on purpose.",
            rows["latency_by_priority"],
        )
    }
{
        _chart(
            "latency_channel.png",
            "Pickup latency by channel: do small merchants wait longer than big ones?",
            "Each merchant is a channel; LonnyMQ shares fetches fairly between channels. Compared"
            " within the standard tier (priority 0), since priority shifts pickup on purpose. Top:"
            " messages per merchant; bottom: their pickup wait percentiles. The table is every tier.",
            rows["latency_by_channel"],
        )
    }
{
        _chart(
            "outcomes.png",
            "Retries and dead letters: which event types failed, and how often?",
            "Bars: the measured rates per event type; dashed lines: the failure rates the workers"
            " inject. They should agree.",
            rows["outcomes_by_kind"],
            rows["outcomes_by_channel"],
        )
    }
<p>Tables as Parquet next to this page: throughput, latency_by_priority, latency_by_channel,
latency_by_channel_standard, latency_distribution, outcomes_by_kind, outcomes_by_channel, overall; summary.json (with the
run parameters).</p>
</body></html>
"""
    (rep / "index.html").write_text(doc)
