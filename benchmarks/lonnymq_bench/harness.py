"""The machinery every workload shares: the server, scratch databases, worker processes, clocks.

Worker processes are forked. Each one prepares its part (opens its own connection, builds its
payloads) and then waits on a barrier shared with the parent; the clock runs from the barrier's
release until the last process has reported its count. So connecting and warming up are never
timed, and every system gets the same process and connection count.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: The one payload every system sends: ~200 bytes of JSON, with a varying sequence number.
_NOTE = "lorem ipsum dolor sit amet " * 4


def payload(i: int) -> dict[str, Any]:
    """The benchmark message: a ~200 byte JSON object (an order-created event)."""
    return {
        "event": "order.created",
        "order_id": 100_000_000 + i,
        "customer": "c-000042",
        "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
        "note": _NOTE[:96],
    }


PAYLOAD_BYTES = len(json.dumps(payload(0), separators=(",", ":")))

#: Server settings recorded with every run: they decide what one-per-transaction paths measure.
SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_wal_size",
    "autovacuum",
    "autovacuum_naptime",
    "jit",
    "commit_delay",
)


# -- server and databases ------------------------------------------------------------------


def dsn_for(base: str, dbname: str) -> str:
    return make_conninfo(base, dbname=dbname)


def asyncpg_kwargs(dsn: str) -> dict[str, Any]:
    """Connection arguments for asyncpg from a libpq conninfo/URI."""
    d = conninfo_to_dict(dsn)
    kw: dict[str, Any] = {"host": d.get("host"), "user": d.get("user"), "database": d.get("dbname")}
    if d.get("port"):
        kw["port"] = int(d["port"])  # type: ignore[arg-type]
    if d.get("password"):
        kw["password"] = d["password"]
    return kw


def create_database(base: str, name: str) -> str:
    """A fresh database ``name`` (a leftover one is dropped first); returns its DSN."""
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return dsn_for(base, name)


def drop_database(base: str, name: str) -> None:
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def server_settings(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as c:
        out = {
            s: str(c.execute(sql.SQL("SHOW {}").format(sql.Identifier(s))).fetchone()[0])  # type: ignore[index]
            for s in SETTINGS
        }
    out["cpus"] = str(os.cpu_count())
    out["python"] = platform.python_version()
    out["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return out


def vacuum(dsn: str, tables: Sequence[str]) -> None:
    """VACUUM ANALYZE the tables, then CHECKPOINT: no phase pays for an earlier one's dead rows,
    checkpoint or full-page writes."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in tables:
            c.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(*t.split("."))))
        c.execute("CHECKPOINT")


def dead_tuples(dsn: str, tables: Sequence[str]) -> tuple[int, int]:
    """(live, dead) tuples of ``tables`` (partitions included) from the statistics collector."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        live = dead = 0
        for t in tables:
            schema, _, name = t.rpartition(".")
            row = c.execute(
                "SELECT coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0)"
                "  FROM pg_stat_user_tables s"
                " WHERE s.relid = %s::regclass"
                "    OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass)",
                [t, t],
            ).fetchone()
            assert row is not None
            live += int(row[0])
            dead += int(row[1])
            del schema, name
        return live, dead


# -- worker processes ----------------------------------------------------------------------


@dataclass
class Ctx:
    """What a worker process is given: its index, how long it may take new work (``deadline``,
    on time.monotonic, is set when the clock starts), a stop event, and a shared counter for
    sampling workloads."""

    index: int
    seconds: float
    deadline: float = float("inf")
    stop: Any = None
    counter: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline or (self.stop is not None and self.stop.is_set())


#: A worker: called in the child with (ctx), prepares, and returns the timed callable, which
#: returns a result (usually the number of messages it handled).
Worker = Callable[[Ctx], Callable[[], Any]]


def _child(worker: Worker, ctx: Ctx, barrier: Any, results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C and stops us
    try:
        work = worker(ctx)
    except BaseException as e:
        barrier.abort()
        results.put((ctx.index, "error", f"{type(e).__name__}: {e}"))
        raise
    try:
        barrier.wait()
    except Exception:
        return
    ctx.deadline = time.monotonic() + ctx.seconds
    try:
        out = work()
    except BaseException as e:
        results.put((ctx.index, "error", f"{type(e).__name__}: {e}"))
        raise
    results.put((ctx.index, "ok", (time.perf_counter(), out)))


@dataclass
class Run:
    seconds: float
    results: list[Any]


def run_procs(
    worker: Worker,
    procs: int,
    *,
    seconds: float,
    stop: Any = None,
    counter: Any = None,
    extra: dict[str, Any] | None = None,
    during: Callable[[float], None] | None = None,
    timeout: float | None = None,
) -> Run:
    """Run ``worker`` in ``procs`` forked processes started together; each stops taking new
    work ``seconds`` after the start. ``during(t0)`` runs in the parent while they work.
    Returns the time from the start to the last report and each process's result."""
    ctx_mp = mp.get_context("fork")
    barrier = ctx_mp.Barrier(procs + 1)
    results = ctx_mp.Queue()
    ps = []
    for i in range(procs):
        ctx = Ctx(i, seconds, stop=stop, counter=counter, extra=dict(extra or {}))
        ps.append(ctx_mp.Process(target=_child, args=(worker, ctx, barrier, results), daemon=True))
    for p in ps:
        p.start()
    try:
        barrier.wait(timeout=120)
    except Exception:
        errs = _drain_errors(results)
        _reap(ps)
        raise RuntimeError(f"a worker failed while preparing: {errs or 'timeout'}") from None
    t0 = time.perf_counter()
    if during is not None:
        during(t0)
    out: list[Any] = [None] * procs
    end = 0.0
    limit = timeout or (seconds * 3 + 120)
    for _ in ps:
        try:
            idx, status, value = results.get(timeout=limit)
        except Exception:
            _reap(ps)
            raise RuntimeError("a worker did not report in time") from None
        if status != "ok":
            _reap(ps)
            raise RuntimeError(f"worker {idx} failed: {value}")
        finished, result = value
        end = max(end, finished)
        out[idx] = result
    for p in ps:
        p.join(30)
    _reap(ps)
    return Run(max(end - t0, 1e-9), out)


def _drain_errors(results: Any) -> list[str]:
    errs = []
    with contextlib.suppress(Exception):
        while True:
            _, status, value = results.get(timeout=0.5)
            if status == "error":
                errs.append(value)
    return errs


def _reap(ps: list[Any]) -> None:
    for p in ps:
        if p.is_alive():
            p.terminate()
            p.join(10)


# -- statistics ----------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), nearest-rank."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]
