"""A long drain at batch 100, traced: throughput and the server's CPU per half second, with
LonnyMQ's rotations marked, beside the lease floor's drain of the same backlog.

One consumer drains a backlog of ``--messages`` with LonnyMQ's ``take(q, 100, ack=previous)``
(the tree on ``PYTHONPATH``; a fresh schema ``lonnymq`` in the scratch database of ``--dsn``)
or with the lease floor's one statement (``lonnymq_bench/systems/lease_floor.py``, a fresh
table ``public.lq``), for at most ``--seconds``; the systems alternate, ``--reps`` times each.
Per call: the wall time and the backend's CPU (``/proc/<pid>/schedstat``: the server must run
on this machine). A second connection polls LonnyMQ's generation every 50 ms, so a call that
rotated is marked. At ``--explain`` seconds into the drain, one call runs under auto_explain
(ANALYZE, BUFFERS, nested statements, sent to the client as NOTICEs; those calls are left out
of the rates) and ``pgstatindex`` of the dequeue index (LonnyMQ) or of ``lq_vt`` (floor) is
read while the consumer waits.

    PYTHONPATH=src python benchmarks/drain_trace.py --dsn postgresql://root@127.0.0.1:5432/scratch \\
        [--messages 300000] [--seconds 4] [--reps 2] [--explain 0.2,2.5] [--json out.json]

As the producers benchmark's drain phase, the backlog is sent in batches of 1,000, then the
tables are vacuumed (ANALYZE) and checkpointed. Before the backlog, one forced rotation puts the
window on record, so that LonnyMQ's first take opens a generation, as after earlier phases.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

import psycopg
from lonnymq_bench.harness import payload
from lonnymq_bench.systems.lease_floor import DDL, LEASE
from psycopg import sql
from send_cpu import _cpu  # type: ignore[import-not-found,unused-ignore]

QUEUE = "bench"


def _setup_lonnymq(dsn: str, n: int) -> None:
    from lonnymq import Client

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS lonnymq CASCADE")
        client = Client(c)
        client.migrate()
        client.create_queue(QUEUE)
        c.execute("SELECT lonnymq.rotate(p_force => true)")
        for start in range(0, n, 1000):
            client.send_batch(QUEUE, [payload(i) for i in range(start, min(n, start + 1000))])
        for t in ("message_logged", "settled", "queue_stat"):
            c.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier("lonnymq", t)))
        c.execute("CHECKPOINT")


def _setup_floor(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS lq")
        c.execute(DDL)
        for start in range(0, n, 1000):
            c.execute(
                "INSERT INTO lq (payload) SELECT p::jsonb FROM unnest(%s::text[]) p",
                [[json.dumps(payload(i)) for i in range(start, min(n, start + 1000))]],
            )
        c.execute("VACUUM ANALYZE lq")
        c.execute("CHECKPOINT")


class Poller(threading.Thread):
    """LonnyMQ's generation, its start and the queue's frozen list, every 50 ms."""

    def __init__(self, dsn: str, t0: float) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.t0 = t0
        self.stop = threading.Event()
        self.seen: list[dict[str, Any]] = []

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            row = self.conn.execute(
                "SELECT pg_sequence_last_value('lonnymq.message_gen_seq'),"
                " (SELECT array_agg(f.gens) FROM lonnymq.message_gen_frozen f),"
                " (SELECT array_agg(p.gen ORDER BY p.gen) FROM lonnymq.message_gen_pending p)"
            ).fetchone()
            assert row is not None
            now = (row[0], str(row[1]), str(row[2]))
            if now != last:
                self.seen.append(
                    {
                        "t": round(time.perf_counter() - self.t0, 3),
                        "gen": row[0],
                        "frozen": now[1],
                        "pending": now[2],
                    }
                )
                last = now
            self.stop.wait(0.05)
        self.conn.close()


def explained(conn: psycopg.Connection[Any]) -> list[str]:
    """auto_explain on ``conn`` (ANALYZE, BUFFERS, nested statements, no timing), its plans sent
    to the client as NOTICEs and collected in the list returned; off until
    ``auto_explain.log_min_duration`` is set."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute(
        "SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on;"
        " SET auto_explain.log_timing = off; SET auto_explain.log_nested_statements = on;"
        " SET auto_explain.log_level = notice; SET auto_explain.log_min_duration = -1"
    )
    return notices


def _index_stats(conn: psycopg.Connection[Any], index: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT leaf_pages, deleted_pages, avg_leaf_density, tree_level FROM pgstatindex(%s)", [index]
    ).fetchone()
    assert row is not None
    return {"leaf_pages": row[0], "deleted_pages": row[1], "avg_leaf_density": row[2], "level": row[3]}


def drain(
    system: str,
    dsn: str,
    seconds: float,
    explain_at: list[float],
    slow_ms: float = -1,
    explain_msgs: list[int] | None = None,
) -> dict[str, Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    side = psycopg.connect(dsn, autocommit=True)
    side.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    notices = explained(conn)
    pid = conn.info.backend_pid
    off = f"SET auto_explain.log_min_duration = {int(slow_ms) if slow_ms >= 0 else -1}"
    conn.execute(off)
    index = "lonnymq.message_logged_gen_queue_id_dequeue_at_id_idx" if system == "lonnymq" else "lq_vt"
    if system == "lonnymq":
        from lonnymq import Client

        client = Client(conn)

        prev: list[Any] = []

        def call() -> int:
            nonlocal prev
            got = client.take(QUEUE, 100, ack=prev)  # type: ignore[arg-type]
            prev = list(got)
            return len(got)
    else:
        stmt = LEASE.format(n=100)
        ids: list[int] = []

        def call() -> int:
            nonlocal ids
            rows = conn.execute(stmt, {"prev": ids}).fetchall()
            ids = [r[0] for r in rows]
            return len(rows)

    t0 = time.perf_counter()
    poller = Poller(dsn, t0) if system == "lonnymq" else None
    if poller:
        poller.start()
    calls: list[tuple[float, float, float, int]] = []
    explains: list[dict[str, Any]] = []
    todo = sorted(explain_at)
    todo_msgs = sorted(explain_msgs or [])
    drained = 0
    while True:
        t = time.perf_counter() - t0
        if t >= seconds:
            break
        if (todo and t >= todo[0]) or (todo_msgs and drained >= todo_msgs[0]):
            if todo and t >= todo[0]:
                todo.pop(0)
            else:
                todo_msgs.pop(0)
            stats = _index_stats(side, index)
            notices.clear()
            conn.execute("SET auto_explain.log_min_duration = 0")
            n = call()
            conn.execute(off)
            explains.append(
                {
                    "t": round(t, 3),
                    "drained": drained,
                    "index": stats,
                    "plans": [x for x in notices if "Buffers" in x or "->" in x],
                }
            )
            drained += n
            if n == 0:
                break
            continue
        c0 = _cpu(pid)
        w0 = time.perf_counter()
        n = call()
        w1 = time.perf_counter()
        calls.append((round(w0 - t0, 5), w1 - w0, _cpu(pid) - c0, n))
        drained += n
        if n == 0:
            break
    if poller:
        poller.stop.set()
        poller.join()
    stats = _index_stats(side, index)
    slow = [x for x in notices if "duration" in x] if slow_ms >= 0 else []
    conn.close()
    side.close()
    return {
        "system": system,
        "calls": calls,
        "explains": explains,
        "gens": poller.seen if poller else [],
        "index_end": stats,
        "slow": slow,
    }


def buckets(calls: list[tuple[float, float, float, int]], width: float = 0.5) -> list[dict[str, Any]]:
    out: dict[int, list[float]] = {}
    for t, wall, cpu, n in calls:
        b = out.setdefault(int(t / width), [0.0, 0.0, 0.0, 0.0, 0.0])
        b[0] += n
        b[1] += wall
        b[2] += cpu
        b[3] += 1
        b[4] = max(b[4], wall)
    return [
        {
            "t": k * width,
            "msgs": int(v[0]),
            "rate": round(v[0] / v[1]) if v[1] else 0,  # msg/s of the calls' own wall time
            "cpu_us_msg": round(v[2] / v[0] * 1e6, 2) if v[0] else None,
            "wall_us_msg": round(v[1] / v[0] * 1e6, 2) if v[0] else None,
            "max_call_ms": round(v[4] * 1e3, 2),
        }
        for k, v in sorted(out.items())
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dsn", required=True, help="a scratch database (schema lonnymq and table lq re-created)"
    )
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--systems", default="lonnymq,leasefloor")
    ap.add_argument("--explain", default="", help="seconds into the drain, comma-separated")
    ap.add_argument(
        "--explain-msgs",
        default="",
        help="or after so many messages drained, comma-separated (deterministic)",
    )
    ap.add_argument(
        "--slow-ms",
        type=float,
        default=-1,
        help="auto_explain every statement slower than this (all calls instrumented)",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    explain_at = [float(x) for x in a.explain.split(",") if x]
    results = []
    for rep in range(a.reps):
        for system in a.systems.split(","):
            (_setup_lonnymq if system == "lonnymq" else _setup_floor)(a.dsn, a.messages)
            load = os.getloadavg()[0]
            r = drain(
                system,
                a.dsn,
                a.seconds,
                explain_at,
                a.slow_ms,
                [int(x) for x in a.explain_msgs.split(",") if x],
            )
            r["rep"] = rep
            r["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            r["buckets"] = buckets(r["calls"])
            results.append(r)
            print(f"# {system} rep {rep} load {r['load']}")
            for b in r["buckets"]:
                print(
                    f"  {b['t']:4.1f}s {b['rate']:>7,} msg/s  server {b['cpu_us_msg']} us/msg"
                    f"  wall {b['wall_us_msg']} us/msg  max call {b['max_call_ms']} ms"
                )
            for g in r["gens"]:
                print(f"  gen at {g['t']:.2f}s: {g['gen']} frozen {g['frozen']} pending {g['pending']}")
            slow = sorted(r["calls"], key=lambda c: -c[1])[:5]
            print("  slowest calls (t, ms):", [(c[0], round(c[1] * 1e3, 1)) for c in slow])
            for e in r["explains"]:
                print(f"  explain at {e['t']}s ({e['drained']} drained), index {e['index']}")
                for p in e["plans"]:
                    print("    " + p.replace("\n", "\n    "))
            print(f"  index at end {r['index_end']}")
            for x in r["slow"]:
                print("  slow: " + x.replace("\n", "\n    "))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"command": sys.argv, "results": [compact(r) for r in results]}, f, separators=(",", ":")
            )


def compact(r: dict[str, Any]) -> dict[str, Any]:
    """The JSON's form of a run: calls as [start s, wall us, server CPU us, messages], and of
    each explained call only the plans that read the dequeue index (LonnyMQ) or ``lq_vt``."""
    out = dict(r)
    out["calls"] = [[t, round(w * 1e6, 1), round(c * 1e6, 1), n] for t, w, c, n in r["calls"]]
    out["explains"] = [
        dict(
            e, plans=[p for p in e["plans"] if "_dequeue_at_id_idx on" in p or "lq_vt" in p or ".take(" in p]
        )
        for e in r["explains"]
    ]
    return out


if __name__ == "__main__":
    main()
