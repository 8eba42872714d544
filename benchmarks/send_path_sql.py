"""The statements of the producer and pop paths side by side, in one connection: what each call
costs the server plus one round trip, without the client's Python or a process per run.

Two source trees (``--before``, ``--after``) each migrate a schema of their own; then the calls
run in short rounds, alternating, on one connection (``synchronous_commit`` as given: ``off``
measures the work without the wait for the WAL flush), and the report gives the median and the
minimum microseconds per call over the rounds.

* ``send_before``: what ``Client.send()`` ran before: ``send_batch`` with one-element arrays;
* ``send_after``: the lean ``send()``; ``send_after_key``: the same with an idempotency key;
* ``pop_before`` / ``pop_after`` (and ``pop10_*``): ``take_tx(queue, 1)`` (10) over a backlog.

    python benchmarks/send_path_sql.py --before ../main/src --after src --dsn postgresql://... \\
        [--commit off] [--calls 100] [--rounds 40] [--backlog 30000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

from send_path import _setup  # type: ignore[import-not-found,unused-ignore]

PAYLOAD = json.dumps(
    {"order_id": 123456, "customer": "c-000042", "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 120}
).encode()

BATCH = (
    "SELECT ord, id, outcome FROM {s}.send_batch(%s::text, %b::bytea[], %b::text[], %b::text[], %b::jsonb[],"
    " %b::bigint[], %b::bigint[], %b::int2[], %b::text[], %b::text[], %s::text)"
)
LEAN = (
    "SELECT id, outcome FROM {s}.send(%s::text, %b::bytea, %s::text, %s::text, %b::jsonb, %s::bigint,"
    " %s::bigint, %s::int2, %s::text, %s::text, %s::text, %s::uuid)"
)
TAKE_TX = "SELECT * FROM {s}.take_tx(%s::text, %s::int, %s::bool)"


def before_after_args(doc: str | None, calls: int, rounds: int) -> argparse.ArgumentParser:
    """The options of a before/after comparison of two source trees on one server."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LONNYMQ_DSN", "postgresql://root@127.0.0.1:5432/test"))
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--commit", default="off", choices=["on", "off"])
    ap.add_argument("--calls", type=int, default=calls)
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap


def main() -> None:
    ap = before_after_args(__doc__, calls=100, rounds=40)
    ap.add_argument("--backlog", type=int, default=30000)
    ap.add_argument("--variants", default="send_before,send_after,send_after_key,pop_before,pop_after")
    args = ap.parse_args()

    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:6]
    b, a = f"abs_before_{tag}", f"abs_after_{tag}"
    for src, schema in ((args.before, b), (args.after, a)):
        _setup(src, args.dsn, schema)

    def key() -> uuid.UUID:  # a UUIDv7 as the client makes (its time first)
        v = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
        v = (v & ~(0xF << 76)) | (0x7 << 76)
        return uuid.UUID(int=(v & ~(0x3 << 62)) | (0x2 << 62))

    variants: dict[str, tuple[str, Any]] = {
        "send_before": (
            BATCH.format(s=b),
            lambda: (
                "q",
                [PAYLOAD],
                None,
                ["application/json"],
                None,
                None,
                None,
                None,
                None,
                None,
                "ignore",
            ),
        ),
        "send_after": (
            LEAN.format(s=a),
            lambda: ("q", PAYLOAD, "application/json", None, None, None, None, 0, None, None, "ignore", None),
        ),
        "send_after_key": (
            LEAN.format(s=a),
            lambda: (
                "q",
                PAYLOAD,
                "application/json",
                None,
                None,
                None,
                None,
                0,
                None,
                None,
                "ignore",
                key(),
            ),
        ),
        "pop_before": (TAKE_TX.format(s=b), lambda: ("p", 1, None)),
        "pop_after": (TAKE_TX.format(s=a), lambda: ("p", 1, None)),
        "pop10_before": (TAKE_TX.format(s=b), lambda: ("p", 10, None)),
        "pop10_after": (TAKE_TX.format(s=a), lambda: ("p", 10, None)),
    }
    names = args.variants.split(",")
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(args.commit)))
            for s in (b, a):
                conn.execute(sql.SQL("SELECT {}.queue_create('p')").format(sql.Identifier(s)))
                conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM {}.send_batch('p', array_fill(%s::bytea, ARRAY[%s]))"
                    ).format(sql.Identifier(s)),
                    (PAYLOAD, args.backlog),
                )
                conn.execute(sql.SQL("ANALYZE {}.message").format(sql.Identifier(s)))
            for _ in range(args.rounds):
                for n in names:
                    query, params = variants[n]
                    t = time.perf_counter()
                    for _ in range(args.calls):
                        conn.execute(query, params()).fetchall()  # type: ignore[arg-type]
                    times[n].append((time.perf_counter() - t) / args.calls * 1e6)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for s in (b, a):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))
    for n in names:
        print(f"{n:15} median {statistics.median(times[n]):8.1f} us   min {min(times[n]):8.1f} us")


if __name__ == "__main__":
    main()
