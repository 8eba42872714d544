"""Where a batch send through the pgmq facade spends its server work, counted in instructions
(issue 13, docs/pgmq.md "Where a facade batch's work goes, and its floor").

Each variant is one statement run in the facade's database as ``server_instructions.py`` runs
its pgmq workloads (a throwaway PostgreSQL 15, single-user under callgrind, the statement
``PREPARE``d and executed 45 and 120 times with the same ``jsonb[]`` literal of the facade
benchmark's 100 messages; the difference over 75 calls, per message):

    python benchmarks/facade_batch_floor.py                   # every variant, this checkout's src
    python benchmarks/facade_batch_floor.py --src path/to/src --variants facade,parse

pgmq's own ``send_batch`` is ``server_instructions.py --workloads pgmq_send_batch100``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import server_instructions as si

_COLS = "(queue_id, gen, dequeue_at, scheduled_at, enqueued_at, priority, content_type, payload)"
_ROWS = (
    " SELECT {id}1, 1, 5, 5, 5, 0, 'application/json', convert_to(m::text, 'UTF8')"
    " FROM unnest($2::jsonb[]) m, (SELECT $1::text) y"
)
_NEXT_ID = "nextval('lonnymq.message_id_seq'), "

VARIANTS = {
    # What pgmq's client sends, through the facade.
    "facade": "SELECT * FROM pgmq.send_batch(queue_name=>$1::text, msgs=>$2::jsonb[])",
    # The parameter alone: 100 JSON documents parsed into jsonb (pgmq pays it too).
    "parse": "SELECT cardinality($2::jsonb[]), $1::text",
    # The parameter and the facade's conversion of each jsonb into the UTF-8 bytes stored.
    "convert": "SELECT sum(octet_length(convert_to(m::text, 'UTF8'))) FROM unnest($2::jsonb[]) m,"
    " (SELECT $1::text) y",
    # A bare insert of the converted rows (no send_batch): into the partitioned table, and
    # straight into the ordinary queues' partition (no tuple routing).
    "insert": "INSERT INTO lonnymq.message " + _COLS + _ROWS.format(id=""),
    "insert_partition": "INSERT INTO lonnymq.message_logged (id, " + _COLS[1:] + _ROWS.format(id=_NEXT_ID),
    # A bare insert of 1-byte payloads: the insert without the conversion.
    "insert_tiny": "INSERT INTO lonnymq.message (queue_id, gen, dequeue_at, scheduled_at, enqueued_at, payload)"
    " SELECT 1, 1, 5, 5, 5, '\\x00'::bytea FROM unnest($2::jsonb[]) m, (SELECT $1::text) y",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="src", help="the LonnyMQ source tree whose facade is measured")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    args = ap.parse_args()
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            ap.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    msgs = si._pgmq_messages(100)
    quoted = ",".join('"' + m.replace("\\", "\\\\").replace('"', '\\"') + '"' for m in msgs)
    batch = "'{" + quoted + "}'"
    cluster = si.Cluster(args.bin)
    try:
        cluster.initdb()
        cluster.pg_ctl("start")
        si._pgmq_databases(cluster, f"postgresql://root@127.0.0.1:{cluster.port}/postgres", [("t", args.src)])
        cluster.pg_ctl("stop")
        low, high = 25, 100
        for name in names:
            counts = []
            for calls in (low, high):
                script = (
                    "SET synchronous_commit = on\nSELECT pgmq.purge_queue('q')\n"
                    # No rotation during the run, a fresh table (as server_instructions.py).
                    "SELECT setval('lonnymq.message_gen_started_seq',"
                    " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000)\n"
                    "VACUUM FULL lonnymq.message\nVACUUM ANALYZE lonnymq.message\n"
                    f"PREPARE p0 AS {VARIANTS[name]}\n" + f"EXECUTE p0('q', {batch})\n" * (20 + calls)
                )
                counts.append(cluster.single(script, "facade_t"))
            per = (counts[1] - counts[0]) / (high - low) / 100
            print(f"{name:17} {per / 1000:8.1f}k instructions/message", flush=True)
    finally:
        cluster.remove()


if __name__ == "__main__":
    main()
