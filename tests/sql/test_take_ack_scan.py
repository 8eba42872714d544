"""take(n, ack=previous)'s batch ack when every pair carries the same token (a drain's usual
batch: its deliveries' first attempts), sql/take.sql: the ids alone sorted (a sort of one
column), each row found by its key with that token, deleted by its ctid in id order. Its plan
under the statistics that misled joins of the ids with the message table (settle.sql's header),
and its lock order against another transaction's settle of the same rows given in the other
order; a batch of mixed tokens goes to _ack whole."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql
from test_dead_paths import _wait_until_blocked
from test_take_batch_ack import _ack_calls, _acked_state, _generic_plan, _nodes, _statement, statistics

from lonnymq import Client

__all__ = ["statistics"]  # (the fixture, shared with test_take_batch_ack.py)


def test_plan_of_takes_one_token_batch_ack(conn: Any, schema: str, statistics: int) -> None:
    """Under each of the statistics that misled a join of the ids with the message table: the
    ids sorted alone (the sort's rows one column, which PostgreSQL sorts as plain values, not
    as tuples), a key lookup per id in that order under a Limit of one row (never the queue's
    part of the key alone, never the partial index of leases), each row deleted by its ctid
    (the DELETE's join: the probes' subquery and the TID scan); no lock taken first, no other
    join, no sequential scan."""
    args = f"{statistics}, '{{3,1,2}}', '{{1,1,1}}', 0"
    _generic_plan(conn, _statement(schema), args)
    row = conn.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE batch_ack({args})").fetchone()  # type: ignore[arg-type]
    assert row is not None
    plan = row[0][0]["Plan"]
    nodes = list(_nodes(plan))
    banned = {"Seq Scan", "Hash Join", "Merge Join", "Memoize", "LockRows", "Materialize"}
    assert not [x for x in nodes if x["Node Type"] in banned], plan
    probes = [x for x in nodes if "Index Name" in x]
    assert probes, plan
    for probe in probes:
        # (Under a held snapshot's statistics a bitmap scan of the same key: one row at most.)
        assert probe["Node Type"] in ("Index Scan", "Bitmap Index Scan"), plan
        assert probe["Index Name"].endswith("_pkey"), plan
        assert probe["Index Cond"].startswith("((p.queue_id = $1) AND (p.id = "), plan
        limit = next(x for x in nodes if any(c is probe for c in x.get("Plans", [])))
        if limit["Node Type"] == "Bitmap Heap Scan":
            limit = next(x for x in nodes if any(c is limit for c in x.get("Plans", [])))
        assert limit["Node Type"] == "Limit" and limit["Plan Rows"] == 1, plan
    [sort] = [x for x in nodes if x["Node Type"] == "Sort"]
    assert len(sort["Sort Key"]) == 1 and sort["Output"] == sort["Sort Key"], sort
    [delete] = [x for x in nodes if x.get("Subplan Name") == "CTE d"]
    assert delete["Node Type"] == "ModifyTable" and delete["Operation"] == "Delete", plan
    [join] = delete["Plans"]
    assert join["Node Type"] == "Nested Loop", plan
    inner = next(x for x in join["Plans"] if x["Parent Relationship"] == "Inner")
    assert inner["Node Type"] == "Tid Scan", plan
    outer = next(x for x in join["Plans"] if x["Parent Relationship"] == "Outer")
    assert [x for x in _nodes(outer) if x["Node Type"] == "Sort"] == [sort], plan
    assert [out for out in join["Output"] if out.endswith(".*")] == ["k.*"], join["Output"]


def test_one_token_batch_ack_and_an_extend_both_given_the_other_order(
    dsn: str, client: Client, schema: str
) -> None:
    """A one-token batch ack and another transaction's extend of the same six rows, both given
    in descending id order, both waiting: a third transaction holds the middle row, the extend
    locks the rows below it and waits, take's ack waits for the first of those. When the
    holder lets go, both finish: each locks in id order, so neither holds a row the other
    waits for while it waits for one of the other's (locked in the order given, the ack would
    hold the rows above the middle one and deadlock with the extend). Every row is deleted
    (the extended versions are still the deliveries'), remembered and counted once."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [str(i).encode() for i in range(6)])
    taken = client.take("q", 6)
    assert {m.token for m in taken} == {1}
    backwards = sorted(taken, key=lambda m: m.id, reverse=True)
    pairs = ([m.id for m in backwards], [m.token for m in backwards])
    middle = sorted(m.id for m in taken)[3]
    errors: list[BaseException] = []
    result: dict[str, Any] = {}
    with (
        psycopg.connect(dsn) as holder,
        psycopg.connect(dsn, autocommit=True) as extender,
        psycopg.connect(dsn, autocommit=True) as acker,
        psycopg.connect(dsn, autocommit=True) as watcher,
    ):
        holder.execute(sql.SQL("SELECT FROM {}.message WHERE id = %s FOR UPDATE").format(s), (middle,))

        def extend() -> None:
            try:
                result["extended"] = extender.execute(
                    sql.SQL("SELECT * FROM {}.extend('q', %s, %s, 60000)").format(s), pairs
                ).fetchall()
            except BaseException as exc:  # (reported below, in the test's thread)
                errors.append(exc)

        def take() -> None:
            try:
                result["got"] = acker.execute(
                    sql.SQL("SELECT id FROM {}.take('q', 6, NULL, %s, %s)").format(s), pairs
                ).fetchall()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=extend), threading.Thread(target=take)]
        threads[0].start()
        _wait_until_blocked(watcher, [extender.info.backend_pid])
        threads[1].start()
        _wait_until_blocked(watcher, [extender.info.backend_pid, acker.info.backend_pid])
        holder.commit()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
    assert errors == []
    assert len(result["extended"]) == len(taken) and result["got"] == []
    with psycopg.connect(dsn) as conn:
        rows, settled, counted = _acked_state(conn, s)
    assert rows == []
    assert settled == sorted((m.id, m.token) for m in taken)
    assert counted == len(taken)


def test_one_token_batch_ack_leaves_repeats_and_stale_tokens_to_ack(
    dsn: str, client: Client, schema: str
) -> None:
    """Pairs of one token with a delivery twice, and a batch of one token whose rows were
    delivered again since (a stale token): each delivery deleted, remembered and counted once;
    the stale batch deletes nothing; what is left over goes to _ack, once a call."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2", b"3", b"4"])
    a, b, c, d = client.take("q", 4)
    take = sql.SQL("SELECT id FROM {}.take('q', 1, NULL, %s, %s)").format(s)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SELECT {}.queue_pause('q')").format(s))
        conn.commit()
        conn.execute("SET track_functions = 'pl'")
        assert conn.execute(take, ([b.id, a.id, b.id], [1, 1, 1])).fetchall() == []
        assert _ack_calls(conn, schema) == 1
        conn.commit()
        # c and d given back and delivered again: token 1 is stale for both.
        client.nack([c, d])
        conn.execute(sql.SQL("SELECT {}.queue_resume('q')").format(s))
        conn.commit()
        again = client.take("q", 2)
        assert sorted((m.id, m.token) for m in again) == [(c.id, 2), (d.id, 2)]
        conn.execute(sql.SQL("SELECT {}.queue_pause('q')").format(s))
        conn.commit()
        before = _ack_calls(conn, schema)  # (a session's counts stay pending up to a second)
        assert conn.execute(take, ([d.id, c.id], [1, 1])).fetchall() == []
        assert _ack_calls(conn, schema) == before + 1
        conn.commit()
        rows, settled, counted = _acked_state(conn, s)
    assert rows == [(c.id, 2, True), (d.id, 2, True)]
    assert settled == sorted([(a.id, 1), (b.id, 1)])
    assert counted == 2


def test_a_batch_of_mixed_tokens_goes_to_ack_whole(dsn: str, client: Client, schema: str) -> None:
    """A drain's batch with a redelivery among first attempts (tokens 1 and 2): take's own
    statement is for one token only, so the batch goes to _ack, once, which acknowledges
    every delivery: each deleted, remembered with its token and counted once."""
    s = sql.Identifier(schema)
    client.create_queue("q", lease=3600)
    client.send_batch("q", [b"1", b"2", b"3"])
    first = client.take("q", 1)
    client.nack(first)
    taken = client.take("q", 3)
    assert sorted(m.token for m in taken) == [1, 1, 2]
    take = sql.SQL("SELECT id FROM {}.take('q', 1, NULL, %s, %s)").format(s)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET track_functions = 'pl'")
        assert conn.execute(take, ([m.id for m in taken], [m.token for m in taken])).fetchall() == []
        assert _ack_calls(conn, schema) == 1
        conn.commit()
        rows, settled, counted = _acked_state(conn, s)
    assert rows == []
    assert settled == sorted((m.id, m.token) for m in taken)
    assert counted == 3
