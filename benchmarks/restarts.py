"""PostgreSQL restarts under a fixed offered load (issue 18, item 5): do producers and workers
with the default settings ride them out, and is every message processed, none after its ack?

    python benchmarks/restarts.py [--rate 1000] [--minutes 10] [--interval 60]
        [--producers 4] [--threads 4] [--workers 2] [--out docs/restarts/restarts-10min.json]

A throwaway Debian PostgreSQL 15 cluster (tools/pgcluster.py; durable: fsync, full_page_writes and
synchronous_commit on) gets LonnyMQ and one queue. ``--producers`` processes, each with one
``lonnymq.Client(dsn)`` (default settings: pool of 4, checked connections, the default retry
policy, idempotent sends where the client has them) shared by ``--threads`` threads, send ``{"p": producer, "k": n}`` on a fixed schedule
(open loop: message n of a producer is offered at start + n / its share of ``--rate``, whatever
happened to the ones before). ``--workers`` processes run the real CLI, ``lonnymq worker``, with
its defaults (concurrency 8, leases extended by its heartbeat, acks batched); the handler appends
``id token time`` of every delivery it runs to a local file before it returns. Two workers by
default: one, at concurrency 8, fetches 8 messages per round trip and falls behind 1,000 msg/s
when the shared 2-core machine is busy.

Every ``--interval`` seconds (first at half an interval) PostgreSQL is restarted with
``pg_ctl restart``, alternately ``-m fast`` (sessions terminated, shutdown checkpoint) and
``-m immediate`` (a crash: no checkpoint, recovery from WAL at the start). After the load the
workers drain the queue (within ``--drain-timeout``) and are stopped with SIGTERM.

The queue is created with ``archive=True`` (the one setting that is not a default): an ack then
moves the message to the archive with the token of the delivery it acknowledged, so the database
itself says, by id, which delivery's ack committed. From the database at the end (not from what
the producers believed):

* committed: every id in the archive or still in the queue; each maps back to (producer, n)
  through its payload, so a message committed twice (a send repeated after it had committed)
  shows as a double send;
* lost: committed ids, and ids a send returned, that the handler never ran (a returned id
  missing from the database is counted too);
* resurrected: an id run with a token above the one its archived ack acknowledged, or acked and
  still in the queue;
* duplicates: runs of a message beyond the first (a delivery in flight at a restart whose ack
  did not commit: allowed, counted).

Reported per 10-second bucket: offered, sent (sends that returned), processed (handler runs),
send errors; per restart: how long ``pg_ctl restart`` took, and from the restart's start the first
send and the first handler run after the server was back, and when the backlog of sends and of
processing built during it had been worked off; in total: errors surfaced to the producers by
type, lost, resurrected, duplicates; a sample every 2 s of the backlog, the message table's dead
tuples and the oldest open transaction. JSON to ``--out``; a summary on stdout. Needs root (the
server runs as the ``postgres`` OS user) and Debian's postgresql-15.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import logging
import multiprocessing as mp
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import lonnymq
from lonnymq import Client, errors

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import pgcluster  # noqa: E402 - needs the path above

QUEUE = "restarts"
#: The handler's log of runs: one "id token time" line per delivery, appended before it returns.
LOG_ENV = "LONNYMQ_RESTARTS_LOG"
BUCKET = 10.0
#: A durable server: a commit that returned survives a crash (pgcluster's base turns these off).
DURABLE = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "shared_preload_libraries": "''",
    "log_min_messages": "warning",
}


# -- the worker's handler (imported by `lonnymq worker restarts:worker_app`) -------------------


def worker_app() -> Any:
    """The App the worker processes run: record the delivery, durably for this process (the log
    is an O_APPEND file written before the handler returns, so before its ack is queued)."""
    from lonnymq.worker import App, Job

    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def record(job: Job) -> None:
        os.write(fd, f"{job.message.id} {job.message.token} {time.time():.4f}\n".encode())

    app = App()
    app.register(record, QUEUE)
    return app


# -- producers -------------------------------------------------------------------------------


def produce(dsn: str, p: int, rate: float, threads: int, t0: float, seconds: float, out: str) -> None:
    """One producer process: ``rate`` msg/s offered from ``t0`` for ``seconds`` by ``threads``
    threads sharing one default Client. Writes one row per message to ``out``:
    n, offered, started, done (wall clock), id (-1: the send raised), error."""
    # The pool's own warnings (a failed reconnection attempt, a dead connection discarded):
    # what the producer sees is its calls' outcomes, recorded below.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    rows: list[tuple[int, float, float, float, int, str]] = []
    lock = threading.Lock()
    counter = iter(range(10**9))
    end = t0 + seconds

    def sender(c: Client) -> None:
        while True:
            with lock:
                n = next(counter)
            offered = t0 + n / rate
            if offered >= end:
                return
            wait = offered - time.time()
            if wait > 0:
                time.sleep(wait)
            started = time.time()
            try:
                r = c.send(QUEUE, {"p": p, "k": n})
                ident, err = (r.id if r.id is not None else -2), ""
            except errors.ConnectionLost as e:
                ident, err = -1, f"ConnectionLost(may_have_committed={e.may_have_committed})"
            except Exception as e:
                ident, err = -1, type(e).__name__
            done = time.time()
            with lock:
                rows.append((n, offered, started, done, ident, err))

    with Client(dsn) as c:
        c.peek(QUEUE, 1)  # the pool's first connection, before the clock starts
        ts = [threading.Thread(target=sender, args=(c,), daemon=True) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    with open(out, "w", newline="") as f:
        csv.writer(f).writerows(sorted(rows))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).with_suffix(".cpu").write_text(f"{ru.ru_utime + ru.ru_stime:.2f}\n")


# -- the run ---------------------------------------------------------------------------------


@contextmanager
def workers(dsn: str, n: int, directory: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` `lonnymq worker` processes with default options; SIGTERM and wait on exit."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
        LOG_ENV: str(directory / "runs.log"),
    }
    procs = []
    for i in range(n):
        err = open(directory / f"worker-{i}.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "lonnymq", "worker", "--dsn", dsn, "restarts:worker_app"],
                env=env,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        )
        err.close()
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def queued(dsn: str) -> int:
    """Messages of the queue still in the database (ready, scheduled or leased)."""
    with Client(dsn, pool_size=1) as c:
        m = c.metrics(QUEUE)
        return m.ready + m.scheduled + m.leased


class Sampler(threading.Thread):
    """Every few seconds: the queue's backlog (ready + leased), the dead row versions of the
    message table, and the oldest open transaction (seconds, and its statement), as (time,
    backlog, dead tuples, oldest, statement); a sample the outage delayed is taken late."""

    def __init__(self, dsn: str, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every = dsn, every
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, int, float, str]] = []

    def run(self) -> None:
        with Client(self.dsn, pool_size=1) as c:
            while not self.stop.wait(self.every):
                try:
                    m = c.metrics(QUEUE)
                    with c.connection() as conn:
                        row = conn.execute(
                            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
                            " WHERE schemaname = 'lonnymq' AND relname LIKE 'message%%'"
                        ).fetchone()
                        old = conn.execute(
                            "SELECT extract(epoch FROM now() - xact_start)::float8, left(query, 60)"
                            " FROM pg_stat_activity WHERE xact_start IS NOT NULL"
                            " AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1"
                        ).fetchone()
                    self.samples.append(
                        (
                            time.time(),
                            m.ready + m.leased,
                            int(row[0]) if row else 0,
                            round(old[0], 1) if old else 0.0,
                            old[1] if old else "",
                        )
                    )
                except psycopg.Error:
                    pass  # the server is restarting: the next sample


def run(cluster: pgcluster.Cluster, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    dsn = cluster.dsn
    with Client(dsn, pool_size=1) as c:
        c.migrate()
        c.create_queue(QUEUE, archive=True)
    seconds = args.minutes * 60
    share = args.rate / args.producers
    ctx = mp.get_context("spawn")
    with workers(dsn, args.workers, directory) as wprocs:
        t0 = time.time() + 3.0  # the producers' processes start and connect meanwhile
        producers = [
            ctx.Process(
                target=produce,
                args=(dsn, p, share, args.threads, t0, seconds, str(directory / f"producer-{p}.csv")),
            )
            for p in range(args.producers)
        ]
        for proc in producers:
            proc.start()
        sampler = Sampler(dsn)
        sampler.start()
        restarts: list[dict[str, Any]] = []
        at = t0 + args.interval / 2
        while at < t0 + seconds:
            time.sleep(max(at - time.time(), 0))
            mode = "fast" if len(restarts) % 2 == 0 else "immediate"
            began = time.time()
            cluster.restart(mode)
            restarts.append({"mode": mode, "began": began, "up": time.time()})
            print(f"  t={began - t0:6.1f}s  pg_ctl restart -m {mode}: {time.time() - began:.2f}s", flush=True)
            at += args.interval
        for proc in producers:
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"a producer failed (exit {proc.exitcode})")
        load_end = time.time()
        deadline = time.time() + args.drain_timeout
        left = queued(dsn)
        while left and time.time() < deadline and all(w.poll() is None for w in wprocs):
            time.sleep(0.5)
            left = queued(dsn)
        drained = time.time()
        sampler.stop.set()
        sampler.join()
    worker_exits = [w.returncode for w in wprocs]
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # producers, workers and pg_ctl, all reaped
    (directory / "children.cpu").write_text(f"{ru.ru_utime + ru.ru_stime:.2f}\n")
    return analyse(
        dsn, args, directory, t0, seconds, restarts, sampler.samples, left, drained - load_end, worker_exits
    )


# -- the analysis ----------------------------------------------------------------------------


@dataclass
class Verdict:
    """The delivery guarantees checked by id (see :func:`check_by_id`)."""

    committed: dict[int, tuple[int, int]]  # id -> (producer, n), from the database
    processed: set[int]  # ids the handler ran
    by_send: Counter[tuple[int, int]]  # (producer, n) -> messages committed for it
    lost: set[int]
    returned_missing: set[int]
    resurrected: set[int]
    acked_unrun: set[int]
    phantom: set[int]
    double_sends: int
    duplicates: int


def check_by_id(
    acked: dict[int, tuple[int, tuple[int, int]]],
    waiting: dict[int, tuple[int, int]],
    returned: set[int],
    runs: list[tuple[int, int, float]],
) -> Verdict:
    """``acked``: id -> (token of the acknowledged delivery, (producer, n)), the archive's acked
    rows; ``waiting``: id -> (producer, n), the messages still in the queue; ``returned``: ids
    the sends returned; ``runs``: (id, token, time) of every handler run.

    lost: committed or returned, never run (a returned id missing from the database included);
    resurrected: run with a token above its acknowledged one, or acked and still queued;
    acked_unrun: acknowledged by a delivery that never ran; phantom: run, never committed;
    double_sends: extra messages for one (producer, n); duplicates: runs beyond the first."""
    committed = {i: pk for i, (_, pk) in acked.items()} | waiting
    by_send = Counter(committed.values())
    tokens: dict[int, set[int]] = defaultdict(set)
    for i, tok, _ in runs:
        tokens[i].add(tok)
    processed = set(tokens)
    resurrected = {i for i, (tok, _) in acked.items() if any(t > tok for t in tokens.get(i, ()))}
    return Verdict(
        committed=committed,
        processed=processed,
        by_send=by_send,
        lost=(set(committed) | returned) - processed,
        returned_missing=returned - set(committed),
        resurrected=resurrected | (set(acked) & set(waiting)),
        acked_unrun={i for i, (tok, _) in acked.items() if tok not in tokens.get(i, ())},
        phantom=processed - set(committed) - returned,
        double_sends=sum(n - 1 for n in by_send.values() if n > 1),
        duplicates=len(runs) - len(processed),
    )


def analyse(
    dsn: str,
    args: argparse.Namespace,
    directory: Path,
    t0: float,
    seconds: float,
    restarts: list[dict[str, Any]],
    samples: list[tuple[float, int, int, float, str]],
    left: int,
    drain_seconds: float,
    worker_exits: list[int | None],
) -> dict[str, Any]:
    # p, n, offered, started, done, id (-1: raised), error
    sends: list[tuple[int, int, float, float, float, int, str]] = []
    for p in range(args.producers):
        with open(directory / f"producer-{p}.csv", newline="") as f:
            for row in csv.reader(f):
                sends.append(
                    (p, int(row[0]), float(row[1]), float(row[2]), float(row[3]), int(row[4]), row[5])
                )
    runs: list[tuple[int, int, float]] = []  # id, token, time
    with open(directory / "runs.log") as f:
        for line in f:
            fields = line.split()
            runs.append((int(fields[0]), int(fields[1]), float(fields[2])))

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("SELECT id FROM lonnymq.queue WHERE name = %s", (QUEUE,)).fetchone()
        assert found is not None
        qid = (found[0],)
        acked = {
            i: (tok, (p, k))
            for i, tok, p, k in conn.execute(
                "SELECT id, deliveries, (convert_from(payload, 'UTF8')::jsonb->>'p')::int,"
                " (convert_from(payload, 'UTF8')::jsonb->>'k')::int"
                " FROM lonnymq.archive WHERE queue_id = %s AND status = 'acked'",
                qid,
            )
        }
        dead = conn.execute(
            "SELECT count(*) FROM lonnymq.archive WHERE queue_id = %s AND status = 'dead'", qid
        ).fetchone()
        waiting = {
            i: (p, k)
            for i, p, k in conn.execute(
                "SELECT id, (convert_from(payload, 'UTF8')::jsonb->>'p')::int,"
                " (convert_from(payload, 'UTF8')::jsonb->>'k')::int"
                " FROM lonnymq.message WHERE queue_id = %s",
                qid,
            )
        }

    returned = {ident for *_, ident, _ in sends if ident >= 0}
    v = check_by_id(acked, waiting, returned, runs)
    committed, processed, by_send = v.committed, v.processed, v.by_send
    lost, resurrected = v.lost, v.resurrected
    first_run: dict[int, float] = {}
    for i, _, at in runs:
        first_run[i] = min(first_run.get(i, at), at)

    producer_cpu = sum(float((directory / f"producer-{p}.cpu").read_text()) for p in range(args.producers))
    children_cpu = float((directory / "children.cpu").read_text())
    errs = Counter(err for *_, err in sends if err)
    errored_committed = sum(
        1 for p, n, *_, ident, err in sends if err and ident < 0 and by_send.get((p, n), 0) > 0
    )

    # Per 10-second bucket, from the start of the offered load.
    nb = int(seconds // BUCKET) + 1
    buckets = [
        {"t": round(b * BUCKET), "offered": 0, "sent": 0, "send_errors": 0, "processed": 0} for b in range(nb)
    ]

    def bucket(at: float) -> dict[str, Any] | None:
        b = int((at - t0) // BUCKET)
        return buckets[b] if 0 <= b < nb else None

    for _, _, offered, _, done, ident, _ in sends:
        if (x := bucket(offered)) is not None:
            x["offered"] += 1
        if (y := bucket(done)) is not None:
            y["sent" if ident >= 0 else "send_errors"] += 1
    for _, _, at in runs:
        if (z := bucket(at)) is not None:
            z["processed"] += 1
    for at, backlog, dead_tuples, oldest, statement in samples:  # the last sample of each bucket
        if (w := bucket(at)) is not None:
            w["backlog"], w["dead_tuples"] = backlog, dead_tuples
            if oldest >= w.get("oldest_xact_s", 0):
                w["oldest_xact_s"], w["oldest_xact_query"] = oldest, statement
    restart_buckets = {int((r["began"] - t0) // BUCKET) for r in restarts}
    for b, x in enumerate(buckets):
        x["restart"] = b in restart_buckets

    # Per restart, seconds from its start (pg_ctl restart called).
    ok_done = sorted(done for *_, done, ident, _ in sends if ident >= 0)
    run_times = sorted(at for _, _, at in runs)
    time_of_id = {ident: (offered, done) for _, _, offered, _, done, ident, _ in sends if ident >= 0}
    per_restart = []
    for r in restarts:
        began, up = r["began"], r["up"]
        first_send = next((t for t in ok_done if t >= up), None)
        first_run_after = next((t for t in run_times if t >= up), None)
        # The backlogs built during the outage: every send offered before the server was back
        # has returned (or raised), and every committed message offered before it has run.
        backlog_sent = max((done for _, _, offered, _, done, _, _ in sends if offered < up), default=up)
        backlog_run = max(
            (first_run[i] for i, (offered, _) in time_of_id.items() if offered < up and i in first_run),
            default=up,
        )
        per_restart.append(
            {
                "t": round(began - t0, 1),
                "mode": r["mode"],
                "pg_ctl_restart_s": round(up - began, 2),
                "first_send_s": None if first_send is None else round(first_send - began, 2),
                "first_processed_s": None if first_run_after is None else round(first_run_after - began, 2),
                "sends_caught_up_s": round(max(backlog_sent - began, 0), 2),
                "processing_caught_up_s": round(max(backlog_run - began, 0), 2),
            }
        )

    def summary(key: str) -> dict[str, float | None]:
        vals = [x[key] for x in per_restart if x[key] is not None]
        return {
            "median": round(statistics.median(vals), 2) if vals else None,
            "max": round(max(vals), 2) if vals else None,
        }

    after_last = sum(1 for t in run_times if restarts and t >= restarts[-1]["up"])
    return {
        "config": {
            "rate": args.rate,
            "minutes": args.minutes,
            "interval": args.interval,
            "producers": args.producers,
            "threads": args.threads,
            "workers": args.workers,
            "server": f"PostgreSQL {pgcluster.PG_MAJOR} (tools/pgcluster.py), "
            + ", ".join(f"{k}={v}" for k, v in DURABLE.items() if k != "log_min_messages"),
            "client": "lonnymq.Client(dsn): default pool, check_connections, retry",
            "worker": "lonnymq worker restarts:worker_app (default options)",
            "queue": "create_queue(archive=True), other options default",
            "idempotent_send_client": idempotent_sends(),
            "lonnymq": lonnymq.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "restarts": per_restart,
        "recovery": {k: summary(k) for k in ("pg_ctl_restart_s", "first_send_s", "first_processed_s")}
        | {k: summary(k) for k in ("sends_caught_up_s", "processing_caught_up_s")},
        "totals": {
            "offered": len(sends),
            "sent": len(returned),
            "committed": len(committed),
            "processed_messages": len(processed),
            "runs": len(runs),
            "errors_surfaced": sum(errs.values()),
            "errors_by_type": dict(errs),
            "errored_sends_committed": errored_committed,
            "double_sends": v.double_sends,
            "lost": len(lost),
            "returned_but_missing": len(v.returned_missing),
            "resurrected": len(resurrected),
            "acked_but_never_run": len(v.acked_unrun),
            "phantom_runs": len(v.phantom),
            "duplicates": v.duplicates,
            "dead": int(dead[0]) if dead else 0,
            "left_in_queue": left,
            "processed_after_last_restart": after_last,
            "drain_seconds": round(drain_seconds, 1),
            "worker_exit_codes": worker_exits,
            "worker_outage_lines": worker_lines(directory, args.workers),
            "oldest_transaction": max(
                ({"seconds": o, "statement": q} for *_, o, q in samples),
                key=lambda x: float(x["seconds"]),
                default=None,
            ),
        },
        "cpu_seconds": {
            "producers": round(producer_cpu, 1),
            "workers_and_pg_ctl": round(children_cpu - producer_cpu, 1),
        },
        "examples": {
            "lost": sorted(lost)[:10],
            "resurrected": sorted(resurrected)[:10],
        },
        "buckets": buckets,
    }


def worker_lines(directory: Path, n: int) -> dict[str, int]:
    """How many outage, recovery and lost-lease lines the workers logged."""
    text = "".join((directory / f"worker-{i}.log").read_text(errors="replace") for i in range(n))
    return {
        "database unavailable": text.count("database unavailable"),
        "reachable again": text.count("reachable again"),
        "lease lost": text.count("lease lost"),
        "not settled again": text.count("not settled again"),
        "tracebacks": text.count("Traceback"),
    }


def idempotent_sends() -> bool:
    """Whether this client repeats, by default, a send cut off in flight (idempotency keys:
    ``Client(idempotent_sends=True)``); without them such a send raises ConnectionLost."""
    p = inspect.signature(Client).parameters.get("idempotent_sends")
    return p is not None and p.default is True


# -- the command -----------------------------------------------------------------------------


def report(result: dict[str, Any]) -> None:
    t = result["totals"]
    print("\n   t  offered   sent  errors  processed  backlog  dead tuples  oldest xact (s)")
    for b in result["buckets"]:
        mark = "  <- restart" if b["restart"] else ""
        print(
            f"{b['t']:4d}  {b['offered']:7d}  {b['sent']:5d}  {b['send_errors']:6d}  {b['processed']:9d}"
            f"  {b.get('backlog', '-')!s:>7}  {b.get('dead_tuples', '-')!s:>11}"
            f"  {b.get('oldest_xact_s', '-')!s:>15}{mark}"
        )
    print("\nrestart  mode       pg_ctl  first send  first run  sends caught up  processing caught up (s)")
    for r in result["restarts"]:
        print(
            f"{r['t']:7.1f}  {r['mode']:9s}  {r['pg_ctl_restart_s']:6.2f}  {r['first_send_s']!s:>10}  "
            f"{r['first_processed_s']!s:>9}  {r['sends_caught_up_s']:15.2f}  {r['processing_caught_up_s']:20.2f}"
        )
    rec = result["recovery"]
    print(
        f"\nrecovery from each restart's start (median / max s): pg_ctl restart {rec['pg_ctl_restart_s']}, "
        f"first send {rec['first_send_s']}, first handler run {rec['first_processed_s']}, "
        f"send backlog gone {rec['sends_caught_up_s']}, processing backlog gone {rec['processing_caught_up_s']}"
    )
    print(
        f"offered {t['offered']}, sends returned {t['sent']}, committed (database) {t['committed']}, "
        f"processed {t['processed_messages']} ({t['runs']} runs)\n"
        f"errors surfaced to producers {t['errors_surfaced']} {t['errors_by_type']} "
        f"(of them committed: {t['errored_sends_committed']}), double sends {t['double_sends']}\n"
        f"lost {t['lost']}, resurrected {t['resurrected']}, duplicates {t['duplicates']}, "
        f"left in queue {t['left_in_queue']}, processed after the last restart "
        f"{t['processed_after_last_restart']}, worker {t['worker_outage_lines']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="offered msg/s, all producers (default 1000)")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the offered load (default 10)")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between restarts (default 60)")
    ap.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    ap.add_argument("--threads", type=int, default=4, help="sending threads per producer (default 4)")
    ap.add_argument("--workers", type=int, default=2, help="`lonnymq worker` processes (default 2)")
    ap.add_argument(
        "--drain-timeout", type=float, default=900.0, help="seconds the workers get to drain the queue (900)"
    )
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and the run's files")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not (pgcluster.BINDIR / "initdb").exists():
        print("restarts.py: needs root and Debian's postgresql-15 (tools/pgcluster.py)", file=sys.stderr)
        return 2
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # the sampler's reconnection attempts
    load_before = os.getloadavg()
    directory = Path(tempfile.mkdtemp(prefix="lonnymq-restarts-"))
    print(
        f"restarts: {args.rate:g} msg/s offered for {args.minutes:g} min, a restart every {args.interval:g}s; "
        f"files in {directory}",
        flush=True,
    )
    started = time.time()
    with pgcluster.temporary_cluster(DURABLE, install=False, keep=args.keep) as cluster:
        result = run(cluster, args, directory)
    # The end of each worker's log (a worker that exited says why there).
    result["worker_log_tails"] = [
        (directory / f"worker-{i}.log").read_text(errors="replace")[-2000:] for i in range(args.workers)
    ]
    result["config"]["load_average_before"] = [round(x, 2) for x in load_before]
    result["config"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    result["config"]["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    report(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {args.out}")
    if not args.keep:
        for f in directory.iterdir():
            f.unlink()
        directory.rmdir()
    t = result["totals"]
    return 0 if t["lost"] == 0 and t["resurrected"] == 0 and t["left_in_queue"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
