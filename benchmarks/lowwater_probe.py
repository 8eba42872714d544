"""Whether a low-water key per generation would be sound, and what it would save: the writers
that put a plain message below the least key its generation held at a rotation, and the buffers
a take's candidate range reads after a long drain with and without that key as a start key.

A low-water key (docs/benchmarks.md, "A long drain, traced": not built) is, per queue and per
generation no writer can add to, the least ``(dequeue_at, id)`` still there at a rotation
(capped at the rotation's clock); the take's candidate range there would start at it. It is
sound only if nothing in that generation ever gets a key below it afterwards. Part ``writers``
builds, on a fresh schema ``lonnymq`` of the scratch database of ``--dsn`` (the tree on
``PYTHONPATH``; its pgmq facade too), a backlog frozen in its generation and then runs, after
the rotation that would record the key, each in-place rescheduler whose new key can fall below
it; for each it compares the first message take() delivers with the first of the range that
starts at the key (the key's take would hand out the latter, and leave the message below the key
undelivered until the key is recomputed). Part ``walk`` sends ``--messages`` in one generation,
drains them by ``take(q, 100, ack=previous)`` with the clock fixed (no rotation), and at each of
``--at`` messages drained reads one take's candidate range (the lean batch statement's, under
EXPLAIN ANALYZE, BUFFERS, take()'s settings, rolled back) from the front and from the least key
left (the best a key could do: recorded just now).

``--rule`` runs part ``writers`` under the writer rule that would make a key sound (nack,
extend and pgmq's set_vt move the rows they reschedule to the current generation, held as
_gen_write() holds it: the functions of the tree, so changed, replaced in the scratch schema).
``--property N`` runs, instead, N random steps of sends (priorities, schedules), takes, acks,
nacks, extends (``p_now`` sometimes in the past), set_vt and rotations, ``--seeds`` times without
the rule and as many with it; each rotation records the keys of the generations no writer can
add to (the queue's frozen ones and G-1), never lowered, and after every step each is checked
for a row below its key, counted by the step's writer. ``--extend-setup PATH`` only writes the
set-up of statement_instructions.py that counts the rule's cost in extend.

    PYTHONPATH=src python benchmarks/lowwater_probe.py --dsn postgresql://root@127.0.0.1:5432/scratch \\
        [--messages 200000] [--at 1000,50000,100000,150000,190000] [--json out.json] \\
        [--rule | --property 2000 [--seeds 4] | --extend-setup setup.sql]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
from typing import Any

import psycopg
from psycopg import sql

from lonnymq import Client
from lonnymq.migrations.pgmq import _template as pgmq_template
from lonnymq.sql import function_text

T0 = 1_000_000_000  # a fixed clock (ms) for the parts that take p_now
BLOB = "\\x00"
SETTINGS = (
    "SET enable_seqscan = off; SET enable_sort = off; SET jit = off;"
    " SET plan_cache_mode = force_generic_plan; SET enable_memoize = off"
)


def _fresh(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
        c.execute("DROP SCHEMA IF EXISTS lonnymq CASCADE")
        Client(c).migrate(pgmq=True)


def _one(c: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = c.execute(query, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def _gen_of(c: psycopg.Connection[Any], mid: int) -> int:
    return int(_one(c, "SELECT gen FROM lonnymq.message WHERE id = %s", [mid]))


def _key(c: psycopg.Connection[Any], gen: int, queue: str, cap: int) -> tuple[int, int]:
    """The low-water key a rotation at clock ``cap`` would record for ``queue`` in ``gen``."""
    row = c.execute(
        "SELECT m.dequeue_at, m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
        " WHERE q.name = %s AND m.gen = %s AND m.channel IS NULL ORDER BY m.dequeue_at, m.id LIMIT 1",
        [queue, gen],
    ).fetchone()
    if row is None or row[0] > cap:
        return (cap, -(2**63))
    return (int(row[0]), int(row[1]))


def _keyed_first(
    c: psycopg.Connection[Any], gen: int, queue: str, key: tuple[int, int], now: int
) -> int | None:
    """The first ready message of ``queue`` in ``gen`` that a range starting at ``key`` finds."""
    row = c.execute(
        "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
        " WHERE q.name = %s AND m.gen = %s AND m.channel IS NULL AND (m.dequeue_at, m.id) >= (%s, %s)"
        " AND m.dequeue_at <= %s ORDER BY m.dequeue_at, m.id LIMIT 1",
        [queue, gen, key[0], key[1], now],
    ).fetchone()
    return None if row is None else int(row[0])


def _frozen_gen(c: psycopg.Connection[Any], queue: str) -> int:
    gens = _one(
        c,
        "SELECT f.gens FROM lonnymq.message_gen_frozen f JOIN lonnymq.queue q ON q.id = f.queue_id"
        " WHERE q.name = %s",
        [queue],
    )
    assert gens, "the backlog's generation was not frozen"
    return int(gens[0])


def _case(
    c: psycopg.Connection[Any], name: str, queue: str, mid: int, gen: int, key: tuple[int, int], now: int
) -> dict[str, Any]:
    at = int(_one(c, "SELECT dequeue_at FROM lonnymq.message WHERE id = %s", [mid]))
    keyed = _keyed_first(c, gen, queue, key, now)
    # What take() delivers first (rolled back: the case stays as it is).
    with c.transaction(force_rollback=True):
        first = _one(c, "SELECT id FROM lonnymq.take(%s, 1, p_now => %s)", [queue, now])
    case = {
        "writer": name,
        "key": list(key),
        "message": mid,
        "its_dequeue_at": at,
        "its_gen": _gen_of(c, mid),
        "frozen_gen": gen,
        "below_key_in_keyed_gen": _gen_of(c, mid) == gen and (at, mid) < key,
        "take_delivers_first": first,
        "keyed_range_delivers_first": keyed,
    }
    print(json.dumps(case))
    return case


def _open(c: psycopg.Connection[Any], queue: str, now: int | None) -> None:
    """Queue ``queue``, with the window on record (two forced rotations at ``now``, None: the clock)."""
    c.execute("SELECT lonnymq.queue_create(%s)", [queue])
    for _ in range(2):
        c.execute("SELECT lonnymq.rotate(p_force => true, p_now => %s)", [now])


def _freeze(
    c: psycopg.Connection[Any], queue: str, nows: tuple[int, int] | None
) -> tuple[int, tuple[int, int]]:
    """Two forced rotations (at ``nows``, None: the clock), which freeze the backlog's generation;
    returns it and the key the second rotation would record there for ``queue``."""
    now = 0
    for at in nows or (None, None):
        now = at if at is not None else int(_one(c, "SELECT lonnymq.now_ms()"))
        c.execute("SELECT lonnymq.rotate(p_force => true, p_now => %s)", [now])
    gen = _frozen_gen(c, queue)
    return gen, _key(c, gen, queue, now)


def _send(c: psycopg.Connection[Any], queue: str, n: int, now: int | None, delay: int | None = None) -> None:
    c.execute(
        "SELECT lonnymq.send_batch(%s, array_fill(%s::bytea, ARRAY[%s]), p_now => %s,"
        " p_delays_ms => array_fill(%s::bigint, ARRAY[%s]))",
        [queue, BLOB, n, now, delay, n],
    )


#: nack (delay 0) and extend of one delivery, each with its p_now (NULL: the clock) and lease.
NACK = (
    "SELECT * FROM lonnymq.nack(%s, ARRAY[%s]::bigint[], ARRAY[%s]::integer[],"
    " p_delays_ms => ARRAY[0]::bigint[], p_now => %s)"
)
EXTEND = "SELECT * FROM lonnymq.extend(%s, ARRAY[%s]::bigint[], ARRAY[%s]::integer[], %s, p_now => %s)"


def priority_nack(dsn: str) -> dict[str, Any]:
    """nack (delay 0) of a priority-10 message leased from a backlog's generation, after the
    rotation that froze it: _dequeue_at puts it at now - 10 x priority_step_ms (settle.sql)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        _open(c, "pn", T0)
        pid = _one(
            c, "SELECT id FROM lonnymq.send('pn', %s, p_priority => 10::smallint, p_now => %s)", [BLOB, T0]
        )
        _send(c, "pn", 2000, T0)
        mid, tok = _one(c, "SELECT id, token FROM lonnymq.take('pn', 1, p_now => %s)", [T0 + 1])
        assert mid == pid
        c.execute(
            "SELECT lonnymq.ack('pn', array_agg(t.id), array_agg(t.token), p_now => %s)"
            " FROM lonnymq.take('pn', 100, p_now => %s) t",
            [T0 + 1, T0 + 1],
        )
        gen, key = _freeze(c, "pn", (T0 + 2000, T0 + 4000))
        c.execute(NACK, ["pn", mid, tok, T0 + 5000])
        return _case(c, "nack, priority 10, delay 0", "pn", mid, gen, key, T0 + 5000)


def inflight_nack(dsn: str) -> dict[str, Any]:
    """nack (priority 0, delay 0, the real clock) that read its clock before a rotation and
    committed after it: it waited for the row, which an extend in an open transaction held."""
    with psycopg.connect(dsn, autocommit=True) as c, psycopg.connect(dsn) as holder:
        _open(c, "fn", None)
        c.execute("SELECT lonnymq.send('fn', %s)", [BLOB])
        # The rest of the backlog is scheduled a minute ahead: the key is then the rotation's clock.
        _send(c, "fn", 1500, None, 60000)
        mid, tok = _one(c, "SELECT id, token FROM lonnymq.take('fn', 1)")
        holder.execute(EXTEND, ["fn", mid, tok, None, None])
        nacker = psycopg.connect(dsn, autocommit=True)
        pid = nacker.info.backend_pid
        worker = threading.Thread(target=nacker.execute, args=(NACK, ["fn", mid, tok, None]))
        worker.start()
        # Until the nack waits for the row (its clock read before: nack's first statements).
        while not _one(
            c, "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [pid]
        ):
            pass
        gen, key = _freeze(c, "fn", None)
        holder.commit()
        worker.join()
        nacker.close()
        return _case(c, "nack in flight across the rotation (real clock)", "fn", mid, gen, key, key[0] + 1)


def pgmq_set_vt(dsn: str) -> dict[str, Any]:
    """pgmq's set_vt of a waiting message of the frozen backlog to a time in the past."""
    with psycopg.connect(dsn, autocommit=True) as c:
        _open(c, "sv", None)
        _send(c, "sv", 2000, None)
        c.execute(
            "SELECT lonnymq.ack('sv', array_agg(t.id), array_agg(t.token)) FROM lonnymq.take('sv', 100) t"
        )
        gen, key = _freeze(c, "sv", None)
        last = int(_one(c, "SELECT max(m.id) FROM lonnymq.message m WHERE m.gen = %s", [gen]))
        c.execute("SELECT * FROM pgmq.set_vt('sv', %s, now() - interval '1 hour')", [last])
        now = int(_one(c, "SELECT lonnymq.now_ms()"))
        return _case(c, "pgmq.set_vt to an hour ago", "sv", last, gen, key, now)


def past_extend(dsn: str) -> dict[str, Any]:
    """extend of a lease from the frozen backlog with a p_now in the past (any caller may pass one:
    _now refuses only a p_now ahead of the clock): the lease now ends before the key."""
    with psycopg.connect(dsn, autocommit=True) as c:
        _open(c, "ex", T0)
        _send(c, "ex", 2000, T0)
        mid, tok = _one(c, "SELECT id, token FROM lonnymq.take('ex', 1, p_now => %s)", [T0 + 1])
        gen, key = _freeze(c, "ex", (T0 + 2000, T0 + 4000))
        c.execute(EXTEND, ["ex", mid, tok, 1, T0 - 60000])
        return _case(c, "extend with a p_now a minute back, lease 1 ms", "ex", mid, gen, key, T0 + 5000)


def extend_setup(schema: str) -> str:
    """statement_instructions.py's --setup for the writer rule's cost: extend as settle.sql has it,
    as extend_moving with the rule (the row goes to the current generation, held as
    _gen_write() holds it), and queue 'e' with one message leased for an hour."""
    text = function_text("extend")
    rule = "SET dequeue_at = {schema}._now(p_now) + v_lease"
    assert rule in text
    text = text.replace("{schema}.extend(", "{schema}.extend_moving(", 1)
    text = text.replace(rule, rule + ", gen = {schema}._gen_write()")
    return (
        text.replace("{schema}", schema)
        + f"\nSELECT {schema}.queue_create('e', p_lease_ms => 3600000);"
        + f"\nSELECT {schema}.send('e', '{BLOB}'::bytea);"
        + f"\nSELECT {schema}.rotate(p_force => true);\nSELECT {schema}.rotate(p_force => true);"
        + f"\nSELECT id, token FROM {schema}.take('e', 1);\n"
    )


def _writer_rule(c: psycopg.Connection[Any]) -> None:
    """The writer rule, on the schema ``lonnymq`` of ``c``: nack, extend and pgmq's set_vt move
    the rows they reschedule to the current generation, held as _gen_write() holds it."""
    texts = [
        function_text("nack").replace("leased = false,", "leased = false, gen = {schema}._gen_write(),", 1),
        function_text("extend").replace(
            "SET dequeue_at = {schema}._now(p_now) + v_lease",
            "SET dequeue_at = {schema}._now(p_now) + v_lease, gen = {schema}._gen_write()",
            1,
        ),
    ]
    facade = pgmq_template()
    start = facade.index("CREATE FUNCTION pgmq._set_vt(")
    set_vt = facade[start : facade.index("END $$;", start) + len("END $$;")]
    texts.append(
        set_vt.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
            "SET dequeue_at =", "SET gen = {schema}._gen_write(), dequeue_at =", 1
        )
    )
    for text in texts:
        assert "_gen_write()" in text
        c.execute(sql.SQL(text).format(schema=sql.Identifier("lonnymq"), schema_name=sql.Literal("lonnymq")))


def _keys(c: psycopg.Connection[Any]) -> dict[tuple[int, int], tuple[int, int] | None]:
    """The keys a rotation would record now: per queue, its frozen generations and G-1, where no
    writer is left; None where the queue holds no row there (any row there later breaks it)."""
    rows = c.execute(
        "WITH g AS (SELECT q.id AS queue_id, x.gen FROM lonnymq.queue q"
        " CROSS JOIN LATERAL unnest(coalesce((SELECT f.gens FROM lonnymq.message_gen_frozen f"
        " WHERE f.queue_id = q.id), ARRAY[]::bigint[])"
        " || pg_sequence_last_value('lonnymq.message_gen_seq') - 1) AS x(gen))"
        " SELECT g.queue_id, g.gen, k.dequeue_at, k.id FROM g LEFT JOIN LATERAL ("
        " SELECT m.dequeue_at, m.id FROM lonnymq.message m WHERE m.gen = g.gen AND m.queue_id = g.queue_id"
        " AND m.channel IS NULL ORDER BY m.dequeue_at, m.id LIMIT 1) k ON true"
        " WHERE lonnymq._gen_writers_gone(g.gen)"
    ).fetchall()
    return {(r[0], r[1]): None if r[2] is None else (r[2], r[3]) for r in rows}


def _below(
    c: psycopg.Connection[Any], keys: dict[tuple[int, int], tuple[int, int] | None]
) -> list[list[int]]:
    """The rows below their generation's recorded key: [queue, gen, dequeue_at, id, key...]."""
    out = []
    for (queue_id, gen), key in keys.items():
        row = c.execute(
            "SELECT m.dequeue_at, m.id FROM lonnymq.message m WHERE m.gen = %s AND m.queue_id = %s"
            " AND m.channel IS NULL ORDER BY m.dequeue_at, m.id LIMIT 1",
            [gen, queue_id],
        ).fetchone()
        if row is not None and (key is None or (row[0], row[1]) < key):
            out.append([queue_id, gen, row[0], row[1], *(key or ())])
    return out


def writers_property(dsn: str, steps: int, seed: int, rule: bool) -> dict[str, Any]:
    """Random sends (priorities, schedules), takes, acks, nacks, extends, set_vt and rotations
    (p_max_moves 20, so that backlogs freeze) on the probe's clock, with or without the writer
    rule; each rotation records the keys (never lowered), and after every step each generation
    is checked for a row below its key. Returns the steps that put one there, by writer."""
    rnd = random.Random(seed)
    _fresh(dsn)
    broken: dict[str, int] = {}
    ops: dict[str, int] = {}
    with psycopg.connect(dsn, autocommit=True) as c:
        if rule:
            _writer_rule(c)
        for name in ("a", "b"):
            _open(c, name, T0)
        now = T0
        keys: dict[tuple[int, int], tuple[int, int] | None] = {}
        leased: list[tuple[str, int, int]] = []
        for _ in range(steps):
            now += rnd.choice((0, 1, 50, 700))
            queue = rnd.choice(("a", "b"))
            past = now - rnd.choice((0, 0, 0, 5000, 60000))
            op = rnd.choice(("send", "send", "take", "take", "ack", "nack", "extend", "set_vt", "rotate"))
            ops[op] = ops.get(op, 0) + 1
            if op == "send":
                n = rnd.choice((1, 20, 60))
                c.execute(
                    "SELECT lonnymq.send_batch(%s, array_fill(%s::bytea, ARRAY[%s]), p_now => %s,"
                    " p_priorities => array_fill(%s::smallint, ARRAY[%s]),"
                    " p_delays_ms => array_fill(%s::bigint, ARRAY[%s]))",
                    [queue, BLOB, n, now, rnd.choice((0, 0, 3, 10, -2)), n, rnd.choice((0, 0, 2000)), n],
                )
            elif op == "take":
                rows = c.execute(
                    "SELECT id, token FROM lonnymq.take(%s, %s, %s, p_now => %s)",
                    [queue, rnd.choice((1, 10, 40)), rnd.choice((1, 1000, 30000)), past],
                ).fetchall()
                leased += [(queue, r[0], r[1]) for r in rows]
            elif op in ("ack", "nack", "extend") and leased:
                q2, mid, tok = leased.pop(rnd.randrange(len(leased)))
                if op == "ack":
                    c.execute(
                        "SELECT lonnymq.ack(%s, ARRAY[%s]::bigint[], ARRAY[%s]::integer[], p_now => %s)",
                        [q2, mid, tok, now],
                    )
                elif op == "nack":
                    c.execute(NACK, [q2, mid, tok, past])
                else:
                    c.execute(EXTEND, [q2, mid, tok, rnd.choice((1, 1000)), past])
                    leased.append((q2, mid, tok))
            elif op == "set_vt":
                newest = c.execute(
                    "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
                    " WHERE q.name = %s ORDER BY m.id DESC LIMIT 1",
                    [queue],
                ).fetchone()
                if newest is not None:
                    c.execute(
                        "SELECT * FROM pgmq.set_vt(%s, %s, to_timestamp(%s / 1000.0))",
                        [queue, newest[0], past - rnd.choice((0, 10000))],
                    )
            elif op == "rotate":
                c.execute("SELECT lonnymq.rotate(p_force => true, p_max_moves => 20, p_now => %s)", [now])
                for k, v in _keys(c).items():
                    keys.setdefault(k, v)
            for found in _below(c, keys):
                broken[op] = broken.get(op, 0) + 1
                keys[(found[0], found[1])] = (found[2], found[3])  # counted once: from here on
        frozen = _one(c, "SELECT count(*) FROM lonnymq.message_gen_frozen f, unnest(f.gens)")
    return {
        "rule": rule,
        "seed": seed,
        "steps": steps,
        "ops": ops,
        "keys_recorded": sum(v is not None for v in keys.values()),
        "empty_gens_recorded": sum(v is None for v in keys.values()),
        "frozen_at_end": frozen,
        "broken_by": broken,
    }


def _buffers(plan: dict[str, Any], index: str) -> int:
    """Shared buffers (hit + read) of the plan nodes that scan ``index``."""
    n = 0
    if plan.get("Index Name") == index:
        n += int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    for child in plan.get("Plans", []):
        n += _buffers(child, index)
    return n


CANDIDATES = (
    "SELECT m.id FROM lonnymq.message_logged m"
    " WHERE m.gen = %(gen)s::bigint AND m.queue_id = %(qid)s::integer AND m.channel IS NULL"
    " AND m.dequeue_at <= %(now)s::bigint {start}"
    " ORDER BY m.dequeue_at, m.id LIMIT 100 FOR UPDATE SKIP LOCKED"
)


def walk(dsn: str, messages: int, at: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT lonnymq.queue_create('wk')")
        for _ in range(2):
            c.execute("SELECT lonnymq.rotate(p_force => true, p_now => %s)", [T0])
        for start in range(0, messages, 1000):
            c.execute(
                "SELECT lonnymq.send_batch('wk', array_fill(%s::bytea, ARRAY[%s]), p_now => %s)",
                [BLOB, min(1000, messages - start), T0],
            )
        c.execute("VACUUM ANALYZE lonnymq.message_logged")
        qid = int(_one(c, "SELECT id FROM lonnymq.queue WHERE name = 'wk'"))
        gen = int(_one(c, "SELECT pg_sequence_last_value('lonnymq.message_gen_seq')"))
        index = str(
            _one(
                c,
                "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                " WHERE x.indrelid = 'lonnymq.message_logged'::regclass"
                " AND pg_get_indexdef(x.indexrelid) LIKE '%%(gen, queue_id, dequeue_at, id)%%'",
            )
        )
        drained = 0
        ids: list[int] = []
        toks: list[int] = []
        for target in at:
            while drained < target:
                rows = c.execute(
                    "SELECT id, token FROM lonnymq.take('wk', 100, p_ack_ids => %s, p_ack_tokens => %s, p_now => %s)",
                    [ids or None, toks or None, T0 + 1],
                ).fetchall()
                ids = [r[0] for r in rows]
                toks = [r[1] for r in rows]
                drained += len(rows)
            c.execute("SELECT lonnymq.ack('wk', %s, %s, p_now => %s)", [ids, toks, T0 + 1])
            ids, toks = [], []
            key = _key(c, gen, "wk", T0 + 1)
            row: dict[str, Any] = {"drained": drained, "key": list(key)}
            for name, cond in (
                ("from_front", ""),
                ("from_key", "AND (m.dequeue_at, m.id) >= (%(k0)s::bigint, %(k1)s::bigint)"),
            ):
                with c.transaction(force_rollback=True):
                    c.execute(SETTINGS)
                    params = {"gen": gen, "qid": qid, "now": T0 + 1, "k0": key[0], "k1": key[1]}
                    plan = _one(
                        c, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CANDIDATES.format(start=cond), params
                    )[0]["Plan"]
                row[name] = _buffers(plan, index)
                if name == "from_key":
                    row["key_index_cond"] = _index_cond(plan, index)
            print(json.dumps(row))
            out.append(row)
    return out


def _index_cond(plan: dict[str, Any], index: str) -> str | None:
    if plan.get("Index Name") == index:
        return str(plan.get("Index Cond"))
    for child in plan.get("Plans", []):
        found = _index_cond(child, index)
        if found:
            return found
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dsn", required=True, help="a scratch database (its schemas lonnymq, pgmq are re-created)"
    )
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument(
        "--at", default="1000,50000,100000,150000,190000", help="messages drained, comma-separated"
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--extend-setup", help="only write the set-up of the writer rule's cost here (schema tree_x)"
    )
    ap.add_argument(
        "--property", type=int, default=0, help="only the writers' property check, this many steps"
    )
    ap.add_argument("--rule", action="store_true", help="the writers' cases under the writer rule (no walk)")
    ap.add_argument("--seeds", type=int, default=3, help="(--property) runs with and without the rule each")
    a = ap.parse_args()
    if a.property:
        runs = [
            writers_property(a.dsn, a.property, seed, rule)
            for rule in (False, True)
            for seed in range(a.seeds)
        ]
        for r in runs:
            print(json.dumps(r))
        if a.json:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"load": os.getloadavg()[0], "runs": runs}, f, indent=1)
                f.write("\n")
        return
    if a.extend_setup:
        with open(a.extend_setup, "w", encoding="utf-8") as f:
            f.write(extend_setup("tree_x"))
        return
    _fresh(a.dsn)
    if a.rule:
        with psycopg.connect(a.dsn, autocommit=True) as c:
            _writer_rule(c)
    result: dict[str, Any] = {"load_before": os.getloadavg()[0], "rule": a.rule}
    result["writers"] = [priority_nack(a.dsn), inflight_nack(a.dsn), pgmq_set_vt(a.dsn), past_extend(a.dsn)]
    if not a.rule:
        result["walk"] = walk(a.dsn, a.messages, [int(x) for x in a.at.split(",")])
    result["load_after"] = os.getloadavg()[0]
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
