"""The client's own CPU per call on the hot paths, against a bare psycopg connection running the
same statements (the floor), for one or more source trees side by side.

Each measurement runs in a child process (``PYTHONPATH`` = the tree), on a schema of its own
made once by the parent. Two methods:

* ``--method time`` (default): ``time.process_time()`` (every thread of the child, the pool's
  included) around ``--calls`` calls, ``--rounds`` times per tree and case, trees alternating;
  prints the minimum (and the median) in µs per call.
* ``--method callgrind``: the instructions of the whole child process (valgrind's callgrind,
  every thread) for ``--calls`` calls minus those for ``--calls // 3`` calls, divided by the
  difference: start-up and set-up cancel out; prints thousands of instructions per call (the
  median of ``--rounds``). Deterministic but ~50x slower: use a few hundred calls. Whatever
  costs per unit of wall time (the pool's threads waking up) weighs 50x too much here.

Cases (``--ops``): ``take_ack`` (``take(q, 1)`` then ``ack(got)``), ``drain`` (``take(q, 1,
ack=previous)``: one call), ``take_tx`` (``take_tx(q, 1)`` in autocommit: the pop), ``send``,
``send_batch`` (10 payloads), ``take_nack``, ``extend`` (one message, extended again and again),
``receive_ack`` (``receive(q, 1)`` with a message ready, then ``ack``). Modes (``--modes``):
``client`` (``Client(dsn, pool_size=1)``), ``conn`` (``Client(connection)``: no pool, no
retries; the benchmark's lonnymq_bench clients), ``raw`` (psycopg alone: the client's composed
statements, its row factory, ``json``, one cursor), ``raw_bytes`` (the same with the statements
rendered to bytes once), ``bare`` (psycopg as pgmq's Python users call it: ``conn.execute(...)
.fetchall()``, a new cursor per call, tuple rows, the statements as bytes; the payload decoded
with ``json``; ``send``: the statement of the client's plain send, ``send_plain``, as
``.fetchone()``, the API send floor's call shape; until 2026-11-27 it ran ``send()``'s).

    PYTHONPATH=src python benchmarks/client_cpu.py --dsn postgresql://... \\
        --trees before=../main/src,after=src [--ops take_ack,send] [--modes client,raw] \\
        [--calls 2000] [--rounds 5] [--method time|callgrind] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

OPS = ("take_ack", "drain", "take_tx", "send", "send_batch", "take_nack", "extend", "receive_ack")
MODES = ("client", "conn", "raw", "raw_bytes", "bare")
QUEUE = "q"


def _fill(conn: Any, schema: str, n: int, ctype: str) -> None:
    """``n`` ready messages, made by the server (the child's CPU for it does not depend on n)."""
    from psycopg import sql

    conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {}.send_batch(%s::text,"
            " ARRAY(SELECT convert_to('{{\"n\": 1}}', 'utf8') FROM generate_series(1, %s)),"
            " NULL, array_fill(%s::text, ARRAY[%s]), NULL, NULL, NULL, NULL, NULL, NULL, 'ignore')"
        ).format(sql.Identifier(schema)),
        (QUEUE, n, ctype, n),
    )


def _purge(conn: Any, schema: str) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("SELECT {}.queue_purge(%s::text)").format(sql.Identifier(schema)), (QUEUE,))


def _client_loop(c: Any, op: str, calls: int) -> None:
    if op in ("take_ack", "receive_ack", "take_nack"):
        settle = c.nack if op == "take_nack" else c.ack
        for _ in range(calls):
            settle(c.receive(QUEUE, 1, timeout=5) if op == "receive_ack" else c.take(QUEUE, 1))
    elif op == "drain":
        prev: list[Any] = []
        for _ in range(calls):
            prev = c.take(QUEUE, 1, ack=prev)
    elif op == "take_tx":
        for _ in range(calls):
            c.take_tx(QUEUE, 1)
    elif op == "send":
        for i in range(calls):
            c.send(QUEUE, {"n": i})
    elif op == "send_batch":
        batch = [{"n": i} for i in range(10)]
        for _ in range(calls):
            c.send_batch(QUEUE, batch)
    elif op == "extend":
        got = c.take(QUEUE, 1)
        for _ in range(calls):
            c.extend(got)
    else:
        raise SystemExit(f"unknown op {op}")


def _raw_loop(conn: Any, schema: str, op: str, calls: int, prerender: bool) -> None:
    """What the client's calls execute, on a bare connection: the same statements and row
    factory, the payload decoded with json."""
    from psycopg.rows import namedtuple_row

    from lonnymq.client.ops import statements
    from lonnymq.serializer import default_serializer

    st = statements(schema)
    ctype = default_serializer().content_type

    def q(name: str) -> Any:
        s = getattr(st, name)
        return s.as_bytes(conn) if prerender else s

    take, ack_one, nack, send, send_batch, extend, take_ack_one, take_tx = (
        q(n) for n in ("take", "ack_one", "nack", "send", "send_batch", "extend", "take_ack_one", "take_tx")
    )
    cur = conn.cursor(row_factory=namedtuple_row)

    def take1() -> list[Any]:
        cur.execute(take, (QUEUE, 1, None, None, None), binary=True)
        rows = cur.fetchall()
        for r in rows:
            json.loads(bytes(r.payload))
        return rows

    if op in ("take_ack", "receive_ack", "take_nack"):
        for _ in range(calls):
            rows = take1()
            ids, tokens = [r.id for r in rows], [r.token for r in rows]
            if op == "take_nack":
                params: tuple[Any, ...] = (QUEUE, ids, tokens, [0], [None], None, True)
                cur.execute(nack, params, binary=True)
            else:  # one delivery: the client's ack_one
                cur.execute(ack_one, (QUEUE, ids[0], tokens[0], None), binary=True)
            {r[0] for r in cur.fetchall()}
    elif op == "drain":
        rows = take1()
        for _ in range(calls - 1):
            cur.execute(take_ack_one, (QUEUE, 1, None, rows[0].id, rows[0].token), binary=True)
            rows = cur.fetchall()
            for r in rows:
                json.loads(bytes(r.payload))
    elif op == "take_tx":
        for _ in range(calls):
            cur.execute(take_tx, (QUEUE, 1, None), binary=True)
            for r in cur.fetchall():
                json.loads(bytes(r.payload))
    elif op == "send":
        for i in range(calls):
            body = json.dumps({"n": i}).encode()
            params = (QUEUE, body, ctype, None, None, None, None, 0, None, None, "ignore", uuid.uuid4())
            cur.execute(send, params, binary=True)
            cur.fetchall()
    elif op == "send_batch":
        batch = [{"n": i} for i in range(10)]
        for _ in range(calls):
            bodies = [json.dumps(p).encode() for p in batch]
            ctypes = [ctype] * len(bodies)
            params = (QUEUE, bodies, None, ctypes, None, None, None, None, None, None, "ignore", uuid.uuid4())
            cur.execute(send_batch, params, binary=True)
            cur.fetchall()
    elif op == "extend":
        rows = take1()
        ids, tokens = [r.id for r in rows], [r.token for r in rows]
        for _ in range(calls):
            cur.execute(extend, (QUEUE, ids, tokens, None), binary=True)
            cur.fetchall()
    else:
        raise SystemExit(f"unknown op {op}")


def _bare_loop(conn: Any, schema: str, op: str, calls: int) -> None:
    """The same statements as pgmq's Python users make theirs: ``conn.execute(...).fetchall()``
    (a new cursor each), tuple rows (the payload is the last column), ``json``."""
    from lonnymq.client.ops import statements
    from lonnymq.serializer import default_serializer

    st = statements(schema)
    take, ack_one, send_plain, take_ack_one, take_tx = (
        getattr(st, n).as_bytes(conn) for n in ("take", "ack_one", "send_plain", "take_ack_one", "take_tx")
    )
    ctype = default_serializer().content_type

    def rows_of(query: bytes, params: tuple[Any, ...]) -> list[Any]:
        rows = conn.execute(query, params, binary=True).fetchall()
        for r in rows:
            json.loads(bytes(r[-1]))
        return rows

    if op == "take_ack":
        for _ in range(calls):
            r = rows_of(take, (QUEUE, 1, None, None, None))[0]
            {x[0] for x in conn.execute(ack_one, (QUEUE, r[0], r[1], None), binary=True).fetchall()}
    elif op == "drain":
        r = rows_of(take, (QUEUE, 1, None, None, None))[0]
        for _ in range(calls - 1):
            r = rows_of(take_ack_one, (QUEUE, 1, None, r[0], r[1]))[0]
    elif op == "take_tx":
        for _ in range(calls):
            rows_of(take_tx, (QUEUE, 1, None))
    elif op == "send":  # the statement of the client's plain send (Client(connection), no key)
        for i in range(calls):
            body = json.dumps({"n": i}, separators=(",", ":")).encode()
            conn.execute(send_plain, (QUEUE, body, ctype, None), binary=True).fetchone()
    else:
        raise SystemExit(f"no bare loop for {op}")


def child(dsn: str, schema: str, op: str, mode: str, calls: int, reps: int, warm: int) -> None:
    """Run ``reps`` timed loops of ``calls`` (after ``warm`` untimed ones); print µs per call."""
    import psycopg

    from lonnymq import Client
    from lonnymq.serializer import default_serializer

    ctype = default_serializer().content_type
    admin = psycopg.connect(dsn, autocommit=True)
    conn = psycopg.connect(dsn, autocommit=True)
    c: Any = None
    if mode == "client":
        c = Client(dsn, schema=schema, pool_size=1)
        c.open()
    elif mode == "conn":
        c = Client(conn, schema=schema)
    results = []
    for rep in range(-1 if warm else 0, reps):
        n = warm if rep < 0 else calls
        _purge(admin, schema)
        _fill(admin, schema, n + 1, ctype)
        started = time.process_time()
        if c is not None:
            _client_loop(c, op, n)
        elif mode == "bare":
            _bare_loop(conn, schema, op, n)
        else:
            _raw_loop(conn, schema, op, n, prerender=mode == "raw_bytes")
        if rep >= 0:
            results.append((time.process_time() - started) / n * 1e6)
    print(json.dumps(results))
    if c is not None and mode == "client":
        c.close()


def _run_child(
    tree: str, args: argparse.Namespace, schema: str, op: str, mode: str, calls: int, reps: int, grind: bool
) -> Any:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--dsn", args.dsn, "--schema", schema]
    cmd += ["--ops", op, "--modes", mode, "--calls", str(calls), "--rounds", str(reps)]
    cmd += ["--warm", str(args.warm)]
    if not grind:
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    with tempfile.NamedTemporaryFile("r", suffix=".callgrind") as f:
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={f.name}", *cmd],
            env=env,
            check=True,
            capture_output=True,
        )
        for line in f.read().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit("callgrind wrote no instruction count")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LONNYMQ_TEST_DSN"))
    ap.add_argument("--trees", default="this=src", help="name=path,... (path: the tree's src/)")
    ap.add_argument("--ops", default="take_ack,send")
    ap.add_argument("--modes", default="client,raw")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--method", choices=("time", "callgrind"), default="time")
    ap.add_argument("--json", help="also write every measurement (and the load) to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--schema", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.dsn, args.schema, args.ops, args.modes, args.calls, args.rounds, args.warm)
        return

    import psycopg
    from psycopg import sql

    from lonnymq import Client

    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    ops = args.ops.split(",")
    modes = args.modes.split(",")
    schema = f"ccpu_{uuid.uuid4().hex[:8]}"
    with Client(args.dsn, schema=schema, pool_size=1) as c:
        c.migrate()
        c.create_queue(QUEUE, max_attempts=2**31 - 1, lease=3600)
    results: list[dict[str, Any]] = []
    try:
        print(f"{args.method}: {args.calls} calls, {args.rounds} rounds; trees {trees}")
        for op in ops:
            for mode in modes:
                # The floor does not depend on the tree: measured on the first.
                names = [next(iter(trees))] if mode in ("raw", "raw_bytes", "bare") else list(trees)
                got: dict[str, list[float]] = {name: [] for name in names}
                for _ in range(args.rounds):
                    for name in names:
                        if args.method == "time":
                            got[name] += _run_child(trees[name], args, schema, op, mode, args.calls, 1, False)
                        else:
                            lo = args.calls // 3
                            hi_n = _run_child(trees[name], args, schema, op, mode, args.calls, 1, True)
                            lo_n = _run_child(trees[name], args, schema, op, mode, lo, 1, True)
                            got[name].append((hi_n - lo_n) / (args.calls - lo) / 1000)
                for name, xs in got.items():
                    unit = "us/call" if args.method == "time" else "k instr/call"
                    stat = (
                        f"min {min(xs):7.1f}  median {statistics.median(xs):7.1f}"
                        if args.method == "time"
                        else f"median {statistics.median(xs):7.1f}  (min {min(xs):.1f}, max {max(xs):.1f})"
                    )
                    print(f"{op:12s} {mode:10s} {name:8s} {stat} {unit}", flush=True)
                    results.append(
                        {
                            "op": op,
                            "mode": mode,
                            "tree": name,
                            "unit": unit,
                            "values": xs,
                            "loadavg": os.getloadavg(),
                        }
                    )
        if args.json:
            with open(args.json, "w") as f:
                meta = {"method": args.method, "calls": args.calls, "rounds": args.rounds, "trees": trees}
                json.dump({**meta, "argv": sys.argv, "results": results}, f, indent=1)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
