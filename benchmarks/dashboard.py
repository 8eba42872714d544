"""How fast each page of the web dashboard (lonnymq.web, issue 16 item 6) answers on a big
installation: 100 queues, one of them holding half of the messages, the rest spread over the
others (60 % ready, 40 % scheduled, one in 5,000 leased: leases are bounded by the consumers'
concurrency; a tenth keyed, 2 % of the big queue's in 10 channels), dead messages in the
archive and an hour of per-minute counters; vacuumed and analysed. Each page is requested through the ASGI
app in-process (the dashboard's own connection pool, the real templates and queries; no network),
once to warm up, then ``--runs`` times; the median and the slowest run are printed.

    .venv/bin/python benchmarks/dashboard.py --dsn postgresql://root@127.0.0.1:5432/test
    .venv/bin/python benchmarks/dashboard.py --dsn ... --messages 5000000   # the issue's size

The loading (generate_series inserts, then VACUUM ANALYZE) takes about 15 s per million rows
on a small machine; ``--keep`` leaves the schema for a second run (``--reuse``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import httpx
import psycopg
from psycopg import sql

from lonnymq import Client
from lonnymq.web import create_app

GEN = 1  # the generation writes of a fresh schema go to (sql/generations.sql)
CHUNK = 500_000


def load(dsn: str, schema: str, queues: int, messages: int, dead: int) -> None:
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        for i in range(queues):
            c.create_queue(f"q{i:03d}", max_attempts=3)
        for t in range(10):
            c.set_channel("q000", f"tenant-{t}", max_concurrency=5)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {}.queue ORDER BY name").format(s))]
        now = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchone()[0]  # type: ignore[index]
        # Half of the messages in q000, the other half spread over the other queues.
        plan = [(ids[0], messages // 2)] + [(q, (messages - messages // 2) // (queues - 1)) for q in ids[1:]]
        for qid, n in plan:
            for start in range(0, n, CHUNK):
                size = min(CHUNK, n - start)
                conn.execute(
                    sql.SQL(
                        """INSERT INTO {}.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at,
                                                   attempts, deliveries, leased, key, channel, payload)
                           SELECT %(q)s, %(gen)s,
                                  CASE WHEN i %% 5000 = 1 THEN %(now)s + 30000 + i   -- leased
                                       WHEN i %% 5 < 2 THEN %(now)s + 3600000 + i     -- scheduled
                                       ELSE %(now)s - %(n)s + i END,                  -- ready
                                  %(now)s - %(n)s + i, %(now)s - %(n)s + i,
                                  (i %% 5000 = 1)::int, (i %% 5000 = 1)::int, i %% 5000 = 1,
                                  CASE WHEN i %% 10 = 0 THEN 'key-' || i END,
                                  CASE WHEN %(q)s = %(big)s AND i %% 50 = 7 THEN 'tenant-' || (i %% 10) END,
                                  convert_to('{{"order": ' || i || ', "note": "benchmark"}}', 'UTF8')
                             FROM generate_series(%(start)s + 1, %(start)s + %(size)s) i"""
                    ).format(s),
                    {"q": qid, "start": start, "gen": GEN, "now": now, "n": n, "size": size, "big": ids[0]},
                )
        # Archived ids above every live one (ids grow with time).
        next_id = conn.execute(sql.SQL("SELECT max(id) + 1 FROM {}.message").format(s)).fetchone()[0]  # type: ignore[index]
        per_queue = max(1, dead // queues)
        conn.execute(
            sql.SQL(
                """INSERT INTO {}.archive (queue_id, id, status, archived_at, scheduled_at, enqueued_at,
                                           attempts, deliveries, priority, last_error, payload)
                   SELECT q, %s + g + q::bigint * %s, 'dead', %s - g, 0, 0, 3, 3, 0,
                          'RuntimeError: attempt 3 failed', '{{"order": 0}}'::bytea
                     FROM unnest(%s::int[]) q, generate_series(1, %s) g"""
            ).format(s),
            (next_id, per_queue, now, ids, per_queue),
        )
        conn.execute(
            sql.SQL(
                """INSERT INTO {s}.queue_stat (queue_id, minute, sent, acked, nacked, dead)
                   SELECT q, %s / 60000 - m, 100, 97, 2, 1
                     FROM unnest(%s::int[]) q, generate_series(0, 59) m, generate_series(1, 3) r"""
            ).format(s=s),
            (now, ids),
        )
        for table in ("message_logged", "archive", "queue_stat"):
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}.{}").format(s, sql.Identifier(table)))
    print(
        f"loaded {messages:,} messages, {dead:,} dead, {queues} queues in {time.perf_counter() - started:.0f} s"
    )


def pages(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        keyed = conn.execute(
            sql.SQL(
                "SELECT m.id, m.key FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
                " WHERE q.name = 'q000' AND m.key IS NOT NULL ORDER BY m.id DESC LIMIT 1"
            ).format(s=s)
        ).fetchone()
    assert keyed is not None, "no keyed message: load the schema first"
    mid, key = keyed
    return [
        "/",
        "/api/queues",
        "/?after=q050",
        "/queues/q000",
        "/queues/q042",
        "/queues/q000/messages",
        "/queues/q000/messages?status=leased",
        "/queues/q000/messages?status=scheduled",
        f"/queues/q000/messages?after={mid - 1000}",
        f"/queues/q000/messages/{mid}",
        f"/api/queues/q000/messages?key={key}",
        "/queues/q000/dead",
        "/queues/q000/archive",
        "/queues/q000/channels",
        "/cron",
        "/workers",
        "/api/queues/q000",
    ]


async def measure(dsn: str, schema: str, paths: list[str], runs: int) -> list[tuple[str, float, float]]:
    app = create_app(dsn, schema=schema, read_only=True)
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard") as http:
        for path in paths:
            times = []
            for i in range(runs + 1):
                t = time.perf_counter()
                r = await http.get(path)
                elapsed = time.perf_counter() - t
                if r.status_code != 200:
                    sys.exit(f"{path}: HTTP {r.status_code}: {r.text[:200]}")
                if i:  # the first is the warm-up (pool, plans)
                    times.append(elapsed * 1000)
            out.append((path, statistics.median(times), max(times)))
    await app.state.lonnymq_dashboard.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("LONNYMQ_DSN"), required=not os.environ.get("LONNYMQ_DSN"))
    p.add_argument("--schema", default="bench_dashboard")
    p.add_argument("--queues", type=int, default=100)
    p.add_argument("--messages", type=int, default=1_000_000, help="live messages (the issue's: 5000000)")
    p.add_argument("--dead", type=int, default=100_000, help="dead messages in the archive")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--reuse", action="store_true", help="use the schema a --keep run left")
    p.add_argument("--keep", action="store_true", help="leave the schema for --reuse")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    if args.queues < 2:
        p.error("--queues must be at least 2")
    if not args.reuse:
        load(args.dsn, args.schema, args.queues, args.messages, args.dead)
    results = asyncio.run(measure(args.dsn, args.schema, pages(args.dsn, args.schema), args.runs))
    width = max(len(r[0]) for r in results)
    print(f"{'page':<{width}}  median ms  max ms")
    for path, median, slowest in results:
        print(f"{path:<{width}}  {median:9.1f}  {slowest:6.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "messages": args.messages,
                    "queues": args.queues,
                    "dead": args.dead,
                    "runs": args.runs,
                    "pages": [
                        {"path": r[0], "median_ms": round(r[1], 2), "max_ms": round(r[2], 2)} for r in results
                    ],
                },
                f,
                indent=2,
            )
    if not args.keep:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(args.schema)))


if __name__ == "__main__":
    main()
