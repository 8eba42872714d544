"""Cost against the number of queues and channels (issue 19), side by side in one run.

    python benchmarks/scale.py                                # throwaway embedded PostgreSQL
    python benchmarks/scale.py --dsn postgresql://... --seconds 5 --queues 1,100,1000,10000

Queue series: N queues exist (LonnyMQ: rows of the shared message table; pgmq: a table pair per
queue), the measured queue is the last one created, one connection, one call per message:
single send, take+ack (LonnyMQ ``take(1, ack=previous)``, one round trip; pgmq ``read`` then
``delete``) and batch take+ack of 100. Channel series: one LonnyMQ queue whose messages are
spread over C channels (round robin), single take+ack. Prints messages per second and the ratio
to the smallest case of each series. pgmq stops at ``--pgmq-max`` queues (creating 10,000 pgmq
queues means 20,000 tables and takes minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
from lonnymq_bench.server import dsn_or_temporary
from psycopg.types.json import Jsonb

from lonnymq import Client, Envelope, Message

SCHEMA = "scale_bench"
PAYLOAD = {"order": 12345, "customer": "c-42", "items": [1, 2, 3], "note": "x" * 120}


def rate(seconds: float, step: Callable[[], int]) -> float:
    """Messages per second of ``step`` (returns messages done per call) over ``seconds``."""
    n = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        n += step()
    return n / (time.perf_counter() - start)


def lonnymq_cells(c: Client, queue: str, seconds: float) -> dict[str, float]:
    cells = {"send": rate(seconds, lambda: len([c.send(queue, PAYLOAD)]))}
    c.send_batch(queue, [PAYLOAD] * 20_000)
    held: list[Message] = []

    def take_ack(n: int) -> Callable[[], int]:
        def step() -> int:
            nonlocal held
            got = c.take(queue, n, ack=held)
            done = len(held)
            held = got
            return done

        return step

    cells["take+ack"] = rate(seconds, take_ack(1))
    cells["take+ack x100"] = rate(seconds, take_ack(100))
    if held:
        c.ack(held)
    c.purge_queue(queue)
    return cells


def pgmq_cells(conn: psycopg.Connection[Any], queue: str, seconds: float) -> dict[str, float]:
    def send() -> int:
        conn.execute("SELECT * FROM pgmq.send(%s::text, %s::jsonb)", [queue, Jsonb(PAYLOAD)]).fetchall()
        return 1

    cells = {"send": rate(seconds, send)}
    for _ in range(20):
        conn.execute("SELECT * FROM pgmq.send_batch(%s::text, %s::jsonb[])", [queue, [Jsonb(PAYLOAD)] * 1000])

    def read_delete(n: int) -> Callable[[], int]:
        def step() -> int:
            ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s::text, 30, %s)", [queue, n])]
            if n == 1 and ids:
                conn.execute("SELECT pgmq.delete(%s::text, %s::bigint)", [queue, ids[0]])
            elif ids:
                conn.execute("SELECT * FROM pgmq.delete(%s::text, %s::bigint[])", [queue, ids]).fetchall()
            return len(ids)

        return step

    cells["take+ack"] = rate(seconds, read_delete(1))
    cells["take+ack x100"] = rate(seconds, read_delete(100))
    conn.execute("SELECT pgmq.purge_queue(%s)", [queue])
    return cells


def queue_series(dsn: str, counts: list[int], pgmq_max: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"lonnymq": {}, "pgmq": {}}
    have_pgmq = True
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        try:
            from pgmq import install_pgmq_from_sql

            conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
            with psycopg.connect(dsn) as c:
                install_pgmq_from_sql(conn=c)
        except ImportError:
            have_pgmq = False
        with Client(dsn, schema=SCHEMA, pool_size=1) as client:
            client.migrate()
            made = made_pgmq = 0
            for n in counts:
                conn.execute(
                    f"SELECT {SCHEMA}.queue_create('q' || i) FROM generate_series(%s::int, %s::int) i",
                    [made + 1, n],
                )
                made = n
                out["lonnymq"][n] = lonnymq_cells(client, f"q{n}", seconds)
                if have_pgmq and n <= pgmq_max:
                    for i in range(made_pgmq + 1, n + 1):
                        conn.execute("SELECT pgmq.create(%s)", [f"q{i}"])
                    made_pgmq = n
                    out["pgmq"][n] = pgmq_cells(conn, f"q{n}", seconds)
                print(json.dumps({"queues": n, **{k: v.get(n) for k, v in out.items()}}), flush=True)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        if have_pgmq:
            # One queue per transaction: dropping a thousand table pairs at once would need more
            # locks than max_locks_per_transaction allows.
            for (name,) in conn.execute("SELECT queue_name FROM pgmq.list_queues()").fetchall():
                conn.execute("SELECT pgmq.drop_queue(%s)", [name])
            conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
    return out


def channel_series(dsn: str, counts: list[int], seconds: float) -> dict[int, float]:
    out: dict[int, float] = {}
    with Client(dsn, schema=SCHEMA, pool_size=1) as c:
        c.migrate()
        for n in counts:
            queue = f"ch{n}"
            c.create_queue(queue)
            total = max(n * 2, 40_000)
            for start in range(0, total, 5_000):
                c.send_batch(
                    queue, [Envelope(PAYLOAD, channel=f"t{i % n}") for i in range(start, start + 5_000)]
                )
            held: list[Message] = []

            def step(queue: str = queue) -> int:
                nonlocal held
                got = c.take(queue, 1, ack=held)
                done = len(held)
                held = got
                return done

            out[n] = rate(seconds, step)
            print(json.dumps({"channels": n, "take+ack": out[n]}), flush=True)
            c.drop_queue(queue)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    return out


def report(queues: dict[str, Any], channels: dict[int, float]) -> str:
    lines = ["| system | workload | " + " | ".join(f"{n:,} queues" for n in queues["lonnymq"]) + " |"]
    lines.append("|---" * (2 + len(queues["lonnymq"])) + "|")
    for system, rows in queues.items():
        if not rows:
            continue
        first = next(iter(rows.values()))
        for work in first:
            cells = []
            for n in queues["lonnymq"]:
                if n in rows:
                    v = rows[n][work]
                    cells.append(f"{v:,.0f}/s ({v / first[work]:.2f}x)")
                else:
                    cells.append("-")
            lines.append(f"| {system} | {work} | " + " | ".join(cells) + " |")
    if channels:
        base = next(iter(channels.values()))
        lines.append("")
        lines.append("| LonnyMQ take+ack | " + " | ".join(f"{n:,} channels" for n in channels) + " |")
        lines.append("|---" * (1 + len(channels)) + "|")
        lines.append(
            "| one queue | " + " | ".join(f"{v:,.0f}/s ({v / base:.2f}x)" for v in channels.values()) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("LONNYMQ_BENCH_DSN"))
    p.add_argument("--queues", default="1,100,1000,10000")
    p.add_argument("--channels", default="10,1000,100000")
    p.add_argument("--pgmq-max", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args()
    with dsn_or_temporary(a.dsn) as dsn:
        queues = queue_series(dsn, [int(x) for x in a.queues.split(",") if x], a.pgmq_max, a.seconds)
        channels = channel_series(dsn, [int(x) for x in a.channels.split(",") if x], a.seconds)
    print(report(queues, channels))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"queues": queues, "channels": channels, "seconds": a.seconds}, f, indent=1)


if __name__ == "__main__":
    main()
