"""A/B of the producer and pop paths: two versions of lonnymq side by side on one server.

Each side is a source tree (``--before``, ``--after``: the ``src`` folder of a checkout); each
gets its own schema, migrated by its own code, and every measurement runs in a subprocess that
imports that side's package. Runs alternate (before, after, before, after, ...) and the report
gives the median msg/s of each side and the ratio after / before.

Workloads (one autocommit connection per producer or consumer, as in the benchmark harness):

* ``send``: one producer, ``Client.send()`` of one message per transaction;
* ``send8``: 8 producer processes at once, the same;
* ``pop``: one consumer, ``Client.take_tx(queue, 1)`` per transaction (take-and-delete) over a
  backlog made beforehand;
* ``key``: the ``--after`` side only: ``send()`` with and without an idempotency key
  (``before`` = without, ``after`` = with), for the cost of the key.

    python benchmarks/send_path.py --before ../main/src --after src --dsn postgresql://... \\
        [--seconds 3] [--reps 3] [--workloads send,send8,pop,key] [--async-commit]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

PAYLOAD = {"order_id": 123456, "customer": "c-000042", "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 120}


# -- worker side (runs with one version's package) ---------------------------------------------


def _client(dsn: str, schema: str) -> Any:
    import psycopg

    from lonnymq import Client

    conn = psycopg.connect(dsn, autocommit=True)
    return Client(conn, schema=schema), conn


def _send_for(dsn: str, schema: str, seconds: float, keyed: bool, start: Any, out: Any) -> None:
    c, conn = _client(dsn, schema)
    kw: dict[str, Any] = {}
    if keyed:  # the client's own keys (UUIDv7); only the --after side has them
        from lonnymq.client.ops import new_send_key  # type: ignore[attr-defined,unused-ignore]
    c.send("q", PAYLOAD)  # connect, prepare
    start.wait()
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if keyed:
            kw["idempotency_key"] = new_send_key()
        c.send("q", PAYLOAD, **kw)
        n += 1
    out.put(n)
    conn.close()


def worker(args: argparse.Namespace) -> None:
    if args.worker in ("send", "send8", "key-off", "key-on"):
        procs = 8 if args.worker == "send8" else 1
        start = mp.Barrier(procs + 1)
        out: Any = mp.Queue()
        ps = [
            mp.Process(
                target=_send_for,
                args=(args.dsn, args.schema, args.seconds, args.worker == "key-on", start, out),
            )
            for _ in range(procs)
        ]
        for p in ps:
            p.start()
        start.wait()
        t = time.perf_counter()
        total = sum(out.get() for _ in ps)
        for p in ps:
            p.join()
        print(json.dumps({"rate": total / (time.perf_counter() - t)}))
    elif args.worker == "pop":
        c, conn = _client(args.dsn, args.schema)
        c.purge_queue("q")
        for _ in range(args.backlog // 1000):
            c.send_batch("q", [PAYLOAD] * 1000)
        n = 0
        t = time.perf_counter()
        end = t + args.seconds
        while time.perf_counter() < end and c.take_tx("q", 1):
            n += 1
        print(json.dumps({"rate": n / (time.perf_counter() - t)}))
        conn.close()


# -- driver ----------------------------------------------------------------------------------


def _run(src: str, dsn: str, schema: str, workload: str, args: argparse.Namespace) -> float:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    if args.async_commit:
        env["PGOPTIONS"] = "-c synchronous_commit=off"

    cmd = [sys.executable, __file__, "--worker", workload, "--dsn", dsn, "--schema", schema]
    cmd += ["--seconds", str(args.seconds), "--backlog", str(args.backlog)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["rate"])


def _setup(src: str, dsn: str, schema: str) -> None:
    code = (
        "import sys; from lonnymq import Client\n"
        "with Client(sys.argv[1], schema=sys.argv[2], pool_size=1) as c:\n"
        "    c.migrate(); c.create_queue('q', if_not_exists=True)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, dsn, schema],
        env=dict(os.environ, PYTHONPATH=os.path.abspath(src)),
        check=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LONNYMQ_DSN", "postgresql://root@127.0.0.1:5432/test"))
    ap.add_argument("--before")
    ap.add_argument("--after")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=20000)
    ap.add_argument("--workloads", default="send,send8,pop,key")
    ap.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit = off: the CPU cost of the paths without the wait for the WAL flush",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--schema", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.before or not args.after:
        ap.error("--before and --after are required")
    import psycopg
    from psycopg import sql

    tag = uuid.uuid4().hex[:6]
    schemas = {"before": f"ab_before_{tag}", "after": f"ab_after_{tag}"}
    srcs = {"before": args.before, "after": args.after}
    try:
        for side in ("before", "after"):
            _setup(srcs[side], args.dsn, schemas[side])
        for workload in args.workloads.split(","):
            rates: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.reps):
                for side in ("before", "after"):
                    if workload == "key":
                        w = "key-off" if side == "before" else "key-on"
                        rates[side].append(_run(srcs["after"], args.dsn, schemas["after"], w, args))
                    else:
                        rates[side].append(_run(srcs[side], args.dsn, schemas[side], workload, args))
            b, a = statistics.median(rates["before"]), statistics.median(rates["after"])
            detail = " ".join(
                f"{x:,.0f}/{y:,.0f}" for x, y in zip(rates["before"], rates["after"], strict=True)
            )
            print(
                f"{workload:6}  before {b:>9,.0f}/s  after {a:>9,.0f}/s  ratio {a / b:5.2f}   runs (b/a): {detail}"
            )
            sys.stdout.flush()
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for s in schemas.values():
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(s)))


if __name__ == "__main__":
    main()
