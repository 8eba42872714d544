"""What one rotation costs with a backlog frozen in one generation, half drained: buffers and
time of ``rotate(p_force => true)`` and of its statements (auto_explain, nested statements, sent
to the client), with take()'s settings (a rotation runs inside a take: enable_seqscan = off,
enable_sort = off, generic plans).

A fresh schema ``lonnymq`` in the scratch database of ``--dsn`` (the tree on ``PYTHONPATH``)
gets ``--messages`` messages in batches of 1,000 after one forced rotation, then VACUUM ANALYZE
(the producers benchmark's preload, whose statistics see every row in one generation); two
forced rotations freeze the backlog's generation; no rotation comes due while half of it is
drained by ``take(q, 100, ack=previous)``; then the rotation is counted.

    PYTHONPATH=<tree>/src python benchmarks/frozen_rotation.py --dsn postgresql://.../scratch
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import psycopg
from drain_trace import _setup_lonnymq, explained

from lonnymq import Client


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True, help="a scratch database (its schema lonnymq is re-created)")
    ap.add_argument("--messages", type=int, default=300_000)
    a = ap.parse_args()
    _setup_lonnymq(a.dsn, a.messages)
    with psycopg.connect(a.dsn, autocommit=True) as c:
        client = Client(c)
        for _ in range(2):
            c.execute("SELECT lonnymq.rotate(p_force => true)")
        frozen = c.execute("SELECT gens FROM lonnymq.message_gen_frozen").fetchall()
        c.execute(
            "SELECT setval('lonnymq.message_gen_started_seq',"
            " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)"
        )
        prev: list[Any] = []
        for _ in range(a.messages // 200):
            prev = list(client.take("bench", 100, ack=prev))  # type: ignore[arg-type]
        client.ack(prev)
        notes = explained(c)
        c.execute(
            "SET auto_explain.log_min_duration = 0; SET enable_seqscan = off; SET enable_sort = off;"
            " SET plan_cache_mode = force_generic_plan; SET jit = off"
        )
        t0 = time.perf_counter()
        c.execute("SELECT lonnymq.rotate(p_force => true)")
        ms = (time.perf_counter() - t0) * 1e3
    print(f"frozen generations {frozen}; {a.messages // 2} of {a.messages} drained; rotate: {ms:.1f} ms")
    for n in notes:  # the statements that read 100 buffers or more
        lines = n.split("\n")
        m = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?.*", n)
        if m and int(m.group(1)) + int(m.group(2) or 0) >= 100:
            print(f"  {lines[0]} {lines[1].strip()[:110]}\n    {m.group(0)}")


if __name__ == "__main__":
    main()
