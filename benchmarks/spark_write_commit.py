"""The Spark batch write's commit against its floor, in SQL only (no Spark, one process).

    python benchmarks/spark_write_commit.py --dsn postgresql://... [-n 200000] [--reps 3]

The same ``n`` rows (~210 bytes of JSON each, in two parts, as two Spark tasks stage them) are
published, each repetition, in alternating order, by:

* ``floor``: the write floor of ``spark_jdbc.py`` (``floor_sink``'s commit): one bare
  ``INSERT ... SELECT`` per part from a bare staging table into a copy of ``message_logged``
  that holds no other rows;
* ``bare into message, below``: the same statement into the real ``message`` table, for queue
  ``q``, while queue ``other`` (created after ``q``: a higher queue id) holds ``n`` messages;
* ``bare into message, above``: the same for queue ``top`` (created after ``other``);
* ``spark_write_commit``: our commit of ``q``'s staged parts (every send rule, staging cleanup),
  staged as the writer stages them (without a content type: the commit gives it).

Every phase starts settled (VACUUM ANALYZE, CHECKPOINT) and its transaction's commit is timed.
The message table's indexes lead with the queue id, so a queue with a lower id than another
queue's rows inserts in the middle of them, where the floor's copy always appends.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from lonnymq import Client

PAYLOAD = (
    "convert_to('{\"order_id\":' || i || ',\"customer\":\"c-' || lpad(mod(i, 50000)::text, 6, '0')"
    ' || \'","status":"created","amount":12.34,"currency":"EUR","items":[{"sku":"SKU-\''
    ' || mod(i, 313) || \'","qty":1}],"region":"eu","created_at":"2024-06-01T12:34:56.789Z",'
    '"source":"checkout-service"}\', \'UTF8\')'
)
TEXT = "text/plain; charset=utf-8"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    dsn, n, half = args.dsn, args.n, args.n // 2
    s = sql.Identifier(f"bench_{uuid.uuid4().hex[:8]}")
    results: dict[str, list[float]] = {}

    def run(text: str, *params: Any) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL(text).format(s=s, payload=sql.SQL(PAYLOAD)), params or None)

    def settle(*tables: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in tables:
                conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(t)))
            conn.execute("CHECKPOINT")

    def one_transaction(*statements: tuple[sql.Composed, tuple[Any, ...]]) -> Callable[[], None]:
        def go() -> None:
            with psycopg.connect(dsn) as conn:
                for query, params in statements:
                    conn.execute(query, params)
                conn.commit()

        return go

    bare = (
        "INSERT INTO {s}.{t} (queue_id, id, dequeue_at, scheduled_at, enqueued_at, gen, content_type, payload)"
        " SELECT %s, nextval('{s}.message_id_seq'), 0, 0, 0, 0, %s, payload FROM {s}.wfloor_stage"
        " WHERE part = %s ORDER BY seq"
    )

    def bare_into(table: str, queue_id: int) -> Callable[[], None]:
        query = sql.SQL(bare).format(s=s, t=sql.Identifier(table))
        return one_transaction(*((query, (queue_id, TEXT, part)) for part in (1, 2)))

    schema = s.as_string()[1:-1]
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        for q in ("q", "other", "top"):
            c.create_queue(q)
    try:
        ids = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, qid in conn.execute(sql.SQL("SELECT name, id FROM {}.queue").format(s)).fetchall():
                ids[name] = qid
        run(
            "SELECT count(*) FROM {s}.send_batch(p_queue => 'other',"
            " p_payloads => ARRAY(SELECT {payload} FROM generate_series(1, %s) i))",
            n,
        )
        run(
            "CREATE UNLOGGED TABLE {s}.wfloor_stage (part bigint NOT NULL, seq int NOT NULL, payload bytea NOT NULL)"
        )
        run("CREATE INDEX ON {s}.wfloor_stage (part, seq)")
        run("CREATE TABLE {s}.wfloor_msg (LIKE {s}.message_logged INCLUDING DEFAULTS INCLUDING INDEXES)")
        run_id = str(uuid.uuid4())
        phases: dict[str, tuple[Callable[[], None], tuple[str, ...]]] = {
            "floor (copy of message_logged)": (
                bare_into("wfloor_msg", ids["q"]),
                ("wfloor_stage", "wfloor_msg"),
            ),
            "bare into message, below": (bare_into("message", ids["q"]), ("wfloor_stage", "message_logged")),
            "bare into message, above": (
                bare_into("message", ids["top"]),
                ("wfloor_stage", "message_logged"),
            ),
            "spark_write_commit": (
                one_transaction(
                    (
                        sql.SQL(
                            "SELECT * FROM {}.spark_write_commit('q', %s::uuid, '{{1,2}}', %s::bigint[],"
                            " p_content_type => %s::text)"
                        ).format(s),
                        (run_id, [half, n - half], TEXT),
                    )
                ),
                ("spark_stage", "message_logged"),
            ),
        }
        print(f"{n:,} rows in 2 parts; queue 'other' holds {n:,}; {args.reps} reps", flush=True)
        for rep in range(args.reps):
            with Client(dsn, schema=schema, pool_size=1) as c:
                c.purge_queue("q")
                c.purge_queue("top")
            run("TRUNCATE {s}.spark_stage, {s}.wfloor_stage")
            run("DELETE FROM {s}.spark_stage_part")
            run("DELETE FROM {s}.wfloor_msg")
            for part, lo in ((1, 0), (2, half)):
                rows = half if part == 1 else n - half
                run(
                    "INSERT INTO {s}.spark_stage_part (part, run_id, queue) VALUES (%s, %s, 'q')",
                    part,
                    run_id,
                )
                for stage in ("spark_stage", "wfloor_stage"):  # the same rows in both
                    run(
                        "INSERT INTO {s}." + stage + " (part, seq, payload)"
                        " SELECT %s, i - %s, {payload} FROM generate_series(%s::int, %s::int) i",
                        part,
                        lo,
                        lo,
                        lo + rows - 1,
                    )
            names = list(phases) if rep % 2 == 0 else list(phases)[::-1]
            for name in names:
                fn, tables = phases[name]
                settle(*tables)
                t = time.perf_counter()
                fn()
                seconds = time.perf_counter() - t
                results.setdefault(name, []).append(seconds)
                print(
                    f"  rep {rep + 1}  {name:<32} {seconds:6.3f} s  {n / seconds:>9,.0f} rows/s", flush=True
                )
                # Each phase starts from the same tables: the rows it wrote go, as a purge does.
                with Client(dsn, schema=schema, pool_size=1) as c:
                    written = c.metrics("q").ready + c.metrics("top").ready
                    assert written == (0 if name.startswith("floor") else n), (name, written)
                    c.purge_queue("q")
                    c.purge_queue("top")
                run("DELETE FROM {s}.wfloor_msg")
    finally:
        run("DROP SCHEMA IF EXISTS {s} CASCADE")
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedians:")
    for k, v in med.items():
        print(f"  {k:<32} {v:6.3f} s  {n / v:>9,.0f} rows/s")
    floor = med["floor (copy of message_logged)"]
    for k in list(med)[1:]:  # in rows/s: the floor's seconds over these
        print(f"  ratio {k + ' / floor':<40} {floor / med[k]:5.2f}x")
    below = med["bare into message, below"]
    print(f"  ratio {'spark_write_commit / bare below':<40} {below / med['spark_write_commit']:5.2f}x")


if __name__ == "__main__":
    main()
