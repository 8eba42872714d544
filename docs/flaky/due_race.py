"""Repro of test_receive_wakes_when_a_scheduled_message_is_due's clock (docs/flaky.md): send a
message due in 0.5 s, then time receive(), N times; prints one JSON line with how often the
test's bound (took >= 0.4 s, the clock read after the send returned) fails, and how often a
clock read before the send would (took >= 0.45 s).

    DSN=postgresql://root@127.0.0.1:5432/DB PYTHONPATH=src python docs/flaky/due_race.py 200
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import psycopg
from psycopg import sql

from lonnymq import Client


def main() -> None:
    dsn, n = os.environ["DSN"], int(sys.argv[1])
    schema = "fh_" + uuid.uuid4().hex[:8]
    after: list[float] = []
    before: list[float] = []
    with Client(dsn, schema=schema) as client:
        client.migrate()
        client.create_queue("q")
        try:
            for _ in range(n):
                t_before = time.monotonic()
                client.send("q", b"soon", delay=0.5)
                t_after = time.monotonic()
                got = client.receive("q", timeout=60, poll=120.0)
                t_end = time.monotonic()
                assert len(got) == 1
                client.ack(got)
                after.append(t_end - t_after)
                before.append(t_end - t_before)
        finally:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    print(
        json.dumps(
            {
                "runs": n,
                "clock_after_send_below_0.4": sum(t < 0.4 for t in after),
                "min_clock_after_send": round(min(after), 4),
                "clock_before_send_below_0.45": sum(t < 0.45 for t in before),
                "min_clock_before_send": round(min(before), 4),
                "loadavg_at_end": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
