"""A drain of a backlog frozen in one generation, the server's CPU per message.

A backlog older than the window (a drain that outlasts two rotations, docs/storage.md) sits in
a frozen generation. This sends ``--messages`` messages to a fresh ``lonnymq`` schema in the
database of ``--dsn``, freezes them in their generation (two forced rotations that move at most
5 rows), keeps any further rotation from coming due, and drains ``--drain`` of them with
``take(q, n, ack=previous)`` on one connection: the backend's CPU per message (from
``/proc/<pid>/schedstat``, so the server must run on this machine) and the wall time per
message. ``--batch`` sets the drain's batch (100; 1 is the one-at-a-time consumer's
``take(q, 1, ack=previous)``); ``--pop`` pops with ``take_tx(q, 1)`` instead. Compare source trees by running it with each on ``PYTHONPATH``, alternating:

    PYTHONPATH=<tree>/src python benchmarks/frozen_drain.py --dsn postgresql://.../scratch

The schema ``lonnymq`` of that database is dropped and re-created: use a scratch database.
"""

from __future__ import annotations

import argparse
import time

import psycopg
from send_cpu import _cpu  # type: ignore[import-not-found,unused-ignore]

from lonnymq import Client

PAYLOAD = {"i": 0, "pad": "x" * 180}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True, help="a scratch database (its schema lonnymq is re-created)")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--drain", type=int, default=60_000)
    ap.add_argument("--batch", type=int, default=100, help="take(q, batch, ack=previous)")
    ap.add_argument("--pop", action="store_true", help="take_tx(q, 1) instead of a drain")
    a = ap.parse_args()
    with psycopg.connect(a.dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS lonnymq CASCADE")
        client = Client(c)
        client.migrate()
        client.create_queue("bench")
        for start in range(0, a.messages, 1000):
            client.send_batch(
                "bench", [dict(PAYLOAD, i=i) for i in range(start, min(a.messages, start + 1000))]
            )
        for _ in range(2):
            c.execute("SELECT lonnymq.rotate(p_force => true, p_max_moves => 5)")
        c.execute(
            "SELECT setval('lonnymq.message_gen_started_seq',"
            " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)"
        )
        frozen = c.execute("SELECT gens FROM lonnymq.message_gen_frozen").fetchall()
        c.execute("VACUUM ANALYZE lonnymq.message")
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        client = Client(conn)
        prev: list[object] = []
        n = 0
        cpu0, t0 = _cpu(conn.info.backend_pid), time.perf_counter()
        while n < a.drain:
            got = (
                client.take_tx("bench", 1) if a.pop else client.take("bench", a.batch, ack=prev)  # type: ignore[arg-type]
            )
            if not got:
                break
            n += len(got)
            prev = list(got)
        cpu, wall = (_cpu(conn.info.backend_pid) - cpu0) * 1e6, time.perf_counter() - t0
    print(
        f"frozen generations {frozen}; {n} messages: server CPU {cpu / n:.2f} us/msg, wall {wall / n * 1e6:.2f} us/msg"
    )


if __name__ == "__main__":
    main()
