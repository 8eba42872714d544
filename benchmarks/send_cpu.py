"""What one send costs the server: backend CPU (µs per call: the backend's time on a CPU from
``/proc/<pid>/schedstat``, so the client's Python and the other processes do not count) and WAL
bytes per call (``pg_current_wal_insert_lsn()`` around the calls: run it on a server of your own,
where nothing else writes WAL), for ``send()`` of two source trees side by side and the send
floor (the rows a send writes, one plain statement on LonnyMQ's tables; see
``lonnymq_bench/systems/send_floor.py``) and the seed queue's ``INSERT ... RETURNING id`` (one
table, one index), alternating in rounds on one connection each. The ratios are the median over
rounds of each round's floor CPU / send CPU (side by side: the load of a round is common to both).

``synchronous_commit`` is ``off`` by default (``--commit on`` to include the flush wait in the
wall time; CPU is the same). The server must run on this machine (``/proc/<backend pid>``).

    python benchmarks/send_cpu.py --before ../main/src --after src --dsn postgresql://... \\
        [--calls 2000] [--rounds 5] [--commit off] [--key]
"""

from __future__ import annotations

import os
import re
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from send_path import _setup  # type: ignore[import-not-found,unused-ignore]
from send_path_sql import LEAN, PAYLOAD, before_after_args  # type: ignore[import-not-found,unused-ignore]

FLOOR = """
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
     ins AS (
       INSERT INTO {s}.message (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority,
                                content_type, payload)
       SELECT %s, nextval('{s}.message_id_seq'), %s, now.ms, now.ms, now.ms, 0, %s, %b
         FROM now
       RETURNING id, enqueued_at),
     st AS (INSERT INTO {s}.queue_stat (queue_id, minute, sent) SELECT %s, ins.enqueued_at / 60000, 1 FROM ins)
SELECT id FROM ins
"""
SEED = "INSERT INTO {s}.scpu_seed (payload) VALUES (%s::jsonb) RETURNING id"
TICK = os.sysconf("SC_CLK_TCK")

# --ablate: copies of the plain send() of the tree on PYTHONPATH, each without the SQL of one of
# the guarantees it adds to the send floor's rows (not for use: they show what each one costs).
_QUEUE_ROW = (
    "FROM (SELECT 1 AS id, 'q'::text AS name, 0::bigint AS priority_step_ms,"
    " 1048576 AS max_payload_bytes) x\n"
)
_GEN_LOCK = (
    r"pg_advisory_xact_lock_shared\(hashtext\(\{schema_name\} \|\| '/gen'\) & 2147483647,"
    r"\s+\(s\.last_value % 2147483647\)::integer\)::text"
)
_GEN_CHECK = r"AND g\.gen = \(SELECT s\.last_value FROM \{schema\}\.message_gen_seq s\s+WHERE s\.last_value >= g\.gen\)"
_WAKE = r"CASE WHEN current_setting\('lonnymq\.wake'.*?END AS woke"
ABLATIONS: dict[str, Callable[[str], str]] = {
    # the queue found by name (a fixed queue row instead: the queue must be the first one made)
    "no_lookup": lambda t: t.replace("FROM {schema}.queue x\n", _QUEUE_ROW),
    # the generation's hold and its re-check (the generation is still read)
    "no_gen_hold": lambda t: re.sub(_GEN_CHECK, "", re.sub(_GEN_LOCK, "'x'", t)),
    # the wake-up: send lock and waiter probe
    "no_wake": lambda t: re.sub(_WAKE, "'x' AS woke", t, flags=re.S),
}
ABLATIONS["none_of_them"] = lambda t: ABLATIONS["no_lookup"](
    ABLATIONS["no_gen_hold"](ABLATIONS["no_wake"](t))
)


def _ablated(name: str) -> str:
    """send() as ``send_<name>``, its plain statement without what ABLATIONS[name] removes."""
    from lonnymq.sql import function_text

    text = function_text("send")
    start = text.index("IF p_send_key IS NULL THEN")
    end = text.index("        ELSE\n", start)
    plain = ABLATIONS[name](text[start:end])
    if plain == text[start:end]:
        raise SystemExit(f"--ablate: {name} matches nothing in this send(); update benchmarks/send_cpu.py")
    text = text[:start] + plain + text[end:]
    return text.replace("FUNCTION {schema}.send(", "FUNCTION {schema}.send_" + name + "(", 1)


def _cpu(pid: int) -> float:
    """The backend's CPU seconds so far: ``/proc/<pid>/schedstat``'s time on a CPU (ns), else
    ``utime + stime`` from ``/proc/<pid>/stat`` (clock ticks)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    ap = before_after_args(__doc__, calls=2000, rounds=5)
    ap.add_argument("--key", action="store_true", help="also send() with an idempotency key")
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="also the --after tree's plain send() without each guarantee (run with PYTHONPATH=<after>/src)",
    )
    args = ap.parse_args()

    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:6]
    b, a = f"scpu_before_{tag}", f"scpu_after_{tag}"
    for src, schema in ((args.before, b), (args.after, a)):
        _setup(src, args.dsn, schema)

    # send()'s arguments as Client.send() passes them: queue, payload, content type, kind,
    # headers, at, delay, priority, key, channel, on_conflict, send key.
    plain = ("q", PAYLOAD, "application/json", *[None] * 4, 0, None, None, "ignore")

    def lean(s: str, key: bool) -> tuple[str, Callable[[], Any]]:
        return LEAN.format(s=s), lambda: (*plain, uuid.uuid4() if key else None)

    variants: dict[str, tuple[str, Callable[[], Any]]] = {
        "send_before": lean(b, False),
        "send_after": lean(a, False),
    }
    if args.key:
        variants["send_before_key"] = lean(b, True)
        variants["send_after_key"] = lean(a, True)
    conns: dict[str, psycopg.Connection[Any]] = {}
    cpu: dict[str, list[float]] = {}
    wal: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    try:
        with psycopg.connect(args.dsn, autocommit=True) as c0:
            qid, gen = c0.execute(
                sql.SQL(
                    "SELECT q.id, s.last_value FROM {s}.queue q, {s}.message_gen_seq s WHERE q.name = 'q'"
                ).format(s=sql.Identifier(a))
            ).fetchone() or (0, 0)
            c0.execute(
                sql.SQL(
                    "CREATE TABLE {}.scpu_seed (id bigserial PRIMARY KEY, payload jsonb NOT NULL)"
                ).format(sql.Identifier(a))
            )
            if args.ablate:
                for name in ABLATIONS:
                    c0.execute(
                        sql.SQL(_ablated(name)).format(schema=sql.Identifier(a), schema_name=sql.Literal(a))
                    )
                    variants[f"after_{name}"] = (
                        LEAN.format(s=a).replace(".send(", f".send_{name}("),
                        variants["send_after"][1],
                    )
        variants["floor"] = (FLOOR.format(s=a), lambda: (qid, gen, "application/json", PAYLOAD, qid))
        variants["seed"] = (SEED.format(s=a), lambda: (PAYLOAD.decode(),))
        for n in variants:
            c = psycopg.connect(args.dsn, autocommit=True, prepare_threshold=0)
            c.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(args.commit)))
            conns[n] = c
            cpu[n], wal[n], wall[n] = [], [], []
        for _ in range(args.rounds):
            for n, (query, params) in variants.items():
                c = conns[n]
                pid = c.info.backend_pid
                for _ in range(20):  # warm: the plan is cached
                    c.execute(query, params()).fetchall()
                lsn0 = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
                t0, c0cpu = time.perf_counter(), _cpu(pid)
                for _ in range(args.calls):
                    c.execute(query, params()).fetchall()
                t1, c1cpu = time.perf_counter(), _cpu(pid)
                d = c.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (lsn0,)).fetchone()[0]  # type: ignore[index]
                cpu[n].append((c1cpu - c0cpu) / args.calls * 1e6)
                wall[n].append((t1 - t0) / args.calls * 1e6)
                wal[n].append(float(d) / args.calls)
    finally:
        for c in conns.values():
            c.close()
        with psycopg.connect(args.dsn, autocommit=True) as c:
            for s in (b, a):
                c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))
    print(
        f"load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.calls} calls, synchronous_commit={args.commit}"
    )
    print(f"{'variant':16} {'server CPU us/call':>24} {'WAL B/call':>12} {'wall us/call':>14}")
    for n in variants:
        print(
            f"{n:16} {statistics.median(cpu[n]):10.1f} (min {min(cpu[n]):6.1f}) "
            f"{statistics.median(wal[n]):12.0f} {statistics.median(wall[n]):14.1f}"
        )
    for ref in ("floor", "seed"):
        for n in variants:
            if n not in ("floor", "seed"):
                per_round = [r / x for r, x in zip(cpu[ref], cpu[n], strict=True)]
                print(
                    f"{ref} CPU / {n} CPU: median {statistics.median(per_round):.2f}"
                    f" (rounds {min(per_round):.2f}..{max(per_round):.2f})"
                )


if __name__ == "__main__":
    main()
