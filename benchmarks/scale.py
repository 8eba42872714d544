"""Cost against the number of queues and channels (issue 19), side by side in one run.

    python benchmarks/scale.py --cluster                      # a throwaway PostgreSQL 15, default settings
    python benchmarks/scale.py --dsn postgresql://... --seconds 5 --queues 1,100,1000,10000
    python benchmarks/scale.py --cluster --queues "" --channels "" --lifecycle "" --concurrent 1,10000

Every series prints messages (or calls) per second and the ratio to its smallest case; with
``--reps`` each cell runs that many times, the systems interleaved, and the median is shown.

* Queue series (``--queues``): N queues exist (LonnyMQ: rows of the shared message table; pgmq:
  a table pair per queue); the measured queue is the last one created; one connection, one call
  per message: single send, take+ack (LonnyMQ ``take(1, ack=previous)``, one round trip; pgmq
  ``read`` then ``delete``) and batch take+ack of 100.
* Concurrent series (``--concurrent``): N queues, ``--consumers`` processes (50) with a
  connection each, spread over the queues (process i serves queues i, i+50, ...; all share the
  queue when there is one); each visits its queues in turn: a send phase (one send per visit),
  then a take+ack phase on a backlog of ``--preload`` messages spread over the queues (one
  message per visit, two round trips for both systems: LonnyMQ ``take(1)`` then ``ack``, pgmq
  ``read`` then ``delete``; a consumer of many queues rarely takes twice in a row from one, so
  ``take(1, ack=previous)`` would not apply). Rate, latency per message (p50, p99, max), takes
  that found nothing, the most relation locks held at once (all backends, sampled from
  ``pg_locks``), the client backends' wait events (``pg_stat_activity``) and the lock requests
  not granted, sampled every 0.1 s, and the CPU time per message of the client processes and
  of their server processes (``/proc``: a server on this machine). ``--nocheck`` adds LonnyMQ's
  client without its pool's connection check (one round trip less per call); ``--functions``
  records the server's self time per SQL function (``track_functions``). Both systems are reset
  (purged and vacuumed / truncated or, beyond 100 queues, deleted) before each rep.
* Channel series (``--channels``): one LonnyMQ queue whose backlog is spread over C channels
  (round robin), single send (cycling over the channels), take+ack and batch take+ack of 100;
  checks that every delivery kept the round robin fair (no channel served twice before every
  channel with messages was served once), then that ``max_concurrency = 1`` held for every
  channel with 4 consumer processes taking batches at once (sampled: channels with two leases).
* Rotation series (``--rotation``, LonnyMQ only, a schema of its own): N queues of 6 waiting
  messages in one generation, and one row of it held by another transaction (a take or an ack
  in flight) while the generation leaves the window, which keeps it pending; then
  ``--rotations`` forced rotations, each timed with the message rows it read (issue 19: the
  sweep used to walk every row that the frozen queues keep in a pending generation, three
  times a rotation), and the rotation after the row is let go, which must finish the generation.
* Lifecycle series (``--lifecycle``): with N queues, ``--ops`` queue creations and drops one
  call each (LonnyMQ and pgmq), a take+ack loop on a busy queue before and during a run of
  creations and drops (its latency: is anything shared locked?), and the listings: a page of
  ``list_queues``, all of it, one queue's metrics and the dashboard's overview and queue page
  (``lonnymq.web.queries``, on the dashboard's own connection settings), ``maintain()`` and a
  worker's heartbeat (``worker_beat``); with ``--counters`` every queue first gets the counter
  rows of a tenant that sent and acked something (two of the current minute, two of three days
  ago), which maintain() and the heartbeats fold.

pgmq stops at ``--pgmq-max`` queues (10,000 pgmq queues are 20,000 tables: 9 minutes to create
on 2 loaded cores, 100 a transaction; with ``--dsn`` and ``--keep-fleets`` a second run reuses
the queue databases a first one left).
``--cluster`` runs everything on a throwaway Debian PostgreSQL 15 (tools/pgcluster.py) with
PostgreSQL's default settings (max_connections 100, max_locks_per_transaction 64, fsync on);
without it, on ``--dsn`` or a throwaway embedded PostgreSQL 16 (max_connections 200).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from lonnymq_bench.harness import Ctx, percentile, run_procs
from lonnymq_bench.server import dsn_or_temporary
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from lonnymq import Client, Envelope, Message

SCHEMA = "scale_bench"
PAYLOAD = {"order": 12345, "customer": "c-42", "items": [1, 2, 3], "note": "x" * 120}
#: PostgreSQL's defaults where tools/pgcluster.py's throwaway cluster differs (it is made for tests).
DEFAULTS = {
    "max_connections": "100",
    "shared_preload_libraries": "''",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}
#: The systems of the concurrent series ("lonnymq-nocheck": the client without its pool's check).
SYSTEMS = ("lonnymq", "lonnymq-nocheck", "floor", "pgmq")
SHOWN_SETTINGS = ("server_version", "max_connections", "max_locks_per_transaction", "shared_buffers", "fsync")

S = sql.Identifier(SCHEMA)


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def rate(seconds: float, step: Callable[[], int]) -> float:
    """Messages per second of ``step`` (returns messages done per call) over ``seconds``."""
    n = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        n += step()
    return n / (time.perf_counter() - start)


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def latency(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of call times (seconds), in ms."""
    if not values:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "p50_ms": ms(percentile(values, 50)),
        "p99_ms": ms(percentile(values, 99)),
        "max_ms": ms(max(values)),
    }


def checkpoint(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
        conn.execute("CHECKPOINT")


# -- the queues of both systems ----------------------------------------------------------------


class Fleet:
    """A database of its own holding N queues of both systems, q1..qN (LonnyMQ created in one
    statement; pgmq one queue per transaction, which a default server's lock table needs), so
    every count can be measured in turn within one rep. Records how long creating them took."""

    def __init__(
        self, base_dsn: str, n: int, pgmq_max: int, functions: bool = False, keep: bool = False
    ) -> None:
        self.n = n
        self.dbname = f"{SCHEMA}_{n}"
        self.base_dsn = base_dsn
        self.keep = keep
        self.dsn = make_conninfo(base_dsn, dbname=self.dbname)
        self.created_s: dict[str, float] = {}
        self.have_pgmq = n <= pgmq_max
        if keep and self._left_by_a_run_before():
            log(f"{n:,} queues: the databases of a run before (--keep-fleets), pgmq: {self.have_pgmq}")
            self.track_functions(functions)
            return
        db = sql.Identifier(self.dbname)
        with psycopg.connect(base_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(db))
        self.track_functions(functions)
        with Client(self.dsn, schema=SCHEMA, pool_size=1) as c:
            c.migrate()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            t = time.perf_counter()
            conn.execute(
                sql.SQL("SELECT count({s}.queue_create('q' || i)) FROM generate_series(1, %s::int) i").format(
                    s=S
                ),
                [n],
            )
            self.created_s["lonnymq"] = time.perf_counter() - t
        try:
            from pgmq import install_pgmq_from_sql
        except ImportError:
            self.have_pgmq = False
        if self.have_pgmq:
            with psycopg.connect(self.dsn) as c:
                install_pgmq_from_sql(conn=c)
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                # Setup, not measured: 100 queues a transaction (about 900 locks: within a
                # default server's lock table) without waiting for each commit's flush.
                conn.execute("SET synchronous_commit = off")
                t = time.perf_counter()
                for i in range(1, n + 1, 100):
                    conn.execute(
                        "SELECT count(pgmq.create('q' || i)) FROM generate_series(%s::int, %s::int) i",
                        [i, min(n, i + 99)],
                    )
                    if (i + 99) % 1000 == 0:
                        log(f"  pgmq: {i + 99:,} queues, {time.perf_counter() - t:.0f} s")
                self.created_s["pgmq"] = time.perf_counter() - t
        log(f"{n:,} queues created: {self.created_s}")

    def _left_by_a_run_before(self) -> bool:
        """Whether an earlier run with --keep-fleets left this fleet whole (both systems' N
        queues, pgmq's only if wanted): creating 10,000 pgmq queues takes 10 minutes here."""
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {s}.queue WHERE name LIKE 'q%%'").format(s=S)
                )
                if row.fetchone() != (self.n,):
                    return False
                if self.have_pgmq:
                    with_pgmq = conn.execute("SELECT count(*) FROM pgmq.meta WHERE queue_name LIKE 'q%%'")
                    return with_pgmq.fetchone() == (self.n,)
                return True
        except psycopg.Error:
            return False

    def track_functions(self, on: bool) -> None:
        """--functions: the server's time by function (``track_functions``), on new sessions."""
        with psycopg.connect(self.base_dsn, autocommit=True) as conn:
            db = sql.Identifier(self.dbname)
            if on:
                conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(db))
            else:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET track_functions").format(db))

    def names(self) -> list[str]:
        return [f"q{i}" for i in range(1, self.n + 1)]

    def drop(self) -> None:
        if self.keep:
            return
        with psycopg.connect(self.base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.dbname))
            )


# -- queue series: one connection ----------------------------------------------------------------


def lonnymq_cells(c: Client, queue: str, seconds: float) -> dict[str, float]:
    cells = {"send": rate(seconds, lambda: len([c.send(queue, PAYLOAD)]))}
    c.send_batch(queue, [PAYLOAD] * 20_000)
    held: list[Message] = []

    def take_ack(n: int) -> Callable[[], int]:
        def step() -> int:
            nonlocal held
            got = c.take(queue, n, ack=held)
            done = len(held)
            held = got
            return done

        return step

    cells["take+ack"] = rate(seconds, take_ack(1))
    cells["take+ack x100"] = rate(seconds, take_ack(100))
    if held:
        c.ack(held)
    c.purge_queue(queue)
    return cells


def pgmq_cells(conn: psycopg.Connection[Any], queue: str, seconds: float) -> dict[str, float]:
    def send() -> int:
        conn.execute("SELECT * FROM pgmq.send(%s::text, %s::jsonb)", [queue, Jsonb(PAYLOAD)]).fetchall()
        return 1

    cells = {"send": rate(seconds, send)}
    for _ in range(20):
        conn.execute("SELECT * FROM pgmq.send_batch(%s::text, %s::jsonb[])", [queue, [Jsonb(PAYLOAD)] * 1000])

    def read_delete(n: int) -> Callable[[], int]:
        def step() -> int:
            ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s::text, 30, %s)", [queue, n])]
            if n == 1 and ids:
                conn.execute("SELECT pgmq.delete(%s::text, %s::bigint)", [queue, ids[0]])
            elif ids:
                conn.execute("SELECT * FROM pgmq.delete(%s::text, %s::bigint[])", [queue, ids]).fetchall()
            return len(ids)

        return step

    cells["take+ack"] = rate(seconds, read_delete(1))
    cells["take+ack x100"] = rate(seconds, read_delete(100))
    conn.execute("SELECT pgmq.purge_queue(%s)", [queue])
    return cells


def queue_cells(fleet: Fleet, seconds: float, flip: bool) -> dict[str, dict[str, float]]:
    """One rep of the queue series on ``fleet``'s last queue, both systems (in turn)."""
    out: dict[str, dict[str, float]] = {"lonnymq": {}, "pgmq": {}}
    queue = f"q{fleet.n}"
    with (
        Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c,
        psycopg.connect(fleet.dsn, autocommit=True) as conn,
    ):
        for system in ("pgmq", "lonnymq") if flip else ("lonnymq", "pgmq"):
            if system == "lonnymq":
                out[system] = lonnymq_cells(c, queue, seconds)
            elif fleet.have_pgmq:
                out[system] = pgmq_cells(conn, queue, seconds)
    return out


# -- concurrent series: 50 consumers spread over the queues -------------------------------------


def _mine(names: Sequence[str], index: int, procs: int) -> list[str]:
    """Process ``index``'s queues: every procs-th one from its own; the one queue if only one."""
    return list(names[index::procs]) or [names[index % len(names)]]


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process ``pid`` has used: /proc, so only for a
    server on this machine (NaN otherwise)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICK


def _loop(
    ctx: Ctx, queues: Sequence[str], call: Callable[[str], tuple[int, bool]], backend: int
) -> dict[str, Any]:
    """Visit ``queues`` in turn until the deadline, one timed call each; ``call`` returns the
    messages it completed and whether it found nothing. Also the CPU time this client process
    and its server process (``backend``) used meanwhile: on a machine where clients and server
    share the cores, the rate is what that CPU allows."""
    lat: list[float] = []
    done = empty = 0
    i = 0
    started = time.monotonic()
    cpu, server = time.process_time(), _backend_cpu(backend)
    while not ctx.expired():
        q = queues[i % len(queues)]
        i += 1
        t = time.perf_counter()
        n, nothing = call(q)
        lat.append(time.perf_counter() - t)
        done += n
        empty += nothing
    return {
        "n": done,
        "elapsed": time.monotonic() - started,
        "lat": lat,
        "empty": empty,
        "client_cpu": time.process_time() - cpu,
        "server_cpu": _backend_cpu(backend) - server,
    }


#: One call of a concurrent series' phase: the messages it completed, and whether it found none.
Call = Callable[[str], tuple[int, bool]]
#: What a worker process of the concurrent series opens on its queues: its send and its take +
#: ack, its server process's pid, and how to close it.
Session = tuple[Call, Call, int, Callable[[], None]]
Worker = Callable[[str, Sequence[str], int, str], Callable[[Ctx], Callable[[], Any]]]


def phase_worker(open_session: Callable[[str, Sequence[str]], Session]) -> Worker:
    """A concurrent series' worker: each process opens a session on its queues and visits them
    with the phase's call until the deadline."""

    def worker(dsn: str, names: Sequence[str], procs: int, phase: str) -> Callable[[Ctx], Callable[[], Any]]:
        def prepare(ctx: Ctx) -> Callable[[], Any]:
            queues = _mine(names, ctx.index, procs)
            send, take_ack, backend, close = open_session(dsn, queues)

            def work() -> dict[str, Any]:
                out = _loop(ctx, queues, send if phase == "send" else take_ack, backend)
                close()
                return out

            return work

        return prepare

    return worker


def lonnymq_worker(check: bool) -> Worker:
    """The LonnyMQ worker: the client as configured by default, or (``check`` false) without
    its pool's connection check, one round trip more per call (README: restarts)."""

    def open_session(dsn: str, queues: Sequence[str]) -> Session:
        c = Client(dsn, schema=SCHEMA, pool_size=1, check_connections=check)
        c.open()
        with c.connection() as conn:  # the pool's one connection
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

        def send(q: str) -> tuple[int, bool]:
            c.send(q, PAYLOAD)
            return 1, False

        def take_ack(q: str) -> tuple[int, bool]:
            got = c.take(q, 1)
            if got:
                c.ack(got)
            return len(got), not got

        return send, take_ack, backend, c.close

    return phase_worker(open_session)


def bare_worker(calls: Callable[[psycopg.Connection[Any], Sequence[str]], tuple[Call, Call]]) -> Worker:
    """A concurrent series' worker on one autocommit psycopg connection (pgmq, the floor)."""

    def open_session(dsn: str, queues: Sequence[str]) -> Session:
        conn = psycopg.connect(dsn, autocommit=True)
        send, take_ack = calls(conn, queues)
        return send, take_ack, conn.info.backend_pid, conn.close

    return phase_worker(open_session)


def _pgmq_calls(conn: psycopg.Connection[Any], queues: Sequence[str]) -> tuple[Call, Call]:
    body = Jsonb(PAYLOAD)

    def send(q: str) -> tuple[int, bool]:
        conn.execute("SELECT * FROM pgmq.send(%s::text, %s::jsonb)", [q, body]).fetchall()
        return 1, False

    def take_ack(q: str) -> tuple[int, bool]:
        # The whole message, as pgmq's own client reads it (its jsonb decoded by psycopg).
        row = conn.execute("SELECT * FROM pgmq.read(%s::text, 30, 1)", [q]).fetchone()
        if row is None:
            return 0, True
        conn.execute("SELECT pgmq.delete(%s::text, %s::bigint)", [q, row[0]])
        return 1, False

    return send, take_ack


pgmq_worker = bare_worker(_pgmq_calls)


# The floor of the concurrent series: what send(), take(1) and ack() write, as plain statements on
# LonnyMQ's own tables from a bare connection (no function call, no queue lookup by name: the
# queues' ids are read once; no generation hold, wake-up check, fencing beyond the token match,
# dead-lettering or argument checks). A send: the message row and its queue_stat row; a take: the
# lease (UPDATE of the first ready row, FOR UPDATE SKIP LOCKED); an ack: the DELETE, ack's memory
# of it (settled, for an idempotent repeat) and its queue_stat row. The rows LonnyMQ's guarantees
# need, at their least: where LonnyMQ is measured against pgmq, this is the most it could reach.
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
FLOOR_SEND = sql.SQL(
    "WITH now AS (SELECT " + _NOW + " AS ms),"
    " ins AS (INSERT INTO {s}.message (queue_id, id, gen, dequeue_at, scheduled_at, enqueued_at, priority,"
    "                                 content_type, payload)"
    "         SELECT %(q)s, nextval({seq}), g.last_value, now.ms, now.ms, now.ms, 0, 'application/json', %(p)b"
    "           FROM now, {s}.message_gen_seq g"
    "         RETURNING id, enqueued_at),"
    " st AS (INSERT INTO {s}.queue_stat (queue_id, minute, sent) SELECT %(q)s, ins.enqueued_at / 60000, 1 FROM ins)"
    " SELECT id FROM ins"
).format(s=S, seq=sql.Literal(f"{SCHEMA}.message_id_seq"))
FLOOR_TAKE = sql.SQL(
    "UPDATE {s}.message m SET dequeue_at = %(now)s + 30000, attempts = m.attempts + 1,"
    "       deliveries = m.deliveries + 1, leased = true"
    " WHERE m.ctid = (SELECT x.ctid FROM {s}.message x"
    "                  WHERE x.gen = (SELECT last_value FROM {s}.message_gen_seq) AND x.queue_id = %(q)s"
    "                    AND x.channel IS NULL AND x.dequeue_at <= %(now)s"
    "                  ORDER BY x.dequeue_at, x.id LIMIT 1 FOR UPDATE OF x SKIP LOCKED)"
    "   AND m.queue_id = %(q)s"
    " RETURNING m.id, m.attempts, m.deliveries, m.dequeue_at, m.scheduled_at, m.enqueued_at, m.priority,"
    "           m.key, m.channel, m.kind, m.content_type, m.headers, m.state, m.last_error, m.payload"
).format(s=S)
FLOOR_ACK = sql.SQL(
    "WITH now AS (SELECT " + _NOW + " AS ms),"
    " d AS (DELETE FROM {s}.message m WHERE m.queue_id = %(q)s AND m.id = %(id)s AND m.deliveries = %(token)s"
    "         AND m.leased RETURNING m.id, m.deliveries),"
    " k AS (INSERT INTO {s}.settled (queue_id, id, token, outcome, settled_at)"
    "       SELECT %(q)s, d.id, d.deliveries, 'acked', now.ms FROM d, now),"
    " st AS (INSERT INTO {s}.queue_stat (queue_id, minute, acked)"
    "        SELECT %(q)s, (SELECT ms FROM now) / 60000, count(*) FROM d HAVING count(*) > 0)"
    " SELECT id FROM d"
).format(s=S)


def _floor_calls(conn: psycopg.Connection[Any], queues: Sequence[str]) -> tuple[Call, Call]:
    # The planner settings take() and ack() run with (their SET clauses): without them a plan
    # made from the backlog's statistics sorts the queue's rows instead of reading the index.
    for setting in (
        "plan_cache_mode = force_generic_plan",
        "enable_seqscan = off",
        "enable_sort = off",
        "jit = off",
    ):
        conn.execute(sql.SQL("SET " + setting))  # type: ignore[arg-type]
    ids = dict(
        conn.execute(sql.SQL("SELECT name, id FROM {s}.queue WHERE name = ANY (%s)").format(s=S), [queues])
    )
    body = json.dumps(PAYLOAD).encode()

    def send(q: str) -> tuple[int, bool]:
        conn.execute(FLOOR_SEND, {"q": ids[q], "p": body}).fetchall()
        return 1, False

    def take_ack(q: str) -> tuple[int, bool]:
        now = int(time.time() * 1000)  # (a parameter, as LonnyMQ's take has it: an index bound)
        row = conn.execute(FLOOR_TAKE, {"q": ids[q], "now": now}, binary=True).fetchone()
        if row is None:
            return 0, True
        json.loads(row[-1])  # the payload, decoded as the clients do
        conn.execute(FLOOR_ACK, {"q": ids[q], "id": row[0], "token": row[2]}, binary=True).fetchall()
        return 1, False

    return send, take_ack


floor_worker = bare_worker(_floor_calls)


class LockSampler:
    """The most relation locks held on the server at once (all backends; fast-path slots and the
    shared lock table), and what the database's client backends were doing, sampled every
    ``every`` seconds while it runs: ``waits`` counts, over all samples, each backend's wait
    event (``CPU`` for an active backend not waiting, ``idle`` for one waiting for its client),
    and ``blocked`` the lock requests not granted, by lock type (which row, transaction,
    advisory or object lock the waits are for)."""

    def __init__(self, dsn: str, every: float = 0.1) -> None:
        self.dsn, self.every = dsn, every
        self.most = self.most_shared = self.samples = 0
        self.waits: Counter[str] = Counter()
        self.blocked: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE NOT fastpath) FROM pg_locks"
                    " WHERE locktype = 'relation' AND pid <> pg_backend_pid()"
                ).fetchone()
                assert row is not None
                self.most, self.most_shared = max(self.most, row[0]), max(self.most_shared, row[1])
                for what, n in conn.execute(
                    "SELECT CASE WHEN state = 'active' THEN coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                    "            ELSE coalesce(state, '?') END, count(*)"
                    "  FROM pg_stat_activity"
                    " WHERE datname = current_database() AND backend_type = 'client backend'"
                    "   AND pid <> pg_backend_pid() GROUP BY 1"
                ):
                    self.waits[what] += n
                for what, n in conn.execute(
                    "SELECT locktype || ' ' || mode, count(*) FROM pg_locks WHERE NOT granted GROUP BY 1"
                ):
                    self.blocked[what] += n
                self.samples += 1
                self._stop.wait(self.every)

    def profile(self) -> dict[str, Any]:
        """The share of backend samples per wait event and the blocked lock requests per
        sample (the most frequent first)."""
        total = sum(self.waits.values()) or 1
        return {
            "samples": self.samples,
            "waits": {k: round(v / total, 3) for k, v in self.waits.most_common(8)},
            "blocked_per_sample": {
                k: round(v / max(self.samples, 1), 2) for k, v in self.blocked.most_common(5)
            },
        }

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def reset(dsn: str, system: str, names: Sequence[str]) -> None:
    """Empty every queue: LonnyMQ purges and vacuums its message table; pgmq's tables are
    truncated (up to 100 queues; beyond, a truncate each would take minutes, so their rows are
    deleted, 500 queues a transaction: a few dead rows a table)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        if system != "pgmq":  # LonnyMQ and the floor (its tables)
            conn.execute(sql.SQL("SELECT count({s}.queue_purge(name)) FROM {s}.queue").format(s=S))
            conn.execute(sql.SQL("VACUUM {s}.message").format(s=S))
        elif len(names) <= 100:
            for q in names:
                conn.execute(sql.SQL("TRUNCATE pgmq.{}").format(sql.Identifier(f"q_{q}")))
        else:
            for i in range(0, len(names), 500):
                with conn.transaction():
                    for q in names[i : i + 500]:
                        conn.execute(sql.SQL("DELETE FROM pgmq.{}").format(sql.Identifier(f"q_{q}")))


def preload(dsn: str, system: str, names: Sequence[str], total: int) -> None:
    """``total`` messages spread evenly over ``names``: one batch send per queue, up to 100
    queues a statement (setup, not measured: commits not waited for)."""
    per = -(-total // len(names))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for i in range(0, len(names), 100):
            chunk = list(names[i : i + 100])
            for k in [min(5000, per - j) for j in range(0, per, 5000)]:
                if system != "pgmq":
                    conn.execute(
                        sql.SQL(
                            "SELECT count(*) FROM unnest(%s::text[]) q,"
                            " LATERAL {s}.send_batch(q, array_fill(%s::bytea, ARRAY[%s::int]))"
                        ).format(s=S),
                        [chunk, json.dumps(PAYLOAD).encode(), k],
                    )
                else:
                    conn.execute(
                        "SELECT count(*) FROM unnest(%s::text[]) q,"
                        " LATERAL pgmq.send_batch(q, array_fill(%s::jsonb, ARRAY[%s::int]))",
                        [chunk, Jsonb(PAYLOAD), k],
                    )


def function_times(dsn: str, since: Counter[str] | None = None) -> Counter[str]:
    """Self time (ms) of each function of the database (``track_functions``, which --functions
    sets): as of now, or since ``since``. Empty where the setting is off."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        now: Counter[str] = Counter(
            dict(conn.execute("SELECT schemaname || '.' || funcname, self_time FROM pg_stat_user_functions"))
        )
    if since is not None:
        now.subtract(since)
        now = +now
    return now


def concurrent_run(
    dsn: str, system: str, names: Sequence[str], procs: int, seconds: float, total: int
) -> dict[str, Any]:
    """One rep: reset, the send phase, the backlog topped up by ``total``, the take+ack phase."""
    worker = (
        pgmq_worker
        if system == "pgmq"
        else floor_worker
        if system == "floor"
        else lonnymq_worker(check=system == "lonnymq")  # "lonnymq-nocheck": Client(check_connections=False)
    )
    out: dict[str, Any] = {}
    reset(dsn, system, names)
    for phase in ("send", "take+ack"):
        if phase == "take+ack":
            preload(dsn, system, names, total)
        checkpoint(dsn)
        before = function_times(dsn)
        with LockSampler(dsn) as locks:
            run = run_procs(worker(dsn, names, procs, phase), procs, seconds=seconds)
        res = run.results
        spent = function_times(dsn, before)
        lat = [x for r in res for x in r["lat"]]
        out[phase] = {
            "rate": sum(r["n"] for r in res) / statistics.mean(r["elapsed"] for r in res),
            "calls": len(lat),
            "empty": sum(r["empty"] for r in res),
            **latency(lat),
            "locks_max": locks.most,
            "locks_shared_max": locks.most_shared,
            "activity": locks.profile(),
            # --functions: the server's time in each SQL function, µs of self time a message.
            "function_self_us": {
                k: round(v * 1000 / max(1, sum(r["n"] for r in res))) for k, v in spent.most_common(8)
            },
            # CPU per message completed, µs: the client processes', their server processes'.
            "client_cpu_us": round(
                sum(r["client_cpu"] for r in res) / max(1, sum(r["n"] for r in res)) * 1e6
            ),
            "server_cpu_us": round(
                sum(r["server_cpu"] for r in res) / max(1, sum(r["n"] for r in res)) * 1e6
            ),
        }
        log(
            f"  {system} {phase}: {out[phase]['rate']:,.0f}/s, client/server CPU"
            f" {out[phase]['client_cpu_us']}/{out[phase]['server_cpu_us']} us a message,"
            f" {json.dumps(out[phase]['activity'])} {json.dumps(out[phase]['function_self_us'])}"
        )
    return out


def concurrent_cells(
    fleet: Fleet, procs: int, seconds: float, total: int, flip: bool, nocheck: bool, floor: bool
) -> dict[str, dict[str, Any]]:
    """One rep of the concurrent series on ``fleet``, both systems (in turn)."""
    out: dict[str, dict[str, Any]] = {s: {} for s in SYSTEMS}
    names = fleet.names()
    systems = (
        ["lonnymq"]
        + (["lonnymq-nocheck"] if nocheck else [])
        + (["floor"] if floor else [])
        + (["pgmq"] if fleet.have_pgmq else [])
    )
    for system in systems[::-1] if flip else systems:
        out[system] = concurrent_run(fleet.dsn, system, names, procs, seconds, total)
        reset(fleet.dsn, system, names)
    return out


# -- channel series --------------------------------------------------------------------------------


def channel_load(c: Client, queue: str, n: int, **settings: Any) -> None:
    c.drop_queue(queue, if_exists=True)
    c.create_queue(queue, **settings)
    total = max(n * 2, 40_000)
    for start in range(0, total, 5_000):
        c.send_batch(queue, [Envelope(PAYLOAD, channel=f"t{i % n}") for i in range(start, start + 5_000)])


def channel_cells(c: Client, n: int, seconds: float) -> dict[str, Any]:
    queue = f"ch{n}"
    channel_load(c, queue, n)
    k = 0

    def send() -> int:
        nonlocal k
        c.send(queue, PAYLOAD, channel=f"t{k % n}")
        k += 1
        return 1

    cells: dict[str, Any] = {"send": rate(seconds, send)}
    # Every channel now holds 2 or more messages (sends went to the front channels, which the
    # round robin serves first anyway): count what each delivery served.
    served: Counter[str] = Counter()
    held: list[Message] = []

    def take_ack(size: int) -> Callable[[], int]:
        def step() -> int:
            nonlocal held
            got = c.take(queue, size, ack=held)
            served.update(m.channel or "" for m in got)
            done = len(held)
            held = got
            return done

        return step

    cells["take+ack"] = rate(seconds, take_ack(1))
    cells["take+ack x100"] = rate(seconds, take_ack(100))
    if held:
        c.ack(held)
    # Round robin: while every channel still has messages, no channel is served twice before
    # every channel is served once, so the counts differ by at most one.
    counts = [served.get(f"t{i}", 0) for i in range(n)]
    cells["fair"] = max(counts) - min(counts) <= 1
    cells["served"] = sum(counts)
    c.drop_queue(queue)
    return cells


def channel_limits(dsn: str, n: int, seconds: float, procs: int = 4) -> dict[str, Any]:
    """``max_concurrency = 1`` on every one of ``n`` channels, ``procs`` consumers taking batches
    of 20 and acking them 20 ms later; a sampler counts channels holding two live leases."""
    queue = f"lim{n}"
    with Client(dsn, schema=SCHEMA, pool_size=1) as c:
        channel_load(c, queue, n, channel_max_concurrency=1)

    def prepare(ctx: Ctx) -> Callable[[], Any]:
        c = Client(dsn, schema=SCHEMA, pool_size=1)
        c.open()

        def work() -> int:
            done = 0
            while not ctx.expired():
                got = c.take(queue, 20)
                time.sleep(0.02)
                if got:
                    c.ack(got)
                done += len(got)
            c.close()
            return done

        return work

    worst = samples = leased_seen = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal worst, samples, leased_seen
        with psycopg.connect(dsn, autocommit=True) as conn:
            qid = conn.execute(
                sql.SQL("SELECT id FROM {s}.queue WHERE name = %s").format(s=S), [queue]
            ).fetchone()
            assert qid is not None
            while not stop.is_set():
                row = conn.execute(
                    sql.SQL(
                        "SELECT count(*) FILTER (WHERE n > 1), coalesce(sum(n), 0) FROM ("
                        " SELECT count(*) AS n FROM {s}.message m"
                        "  WHERE m.queue_id = %s AND m.leased AND m.dequeue_at > {s}.now_ms()"
                        "  GROUP BY m.channel) x"
                    ).format(s=S),
                    [qid[0]],
                ).fetchone()
                assert row is not None
                worst, leased_seen, samples = max(worst, row[0]), max(leased_seen, int(row[1])), samples + 1
                stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = run_procs(prepare, procs, seconds=seconds)
    finally:
        stop.set()
        sampler.join()
    with Client(dsn, schema=SCHEMA, pool_size=1) as c:
        over = [ch.name for ch in c.channels(queue, limit=1000) if ch.leased > 1]
        c.drop_queue(queue)
    return {
        "taken": sum(run.results),
        "samples": samples,
        "most_leases_seen": leased_seen,
        "channels_over_limit": worst,
        "counters_over_limit": len(over),
    }


def channel_series(dsn: str, counts: list[int], seconds: float, reps: int) -> dict[int, dict[str, Any]]:
    """The channel series, the counts in turn within each rep, then the limits check per count."""
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    out: dict[int, dict[str, Any]] = {}
    with Client(dsn, schema=SCHEMA, pool_size=1) as c:
        c.migrate()
        for r in range(reps):
            for n in counts if r % 2 == 0 else counts[::-1]:
                runs[n].append(channel_cells(c, n, seconds))
                log(f"  channels {n:,} rep {r + 1}: {json.dumps(runs[n][-1])}")
    for n in counts:
        out[n] = {
            "runs": runs[n],
            **{k: med([x[k] for x in runs[n]]) for k in ("send", "take+ack", "take+ack x100")},
            "fair": all(x["fair"] for x in runs[n]),
            "limits": channel_limits(dsn, n, min(seconds, 3.0)),
        }
        log(f"  channel limits {n:,}: {json.dumps(out[n]['limits'])}")
    return out


# -- rotation series --------------------------------------------------------------------------------


def _message_rows_read(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = %s AND relname = 'message_logged'",
        [schema],
    ).fetchone()
    return int(row[0]) if row else 0


def rotation_cells(dsn: str, n: int, rotations: int) -> dict[str, Any]:
    """N queues of 6 waiting messages, all in one generation, and one row of it held by another
    transaction (a take or an ack in flight) while the generation leaves the window: the
    rotations that follow (forced, rotate()'s default budget), timed, with the message rows
    each read; then the row is let go and the generation must be finished within a rotation."""
    schema = f"{SCHEMA}_rot"
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as holder:
        conn.execute(sql.SQL("SELECT {}.queue_create('held')").format(s))
        [(held,)] = conn.execute(
            sql.SQL("SELECT id FROM {}.send_batch('held', ARRAY['x']::bytea[])").format(s)
        ).fetchall()
        conn.execute(
            sql.SQL("SELECT count({s}.queue_create('q' || i)) FROM generate_series(1, %s::int) i").format(
                s=s
            ),
            [n],
        )
        conn.execute(
            sql.SQL(
                "SELECT count(*) FROM generate_series(1, %s::int) i,"
                " LATERAL {s}.send_batch('q' || i, array_fill('m'::bytea, ARRAY[6]))"
            ).format(s=s),
            [n],
        )
        conn.execute(sql.SQL("ANALYZE {}.message").format(s))
        holder.execute(sql.SQL("SELECT 1 FROM {}.message WHERE id = %s FOR UPDATE").format(s), [held])

        def rotate() -> tuple[float, int]:
            with conn.transaction():
                before = _message_rows_read(conn, schema)
                t = time.perf_counter()
                conn.execute(sql.SQL("SELECT {}.rotate(p_force => true)").format(s))
                took = time.perf_counter() - t
                return took, _message_rows_read(conn, schema) - before

        leaving = [rotate() for _ in range(3)]  # the generation leaves the window: its first sweep
        held_on = [rotate() for _ in range(rotations)]
        holder.rollback()
        after = rotate()
        [(pending,)] = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {s}.message_gen_pending p, {s}.message_gen_seq q"
                " WHERE p.gen < q.last_value - 1"
            ).format(s=s)
        ).fetchall()
        out = {
            "leaving_ms": [ms(t) for t, _ in leaving],
            "leaving_rows": [r for _, r in leaving],
            **{f"held_{k}": v for k, v in latency([t for t, _ in held_on]).items()},
            "held_rows_max": max(r for _, r in held_on),
            "released_ms": ms(after[0]),
            "pending_after": int(pending),
        }
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(s))
    return out


def rotation_series(dsn: str, counts: list[int], rotations: int) -> dict[int, dict[str, Any]]:
    out = {}
    for n in counts:
        out[n] = rotation_cells(dsn, n, rotations)
        log(f"  rotation {n:,}: {json.dumps(out[n])}")
    return out


# -- lifecycle series -------------------------------------------------------------------------------


def timed(calls: Sequence[Callable[[], Any]]) -> list[float]:
    out = []
    for call in calls:
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def create_drop(fleet: Fleet, ops: int, tag: str) -> dict[str, Any]:
    """``ops`` queues created, then dropped, one call each (LonnyMQ, then pgmq)."""
    out: dict[str, Any] = {}
    names = [f"life{tag}_{i}" for i in range(ops)]
    with Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c:
        out["lonnymq create"] = latency(timed([lambda q=q: c.create_queue(q) for q in names]))
        out["lonnymq drop"] = latency(timed([lambda q=q: c.drop_queue(q) for q in names]))
    if fleet.have_pgmq:
        with psycopg.connect(fleet.dsn, autocommit=True) as conn:
            out["pgmq create"] = latency(
                timed([lambda q=q: conn.execute("SELECT pgmq.create(%s)", [q]) for q in names])
            )
            out["pgmq drop"] = latency(
                timed([lambda q=q: conn.execute("SELECT pgmq.drop_queue(%s)", [q]) for q in names])
            )
    return out


def under_load(fleet: Fleet, seconds: float, tag: str) -> dict[str, Any]:
    """A take+ack loop on queue ``busy`` (a backlog, one process) for ``seconds``: the first
    third alone, the second third while this process creates and drops queues, one call each."""
    busy = "busy"
    with Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c:
        c.create_queue(busy, if_not_exists=True)
        c.purge_queue(busy)
        for _ in range(10):
            c.send_batch(busy, [PAYLOAD] * 5_000)
    checkpoint(fleet.dsn)

    def prepare(ctx: Ctx) -> Callable[[], Any]:
        c = Client(fleet.dsn, schema=SCHEMA, pool_size=1)
        c.open()

        def work() -> list[tuple[float, float]]:
            held: list[Message] = []
            calls = []
            while not ctx.expired():
                t = time.perf_counter()
                got = c.take(busy, 1, ack=held)
                calls.append((time.monotonic(), time.perf_counter() - t))
                held = got
            if held:
                c.ack(held)
            c.close()
            return calls

        return work

    window: dict[str, float] = {}
    lifecycle: list[float] = []

    def during(_t0: float) -> None:
        time.sleep(seconds / 3)
        with Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c:
            window["from"] = time.monotonic()
            i = 0
            while time.monotonic() < window["from"] + seconds / 3:
                q = f"churn{tag}_{i}"
                lifecycle.extend(timed([lambda q=q: c.create_queue(q), lambda q=q: c.drop_queue(q)]))
                i += 1
            window["to"] = time.monotonic()

    run = run_procs(prepare, 1, seconds=seconds, during=during)
    calls = run.results[0]
    before = [d for t, d in calls if t < window["from"]]
    amid = [d for t, d in calls if window["from"] <= t <= window["to"]]
    with Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c:
        c.drop_queue(busy)
    return {
        "take+ack alone": {"calls": len(before), **latency(before)},
        "take+ack during creates/drops": {"calls": len(amid), **latency(amid)},
        "create/drop amid": {"calls": len(lifecycle), **latency(lifecycle)},
    }


def give_counters(fleet: Fleet) -> None:
    """Counter rows for every queue of the fleet, as tenants that all sent and acked something
    leave them: two of the current minute and two of three days ago each (maintain() and the
    heartbeats fold them)."""
    with psycopg.connect(fleet.dsn, autocommit=True) as conn:
        now = int(time.time() * 1000) // 60_000
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.queue_stat (queue_id, minute, sent, acked)"
                " SELECT q.id, m, 1, 1 FROM {s}.queue q, unnest(%s::bigint[]) m"
            ).format(s=sql.Identifier(SCHEMA)),
            ([now, now, now - 3 * 1440, now - 3 * 1440],),
        )
        conn.execute(sql.SQL("ANALYZE {}.queue_stat").format(sql.Identifier(SCHEMA)))


def listings(fleet: Fleet, runs: int = 7) -> dict[str, Any]:
    """Median and max of ``runs`` of each listing (after one to warm up), in ms."""

    def stats(t: Sequence[float]) -> dict[str, float]:
        return {"median_ms": ms(med(t)), "max_ms": ms(max(t))}

    from lonnymq.worker.ops import worker_ops

    out: dict[str, Any] = {}
    middle = f"q{max(1, fleet.n // 2)}"
    # A worker's heartbeat (its registry row; folds the recent counters, at most every 10 s).
    beat = worker_ops(SCHEMA).worker_beat("scale-bench", "bench", os.getpid(), [middle], 1, 0, 60_000)
    with Client(fleet.dsn, schema=SCHEMA, pool_size=1) as c:
        for name, call in (
            ("list_queues(limit=100)", lambda: c.list_queues(limit=100)),
            ("list_queues(limit=100, after=middle)", lambda: c.list_queues(limit=100, after=middle)),
            ("list_queues() all", lambda: c.list_queues()),
            ("metrics(queue)", lambda: c.metrics(middle)),
            ("maintain()", lambda: c.maintain()),
            ("worker heartbeat", lambda: c.run(beat)),
        ):
            out[name] = stats(timed([call] * (runs + 1))[1:])
    try:
        from lonnymq.client import AsyncClient
        from lonnymq.web import queries
        from lonnymq.web.app import reader_conninfo
    except ImportError:  # no web extra
        return out

    async def web() -> None:
        async with AsyncClient(reader_conninfo(fleet.dsn), schema=SCHEMA) as ac:
            pages: list[tuple[str, Callable[[], Any]]] = [
                ("dashboard overview (100 a page)", lambda: queries.queue_rows(ac, after=None, limit=100)),
                ("dashboard overview after=middle", lambda: queries.queue_rows(ac, after=middle, limit=100)),
                ("dashboard queue page", lambda: queries.queue_page(ac, middle)),
            ]
            for name, page in pages:
                t = []
                for _ in range(runs + 1):
                    s = time.perf_counter()
                    await page()
                    t.append(time.perf_counter() - s)
                out[name] = stats(t[1:])

    asyncio.run(web())
    return out


def lifecycle_cells(
    fleet: Fleet, ops: int, seconds: float, tag: str, counters: bool = False
) -> dict[str, Any]:
    """One rep of the lifecycle series on ``fleet`` (with ``counters``, every queue gets counter
    rows before the listings: give_counters)."""
    cells = {"create/drop": create_drop(fleet, ops, tag), "under load": under_load(fleet, seconds, tag)}
    if counters:
        give_counters(fleet)
    return {**cells, "listings": listings(fleet)}


# -- report ----------------------------------------------------------------------------------------


def _cell(v: float, base: float) -> str:
    return f"{v:,.0f}/s ({v / base:.2f}x)"


def _med_cells(reps: list[dict[str, dict[str, float]]], system: str) -> dict[str, float]:
    """The median of each workload over the reps of one system."""
    rows = [r[system] for r in reps if r[system]]
    return {k: med([x[k] for x in rows]) for k in rows[0]} if rows else {}


def _lat(reps: list[dict[str, Any]]) -> str:
    """p50 / p99 / max (ms) over reps: medians of p50 and p99, the largest max."""
    return (
        f"{med([r['p50_ms'] for r in reps]):.2f} / {med([r['p99_ms'] for r in reps]):.2f} /"
        f" {max(r['max_ms'] for r in reps):.2f}"
    )


def report(results: dict[str, Any]) -> str:
    lines: list[str] = [f"Server: {results['settings']}"]
    qs = results.get("queues") or {}
    if qs:
        counts = sorted(qs)
        cells = {n: {s: _med_cells(qs[n], s) for s in ("lonnymq", "pgmq")} for n in counts}
        lines += ["", "Queue series (one connection; median of reps; ratio to the smallest count):", ""]
        lines.append("| system | workload | " + " | ".join(f"{n:,} queues" for n in counts) + " |")
        lines.append("|---" * (2 + len(counts)) + "|")
        for system in ("lonnymq", "pgmq"):
            have = [n for n in counts if cells[n][system]]
            for work in cells[have[0]][system] if have else ():
                base = cells[have[0]][system][work]
                row = [_cell(cells[n][system][work], base) if n in have else "-" for n in counts]
                lines.append(f"| {system} | {work} | " + " | ".join(row) + " |")
        both = [n for n in counts if cells[n]["pgmq"]]
        if both:
            lines += ["", "LonnyMQ / pgmq at the same count (medians of the per-rep ratios):", ""]
            lines.append("| workload | " + " | ".join(f"{n:,} queues" for n in both) + " |")
            lines.append("|---" * (1 + len(both)) + "|")
            for work in cells[both[0]]["lonnymq"]:
                ratios = [med([r["lonnymq"][work] / r["pgmq"][work] for r in qs[n]]) for n in both]
                lines.append(f"| {work} | " + " | ".join(f"{x:.2f}x" for x in ratios) + " |")
    cc = results.get("concurrent") or {}
    if cc:
        counts = sorted(cc)
        procs = results["args"]["consumers"]
        lines += ["", f"Concurrent series ({procs} connections spread over the queues; median of reps):", ""]
        lines.append(
            "| system | workload | queues | msg/s | vs the fewest queues | vs pgmq | p50 / p99 / max ms"
            " | empty takes | relation locks at most | CPU µs a message, client / server |"
        )
        lines.append("|---" * 10 + "|")
        for system in SYSTEMS:
            have = [n for n in counts if cc[n][0].get(system)]
            for phase in ("send", "take+ack"):
                for n in have:
                    reps = [r[system][phase] for r in cc[n]]
                    v = med([x["rate"] for x in reps])
                    base = med([r[system][phase]["rate"] for r in cc[have[0]]])
                    vs = ""
                    if system != "pgmq" and cc[n][0].get("pgmq"):
                        vs = f"{med([r[system][phase]['rate'] / r['pgmq'][phase]['rate'] for r in cc[n]]):.2f}x"
                    cpu = f"{med([x['client_cpu_us'] for x in reps]):,.0f} / {med([x['server_cpu_us'] for x in reps]):,.0f}"
                    lines.append(
                        f"| {system} | {phase} | {n:,} | {v:,.0f} | {v / base:.2f}x | {vs} | {_lat(reps)} |"
                        f" {med([x['empty'] for x in reps]):,.0f} | {max(x['locks_max'] for x in reps):,} | {cpu} |"
                    )
    ch = results.get("channels") or {}
    if ch:
        counts = sorted(ch)
        base = ch[counts[0]]
        lines += ["", "Channel series (LonnyMQ, one queue, one connection; median of reps):", ""]
        lines.append("| workload | " + " | ".join(f"{n:,} channels" for n in counts) + " |")
        lines.append("|---" * (1 + len(counts)) + "|")
        for work in ("send", "take+ack", "take+ack x100"):
            lines.append(f"| {work} | " + " | ".join(_cell(ch[n][work], base[work]) for n in counts) + " |")
        lines.append(
            "| round robin fair (every rep) | " + " | ".join(str(ch[n]["fair"]) for n in counts) + " |"
        )
        lines.append(
            "| max_concurrency=1: channels seen over it / counters over it | "
            + " | ".join(
                f"{ch[n]['limits']['channels_over_limit']} / {ch[n]['limits']['counters_over_limit']}"
                f" ({ch[n]['limits']['samples']} samples, up to {ch[n]['limits']['most_leases_seen']} leases)"
                for n in counts
            )
            + " |"
        )
    rot = results.get("rotation") or {}
    if rot:
        counts = sorted(rot)
        lines += [
            "",
            "Rotation series (N queues of 6 messages in one generation, one of its rows held;"
            " forced rotations, ms):",
            "",
        ]
        lines.append("| what | " + " | ".join(f"{n:,} queues" for n in counts) + " |")
        lines.append("|---" * (1 + len(counts)) + "|")
        for label, cell in (
            (
                "the 3 rotations the generation leaves in",
                lambda r: " / ".join(f"{x:.0f}" for x in r["leaving_ms"]),
            ),
            (
                "a rotation while the row is held: p50 / p99 / max",
                lambda r: f"{r['held_p50_ms']:.1f} / {r['held_p99_ms']:.1f} / {r['held_max_ms']:.1f}",
            ),
            ("message rows read by one of those, at most", lambda r: f"{r['held_rows_max']:,}"),
            ("the rotation after the row is let go", lambda r: f"{r['released_ms']:.1f}"),
            ("pending generations left after it", lambda r: str(r["pending_after"])),
        ):
            lines.append(f"| {label} | " + " | ".join(cell(rot[n]) for n in counts) + " |")
    lc = results.get("lifecycle") or {}
    if lc:
        counts = sorted(lc)
        lines += [
            "",
            "Lifecycle series (ms; p50 / p99 / max: medians of p50 and p99 over reps, largest max):",
            "",
        ]
        lines.append("| what | " + " | ".join(f"{n:,} queues" for n in counts) + " |")
        lines.append("|---" * (1 + len(counts)) + "|")
        rows: dict[str, list[str]] = {}
        for i, n in enumerate(counts):
            for part in ("create/drop", "under load"):
                for what in lc[n][0][part]:
                    label = what if part == "create/drop" else f"busy queue: {what}"
                    rows.setdefault(label, ["-"] * len(counts))[i] = _lat([r[part][what] for r in lc[n]])
            for what in lc[n][0]["listings"]:
                reps = [r["listings"][what] for r in lc[n]]
                rows.setdefault(f"{what} (median / max)", ["-"] * len(counts))[i] = (
                    f"{med([x['median_ms'] for x in reps]):.2f} / {max(x['max_ms'] for x in reps):.2f}"
                )
        for what, row in rows.items():
            lines.append(f"| {what} | " + " | ".join(row) + " |")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[str]:
    if not args.cluster:
        with dsn_or_temporary(args.dsn) as dsn:
            yield dsn
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import pgcluster

    with pgcluster.temporary_cluster(DEFAULTS, install=False) as cluster:
        yield cluster.dsn


def ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("LONNYMQ_BENCH_DSN"))
    p.add_argument("--cluster", action="store_true", help="a throwaway PostgreSQL 15 with default settings")
    p.add_argument("--queues", default="1,100,1000,10000", help="queue series counts ('' to skip)")
    p.add_argument("--concurrent", default="1,10000", help="concurrent series counts ('' to skip)")
    p.add_argument("--channels", default="10,1000,100000", help="channel series counts ('' to skip)")
    p.add_argument("--lifecycle", default="1,100,10000", help="lifecycle series counts ('' to skip)")
    p.add_argument("--rotation", default="", help="rotation series counts ('' to skip), e.g. 1000,10000")
    p.add_argument("--rotations", type=int, default=20, help="rotations timed per count (rotation series)")
    p.add_argument("--pgmq-max", type=int, default=10_000, help="pgmq queues for counts up to this")
    p.add_argument("--seconds", type=float, default=5.0, help="per cell of the queue and channel series")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--consumers", type=int, default=50, help="connections of the concurrent series")
    p.add_argument(
        "--concurrent-seconds", type=float, default=10.0, help="per phase of the concurrent series"
    )
    p.add_argument("--preload", type=int, default=60_000, help="backlog of each take+ack phase")
    p.add_argument("--ops", type=int, default=200, help="queues created and dropped per lifecycle rep")
    p.add_argument("--load-seconds", type=float, default=9.0, help="the busy queue's run (lifecycle)")
    p.add_argument(
        "--counters",
        action="store_true",
        help="lifecycle series: every queue gets counter rows before the listings (as if all had sent)",
    )
    p.add_argument(
        "--nocheck",
        action="store_true",
        help="concurrent series: also LonnyMQ's client with check_connections=False",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="concurrent series: also the floor (LonnyMQ's rows in plain statements, a bare connection)",
    )
    p.add_argument(
        "--functions",
        action="store_true",
        help="track_functions = 'pl' on the fleets' databases: each phase's server time by function",
    )
    p.add_argument(
        "--keep-fleets",
        action="store_true",
        help="with --dsn: keep the queue databases for the next run, and reuse those a run left",
    )
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args()
    series = {"queues": ints(a.queues), "concurrent": ints(a.concurrent), "lifecycle": ints(a.lifecycle)}
    results: dict[str, Any] = {
        "args": vars(a),
        "channels": {},
        **{k: {n: [] for n in v} for k, v in series.items()},
    }
    with server(a) as dsn:
        with psycopg.connect(dsn) as conn:
            results["settings"] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(SHOWN_SETTINGS)]
                ).fetchall()
            )
        log(f"server: {results['settings']}")
        started = time.perf_counter()
        counts = sorted({n for v in series.values() for n in v})
        fleets = {n: Fleet(dsn, n, a.pgmq_max, a.functions, a.keep_fleets) for n in counts}
        results["created_s"] = {n: f.created_s for n, f in fleets.items()}
        try:
            # Each rep measures every count in turn (the order reversed every other rep), so a
            # change in the machine's load falls on all counts alike.
            for r in range(a.reps):
                flip = r % 2 == 1
                for n in counts[::-1] if flip else counts:
                    f = fleets[n]
                    if n in series["queues"]:
                        results["queues"][n].append(queue_cells(f, a.seconds, flip))
                        log(f"queues {n:,} rep {r + 1}: {json.dumps(results['queues'][n][-1])}")
                    if n in series["concurrent"]:
                        results["concurrent"][n].append(
                            concurrent_cells(
                                f, a.consumers, a.concurrent_seconds, a.preload, flip, a.nocheck, a.floor
                            )
                        )
                        log(f"concurrent {n:,} rep {r + 1}: {json.dumps(results['concurrent'][n][-1])}")
                    if n in series["lifecycle"]:
                        results["lifecycle"][n].append(
                            lifecycle_cells(f, a.ops, a.load_seconds, str(r), a.counters)
                        )
                        log(f"lifecycle {n:,} rep {r + 1}: {json.dumps(results['lifecycle'][n][-1])}")
        finally:
            for f in fleets.values():
                f.drop()
        if ints(a.rotation):
            results["rotation"] = rotation_series(dsn, ints(a.rotation), a.rotations)
        if ints(a.channels):
            try:
                results["channels"] = channel_series(dsn, ints(a.channels), a.seconds, a.reps)
            finally:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(S))
        results["minutes"] = round((time.perf_counter() - started) / 60, 1)
    print(report(results))
    if a.json:
        with open(a.json, "w") as out:
            json.dump(results, out, indent=1, default=str)


if __name__ == "__main__":
    main()
