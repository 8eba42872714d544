"""The pgmq facade's speed (issue 13 item 5): send, read + delete, pop and batch send through the
facade's ``pgmq.*`` functions, through LonnyMQ's native functions (the statements its client
sends) and through pgmq itself, side by side in one run; prints the medians and the ratios
facade / native and facade / pgmq. Batch send has a fourth side, the floor: pgmq's own
send_batch plus, in the same statement, the conversion the facade cannot skip (each jsonb
message to its JSON text in UTF-8, LonnyMQ's payload bytes), with the ratio facade / floor.

    python benchmarks/pgmq_facade.py --dsn postgresql://root@127.0.0.1:5432/test

Each side runs on one autocommit connection, one statement per message (read + delete: two;
batch send: ``--batch`` messages per statement), with the benchmark suite's ~200-byte JSON
payload. The sides take turns call by call (facade, native, pgmq, facade, ...) for ``--seconds``
each, every call timed, so a busy machine's drifts hit them alike; a side's rate is its
messages over the time spent in its calls. That repeats ``--reps`` times per operation, and
every ratio is taken within one repetition, then the median. Before each repetition of an
operation the queues are emptied (and, for read + delete and pop, refilled with ``--backlog``
messages), vacuumed and checkpointed.

Two scratch databases on the server (the role must be allowed to CREATE DATABASE):
``<prefix>_facade`` holds LonnyMQ with the facade (``migrate(pgmq=True)``; the facade's queue
``bq`` and the native side's queue ``bn`` share its tables), ``<prefix>_pgmq`` holds pgmq's own
SQL-only install (the ``pgmq.sql`` shipped in the ``pgmq`` PyPI package; pip install -r
benchmarks/requirements.txt; its queue ``bq``, and ``bf`` for the floor). Both are dropped at
the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from lonnymq_bench import harness
from lonnymq_bench.harness import median, payload
from lonnymq_bench.server import dsn_or_temporary
from psycopg.types.json import Jsonb

from lonnymq import Client

OPS = ("send", "read+delete", "pop", "batch send")
SIDES = ("facade", "native", "pgmq", "floor")
# The goal of each ratio facade / side (issue 13 item 5).
GOALS = {"native": 0.9, "pgmq": 1.0, "floor": 0.9}
VT = 30
# The statements pgmq's own Python client sends (pgmq/_sql.py), for the facade and for pgmq.
SEND = "SELECT * FROM pgmq.send(queue_name=>%s::text, msg=>%s::jsonb)"
# Binary parameters for the array, the driver-level choice LonnyMQ's client makes.
SEND_BATCH = "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%b::jsonb[])"
READ = "SELECT msg_id, message FROM pgmq.read(queue_name=>%s::text, vt=>%s, qty=>%s)"
DELETE = "SELECT pgmq.delete(queue_name=>%s::text, msg_id=>%s::bigint)"
POP = "SELECT msg_id, message FROM pgmq.pop(queue_name=>%s::text, qty=>%s)"
# The floor of batch send: pgmq's own send_batch, and in the same statement the conversion of
# the same messages that the facade cannot skip (LonnyMQ stores a payload as bytes, pgmq's
# clients send jsonb: each message's JSON text, in UTF-8). The jsonb[] parameter is parsed once,
# as in pgmq's and the facade's statements; the WHERE makes the conversion run.
FLOOR_BATCH = (
    "WITH m AS MATERIALIZED (SELECT %b::jsonb[] AS msgs),"
    " c AS MATERIALIZED (SELECT ARRAY(SELECT pg_catalog.convert_to(e::text, 'UTF8')"
    " FROM unnest(m.msgs) AS e) AS payloads FROM m)"
    " SELECT s.id FROM m, c, LATERAL pgmq.send_batch(queue_name=>%s::text, msgs=>m.msgs) AS s(id)"
    " WHERE cardinality(c.payloads) = cardinality(m.msgs)"
)
MSGS = [payload(i) for i in range(1000)]

#: One unit of an operation (one message; a batch for batch send): returns the messages handled.
Unit = Callable[[int], int]


@dataclass
class Side:
    name: str
    dsn: str
    tables: tuple[str, ...]
    units: dict[str, Unit]
    fill: Callable[[int], None]  # n ready messages, untimed
    clear: Callable[[], None]
    cpu: Callable[[], int | None]  # the side's backend's CPU time so far (ns), if readable


def backend_cpu(c: psycopg.Connection[Any]) -> Callable[[], int | None]:
    """The CPU time (ns) the server process of connection ``c`` has run, from Linux's
    /proc/<pid>/schedstat: readable when the server runs on this machine (None otherwise). On a
    busy machine it measures a side's work without the time its calls waited for a CPU."""
    row = c.execute("SELECT pg_backend_pid()").fetchone()
    path = Path(f"/proc/{row[0] if row else 0}/schedstat")

    def read() -> int | None:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    return read


def pgmq_side(name: str, dsn: str, c: psycopg.Connection[Any], queue: str, batch: int) -> Side:
    """The four operations through ``pgmq.*`` on ``queue``: the facade's or pgmq's own."""

    def send(i: int) -> int:
        c.execute(SEND, [queue, Jsonb(MSGS[i % 1000])]).fetchall()
        return 1

    def read_delete(i: int) -> int:
        row = c.execute(READ, [queue, VT, 1]).fetchone()
        if row is None:
            return 0
        c.execute(DELETE, [queue, row[0]]).fetchall()
        return 1

    def pop(i: int) -> int:
        return 0 if c.execute(POP, [queue, 1]).fetchone() is None else 1

    def send_batch(i: int) -> int:
        c.execute(SEND_BATCH, [queue, [Jsonb(m) for m in MSGS[:batch]]]).fetchall()
        return batch

    def fill(n: int) -> None:
        for start in range(0, n, 1000):
            k = min(1000, n - start)
            c.execute(SEND_BATCH, [queue, [Jsonb(m) for m in MSGS[:k]]]).fetchall()

    def clear() -> None:
        c.execute("SELECT pgmq.purge_queue(%s)", [queue])

    units: dict[str, Unit] = {"send": send, "read+delete": read_delete, "pop": pop, "batch send": send_batch}
    tables = ("lonnymq.message",) if name == "facade" else (f"pgmq.q_{queue}", f"pgmq.a_{queue}")
    return Side(name, dsn, tables, units, fill, clear, backend_cpu(c))


def floor_side(dsn: str, c: psycopg.Connection[Any], queue: str, batch: int) -> Side:
    """Batch send only: pgmq's send_batch plus the facade's jsonb-to-bytes conversion of the same
    messages, on pgmq's own install (``queue``), in one statement (FLOOR_BATCH)."""

    def send_batch(i: int) -> int:
        rows = c.execute(FLOOR_BATCH, [[Jsonb(m) for m in MSGS[:batch]], queue]).fetchall()
        if len(rows) != batch:
            raise RuntimeError(f"the floor's batch sent {len(rows)} messages, not {batch}")
        return batch

    def clear() -> None:
        c.execute("SELECT pgmq.purge_queue(%s)", [queue])

    tables = (f"pgmq.q_{queue}", f"pgmq.a_{queue}")
    return Side("floor", dsn, tables, {"batch send": send_batch}, lambda n: None, clear, backend_cpu(c))


def native_side(dsn: str, c: psycopg.Connection[Any], queue: str, batch: int) -> Side:
    """The same operations through LonnyMQ's own functions, with the statements (and the row
    decoding) of its client: ``send``, ``take(1)`` + ``ack``, ``take_tx(1)`` (on a plain queue,
    the lean pop) and ``send_batch``."""
    ops = Client(c).ops

    def call(op: Any) -> Any:
        cur = c.cursor(binary=True, row_factory=op.row_factory)  # the client's rows: Op.row_factory
        cur.execute(op.query, op.params)
        return op.decode(cur.fetchall() if cur.rownumber is not None else [])

    def send(i: int) -> int:
        msg = MSGS[i % 1000]
        call(ops.send(queue, msg))
        return 1

    def take_ack(i: int) -> int:
        got = call(ops.take(queue, 1))
        if not got:
            return 0
        call(ops.ack(got))
        return 1

    def pop(i: int) -> int:
        return 1 if call(ops.take_tx(queue, 1)) else 0

    def send_batch(i: int) -> int:
        call(ops.send_batch(queue, MSGS[:batch]))
        return batch

    def fill(n: int) -> None:
        for start in range(0, n, 1000):
            call(ops.send_batch(queue, MSGS[: min(1000, n - start)]))

    def clear() -> None:
        call(ops.queue_purge(queue))

    units: dict[str, Unit] = {"send": send, "read+delete": take_ack, "pop": pop, "batch send": send_batch}
    return Side("native", dsn, ("lonnymq.message",), units, fill, clear, backend_cpu(c))


# What batch send's conversion costs the server, per message (conversion_cost): receiving the
# messages as bytes (LonnyMQ's client) or as jsonb (pgmq's API: each parsed), and each jsonb
# turned back into its text three ways.
CONVERSIONS = {
    "bytea[] received": ("SELECT cardinality(%b::bytea[])", "bytes"),
    "jsonb[] received (parsed)": ("SELECT cardinality(%b::jsonb[])", "jsonb"),
    "parsed + convert_to(m::text, 'UTF8')": (
        "SELECT cardinality(ARRAY(SELECT pg_catalog.convert_to(m::text, 'UTF8') FROM unnest(%b::jsonb[]) AS m))",
        "jsonb",
    ),
    "parsed + m::text": ("SELECT cardinality(ARRAY(SELECT m::text FROM unnest(%b::jsonb[]) AS m))", "jsonb"),
    "parsed + jsonb_send(m)": (
        "SELECT cardinality(ARRAY(SELECT jsonb_send(m) FROM unnest(%b::jsonb[]) AS m))",
        "jsonb",
    ),
}


def conversion_cost(dsn: str, batch: int, calls: int) -> dict[str, float] | None:
    """Server CPU per message (us) of each CONVERSIONS statement over batches of ``batch``
    messages, the statements taking turns call by call, ``calls`` calls each; None when the
    server's processes cannot be read (a remote server)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        cpu = backend_cpu(c)
        if cpu() is None:
            return None
        params = {
            "bytes": [json.dumps(m, separators=(",", ":")).encode() for m in MSGS[:batch]],
            "jsonb": [Jsonb(m) for m in MSGS[:batch]],
        }
        spent = dict.fromkeys(CONVERSIONS, 0)
        for i in range(calls + 5):
            for name, (query, kind) in CONVERSIONS.items():
                start = cpu() or 0
                c.execute(query, [params[kind]]).fetchall()
                if i >= 5:  # the first calls prepare the statements
                    spent[name] += (cpu() or 0) - start
    return {name: round(ns / calls / batch / 1000, 2) for name, ns in spent.items()}


def measure(sides: list[Side], reps: int, seconds: float, backlog: int) -> list[dict[str, Any]]:
    """Per repetition and operation: empty (and refill) every side's queue, vacuum, then run the
    sides' units in turn, one after the other, for ``seconds``, timing each: the machine's
    drifts hit every side alike. A side's rate is its messages over the time spent in its units;
    its CPU, the time its server process ran over the phase, per message (when readable). A side
    without a unit for an operation (the floor has batch send only) sits that one out."""
    out = []
    everyone = sides
    for rep in range(reps):
        for op in OPS:
            sides = [s for s in everyone if op in s.units]
            for side in sides:
                side.clear()
                if op in ("read+delete", "pop"):
                    side.fill(backlog)
                harness.vacuum(side.dsn, side.tables)
            spent = dict.fromkeys((s.name for s in sides), 0.0)
            done = dict.fromkeys((s.name for s in sides), 0)
            cpu0 = {s.name: s.cpu() for s in sides}
            end = time.monotonic() + seconds * len(sides)
            i = 0
            while time.monotonic() < end:
                side = sides[i % len(sides)]
                t = time.perf_counter()
                n = side.units[op](i // len(sides))
                spent[side.name] += time.perf_counter() - t
                if not n:
                    raise RuntimeError(f"{side.name} ran out of messages in {op}: raise --backlog")
                done[side.name] += n
                i += 1
            for side in sides:
                rate = done[side.name] / spent[side.name]
                start, stop = cpu0[side.name], side.cpu()
                cpu = None if start is None or stop is None else (stop - start) / done[side.name] / 1000
                out.append(
                    {
                        "rep": rep,
                        "op": op,
                        "side": side.name,
                        "n": done[side.name],
                        "rate": round(rate, 1),
                        "cpu_us": None if cpu is None else round(cpu, 1),
                    }
                )
                extra = "" if cpu is None else f", server CPU {cpu:,.0f} us/msg"
                print(f"  rep {rep} {op:<12} {side.name:<7} {rate:>9,.0f} msg/s{extra}", flush=True)
    return out


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for op in OPS:
        by = {(r["side"], r["rep"]): r["rate"] for r in runs if r["op"] == op}
        reps = sorted({rep for _, rep in by})
        row: dict[str, Any] = {"op": op}
        for side in SIDES:
            rates = [by[(side, k)] for k in reps if (side, k) in by]
            row[side] = round(median(rates), 1) if rates else None
        for ref, goal in GOALS.items():
            ratios = [
                by[("facade", k)] / by[(ref, k)] for k in reps if (ref, k) in by and ("facade", k) in by
            ]
            row[f"facade/{ref}"] = round(median(ratios), 3) if ratios else None
            row[f"facade/{ref} per rep"] = [round(x, 3) for x in ratios]
            row[f"facade/{ref} met"] = None if not ratios else median(ratios) >= goal
        # Server CPU per message (lower is better): the facade's over the other side's.
        cpu = {(r["side"], r["rep"]): r.get("cpu_us") for r in runs if r["op"] == op}
        for side in SIDES:
            values = [v for k in reps if (v := cpu.get((side, k))) is not None]
            row[f"{side} cpu_us"] = round(median(values), 1) if values else None
        for ref in GOALS:
            fc = [(cpu.get(("facade", k)), cpu.get((ref, k))) for k in reps]
            ratios = [f / o for f, o in fc if f is not None and o]
            row[f"cpu facade/{ref}"] = round(median(ratios), 3) if ratios else None
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    what = {"read+delete": "read + delete (native: take + ack)", "pop": "pop (native: take_tx(1))"}
    goals = " | ".join(f"facade / {ref} (≥ {goal})" for ref, goal in GOALS.items())
    print(f"| operation | {' | '.join(SIDES)} | {goals} |")
    print(f"| --- |{' ---: |' * (len(SIDES) + len(GOALS))}")
    for r in rows:

        def rate(side: str, r: dict[str, Any] = r) -> str:
            return "" if r[side] is None else f"{r[side]:,.0f}/s"

        def ratio(ref: str, r: dict[str, Any] = r) -> str:
            v = r[f"facade/{ref}"]
            if v is None:
                return ""
            per = ", ".join(f"{x:.2f}" for x in r[f"facade/{ref} per rep"])
            return f"{v:.2f}x ({per}){'' if r[f'facade/{ref} met'] else ' **missed**'}"

        name = what.get(r["op"], r["op"])
        cells = [rate(side) for side in SIDES] + [ratio(ref) for ref in GOALS]
        print(f"| {name} | {' | '.join(cells)} |")
    if all(r["facade cpu_us"] is None for r in rows):
        return
    print("\nServer CPU per message (the backends' run time from /proc; lower is better):\n")
    print(f"| operation | {' | '.join(SIDES)} | {' | '.join(f'facade / {ref}' for ref in GOALS)} |")
    print(f"| --- |{' ---: |' * (len(SIDES) + len(GOALS))}")
    formats = [(f"{side} cpu_us", "{:,.0f} us") for side in SIDES]
    formats += [(f"cpu facade/{ref}", "{:.2f}x") for ref in GOALS]
    for r in rows:
        cells = ["" if r[key] is None else fmt.format(r[key]) for key, fmt in formats]
        print(f"| {what.get(r['op'], r['op'])} | {' | '.join(cells)} |")


@contextlib.contextmanager
def _databases(base: str, prefix: str, keep: bool) -> Iterator[tuple[str, str]]:
    """Scratch databases for the facade (with the native side) and for pgmq itself."""
    facade = harness.create_database(base, f"{prefix}_facade")
    real = harness.create_database(base, f"{prefix}_pgmq")
    try:
        yield facade, real
    finally:
        if not keep:
            harness.drop_database(base, f"{prefix}_facade")
            harness.drop_database(base, f"{prefix}_pgmq")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/pgmq_facade.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--dsn", help="server (a role that may CREATE DATABASE); default: a throwaway embedded PostgreSQL"
    )
    ap.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="time each side spends in each repetition of an operation (default 2)",
    )
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--batch", type=int, default=100, help="messages per batch send (default 100)")
    ap.add_argument("--backlog", type=int, default=10_000, help="ready messages before read/pop phases")
    ap.add_argument("--quick", action="store_true", help="one repetition of 0.2 s phases: a smoke run")
    ap.add_argument("--out", type=Path, help="write the results as JSON here too")
    ap.add_argument(
        "--db-prefix", default="facade_bench", help="scratch databases <prefix>_facade, <prefix>_pgmq"
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch databases")
    ap.add_argument(
        "--commit",
        choices=("on", "off"),
        default="on",
        help="synchronous_commit of the three connections (off: the server's work without the wait"
        " for the WAL flush; default on)",
    )
    a = ap.parse_args(argv)
    if a.quick:
        # A backlog no side drains in its 0.2 s (a pop at 2,500/s emptied 500: the smoke test
        # failed on a quiet machine): 5,000 lasts to 25,000/s.
        a.seconds, a.reps, a.backlog = 0.2, 1, 5_000
    from importlib.metadata import version

    from pgmq import get_embedded_sql_version, install_pgmq_from_sql

    command = shlex.join(["python", "benchmarks/pgmq_facade.py", *sys.argv[1:]])
    started = time.time()
    with dsn_or_temporary(a.dsn) as base:
        server = harness.server_settings(base)
        with _databases(base, a.db_prefix, a.keep) as (facade_dsn, pgmq_dsn):
            with Client(facade_dsn, pool_size=1) as client:
                client.migrate(pgmq=True)
                client.create_queue("bn", max_attempts=2147483647)
            with psycopg.connect(pgmq_dsn) as c:  # pgmq's installer wants a transaction
                install_pgmq_from_sql(conn=c)
            with (
                psycopg.connect(facade_dsn, autocommit=True) as fc,
                psycopg.connect(facade_dsn, autocommit=True) as nc,
                psycopg.connect(pgmq_dsn, autocommit=True) as pc,
                psycopg.connect(pgmq_dsn, autocommit=True) as lc,
            ):
                for conn in (fc, nc, pc, lc):
                    conn.execute("SELECT set_config('synchronous_commit', %s, false)", [a.commit])
                fc.execute("SELECT pgmq.create('bq')")
                pc.execute("SELECT pgmq.create('bq')")
                pc.execute("SELECT pgmq.create('bf')")
                sides = [
                    pgmq_side("facade", facade_dsn, fc, "bq", a.batch),
                    native_side(facade_dsn, nc, "bn", a.batch),
                    pgmq_side("pgmq", pgmq_dsn, pc, "bq", a.batch),
                    floor_side(pgmq_dsn, lc, "bf", a.batch),
                ]
                print(
                    f"pgmq facade vs native vs pgmq SQL {get_embedded_sql_version()} on PostgreSQL "
                    f"{server['server_version']}, {server['cpus']} CPUs, load {server['loadavg_at_start']}",
                    flush=True,
                )
                runs = measure(sides, a.reps, a.seconds, a.backlog)
            conversion = conversion_cost(facade_dsn, a.batch, 20 if a.quick else 300)
    rows = summarize(runs)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\nmsg/s, one connection each, median of {a.reps} interleaved repetitions of {a.seconds:g} s"
        f" (ratios: median of the per-repetition ratios); load {server['loadavg_at_start']} -> {load_end}\n"
    )
    print_table(rows)
    if conversion:
        print("\nServer CPU per message of batch send's conversion (us; one statement per batch):\n")
        for name, us in conversion.items():
            print(f"  {name:<40} {us:6.2f}")
    print(f"\nreproduce: {command}")
    if a.out:
        doc = {
            "meta": {
                "command": command,
                "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
                "seconds": round(time.time() - started),
                "server": server,
                "loadavg_at_end": load_end,
                "config": {
                    "seconds": a.seconds,
                    "reps": a.reps,
                    "batch": a.batch,
                    "backlog": a.backlog,
                    "synchronous_commit": a.commit,
                },
                "payload_bytes": harness.PAYLOAD_BYTES,
                "pgmq": f"pgmq SQL {get_embedded_sql_version()} (Python package {version('pgmq')})",
            },
            "summary": rows,
            "conversion_cpu_us_per_msg": conversion,
            "runs": runs,
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
