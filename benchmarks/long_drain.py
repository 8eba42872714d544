"""One consumer's drain of a long backlog at batch 100: LonnyMQ's take(n, ack=previous) and the
API lease floor (benchmarks/lonnymq_bench/systems/api_floor.py) on the same tables, one
connection, no client objects (rows read as tuples), the rate every 20,000 messages.

    PYTHONPATH=src:benchmarks python benchmarks/long_drain.py --dsn postgresql://.../scratch \\
        --messages 200000 --systems floor,lonnymq,floor,lonnymq

The schemas lonnymq and lonnymq_floor of that database are dropped and re-created before each
system's drain: use a scratch database. Autovacuum is off on the message table during a drain
(the same for both), so each drain runs on the layout its own work leaves.
"""

from __future__ import annotations

import argparse
import time

import psycopg
from lonnymq_bench.systems import api_floor
from lonnymq_bench.systems.lonnymq import LonnyMQ

CALLS = {
    "floor": "SELECT * FROM lonnymq_floor.take(%s::text, %s::integer, %b::bigint[], %b::integer[])",
    "lonnymq": "SELECT * FROM lonnymq.take(%s::text, %s::integer, NULL::bigint, %b::bigint[], %b::integer[])",
}


def drain(dsn: str, system: str, messages: int, batch: int, step: int) -> list[float]:
    """Install both systems afresh, preload ``messages``, drain them with ``system``'s call; the
    rate of each ``step`` messages."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS lonnymq_floor CASCADE")
        c.execute("DROP SCHEMA IF EXISTS lonnymq CASCADE")
    api_floor.install_floor(dsn)
    LonnyMQ().preload(dsn, messages)
    rates: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("VACUUM ANALYZE lonnymq.message_logged")
        c.execute("ALTER TABLE lonnymq.message_logged SET (autovacuum_enabled = false)")
        ids: list[int] = []
        toks: list[int] = []
        n = mark = 0
        t = time.perf_counter()
        while True:
            rows = c.execute(CALLS[system], (api_floor.QUEUE, batch, ids or None, toks or None)).fetchall()  # type: ignore[arg-type]
            if not rows:
                break
            n += len(rows)
            ids, toks = [r[0] for r in rows], [r[2] for r in rows]
            if n - mark >= step:
                now = time.perf_counter()
                rates.append((n - mark) / (now - t))
                mark, t = n, now
        c.execute("ALTER TABLE lonnymq.message_logged RESET (autovacuum_enabled)")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dsn", required=True, help="a scratch database (schemas lonnymq, lonnymq_floor re-created)"
    )
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--step", type=int, default=20_000)
    ap.add_argument("--systems", default="floor,lonnymq,floor,lonnymq", help="drains in this order")
    a = ap.parse_args()
    for system in a.systems.split(","):
        rates = drain(a.dsn, system, a.messages, a.batch, a.step)
        whole = len(rates) * a.step / sum(a.step / r for r in rates) if rates else 0.0
        print(f"{system:8s} {whole:8.0f} msg/s overall; per {a.step}: " + " ".join(f"{r:.0f}" for r in rates))


if __name__ == "__main__":
    main()
