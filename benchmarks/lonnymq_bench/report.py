"""Summaries, target ratios, the printed table, results.json and the PNG chart."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .harness import median
from .workloads import Bench

# Targets, as ratios measured in the same run (see docs/benchmarks.md).
BATCH_VS_PGQUEUER = 5.0
BATCH_VS_FLOOR = 0.4
ONE_VS_SEED = 1.0
SEND_BATCH_VS_PGMQ = 1.5
PICKUP_P99_MS = 20.0


def summarize(b: Bench) -> list[dict[str, Any]]:
    """One row per (workload, kind, procs, system, variant): median rate over the repetitions."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in b.throughput:
        groups[(r["workload"], r["kind"], r["procs"], r["system"], r["variant"])].append(r)
    rows = []
    for (workload, kind, procs, system, variant), rs in groups.items():
        rates = [r["rate"] for r in rs]
        rows.append(
            {
                "workload": workload,
                "kind": kind,
                "procs": procs,
                "system": system,
                "variant": variant,
                "headline": rs[0]["headline"],
                "note": rs[0]["note"],
                "reps": len(rs),
                "rate_median": round(median(rates), 1),
                "rate_min": min(rates),
                "rate_max": max(rates),
                "complete": all(r.get("complete", True) for r in rs),
                "accounted": all(r.get("accounted", True) for r in rs),
            }
        )
    return rows


def per_rep(
    b: Bench, workload: str, kind: str, procs: int, system: str, pick: str = "headline"
) -> dict[int, float]:
    """rep -> rate of ``system``'s headline variant (``pick='best'``: its best variant; else the
    variant named ``pick``)."""
    out: dict[int, float] = {}
    for r in b.throughput:
        if (r["workload"], r["kind"], r["procs"], r["system"]) != (workload, kind, procs, system):
            continue
        if pick == "headline" and not r["headline"]:
            continue
        if pick not in ("headline", "best") and r["variant"] != pick:
            continue
        out[r["rep"]] = max(out.get(r["rep"], 0.0), r["rate"])
    return out


def ratio(
    b: Bench, workload: str, kind: str, procs: int, ours: str, ref: str, ref_pick: str
) -> tuple[float, list[float]]:
    a = per_rep(b, workload, kind, procs, ours)
    r = per_rep(b, workload, kind, procs, ref, ref_pick)
    ratios = [a[k] / r[k] for k in sorted(a) if k in r and r[k] > 0]
    return (median(ratios) if ratios else math.nan), ratios


def target(
    name: str, value: float, ratios: list[float], goal: float | None, op: str, detail: str
) -> dict[str, Any]:
    """A target's record; goal None: a ratio shown for context, with no goal."""
    ok = None if goal is None or math.isnan(value) else (value >= goal if op == ">=" else value < goal)
    return {
        "target": name,
        "value": None if math.isnan(value) else round(value, 3),
        "per_rep": [round(x, 3) for x in ratios],
        "goal": "" if goal is None else f"{op} {goal:g}",
        "met": ok,
        "detail": detail,
    }


def targets(b: Bench) -> list[dict[str, Any]]:
    """Each target as the median over repetitions of the per-repetition ratio."""
    have = {s.name for s, _ in b.systems}
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, ratios: list[float], goal: float | None, op: str, detail: str) -> None:
        out.append(target(name, value, ratios, goal, op, detail))

    procs_list = sorted({r["procs"] for r in b.throughput if r["workload"] == "drain"})
    if "lonnymq" in have:
        for p in procs_list:
            if "floor" in have:
                v, rs = ratio(b, "drain", "batch", p, "lonnymq", "floor", "headline")
                add(
                    f"batched take+ack / floor (P={p})",
                    v,
                    rs,
                    BATCH_VS_FLOOR,
                    ">=",
                    "take(100, ack=prev) vs DELETE ... LIMIT 100",
                )
            if "pgqueuer" in have:
                v, rs = ratio(b, "drain", "batch", p, "lonnymq", "pgqueuer", "best")
                add(
                    f"batched take+ack / PgQueuer drain (P={p})",
                    v,
                    rs,
                    BATCH_VS_PGQUEUER,
                    ">=",
                    "vs PgQueuer's best batch size in the run (10 or 100)",
                )
                v, rs = ratio(b, "drain", "batch", p, "lonnymq", "pgqueuer", "QueueManager batch_size=10")
                add(
                    f"  ... / PgQueuer at its default batch_size=10 (P={p})",
                    v,
                    rs,
                    BATCH_VS_PGQUEUER,
                    ">=",
                    "vs PgQueuer as configured out of the box",
                )
            if "seed" in have:
                v, rs = ratio(b, "drain", "one", p, "lonnymq", "seed", "headline")
                add(
                    f"one-at-a-time lease+ack / bare seed queue (P={p})",
                    v,
                    rs,
                    ONE_VS_SEED,
                    ">=",
                    "take(1, ack=prev) vs message_dequeue()",
                )
            if "leasefloor" in have:
                for kind, what in (("one", "one-at-a-time"), ("batch", "batched")):
                    v, rs = ratio(b, "drain", kind, p, "lonnymq", "leasefloor", "headline")
                    add(
                        f"  {what} lease+ack / lease floor (P={p})",
                        v,
                        rs,
                        None,
                        ">=",
                        "context: vs one plain statement that acks and leases (no attempts, tokens)",
                    )
        if "pgmq" in have:
            procs = sorted({r["procs"] for r in b.throughput if r["workload"] == "send"})
            for p in procs:
                v, rs = ratio(b, "send", "batch", p, "lonnymq", "pgmq", "best")
                add(
                    f"send_batch(1000) / pgmq send_batch (P={p})",
                    v,
                    rs,
                    SEND_BATCH_VS_PGMQ,
                    ">=",
                    "vs pgmq's faster variant in each repetition (text or binary parameters)",
                )
                v, rs = ratio(b, "send", "batch", p, "lonnymq", "pgmq", "send_batch(1000)")
                add(
                    f"  ... / pgmq send_batch as its client sends it (P={p})",
                    v,
                    rs,
                    SEND_BATCH_VS_PGMQ,
                    ">=",
                    "vs pgmq's own client statement (%s::jsonb[], text parameters)",
                )
        for rec in b.latency:
            if rec["system"] == "lonnymq" and rec["headline"]:
                v = rec["p99_ms"]
                add(
                    "idle pickup latency p99 (ms)",
                    v,
                    [v],
                    PICKUP_P99_MS,
                    "<",
                    f"{rec['variant']}, {rec['rate']:g} msg/s, {rec['consumers']} idle consumers",
                )
    return out


def print_report(b: Bench, rows: list[dict[str, Any]], tgts: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    t = Table(title="Throughput (msg/s, median of repetitions; min..max)", show_lines=False)
    for col in ("workload", "procs", "system", "variant", "median", "min..max", "reps", "note"):
        t.add_column(col, justify="right" if col in ("median", "procs", "reps") else "left")
    order = {s.name: i for i, (s, _) in enumerate(b.systems)}
    for r in sorted(
        rows,
        key=lambda r: (
            r["workload"] != "send",
            r["kind"] != "one",
            r["procs"],
            order.get(r["system"], 99),
            r["variant"],
        ),
    ):
        flags = "" if r["complete"] else " (time-boxed)"
        if not r["accounted"]:
            flags += " (COUNT MISMATCH)"
        t.add_row(
            f"{r['workload']} {r['kind']}",
            str(r["procs"]),
            r["system"],
            r["variant"] + ("" if r["headline"] else " *"),
            f"{r['rate_median']:,.0f}",
            f"{r['rate_min']:,.0f}..{r['rate_max']:,.0f}",
            str(r["reps"]),
            r["note"] + flags,
        )
    con.print(t)
    con.print("* shown for context; targets use the unstarred variant of each system")
    if b.latency:
        t = Table(title="Pickup latency at a fixed send rate, idle consumers (ms)")
        for col in ("system", "variant", "p50", "p90", "p99", "max", "received"):
            t.add_column(col)
        for r in b.latency:
            t.add_row(
                r["system"],
                r["variant"],
                f"{r['p50_ms']:.1f}",
                f"{r['p90_ms']:.1f}",
                f"{r['p99_ms']:.1f}",
                f"{r['max_ms']:.1f}",
                f"{r['received']}/{r['sent']}",
            )
        con.print(t)
    if b.flat:
        t = Table(
            title="Dequeue latency, one take+settle per round trip: empty queue vs a queue with future-dated + leased rows (ms), interleaved"
        )
        for col in (
            "system",
            "probe",
            "rows empty",
            "p50",
            "p99",
            "rows loaded",
            "p50 ",
            "p99 ",
            "p50 ratio",
        ):
            t.add_column(col)
        for r in b.flat:
            t.add_row(
                r["system"],
                r["probe"],
                f"{r['empty_rows']:,}",
                f"{r['empty_p50_ms']:.2f}",
                f"{r['empty_p99_ms']:.2f}",
                f"{r['loaded_rows']:,}",
                f"{r['loaded_p50_ms']:.2f}",
                f"{r['loaded_p99_ms']:.2f}",
                f"{r['p50_ratio']:.2f}",
            )
        con.print(t)
    for c in b.churn:
        tl = c["timeline"]
        first, last = tl[0], tl[-1]
        con.print(
            f"churn {c['system']:<9} {c['minutes']:g} min at {c['rate']:g} msg/s: consumed/s "
            f"{first['consumed_per_s']:,.0f} -> {last['consumed_per_s']:,.0f}, backlog -> {last['backlog']:,}, "
            f"take p50 {first['take_p50_ms']} -> {last['take_p50_ms']} ms, "
            f"dead tuples -> {last.get('dead_tuples', 'n/a')}"
        )
    if tgts:
        t = Table(title="Targets (ratios within this run)")
        for col in ("target", "value", "goal", "met", "per repetition", "compared"):
            t.add_column(col)
        for g in tgts:
            met = {True: "yes", False: "NO", None: "n/a" if g["goal"] else ""}[g["met"]]
            t.add_row(
                g["target"],
                "n/a" if g["value"] is None else f"{g['value']:.2f}",
                g["goal"],
                met,
                ", ".join(f"{x:.2f}" for x in g["per_rep"]),
                g["detail"],
            )
        con.print(t)


def write_json(
    path: Path, meta: dict[str, Any], b: Bench, rows: list[dict[str, Any]], tgts: list[dict[str, Any]]
) -> None:
    doc = {
        "meta": meta,
        "summary": rows,
        "targets": tgts,
        "throughput": b.throughput,
        "latency": b.latency,
        "flat": b.flat,
        "churn": b.churn,
    }
    path.write_text(json.dumps(doc, indent=1, default=str))


def write_chart(path: Path, b: Bench, rows: list[dict[str, Any]], title: str) -> bool:
    """A PNG with one panel per workload; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(19, 11))
    fig.suptitle(title, fontsize=11)

    def bars(ax: Any, picked: list[dict[str, Any]], label: Any, heading: str) -> None:
        if not picked:
            ax.set_axis_off()
            return
        names = [label(r) for r in picked]
        vals = [r["rate_median"] for r in picked]
        errs = [
            [r["rate_median"] - r["rate_min"] for r in picked],
            [r["rate_max"] - r["rate_median"] for r in picked],
        ]
        colors = [
            "tab:blue"
            if r["system"] == "lonnymq"
            else "tab:gray"
            if r["system"] in ("floor", "leasefloor")
            else "tab:orange"
            for r in picked
        ]
        ax.barh(range(len(vals)), vals, xerr=errs, color=colors)
        ax.set_yticks(range(len(vals)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("msg/s (median, min..max), log scale")
        ax.set_title(heading, fontsize=10)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:,.0f}", va="center", fontsize=7)

    order = {s.name: i for i, (s, _) in enumerate(b.systems)}

    def pick(workload: str, kind: str) -> list[dict[str, Any]]:
        return sorted(
            (r for r in rows if r["workload"] == workload and r["kind"] == kind),
            key=lambda r: (r["procs"], order.get(r["system"], 99), r["variant"]),
        )

    send_rows = pick("send", "one") + pick("send", "batch")
    bars(
        axes[0][0],
        send_rows,
        lambda r: f"{r['system']}: {r['variant']}",
        "send (one per tx, batches of 1000)",
    )
    bars(
        axes[0][1],
        pick("drain", "one"),
        lambda r: f"P={r['procs']} {r['system']}: {r['variant']}",
        "drain, one message per take",
    )
    bars(
        axes[0][2],
        pick("drain", "batch"),
        lambda r: f"P={r['procs']} {r['system']}: {r['variant']}",
        "drain, batched",
    )

    ax = axes[1][0]
    if b.latency:
        names = [f"{r['system']}: {r['variant']}" for r in b.latency]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [r["p50_ms"] for r in b.latency], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [r["p99_ms"] for r in b.latency], 0.4, label="p99")
        ax.axhline(PICKUP_P99_MS, color="red", lw=0.8, ls="--", label=f"target p99 {PICKUP_P99_MS:g} ms")
        ax.set_xticks(list(x), names, rotation=25, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms, log scale")
        ax.set_title("pickup latency, idle consumers", fontsize=10)
        ax.legend(fontsize=7)
    else:
        ax.set_axis_off()

    ax = axes[1][1]
    if b.flat:
        names = [r["system"] for r in b.flat]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [r["empty_p50_ms"] for r in b.flat], 0.4, label="p50, empty queue")
        ax.bar(
            [i + 0.2 for i in x],
            [r["loaded_p50_ms"] for r in b.flat],
            0.4,
            label=f"p50, + {b.flat[0]['future']:,} future + {b.flat[0]['leased']:,} leased",
        )
        for i, r in enumerate(b.flat):
            ax.text(
                i - 0.2, r["empty_p50_ms"], f"{r['empty_p50_ms']:.2f}", ha="center", va="bottom", fontsize=7
            )
            ax.text(
                i + 0.2, r["loaded_p50_ms"], f"{r['loaded_p50_ms']:.2f}", ha="center", va="bottom", fontsize=7
            )
        ax.set_xticks(list(x), names)
        ax.set_yscale("log")
        ax.set_ylabel("ms per take+settle round trip, log scale")
        ax.set_title("dequeue latency must stay flat", fontsize=10)
        ax.legend(fontsize=7)
    else:
        ax.set_axis_off()

    ax = axes[1][2]
    if b.churn:
        ax2 = ax.twinx()
        for c in b.churn:
            ts = [p["t"] / 60 for p in c["timeline"]]
            line = ax.plot(
                ts, [p["consumed_per_s"] for p in c["timeline"]], label=f"{c['system']} consumed/s"
            )
            dead = [p.get("dead_tuples") for p in c["timeline"]]
            if any(d is not None for d in dead):
                ax2.plot(
                    ts,
                    [d if d is not None else math.nan for d in dead],
                    ls=":",
                    color=line[0].get_color(),
                    label=f"{c['system']} dead tuples",
                )
        ax.set_xlabel("minutes")
        ax.set_ylabel("consumed msg/s")
        ax2.set_ylabel("dead tuples (dotted)")
        ax.set_title(
            f"churn at {b.churn[0]['rate']:g} msg/s, vacuum held back by an open snapshot", fontsize=10
        )
        ax.legend(fontsize=7, loc="lower left")
    else:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
