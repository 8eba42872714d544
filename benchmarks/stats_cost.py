"""What the per-minute counters (issue 16, queue_stat, sql/stats.sql) cost on the hot path:
send, take+ack and batch send+take+ack on two schemas side by side, one with the function files
of this checkout and one with those of git revision ``--before`` (default: the revision before
migration 0010 added the counters, HEAD while that is uncommitted). Both schemas carry the same
tables (migrated by this checkout): the only difference is whether the calls count. One
connection per schema, one statement per message (batch: 100 per statement), calls
interleaved one by one, so a load spike on the machine hits both sides alike; medians and
the ratio counted/baseline.

    .venv/bin/python benchmarks/stats_cost.py --dsn postgresql://root@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from lonnymq import Client

COUNTED, BASELINE = "bench_stats_on", "bench_stats_off"
BODY = b'{"n": 1}'
# The function files whose functions call _stat_add.
CHANGED = ("send", "settle", "dead", "messages", "maintenance")
Conn = psycopg.Connection[tuple[object, ...]]


def baseline_ref(root: Path) -> str:
    """The revision before migration 0010 was committed (HEAD while it is not)."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "src/lonnymq/migrations/0010_dashboard.sql"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


def install(dsn: str, schema: str, before: str | None) -> None:
    """A fresh schema with queue 'b'; with ``before``, the function files of that revision."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    with Client(dsn, schema=schema, pool_size=1) as client:
        client.migrate()
        client.create_queue("b")
    if before is None:
        return
    root = Path(__file__).resolve().parent.parent
    with psycopg.connect(dsn, autocommit=True) as c:
        for name in CHANGED:
            text = subprocess.run(
                ["git", "show", f"{before}:src/lonnymq/sql/{name}.sql"],
                cwd=root,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rendered = sql.SQL(text).format(  # type: ignore[arg-type]
                schema=sql.Identifier(schema), schema_name=sql.Literal(schema)
            )
            c.execute(rendered)


def work(c: Conn, schema: str) -> dict[str, Callable[[], None]]:
    """One unit of each measured operation (batch: 100 messages) on queue 'b'."""
    s = sql.Identifier(schema)
    send_one = sql.SQL("SELECT id FROM {}.send_batch('b', ARRAY[%s::bytea])").format(s)
    send_many = sql.SQL("SELECT id FROM {}.send_batch('b', %s::bytea[])").format(s)
    take = sql.SQL("SELECT id, token FROM {}.take('b', %s)").format(s)
    ack = sql.SQL("SELECT {}.ack('b', %s::bigint[], %s::integer[])").format(s)

    def send() -> None:
        c.execute(send_one, (BODY,))

    def take_ack() -> None:
        row = c.execute(take, (1,)).fetchone()
        assert row is not None
        c.execute(ack, ([row[0]], [row[1]]))

    def batch() -> None:
        c.execute(send_many, ([BODY] * 100,)).fetchall()
        rows = c.execute(take, (100,)).fetchall()
        c.execute(ack, ([r[0] for r in rows], [r[1] for r in rows])).fetchall()

    return {"send": send, "take+ack": take_ack, "batch 100 send+take+ack": batch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True)
    p.add_argument("-n", type=int, default=3000, help="calls of each operation per side (default 3000)")
    p.add_argument("--before", metavar="REF", help="the baseline's revision (default: before 0010)")
    args = p.parse_args()
    before = args.before or baseline_ref(Path(__file__).resolve().parent.parent)
    install(args.dsn, COUNTED, None)
    install(args.dsn, BASELINE, before)
    times: dict[tuple[str, str], list[float]] = {}
    with psycopg.connect(args.dsn, autocommit=True) as on, psycopg.connect(args.dsn, autocommit=True) as off:
        sides = {COUNTED: work(on, COUNTED), BASELINE: work(off, BASELINE)}
        for op in sides[COUNTED]:
            # take+ack drains what send left; batch brings its own messages.
            n = args.n if op != "batch 100 send+take+ack" else max(args.n // 20, 10)
            warm = n // 10
            for i in range(n + warm):
                for schema in (COUNTED, BASELINE) if i % 2 else (BASELINE, COUNTED):
                    t = time.perf_counter()
                    sides[schema][op]()
                    if i >= warm:
                        times.setdefault((schema, op), []).append(time.perf_counter() - t)
            if op == "send":  # take+ack needs as many as it will take
                for schema in (COUNTED, BASELINE):
                    for _ in range(warm):
                        sides[schema]["send"]()
    print(f"baseline: git {before}; us per call, median over {args.n} calls (batch: per 100 messages)")
    print(f"{'operation':26} {'counted':>10} {'baseline':>10} {'ratio':>7}")
    for op in sides[COUNTED]:
        a = statistics.median(times[(COUNTED, op)]) * 1e6
        b = statistics.median(times[(BASELINE, op)]) * 1e6
        print(f"{op:26} {a:10.1f} {b:10.1f} {a / b:7.3f}")
    with psycopg.connect(args.dsn, autocommit=True) as c:
        for schema in (COUNTED, BASELINE):
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
