"""take(1, ack=previous) of an ordinary queue, a one-at-a-time consumer's drain (sql/take.sql):
the delivery acknowledged and the next one leased in one statement. Its plan under the
statistics that misled joins of the ids with the message table (settle.sql's header); a repeat
or a stale token answered by nothing else (no ack(), no _ack); an expired lease it acknowledges
never leased again by the same statement; arrays of other bounds; a row another transaction
holds, waited for and checked again."""

from __future__ import annotations

import re
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_dead_paths import _wait_until_blocked
from test_take_batch_ack import _meanwhile, _nodes, statistics  # noqa: F401 (a fixture)

from lonnymq import Client
from lonnymq.sql import function_text

#: take()'s variables in the statement, as parameters: name: (parameter, type, value).
_NAMES = {
    "q.id": ("$1", "integer", None),  # (the queue's)
    "p_ack_ids": ("$2", "bigint[]", "'{1}'"),
    "p_ack_tokens": ("$3", "integer[]", "'{1}'"),
    "v_now": ("$4", "bigint", "0"),
    "p_lease_ms": ("$5", "bigint", "NULL"),
    "q.lease_ms": ("$6", "bigint", "60000"),
    "q.max_attempts": ("$7", "integer", "5"),
    "v_head.gen": ("$8", "bigint", "1"),
    "p_limit": ("$9", "integer", "1"),
    "v_head.frozen": ("$10", "bigint[]", "'{0}'"),  # (the frozen copy's: the queue's one frozen generation)
}
#: take()'s statement of a one-delivery drain: the ack's CTEs and take(1)'s lease.
ONE_ACK = r"RETURN QUERY\s+(WITH d AS \(\s+DELETE FROM \{schema\}\.message_logged m\s+WHERE .*?m\.payload);"


def _statement(schema: str, copy: int = 0) -> str:
    """take()'s one-delivery drain statement, its variables as parameters, for ``schema``: its
    ``copy`` 0 (the window's two candidate ranges) or 1 (and the queue's one frozen generation)."""
    window, frozen = re.finditer(ONE_ACK, function_text("take"), re.S)
    text = (window, frozen)[copy][1]
    for name, (param, _, _) in _NAMES.items():
        text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", param, text)
    unknown = re.findall(r"(?<![\w.])(?:p|v)_\w+|\bq\.\w+", text)
    assert not unknown, f"take()'s one-delivery drain uses {unknown}: teach this test about them"
    return sql.SQL(text).format(schema=sql.Identifier(schema)).as_string()


@pytest.mark.parametrize("copy", [0, 1], ids=["window", "frozen"])
def test_plan_of_takes_one_delivery_drain(conn: Any, schema: str, statistics: int, copy: int) -> None:  # noqa: F811
    """The ack's DELETE probes the primary key by the whole key (never the partial index of
    leases, never the queue's part of the key alone, never a scan); the lease changes its row by
    ctid, found by the window's candidate query on the dequeue index. Both copies: without and
    with a frozen generation."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    for setting in ("enable_seqscan", "enable_sort", "jit", "enable_memoize"):  # take()'s SET clauses
        conn.execute(sql.SQL("SET {} = off").format(sql.Identifier(setting)))
    types = ", ".join(t for _, t, _ in _NAMES.values())
    conn.execute(f"PREPARE one_ack({types}) AS {_statement(schema, copy)}")  # type: ignore[arg-type]
    args = ", ".join(str(statistics) if v is None else v for _, _, v in _NAMES.values())
    row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE one_ack({args})").fetchone()  # type: ignore[arg-type]
    assert row is not None
    plan = row[0][0]["Plan"]
    nodes = list(_nodes(plan))
    assert not {"Seq Scan", "Hash Join", "Merge Join"} & {x["Node Type"] for x in nodes}, plan
    [delete] = [x for x in nodes if x.get("Subplan Name") == "CTE d"]
    assert delete["Node Type"] == "ModifyTable" and delete["Operation"] == "Delete", plan
    # (Under a held snapshot's statistics a bitmap scan of the same key: one row at most.)
    [probe] = [x for x in _nodes(delete) if "Index Name" in x]
    assert probe["Node Type"] in ("Index Scan", "Bitmap Index Scan"), plan
    assert probe["Index Name"] == "message_logged_pkey", plan
    assert probe["Index Cond"] == "((queue_id = $1) AND (id = ($2)[1]))", plan
    assert plan["Node Type"] == "ModifyTable" and plan["Operation"] == "Update", plan
    [change] = [x for x in plan["Plans"] if x["Parent Relationship"] == "Outer"]
    assert change["Node Type"] == "Tid Scan", plan
    walks = [x for x in nodes if "Index Name" in x and x is not probe]
    assert walks and all(x["Index Name"].endswith("_gen_queue_id_dequeue_at_id_idx") for x in walks), plan


def _calls(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """The functions of ``schema`` this transaction called, with their calls (track_functions)."""
    rows = conn.execute(
        "SELECT funcname, sum(calls) FROM pg_stat_xact_user_functions WHERE schemaname = %s GROUP BY 1",
        (schema,),
    ).fetchall()
    return {name: int(n) for name, n in rows}


def _more(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The calls made between two readings of _calls (its counts are those not yet flushed,
    which may span transactions)."""
    return {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}


def _take(
    conn: psycopg.Connection[Any],
    schema: str,
    ids: Any,
    tokens: Any,
    lease_ms: int | None = None,
    now: int | None = None,
) -> list[tuple[int, int]]:
    """take('q', 1, lease_ms, ack => (ids, tokens), p_now => now) on ``conn``: the (id, token) of
    what it leased."""
    stmt = sql.SQL(
        "SELECT id, token FROM {}.take('q', 1, %s::bigint, %s::bigint[], %s::integer[], %s::bigint)"
    )
    rows = conn.execute(stmt.format(sql.Identifier(schema)), (lease_ms, ids, tokens, now)).fetchall()
    return [(int(i), int(t)) for i, t in rows]


def _left(
    conn: psycopg.Connection[Any], schema: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """Queue "q"'s messages (id, token), its settled rows (id, token) and its acked count."""
    s = sql.Identifier(schema)
    rows = conn.execute(sql.SQL("SELECT id, deliveries FROM {}.message ORDER BY id").format(s)).fetchall()
    settled = conn.execute(sql.SQL("SELECT id, token FROM {}.settled ORDER BY id").format(s)).fetchall()
    [(acked,)] = conn.execute(
        sql.SQL("SELECT coalesce(sum(acked), 0) FROM {}.queue_stat").format(s)
    ).fetchall()
    return rows, settled, int(acked)


def test_a_one_delivery_drain_calls_nothing_else(dsn: str, client: Client, schema: str) -> None:
    """take(1, ack=previous) acknowledges and leases without calling another function, and
    answers a repeat or a stale token with nothing more (ack() would answer the pair, which take
    discards, and change nothing): the delivery stays acknowledged once, the stale one leased."""
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2", b"3", b"4"])
    [a] = client.take("q", 1)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET track_functions = 'pl'")
        before = _calls(conn, schema)
        [(b, tb)] = _take(conn, schema, [a.id], [a.token])
        assert _more(before, _calls(conn, schema)) == {"take": 1}
        conn.commit()
        before = _calls(conn, schema)
        assert _take(conn, schema, [a.id], [a.token]) != []  # a repeat: the next one leased
        assert _take(conn, schema, [b], [tb + 1]) != []  # a stale token: the next one leased
        assert _more(before, _calls(conn, schema)) == {"take": 2}
        conn.rollback()
        rows, settled, acked = _left(conn, schema)
    assert [r[0] for r in rows] == [b, b + 1, b + 2] and settled == [(a.id, a.token)] and acked == 1


def test_a_one_delivery_drain_never_leases_what_it_acknowledges(
    dsn: str, client: Client, schema: str
) -> None:
    """A delivery whose lease expired, first in line again, is acknowledged, not leased again
    by the take that acknowledges it: the next one is. With a stale token (it was delivered
    again since) it is left to the take, which leases it once more."""
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2"])
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(now,)] = conn.execute(sql.SQL("SELECT {}.now_ms()").format(s)).fetchall()
        # No rotation due at these times (a rotation's take goes the general way).
        seq = sql.Identifier(schema, "message_gen_started_seq").as_string(conn)
        conn.execute("SELECT setval(%s::regclass, %s)", (seq, now))
        [(a, ta)] = _take(conn, schema, None, None, lease_ms=1, now=now)
        [(b, tb)] = _take(conn, schema, None, None, lease_ms=1, now=now)
        # Both leases expired (at the same time): a is first in line again.
        got = _take(conn, schema, [a], [ta], lease_ms=1, now=now + 10)
        assert got == [(b, tb + 1)]
        rows, settled, acked = _left(conn, schema)
        assert rows == [(b, tb + 1)] and settled == [(a, ta)] and acked == 1
        # b's lease expired again: a stale token of b, first in line, leaves b to be leased.
        got = _take(conn, schema, [b], [tb], now=now + 20)
        assert got == [(b, tb + 2)]
        rows, settled, acked = _left(conn, schema)
    assert settled == [(a, ta)] and acked == 1


def test_a_one_delivery_drain_reads_arrays_of_any_bounds(dsn: str, client: Client, schema: str) -> None:
    """The delivery to acknowledge is the arrays' one element, whatever their bounds."""
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2"])
    [a] = client.take("q", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = _take(conn, schema, f"[3:3]={{{a.id}}}", f"[0:0]={{{a.token}}}")
        rows, settled, acked = _left(conn, schema)
    assert len(got) == 1 and [r[0] for r in rows] == [got[0][0]]
    assert settled == [(a.id, a.token)] and acked == 1


@pytest.mark.parametrize(
    ("what", "still_its"), [("extend", True), ("hold", True), ("release", False), ("re-lease", False)]
)
def test_a_one_delivery_drain_waits_for_a_held_row_and_checks_its_new_version(
    dsn: str, client: Client, schema: str, what: str, still_its: bool
) -> None:
    """take(1, ack=previous) that meets its delivery held by another transaction waits for it,
    then acknowledges its new version only if it is still the delivery's: an extended or merely
    locked row is deleted, one given back is leased again by the same take (the statement that
    acknowledges skipped it, the general path did not), one delivered again is left."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1"])
    [a] = client.take("q", 1)
    result: dict[str, Any] = {}
    with psycopg.connect(dsn) as other, psycopg.connect(dsn, autocommit=True) as taker:
        for stmt, args in _meanwhile(s, [a], what):
            other.execute(stmt, args).fetchall()

        def take() -> None:
            result["got"] = _take(taker, schema, [a.id], [a.token])

        thread = threading.Thread(target=take)
        thread.start()
        with psycopg.connect(dsn, autocommit=True) as watcher:
            _wait_until_blocked(watcher, [taker.info.backend_pid])
        other.commit()
        thread.join(30)
    with psycopg.connect(dsn) as conn:
        rows, settled, acked = _left(conn, schema)
    if still_its:
        assert result["got"] == [] and rows == [] and settled == [(a.id, a.token)] and acked == 1
    else:
        assert result["got"] == ([(a.id, a.token + 1)] if what == "release" else [])
        assert rows == [(a.id, a.token + 1)] and settled == [] and acked == 0
