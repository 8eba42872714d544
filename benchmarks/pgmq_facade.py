"""The pgmq facade's speed (issue 13 item 5): the same work through the facade's ``pgmq.*``
functions and through LonnyMQ's native functions, one connection, one statement per message
(batch send: 100 per statement), interleaved and repeated; medians and the facade/native ratio.
With ``--pgmq-dsn`` (a database where the real pgmq extension is installed; it cannot share a
database with the facade) the same ``pgmq.*`` calls run against pgmq itself too.

    .venv/bin/python benchmarks/pgmq_facade.py --dsn postgresql://root@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from lonnymq import Client

SCHEMA = "bench_pgmq_facade"
BODY = b'{"n": 1}'
Conn = psycopg.Connection[tuple[object, ...]]


def pgmq_work(c: Conn, n: int) -> dict[str, Callable[[], None]]:
    """The four measured operations through ``pgmq.*`` (facade or real pgmq), on queue 'bq'."""

    def send() -> None:
        for _ in range(n):
            c.execute("SELECT pgmq.send('bq', %s::jsonb)", (Jsonb({"n": 1}),))

    def read_delete() -> None:
        for _ in range(n):
            row = c.execute("SELECT msg_id FROM pgmq.read('bq', 30, 1)").fetchone()
            assert row is not None
            c.execute("SELECT pgmq.delete('bq', %s::bigint)", row)

    def pop() -> None:
        c.execute("SELECT pgmq.send_batch('bq', %s::jsonb[])", ([Jsonb({"n": 1})] * n,))
        for _ in range(n):
            c.execute("SELECT * FROM pgmq.pop('bq')").fetchone()

    def batch() -> None:
        for _ in range(n // 100):
            c.execute("SELECT pgmq.send_batch('bq', %s::jsonb[])", ([Jsonb({"n": 1})] * 100,)).fetchall()
        c.execute("SELECT pgmq.purge_queue('bq')")

    return {"send": send, "read+delete": read_delete, "pop": pop, "batch send": batch}


def native_work(c: Conn, n: int) -> dict[str, Callable[[], None]]:
    """The same operations through LonnyMQ's own functions, on queue 'bn'."""
    s = sql.Identifier(SCHEMA)
    send_one = sql.SQL("SELECT id FROM {}.send_batch('bn', ARRAY[%s::bytea], p_content_types => ARRAY['application/json'])").format(s)  # fmt: skip
    send_many = sql.SQL("SELECT id FROM {}.send_batch('bn', %s::bytea[], p_content_types => array_fill('application/json'::text, ARRAY[%s]))").format(s)  # fmt: skip
    take = sql.SQL("SELECT id, token FROM {}.take('bn', 1)").format(s)
    ack = sql.SQL("SELECT {}.ack('bn', ARRAY[%s::bigint], ARRAY[%s::integer])").format(s)
    take_tx = sql.SQL("SELECT * FROM {}.take_tx('bn', 1)").format(s)
    purge = sql.SQL("SELECT {}.queue_purge('bn')").format(s)

    def send() -> None:
        for _ in range(n):
            c.execute(send_one, (BODY,))

    def take_ack() -> None:
        for _ in range(n):
            row = c.execute(take).fetchone()
            assert row is not None
            c.execute(ack, row)

    def pop() -> None:
        c.execute(send_many, ([BODY] * n, n))
        for _ in range(n):
            c.execute(take_tx).fetchone()

    def batch() -> None:
        for _ in range(n // 100):
            c.execute(send_many, ([BODY] * 100, 100)).fetchall()
        c.execute(purge)

    return {"send": send, "read+delete": take_ack, "pop": pop, "batch send": batch}


def rate(f: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    f()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True, help="a database without the pgmq extension or a pgmq schema")
    ap.add_argument("--pgmq-dsn", help="a database with the real pgmq extension, for the third column")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    n = a.messages
    with Client(a.dsn, schema=SCHEMA, pool_size=1) as client:
        client.migrate(pgmq=True)
        client.create_queue("bn", max_attempts=2147483647, if_not_exists=True)
        try:
            with psycopg.connect(a.dsn, autocommit=True) as c:
                c.execute("SELECT pgmq.create('bq')")
                sides = {"facade": pgmq_work(c, n), "native": native_work(c, n)}
                real = psycopg.connect(a.pgmq_dsn, autocommit=True) if a.pgmq_dsn else None
                if real is not None:
                    real.execute("SELECT pgmq.create('bq')")
                    sides["pgmq"] = pgmq_work(real, n)
                rates: dict[tuple[str, str], list[float]] = {}
                for _ in range(a.repeat):
                    for op in ("send", "read+delete", "pop", "batch send"):
                        for side, work in sides.items():  # interleaved: the machine's noise hits all
                            rates.setdefault((op, side), []).append(rate(work[op], n))
                for op in ("send", "read+delete", "pop", "batch send"):
                    med = {side: statistics.median(rates[(op, side)]) for side in sides}
                    cols = "  ".join(f"{side} {v:8.0f}/s" for side, v in med.items())
                    ratios = f"facade/native {med['facade'] / med['native']:.2f}x"
                    if "pgmq" in med:
                        ratios += f", facade/pgmq {med['facade'] / med['pgmq']:.2f}x"
                    print(f"{op:12} {cols}  {ratios}")
                if real is not None:
                    real.execute("SELECT pgmq.drop_queue('bq')")
                    real.close()
        finally:
            client.uninstall_pgmq()
            with psycopg.connect(a.dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    main()
