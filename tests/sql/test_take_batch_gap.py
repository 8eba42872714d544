"""What take(n, ack=previous)'s batch ack and the settles' lock probes do per row (sql/take.sql,
sql/settle.sql; docs/benchmarks.md, "take()'s batch ack, row by row"): each probe of the
primary key ends at the key's row (LIMIT 1) instead of reading on to the next key (take's
batch ack's own plan, its probes and its DELETE's join: test_take_ack_scan.py). The guarantees
around them (fencing, the lock order, a held row's new version) are test_take_batch_ack.py's."""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql
from test_take_batch_ack import _nodes

from lonnymq import Client
from lonnymq.sql import function_text


def _parent_of(plan: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in _nodes(plan) if any(child is node for child in x.get("Plans", [])))


#: The settles' lock probes: LATERAL subqueries that lock a row found by its key.
_LOCK_PROBE = re.compile(r"CROSS JOIN LATERAL \((SELECT [^()]*?FOR UPDATE)\)", re.S)


def test_every_settle_lock_probe_ends_at_its_row() -> None:
    """ack's, nack's, extend's and give_up's lock probes (one key each) say LIMIT 1: the index
    scan stops at the key's row."""
    probes = [
        probe
        for name in ("_ack", "nack", "extend", "give_up")
        for probe in _LOCK_PROBE.findall(function_text(name))
    ]
    assert len(probes) == 4, probes
    assert all(re.search(r"\sLIMIT 1\s+FOR UPDATE$", probe) for probe in probes), probes


def _acks_lock(schema: str) -> str:
    """_ack's lock of the matching rows, its variables as parameters ($1 the queue's id, $2 the
    ids, $3 the tokens)."""
    [match] = re.finditer(
        r"SELECT array_agg\(k\.tid\) INTO v_tids\s+(FROM .*?FOR UPDATE\) k);", function_text("_ack"), re.S
    )
    text = "SELECT array_agg(k.tid) " + match[1]
    for name, param in {"q.id": "$1", "p_ids": "$2", "p_tokens": "$3"}.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", param, text)
    return sql.SQL(text).format(schema=sql.Identifier(schema)).as_string()


def test_acks_lock_probe_stops_at_the_row_it_locks(client: Client, conn: Any, schema: str) -> None:
    """ack()'s lock of a batch (_ack, also what take's batch ack leaves over): per pair, a Limit
    of one over the lock over the key's index scan, in the generic plan it runs."""
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"x"] * 10)
    taken = client.take("q", 10)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("SET enable_seqscan = off")
    conn.execute(f"PREPARE acks_lock(integer, bigint[], integer[]) AS {_acks_lock(schema)}")  # type: ignore[arg-type]
    [(qid,)] = conn.execute(
        sql.SQL("SELECT id FROM {} WHERE name = 'q'").format(sql.Identifier(schema, "queue"))
    ).fetchall()
    ids = "{" + ",".join(str(m.id) for m in taken) + "}"
    toks = "{" + ",".join(str(m.token) for m in taken) + "}"
    row = conn.execute(
        f"EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) EXECUTE acks_lock({qid}, '{ids}', '{toks}')"  # type: ignore[arg-type]
    ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    locks = [x for x in _nodes(plan) if x["Node Type"] == "LockRows"]
    assert locks, plan
    for lock in locks:
        limit = _parent_of(plan, lock)
        assert limit["Node Type"] == "Limit", plan
        assert lock["Actual Rows"] == 1 and lock["Actual Loops"] == len(taken), plan
