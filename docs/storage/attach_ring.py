"""Attach-ring prototype: what a message table sub-partitioned by generation would cost (issue 17,
target 3). Standalone: creates schemas ``attach_ring_*``, measures, drops them. Not the product.

    python docs/storage/attach_ring.py [DSN] [--rounds 6] [--iters 300] [--c-seconds 120]
        [--c-span 5] [--c-today-first] [--parts abcd] [--json out.json] [--keep]

Layouts (the columns LonnyMQ's hot statements touch, the indexes of 0006/0008):

* ``today``: ``message`` RANGE-partitioned by queue_id into ``message_logged`` and
  ``message_unlogged``; PRIMARY KEY (queue_id, id), UNIQUE (queue_id, key), dequeue index
  (gen, queue_id, dequeue_at, id) WHERE channel IS NULL, the leased and channel indexes.
* ``ring<N>``: the same, but ``message_logged`` is itself RANGE-partitioned by gen into N
  segments (standalone tables ATTACHed); (queue_id, id) and (queue_id, key) are plain indexes
  (a unique index must contain the partition key), plus a side table ``message_key``.

Parts (each prints a table):

a. per-call time of the hot statements (PL/pgSQL functions, ``plan_cache_mode =
   force_generic_plan`` as the product pins), one connection, each call its own transaction,
   layouts interleaved round by round; relation locks a lease takes (fast-path / shared table).
b. TRUNCATE of an empty segment (lock_timeout 20 / 50 ms) while 4 processes run send+lease+ack.
c. a pg_dump-like holder (REPEATABLE READ, ACCESS SHARE on every table, read) for the whole run,
   1,000 msg/s lease+ack with 2 s rotations: size over time, ring (attach ahead, truncate
   retired segments) vs today's layout.
d. keyed send: unique index (today) vs side table vs advisory lock + probe (ring16).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

PREFIX = "attach_ring_"
G0 = 1000  # the current generation in part a
W = 5  # generations per segment
LEASE_US = 30_000_000
PINNED = (
    "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_sort = off SET jit = off"
)

COLS = """
    queue_id      integer NOT NULL,
    id            bigint NOT NULL,
    gen           bigint NOT NULL,
    dequeue_at    bigint NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    deliveries    integer NOT NULL DEFAULT 0,
    leased        boolean NOT NULL DEFAULT false,
    key           text,
    channel       text,
    superseded_by bigint,
    payload       bytea NOT NULL
"""

TABLES_TODAY = f"""
CREATE SEQUENCE message_id_seq;
CREATE SEQUENCE message_gen_seq;
CREATE TABLE message ({COLS}) PARTITION BY RANGE (queue_id);
CREATE TABLE message_logged PARTITION OF message FOR VALUES FROM (0) TO (MAXVALUE)
    WITH (autovacuum_enabled = false);
CREATE UNLOGGED TABLE message_unlogged PARTITION OF message FOR VALUES FROM (MINVALUE) TO (0);
ALTER TABLE message ADD PRIMARY KEY (queue_id, id);
CREATE INDEX message_dequeue_idx ON message (gen, queue_id, dequeue_at, id) WHERE channel IS NULL;
CREATE INDEX message_channel_idx ON message (queue_id, channel, dequeue_at, id)
    WHERE channel IS NOT NULL;
CREATE UNIQUE INDEX message_key_idx ON message (queue_id, key)
    WHERE key IS NOT NULL AND superseded_by IS NULL;
CREATE INDEX message_leased_idx ON message (queue_id, channel, dequeue_at) WHERE leased;
"""

TABLES_RING = f"""
CREATE SEQUENCE message_id_seq;
CREATE SEQUENCE message_gen_seq;
CREATE TABLE message ({COLS}) PARTITION BY RANGE (queue_id);
CREATE TABLE message_logged PARTITION OF message FOR VALUES FROM (0) TO (MAXVALUE)
    PARTITION BY RANGE (gen);
CREATE UNLOGGED TABLE message_unlogged PARTITION OF message FOR VALUES FROM (MINVALUE) TO (0);
CREATE INDEX message_id_idx ON message (queue_id, id);
CREATE INDEX message_dequeue_idx ON message (gen, queue_id, dequeue_at, id) WHERE channel IS NULL;
CREATE INDEX message_channel_idx ON message (queue_id, channel, dequeue_at, id)
    WHERE channel IS NOT NULL;
CREATE INDEX message_key_idx ON message (queue_id, key)
    WHERE key IS NOT NULL AND superseded_by IS NULL;
CREATE INDEX message_leased_idx ON message (queue_id, channel, dequeue_at) WHERE leased;
CREATE TABLE message_key (queue_id integer, key text, id bigint NOT NULL,
                          PRIMARY KEY (queue_id, key));
"""

# The hot statements, as PL/pgSQL runs them. A row is found through an index and then changed
# by ctid (settle.sql); on the ring a ctid names a row only together with its segment, so the
# change there also says gen = <the row's gen> (pruned at executor start, as gen is a parameter).
FUNCTIONS = """
CREATE FUNCTION now_us() RETURNS bigint LANGUAGE sql VOLATILE
    RETURN (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

CREATE FUNCTION send(p_queue int, p_n int, p_key text) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_id bigint;
BEGIN
    WITH i AS (
        INSERT INTO message (queue_id, id, gen, dequeue_at, key, payload)
        SELECT p_queue, nextval('message_id_seq'), s.last_value, now_us(), p_key, '\\x00'::bytea
          FROM message_gen_seq s, generate_series(1, p_n)
        RETURNING id)
    SELECT max(i.id) INTO v_id FROM i;
    RETURN v_id;
END $$;

-- The candidate query of take(): one index range per generation of the window (LATERAL).
CREATE FUNCTION take_select(p_queue int) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_gen bigint; v_now bigint := now_us(); v_id bigint;
BEGIN
    SELECT s.last_value INTO v_gen FROM message_gen_seq s;
    SELECT w.id INTO v_id
      FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
     CROSS JOIN LATERAL (
           SELECT m.id, m.dequeue_at FROM message m
            WHERE m.gen = g.gen AND m.queue_id = p_queue AND m.channel IS NULL
              AND m.dequeue_at <= v_now
            ORDER BY m.dequeue_at, m.id LIMIT 1 FOR UPDATE SKIP LOCKED) w
     ORDER BY w.dequeue_at, w.id LIMIT 1;
    RETURN v_id;
END $$;

-- peek / a lookup by id (the client knows (queue, id), not the segment).
CREATE FUNCTION lookup(p_queue int, p_id bigint) RETURNS bytea LANGUAGE plpgsql {pinned} AS $$
DECLARE v bytea;
BEGIN
    SELECT m.payload INTO v FROM message m WHERE m.queue_id = p_queue AND m.id = p_id;
    RETURN v;
END $$;

-- ack: lock the rows by (queue_id, id, token), then delete them by ctid (settle.sql).
CREATE FUNCTION ack(p_queue int, p_ids bigint[], p_toks int[]) RETURNS int LANGUAGE plpgsql {pinned} AS $$
DECLARE v_tids tid[]; v_gens bigint[]; v_n int;
BEGIN
    SELECT array_agg(t.tid), array_agg(t.gen) INTO v_tids, v_gens
      FROM unnest(p_ids, p_toks) AS a(id, tok)
     CROSS JOIN LATERAL (SELECT m.ctid AS tid, m.gen FROM message m
                          WHERE m.queue_id = p_queue AND m.id = a.id AND m.deliveries = a.tok
                            FOR UPDATE) t;
    DELETE FROM message m WHERE m.ctid = ANY (v_tids) {gen_match} AND (m.queue_id = p_queue) IS TRUE;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    {key_delete}
    RETURN v_n;
END $$;

-- Rotation: the live plain rows of the generations that left the window move to the current one
-- (on the ring, across segments: a cross-partition UPDATE, i.e. delete + insert).
CREATE FUNCTION rotate(p_low bigint) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_gen bigint := nextval('message_gen_seq'); v_n bigint;
BEGIN
    UPDATE message m SET gen = v_gen
     WHERE m.gen >= p_low AND m.gen <= v_gen - 2 AND m.channel IS NULL
       AND (m.queue_id, m.id) IN (SELECT x.queue_id, x.id FROM message x
                                   WHERE x.gen >= p_low AND x.gen <= v_gen - 2
                                     AND x.channel IS NULL FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;
"""

LEASE = """
-- take(n): the candidates, locked, then leased by ctid (and gen on the ring). lease: generic
-- plans, the window as a LATERAL per generation (as take.sql). lease_custom: custom plans
-- (planned per call with the generation as a constant), so a plan pruned at planning locks only
-- the segments it reads; the window as UNION ALL (a LATERAL's gen is a join value, which only
-- run-time pruning can use).
CREATE FUNCTION {fn}(p_queue int, p_n int)
RETURNS TABLE (id bigint, token int, gen bigint) LANGUAGE plpgsql {plan} AS $$
DECLARE v_gen bigint; v_now bigint := now_us(); v_tids tid[]; v_gens bigint[];
BEGIN
    SELECT s.last_value INTO v_gen FROM message_gen_seq s;
    SELECT array_agg(c.tid), array_agg(c.gen) INTO v_tids, v_gens
      FROM (SELECT w.tid, w.gen FROM {window} w
             ORDER BY w.dequeue_at, w.id LIMIT p_n) c;
    IF v_tids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE message m
       SET dequeue_at = v_now + {lease}, attempts = m.attempts + 1,
           deliveries = m.deliveries + 1, leased = true
     WHERE m.ctid = ANY (v_tids) {match} AND (m.queue_id = p_queue) IS TRUE
    RETURNING m.id, m.deliveries, m.gen;
END $$;
"""
WINDOW_LATERAL = """(SELECT x.* FROM (VALUES (v_gen - 1), (v_gen)) AS g(gen)
             CROSS JOIN LATERAL (
                   SELECT m.ctid AS tid, m.gen, m.id, m.dequeue_at FROM message m
                    WHERE m.gen = g.gen AND m.queue_id = p_queue AND m.channel IS NULL
                      AND m.dequeue_at <= v_now
                    ORDER BY m.dequeue_at, m.id LIMIT p_n FOR UPDATE SKIP LOCKED) x)"""
WINDOW_UNION = """(SELECT * FROM (SELECT m.ctid AS tid, m.gen, m.id, m.dequeue_at FROM message m
                      WHERE m.gen = v_gen - 1 AND m.queue_id = p_queue AND m.channel IS NULL
                        AND m.dequeue_at <= v_now
                      ORDER BY m.dequeue_at, m.id LIMIT p_n FOR UPDATE SKIP LOCKED) a
                    UNION ALL
                    SELECT * FROM (SELECT m.ctid AS tid, m.gen, m.id, m.dequeue_at FROM message m
                      WHERE m.gen = v_gen AND m.queue_id = p_queue AND m.channel IS NULL
                        AND m.dequeue_at <= v_now
                      ORDER BY m.dequeue_at, m.id LIMIT p_n FOR UPDATE SKIP LOCKED) b)"""

ACK_GEN = """
-- ack of one delivery when the client hands back the gen take returned: the probe prunes
-- (generic plan: ack_gen; custom: ack_gen_custom).
CREATE FUNCTION {fn}(p_queue int, p_id bigint, p_tok int, p_gen bigint) RETURNS int
LANGUAGE plpgsql {plan} AS $$
DECLARE v_tid tid; v_n int;
BEGIN
    SELECT m.ctid INTO v_tid FROM message m
     WHERE m.gen = p_gen AND m.queue_id = p_queue AND m.id = p_id AND m.deliveries = p_tok
       FOR UPDATE;
    DELETE FROM message m WHERE m.ctid = v_tid AND m.gen = p_gen AND (m.queue_id = p_queue) IS TRUE;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;
"""

# Keyed sends (part d).
KEYED = """
CREATE FUNCTION send_key_unique(p_queue int, p_key text) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_id bigint;
BEGIN
    INSERT INTO message (queue_id, id, gen, dequeue_at, key, payload)
    SELECT p_queue, nextval('message_id_seq'), s.last_value, now_us(), p_key, '\\x00'::bytea
      FROM message_gen_seq s
    ON CONFLICT (queue_id, key) WHERE key IS NOT NULL AND superseded_by IS NULL DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

-- (ring only: the side table; in today's layout these two are created but never called)
CREATE FUNCTION send_key_side(p_queue int, p_key text) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_id bigint;
BEGIN
    INSERT INTO message_key (queue_id, key, id) VALUES (p_queue, p_key, nextval('message_id_seq'))
    ON CONFLICT DO NOTHING RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        INSERT INTO message (queue_id, id, gen, dequeue_at, key, payload)
        SELECT p_queue, v_id, s.last_value, now_us(), p_key, '\\x00'::bytea FROM message_gen_seq s;
    END IF;
    RETURN v_id;
END $$;

CREATE FUNCTION send_key_advisory(p_queue int, p_key text) RETURNS bigint LANGUAGE plpgsql {pinned} AS $$
DECLARE v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(p_queue, hashtext(p_key));
    IF NOT EXISTS (SELECT FROM message m WHERE m.queue_id = p_queue AND m.key = p_key
                                            AND m.superseded_by IS NULL) THEN
        INSERT INTO message (queue_id, id, gen, dequeue_at, key, payload)
        SELECT p_queue, nextval('message_id_seq'), s.last_value, now_us(), p_key, '\\x00'::bytea
          FROM message_gen_seq s
        RETURNING id INTO v_id;
    END IF;
    RETURN v_id;
END $$;
"""


def set_span(gens: int) -> None:
    global W
    W = gens


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def create_layout(conn: psycopg.Connection[Any], schema: str, segments: int | None) -> None:
    """segments None: today's layout; else a ring of that many gen segments (the last holds G0)."""
    ring = segments is not None
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    conn.execute((TABLES_RING if ring else TABLES_TODAY).encode())
    pinned = PINNED + " SET search_path = " + sql.Identifier(schema).as_string(conn)
    fmt = {
        "pinned": pinned,
        "custom": pinned.replace("force_generic_plan", "force_custom_plan"),
        "lease": str(LEASE_US),
        "gen_match": "AND m.gen = ANY (v_gens)" if ring else "",
        "key_delete": (
            "DELETE FROM message_key k USING unnest(p_ids) AS a(id)"
            " WHERE k.queue_id = p_queue AND k.id = a.id;"
            if ring
            else ""
        ),
    }
    body = FUNCTIONS + KEYED
    for fn, plan in (("ack_gen", "{pinned}"), ("ack_gen_custom", "{custom}")):
        body += ACK_GEN.replace("{fn}", fn).replace("{plan}", plan)
    for fn, plan, window, match in (
        ("lease", "{pinned}", WINDOW_LATERAL, "{gen_match}"),
        ("lease_custom", "{custom}", WINDOW_UNION, "AND m.gen = ANY (v_gens)"),
    ):
        body += (
            LEASE.replace("{fn}", fn)
            .replace("{plan}", plan)
            .replace("{window}", window)
            .replace("{match}", match)
        )
    for k, v in fmt.items():
        body = body.replace("{" + k + "}", v)
    conn.execute(body.encode())
    if ring:
        assert segments is not None
        hi = G0 + 2
        for k in range(segments):
            seg_hi = hi - (segments - 1 - k) * W
            attach_segment(conn, schema, k, seg_hi - W, seg_hi)
    conn.execute(sql.SQL("SELECT setval('message_gen_seq', %s)"), (G0,))
    conn.execute("RESET search_path")


def seg_name(k: int) -> str:
    return f"seg_{k}"


def attach_segment(conn: psycopg.Connection[Any], schema: str, k: int, lo: int, hi: int) -> None:
    """A segment is created standalone and ATTACHed (SHARE UPDATE EXCLUSIVE on the parent, which a
    pg_dump's ACCESS SHARE does not block); the caller sets lock_timeout."""
    s = sql.Identifier(schema)
    seg = sql.Identifier(schema, seg_name(k))
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) WITH (autovacuum_enabled = false)"
        ).format(seg, sql.Identifier(schema, "message_logged"))
    )
    conn.execute(
        sql.SQL("ALTER TABLE {}.message_logged ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
            s, seg, sql.Literal(lo), sql.Literal(hi)
        )
    )


def call(conn: psycopg.Connection[Any], schema: str, fn: str, args: tuple[Any, ...]) -> Any:
    q = sql.SQL("SELECT * FROM {}({})").format(
        sql.Identifier(schema, fn), sql.SQL(", ").join([sql.Placeholder()] * len(args))
    )
    return conn.execute(q, args, prepare=True).fetchall()


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# ---------------------------------------------------------------- part a


def part_a(dsn: str, rounds: int, iters: int) -> dict[str, Any]:
    layouts: list[tuple[str, int | None]] = [
        ("today", None),
        ("ring1", 1),
        ("ring4", 4),
        ("ring16", 16),
        ("ring64", 64),
    ]
    conn = connect(dsn)
    conn.execute("SET track_functions = 'pl'")
    # the commit's WAL flush would be most of a call's wall time; the server's work is not
    conn.execute("SET synchronous_commit = off")
    for name, n in layouts:
        create_layout(conn, PREFIX + name, n)
        call(conn, PREFIX + name, "send", (1, 2000, None))
    times: dict[str, dict[str, list[float]]] = {name: {} for name, _ in layouts}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name, _ in layouts}
    # The backend's CPU time (Linux, server on this machine): what a call costs the server,
    # whatever else the shared machine runs meanwhile (wall time also counts waiting for a core).
    stat = f"/proc/{conn.info.backend_pid}/schedstat"
    has_cpu = os.access(stat, os.R_OK)

    def cpu_ns() -> int:
        if not has_cpu:
            return 0
        with open(stat) as f:
            return int(f.read().split()[0])

    def timed(name: str, fn: str, args: tuple[Any, ...]) -> Any:
        c0, t0 = cpu_ns(), time.perf_counter()
        rows = call(conn, PREFIX + name, fn, args)
        times[name].setdefault(fn, []).append(time.perf_counter() - t0)
        cpu[name].setdefault(fn, []).append((cpu_ns() - c0) / 1e9)
        return rows

    for r in range(rounds):
        order = layouts[r % len(layouts) :] + layouts[: r % len(layouts)]
        for name, _ in order:
            for i in range(iters):
                timed(name, "send", (1, 1, None))
                timed(name, "take_select", (1,))
                ((mid, tok, gen),) = timed(name, "lease" if i % 4 < 2 else "lease_custom", (1, 1))
                timed(name, "lookup", (1, mid))
                if i % 4 == 3:
                    n = timed(name, "ack_gen_custom", (1, mid, tok, gen))[0][0]
                elif i % 2:
                    n = timed(name, "ack_gen", (1, mid, tok, gen))[0][0]
                else:
                    n = timed(name, "ack", (1, [mid], [tok]))[0][0]
                assert n == 1, (name, n)
        for name, _ in layouts:  # the same cleanup for all: dead entries do not pile up
            conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(PREFIX + name, "message")))
    # server time per call, from pg_stat_user_functions (self+children of the function)
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.2)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    server: dict[str, dict[str, float]] = {}
    for row in conn.execute(
        "SELECT schemaname, funcname, total_time / nullif(calls, 0) * 1000 FROM pg_stat_user_functions"
        " WHERE schemaname LIKE %s",
        (PREFIX + "%",),
    ):
        server.setdefault(row[0][len(PREFIX) :], {})[row[1]] = float(row[2] or 0)
    # relation locks a lease holds (PostgreSQL 15/16: 16 fast-path slots per backend)
    locks: dict[str, tuple[int, int]] = {}
    for name, _ in layouts:
        with conn.transaction():
            call(conn, PREFIX + name, "lease", (1, 1))
            # the layout's relations only (a re-plan also locks catalogs)
            fp, sh = conn.execute(
                "SELECT count(DISTINCT l.relation) FILTER (WHERE l.fastpath),"
                " count(DISTINCT l.relation) FILTER (WHERE NOT l.fastpath)"
                " FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND n.nspname = %s",
                (PREFIX + name,),
            ).fetchone() or (0, 0)
            locks[name] = (fp, sh)
    conn.close()
    stmts = ["send", "take_select", "lease", "lease_custom", "lookup", "ack", "ack_gen", "ack_gen_custom"]
    wall = {name: {s: statistics.median(times[name][s]) * 1e6 for s in stmts} for name, _ in layouts}
    print(
        f"\n## a. per call, µs: client wall median (server: pg_stat_user_functions mean), x today's"
        f" same statement (custom plans: x today's generic one); {rounds} rounds x {iters}"
    )
    print("| statement | " + " | ".join(n for n, _ in layouts) + " |")
    print("|---|" + "---|" * len(layouts))
    for s in stmts:
        cells = []
        for name, _ in layouts:
            # the custom-plan and gen-known variants against today's product statement
            base = wall["today"][{"lease_custom": "lease", "ack_gen_custom": "ack_gen"}.get(s, s)]
            cells.append(
                f"{wall[name][s]:.0f} ({server.get(name, {}).get(s, float('nan')):.0f}) {wall[name][s] / base:.2f}x"
            )
        print(f"| {s} | " + " | ".join(cells) + " |")
    cpu_us = {name: {s: statistics.mean(cpu[name][s]) * 1e6 for s in stmts} for name, _ in layouts}
    if has_cpu:
        print("| **backend CPU µs per call (mean)** |" + " |" * len(layouts))
        for s in stmts:
            base = cpu_us["today"][{"lease_custom": "lease", "ack_gen_custom": "ack_gen"}.get(s, s)]
            print(
                f"| {s} | "
                + " | ".join(f"{cpu_us[n][s]:.0f} {cpu_us[n][s] / base:.2f}x" for n, _ in layouts)
                + " |"
            )
    print(
        "| relations a lease locks (fast-path / shared lock table) | "
        + " | ".join(f"{a} / {b}" for a, b in locks.values())
        + " |"
    )
    return {"wall_us": wall, "server_us": server, "cpu_us": cpu_us if has_cpu else None, "locks": locks}


# ---------------------------------------------------------------- part b


def client_loop(dsn: str, schema: str, stop_at: float, out: Any, batch: int) -> None:
    conn = connect(dsn)
    lat: list[tuple[float, float]] = []
    while time.time() < stop_at:
        call(conn, schema, "send", (1, batch, None))
        t0 = time.time()
        rows = call(conn, schema, "lease", (1, batch))
        lat.append((t0, time.time() - t0))
        if rows:
            call(conn, schema, "ack", (1, [r[0] for r in rows], [r[1] for r in rows]))
    conn.close()
    out.put(lat)


def part_b(dsn: str, phase_s: float) -> dict[str, Any]:
    schema = PREFIX + "b"
    conn = connect(dsn)
    create_layout(conn, schema, 4)
    call(conn, schema, "send", (1, 200, None))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start = time.time() + 1.0
    # (label, lock_timeout, synchronous_commit of the TRUNCATE's transaction)
    phases = [
        ("none", None, "on"),
        ("20 ms", "20ms", "on"),
        ("none", None, "on"),
        ("50 ms", "50ms", "on"),
        ("20 ms, async commit", "20ms", "off"),
    ]
    stop_at = start + phase_s * len(phases)
    procs = [ctx.Process(target=client_loop, args=(dsn, schema, stop_at, q, 1)) for _ in range(4)]
    for p in procs:
        p.start()
    target = sql.Identifier(schema, seg_name(0))  # empty: the segment of the oldest generations
    attempts: dict[int, list[tuple[float, float, bool]]] = {}
    time.sleep(max(0.0, start - time.time()))
    for i, (_, timeout, sync) in enumerate(phases):
        end = start + (i + 1) * phase_s
        while time.time() < end - 0.1:
            if timeout is not None:
                conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(timeout)))
                conn.execute(sql.SQL("SET synchronous_commit = {}").format(sql.Literal(sync)))
                t0 = time.time()
                try:
                    conn.execute(sql.SQL("TRUNCATE {}").format(target))
                    ok = True
                except psycopg.errors.LockNotAvailable:
                    ok = False
                attempts.setdefault(i, []).append((t0, time.time() - t0, ok))
            time.sleep(0.25)
    lat: list[tuple[float, float]] = []
    for _ in procs:
        lat.extend(q.get())
    for p in procs:
        p.join()
    conn.execute("RESET lock_timeout")
    conn.close()
    print(
        f"\n## b. TRUNCATE of an empty segment (ring4) every 250 ms, 4 processes send+lease+ack, {phase_s:.0f} s per phase"
    )
    print(
        "| phase | leases/s | lease p50 ms | p99 ms | max ms | truncates ok / tried | attempt ms p50 / max"
        " | leases overlapping an attempt: n, p50 / max ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    res = []
    for i, (label, _, _) in enumerate(phases):
        lo, hi = start + i * phase_s, start + (i + 1) * phase_s
        xs = [d * 1000 for t, d in lat if lo <= t < hi]
        at = attempts.get(i, [])
        ok = sum(1 for a in at if a[2])
        ams = [a[1] * 1000 for a in at]
        # the leases that were in flight or began while an attempt ran (its lock queue)
        during = [
            d * 1000 for t, d in lat if lo <= t < hi and any(a0 - d <= t <= a0 + ad for a0, ad, _ in at)
        ]
        row = {
            "phase": label,
            "per_s": len(xs) / phase_s,
            "p50": pct(xs, 50),
            "p99": pct(xs, 99),
            "max": max(xs) if xs else float("nan"),
            "ok": ok,
            "tried": len(at),
            "attempt_p50": pct(ams, 50) if ams else float("nan"),
            "attempt_max": max(ams) if ams else float("nan"),
            "during_n": len(during),
            "during_p50": pct(during, 50),
            "during_max": max(during) if during else float("nan"),
        }
        res.append(row)
        print(
            f"| {label} | {row['per_s']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | {row['max']:.1f} | "
            f"{ok} / {len(at)} | {row['attempt_p50']:.1f} / {row['attempt_max']:.1f} |"
            f" {len(during)}, {row['during_p50']:.1f} / {row['during_max']:.1f} |"
        )
    return {"phases": res}


# ---------------------------------------------------------------- part c


def producer(dsn: str, schema: str, rate: int, stop_at: float) -> None:
    conn = connect(dsn)
    batch = 10
    nxt = time.time()
    while time.time() < stop_at:
        call(conn, schema, "send", (1, batch, None))
        nxt += batch / rate
        time.sleep(max(0.0, nxt - time.time()))
    conn.close()


def consumer(dsn: str, schema: str, stop_at: float, out: Any) -> None:
    conn = connect(dsn)
    lat: list[tuple[float, float, int]] = []
    while time.time() < stop_at:
        t0 = time.time()
        rows = call(conn, schema, "lease", (1, 10))
        lat.append((t0, time.time() - t0, len(rows)))
        if rows:
            call(conn, schema, "ack", (1, [r[0] for r in rows], [r[1] for r in rows]))
        else:
            time.sleep(0.005)
    conn.close()
    out.put(lat)


class Ring:
    """The maintenance of the attach-ring: segments of W generations attached ahead of need; a
    segment whose generations have all left the window (and whose live rows rotation moved) is
    TRUNCATEd under a short lock_timeout; truncated segments are DETACHed and DROPped when no
    long transaction holds the parent (else they stay, empty, attached)."""

    def __init__(
        self, conn: psycopg.Connection[Any], schema: str, first_lo: int, first_hi: int, n: int
    ) -> None:
        self.conn, self.schema = conn, schema
        self.segs: dict[int, tuple[int, int, str]] = {}  # k -> (lo, hi, state)
        for k in range(n):
            self.segs[k] = (first_lo + k * W, first_lo + (k + 1) * W, "attached")
        self.next_k = n
        self.first_after_holder = n  # segments from here on were attached after the holder began
        self.timeouts: list[int] = []  # the segment of each truncate that timed out
        self.stats = {
            "attach_ok": 0,
            "attach_timeout": 0,
            "trunc_ok": 0,
            "trunc_timeout": 0,
            "trunc_not_empty": 0,
            "trunc_skipped_holder": 0,
            "drop_ok": 0,
            "drop_timeout": 0,
            "drop_skipped_holder": 0,
        }

    def _try(self, stmts: list[sql.Composable], timeout: str = "50ms") -> bool:
        try:
            with self.conn.transaction():
                self.conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(timeout)))
                for s in stmts:
                    self.conn.execute(s)
            return True
        except psycopg.errors.LockNotAvailable:
            return False

    def held_by_long(self, rel: sql.Identifier) -> bool:
        """Does a transaction older than 5 s hold a lock on rel (a pg_dump)? Then an ACCESS
        EXCLUSIVE attempt would only queue every take behind it for lock_timeout."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.relation = %s::regclass AND l.granted AND a.pid <> pg_backend_pid()"
            " AND a.xact_start < now() - interval '5 s')",
            (rel.as_string(self.conn),),
        ).fetchone()
        return bool(row and row[0])

    def maintain(self, gen: int) -> None:
        top = max(hi for lo, hi, st in self.segs.values())
        while top <= gen + W:  # one segment ahead of the current generation
            k = self.next_k
            try:
                with self.conn.transaction():
                    self.conn.execute(sql.SQL("SET LOCAL lock_timeout = '50ms'"))
                    attach_segment(self.conn, self.schema, k, top, top + W)
                self.segs[k] = (top, top + W, "attached")
                self.next_k += 1
                self.stats["attach_ok"] += 1
                top += W
            except psycopg.errors.LockNotAvailable:
                self.stats["attach_timeout"] += 1
                break
        for k, (lo, hi, st) in sorted(self.segs.items()):
            seg = sql.Identifier(self.schema, seg_name(k))
            if st == "attached" and hi <= gen - 1:
                if self.held_by_long(seg):
                    self.stats["trunc_skipped_holder"] += 1
                    continue
                try:
                    with self.conn.transaction():
                        self.conn.execute(sql.SQL("SET LOCAL lock_timeout = '50ms'"))
                        self.conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(seg))
                        # under the lock, a fresh snapshot sees every committed row
                        if self.conn.execute(
                            sql.SQL("SELECT EXISTS (SELECT FROM {})").format(seg)
                        ).fetchone()[0]:
                            self.stats["trunc_not_empty"] += 1
                            raise _Rollback
                        self.conn.execute(sql.SQL("TRUNCATE {}").format(seg))
                    self.segs[k] = (lo, hi, "truncated")
                    self.stats["trunc_ok"] += 1
                except psycopg.errors.LockNotAvailable:
                    self.stats["trunc_timeout"] += 1
                    self.timeouts.append(k)
                except _Rollback:
                    pass
            elif st == "truncated":
                # DETACH needs ACCESS EXCLUSIVE on the parent: while a long transaction holds it
                # (a pg_dump), an attempt would only stall every take for lock_timeout.
                if self.held_by_long(sql.Identifier(self.schema, "message_logged")):
                    self.stats["drop_skipped_holder"] += 1
                    continue
                ok = self._try(
                    [
                        sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                            sql.Identifier(self.schema, "message_logged"), seg
                        ),
                        sql.SQL("DROP TABLE {}").format(seg),
                    ]
                )
                if ok:
                    del self.segs[k]
                    self.stats["drop_ok"] += 1
                else:
                    self.stats["drop_timeout"] += 1


class _Rollback(Exception):
    pass


def size_of(conn: psycopg.Connection[Any], schema: str) -> tuple[float, int]:
    row = conn.execute(
        "SELECT sum(pg_total_relation_size(relid)), count(*) FROM pg_partition_tree(%s::regclass) WHERE isleaf",
        (sql.Identifier(schema, "message").as_string(conn),),
    ).fetchone()
    assert row is not None
    return float(row[0] or 0) / 1e6, int(row[1])


def run_c(dsn: str, schema: str, ring: bool, seconds: float, rate: int) -> dict[str, Any]:
    conn = connect(dsn)
    create_layout(conn, schema, 4 if ring else None)
    mconn = connect(dsn)
    rg = Ring(mconn, schema, G0 + 2 - 4 * W, G0 + 2, 4) if ring else None
    # the holder: like pg_dump, REPEATABLE READ, ACCESS SHARE on every table it found, read
    holder = connect(dsn)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    tables = holder.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
        (schema,),
    ).fetchall()
    for (t,) in tables:
        holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(sql.Identifier(schema, t)))
    holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "message"))).fetchone()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t_start = time.time()
    stop_at = t_start + seconds
    procs = [ctx.Process(target=producer, args=(dsn, schema, rate, stop_at))]
    procs += [ctx.Process(target=consumer, args=(dsn, schema, stop_at, q)) for _ in range(2)]
    for p in procs:
        p.start()
    samples = []
    low = 1
    next_sample = t_start
    moved = 0
    while time.time() < stop_at:
        gen_before = mconn.execute(
            sql.SQL("SELECT last_value FROM {}").format(sql.Identifier(schema, "message_gen_seq"))
        ).fetchone()[0]
        moved += call(mconn, schema, "rotate", (low,))[0][0]
        low = max(1, gen_before - 6)
        if rg is not None:
            rg.maintain(gen_before + 1)
        if time.time() >= next_sample:
            mb, leaves = size_of(mconn, schema)
            samples.append((round(time.time() - t_start), mb, leaves))
            next_sample += 15
        time.sleep(2.0)
    lat: list[tuple[float, float, int]] = []
    for _ in range(2):
        lat.extend(q.get())
    for p in procs:
        p.join()
    mb, leaves = size_of(mconn, schema)
    samples.append((round(time.time() - t_start), mb, leaves))
    holder.execute("ROLLBACK")
    holder.close()
    taken = sum(n for _, _, n in lat)
    first = [d * 1000 for t, d, n in lat if t < t_start + 30]
    last = [d * 1000 for t, d, n in lat if t >= stop_at - 30]
    out = {
        "samples": samples,
        "taken_per_s": taken / seconds,
        "p50_first30": pct(first, 50),
        "p99_first30": pct(first, 99),
        "p50_last30": pct(last, 50),
        "p99_last30": pct(last, 99),
        # lease p50 / p99 per 30 s, with the segments attached at its end
        "windows": [
            (
                w,
                pct([d * 1000 for t, d, n in lat if t_start + w <= t < t_start + w + 30], 50),
                pct([d * 1000 for t, d, n in lat if t_start + w <= t < t_start + w + 30], 99),
                max((lv for ts, _, lv in samples if ts <= w + 30), default=0) - 1,
            )
            for w in range(0, int(seconds), 30)
        ],
        "moved": moved,
        "ring": rg.stats if rg else None,
        "trunc_timeouts_on_segments_the_holder_locked": (
            sum(1 for k in rg.timeouts if k < rg.first_after_holder) if rg else None
        ),
    }
    mconn.close()
    conn.close()
    return out


def part_c(dsn: str, seconds: float, rate: int, today_first: bool) -> dict[str, Any]:
    order = ["today", "ring"] if today_first else ["ring", "today"]
    res = {k: run_c(dsn, PREFIX + "c_" + k, k == "ring", seconds, rate) for k in order}
    print(
        f"\n## c. pg_dump-like holder for the whole run, {rate} msg/s offered, 2 s rotations,"
        f" {W} generations a segment, {seconds:.0f} s each, {order[0]} first"
    )
    print("| t s | ring MB (leaves) | today MB |")
    print("|---|---|---|")
    for (t, mb, lv), (_, mb2, _) in zip(res["ring"]["samples"], res["today"]["samples"], strict=False):
        print(f"| {t} | {mb:.1f} ({lv}) | {mb2:.1f} |")
    print(
        "| lease p50 / p99 ms, per 30 s | "
        + " | ".join(f"{w}-{w + 30} s" for w, *_ in res["ring"]["windows"])
        + " |"
    )
    for k in ("ring", "today"):
        cells = [
            f"{a:.2f} / {b:.2f}" + (f" ({n})" if k == "ring" else "") for _, a, b, n in res[k]["windows"]
        ]
        print(f"| {k} (segments attached) | " + " | ".join(cells) + " |")
    for k in ("ring", "today"):
        r = res[k]
        print(
            f"{k}: taken {r['taken_per_s']:.0f}/s, lease p50/p99 first 30 s {r['p50_first30']:.2f}/{r['p99_first30']:.2f} ms,"
            f" last 30 s {r['p50_last30']:.2f}/{r['p99_last30']:.2f} ms, rows moved {r['moved']}, ring {r['ring']},"
            f" of the truncate timeouts on segments the holder locked: {r['trunc_timeouts_on_segments_the_holder_locked']}"
        )
    return res


# ---------------------------------------------------------------- part d


def part_d(dsn: str, rounds: int, iters: int) -> dict[str, Any]:
    conn = connect(dsn)
    conn.execute("SET synchronous_commit = off")
    create_layout(conn, PREFIX + "d_today", None)
    create_layout(conn, PREFIX + "d_ring", 16)
    cells = [
        ("unique index (today)", "d_today", "send_key_unique"),
        ("side table (ring16)", "d_ring", "send_key_side"),
        ("advisory lock + probe (ring16)", "d_ring", "send_key_advisory"),
    ]
    for sch in ("d_today", "d_ring"):  # some keyed messages live in the queue
        for i in range(2000):
            call(
                conn,
                PREFIX + sch,
                "send_key_side" if sch == "d_ring" else "send_key_unique",
                (1, f"seed-{i}"),
            )
    send_t: dict[str, list[float]] = {}
    ack_t: dict[str, list[float]] = {}
    n = 0
    for r in range(rounds):
        for label, sch, fn in cells[r % 3 :] + cells[: r % 3]:
            for _ in range(iters):
                n += 1
                key = f"k-{n}"
                t0 = time.perf_counter()
                ((mid,),) = call(conn, PREFIX + sch, fn, (1, key))
                send_t.setdefault(label, []).append(time.perf_counter() - t0)
                assert mid is not None
                dup = call(conn, PREFIX + sch, fn, (1, key))[0][0]
                assert dup is None, (label, "a duplicate key was accepted")
                t0 = time.perf_counter()
                call(conn, PREFIX + sch, "ack", (1, [mid], [0]))
                ack_t.setdefault(label, []).append(time.perf_counter() - t0)
    conn.close()
    base_s = statistics.median(send_t[cells[0][0]]) * 1e6
    base_a = statistics.median(ack_t[cells[0][0]]) * 1e6
    print(
        f"\n## d. keyed send (a new key) and its ack, µs per call, client wall median; {rounds} rounds x {iters}"
    )
    print("| uniqueness of (queue_id, key) | send µs | ack µs |")
    print("|---|---|---|")
    out = {}
    for label, _, _ in cells:
        s = statistics.median(send_t[label]) * 1e6
        a = statistics.median(ack_t[label]) * 1e6
        out[label] = (s, a)
        print(f"| {label} | {s:.0f} ({s / base_s:.2f}x) | {a:.0f} ({a / base_a:.2f}x) |")
    return out


def drop_all(dsn: str) -> None:
    conn = connect(dsn)
    for (s,) in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (PREFIX + "%",)
    ).fetchall():
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(s)))
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dsn", nargs="?", default="postgresql://root@127.0.0.1:5432/ring")
    ap.add_argument("--parts", default="abcd")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--b-seconds", type=float, default=8.0)
    ap.add_argument("--c-seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--c-today-first", action="store_true", help="part c: today's layout first")
    ap.add_argument("--c-span", type=int, default=W, help="generations (2 s each) per segment in part c")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="leave the schemas (to look at them)")
    a = ap.parse_args()
    results: dict[str, Any] = {}
    with connect(a.dsn) as c:
        results["version"] = c.execute("SHOW server_version").fetchone()[0]
    print("server", results["version"], "load average", os.getloadavg())
    try:
        if "a" in a.parts:
            print("\nload average before a:", os.getloadavg())
            results["a"] = part_a(a.dsn, a.rounds, a.iters)
        if "b" in a.parts:
            print("\nload average before b:", os.getloadavg())
            results["b"] = part_b(a.dsn, a.b_seconds)
        if "c" in a.parts:
            set_span(a.c_span)  # part c's segment span; parts a, b and d do not depend on it
            print("\nload average before c:", os.getloadavg())
            results["c"] = part_c(a.dsn, a.c_seconds, a.rate, a.c_today_first)
        if "d" in a.parts:
            print("\nload average before d:", os.getloadavg())
            results["d"] = part_d(a.dsn, max(3, a.rounds // 2), a.iters)
        results["load_after"] = os.getloadavg()
        print("load average after", results["load_after"])
    finally:
        if not a.keep:
            drop_all(a.dsn)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
