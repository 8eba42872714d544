"""The drain's floors of the producers benchmark (benchmarks/lonnymq_bench/systems/
lease_store_floor.py and api_floor.py's ``take``) do what they stand for: they lease the rows
``take(n)`` leases, in its order, and return its row; they acknowledge the previous deliveries
as ``take(n, ack=previous)`` does (deleted, remembered in ``settled`` so that LonnyMQ's own ack
answers a repeat, counted in ``queue_stat``); a stale token deletes nothing; an unknown queue is
an error."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from lonnymq import Client

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from lonnymq_bench.systems.api_floor import TAKE_CALL, drop_leases_index  # noqa: E402 - needs the path above
from lonnymq_bench.systems.lease_store_floor import drain_statement, where  # noqa: E402

Conn = psycopg.Connection[tuple[Any, ...]]
#: A floor as a call: (batch, ids, tokens) -> the rows it returns.
Floor = Callable[[int, list[int], list[int]], list[tuple[Any, ...]]]


def _floors(c: Conn, f: sql.Identifier, schema: str) -> dict[str, Floor]:
    args = where(c, schema, "q")
    call = sql.SQL(TAKE_CALL).format(f=f)
    return {
        "leasestorefloor": lambda n, ids, toks: c.execute(
            drain_statement(n, schema), {**args, "ids": ids, "toks": toks}
        ).fetchall(),
        "apileasefloor": lambda n, ids, toks: c.execute(call, ("q", n, ids, toks)).fetchall(),
        # The API lease floor's function on the tables without the partial index of leases.
        "guaranteefloor": lambda n, ids, toks: c.execute(call, ("q", n, ids, toks)).fetchall(),
    }


def _leases_index(c: Conn, schema: str) -> int:
    """How many partial indexes of leases (``... WHERE leased``) ``schema`` holds: the
    partitioned table's and each partition's."""
    got = c.execute(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND indexdef LIKE '%%WHERE leased%%'",
        (schema,),
    ).fetchone()
    assert got is not None
    return int(got[0])


@pytest.mark.parametrize("which", ["leasestorefloor", "apileasefloor", "guaranteefloor"])
def test_drain_floor_leases_and_acks_as_take_does(
    client: Client, schema: str, floor: tuple[Conn, sql.Identifier], which: str
) -> None:
    c, f = floor
    s = sql.Identifier(schema)
    if which == "guaranteefloor":
        # The guarantee floor's install: every partition's partial index of leases is gone, and
        # the floor (and LonnyMQ's own take, below) work without it.
        assert _leases_index(c, schema) > 0
        drop_leases_index(c, schema)
        assert _leases_index(c, schema) == 0
    client.create_queue("q")
    ids = [m.id for m in client.send_batch("q", [{"n": n} for n in range(5)])]
    call = _floors(c, f, schema)[which]
    # The rows take(2) would lease (asked in a transaction rolled back), in its order.
    with c.transaction(force_rollback=True):
        taken = c.execute(sql.SQL("SELECT id FROM {}.take('q', 2)").format(s)).fetchall()
    got = call(2, [], [])
    assert [r[0] for r in got] == [r[0] for r in taken] == ids[:2]
    # take()'s row: id, attempt, token, lease_until (the clock + the queue's 30 s), ..., payload.
    now = c.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()
    assert now is not None
    assert all(r[1:3] == (1, 1) and now[0] < r[3] <= now[0] + 30_000 for r in got), got
    assert [bytes(r[14]) for r in got] == [b'{"n":0}', b'{"n":1}']
    # A stale token deletes nothing, and the call leases the next two.
    nxt = call(2, [got[0][0], got[1][0]], [2, 1])
    assert [r[0] for r in nxt] == ids[2:4]
    left = c.execute(sql.SQL("SELECT id FROM {}.message ORDER BY id").format(s)).fetchall()
    assert [r[0] for r in left] == [*ids[:1], *ids[2:]]
    mem = c.execute(sql.SQL("SELECT queue_id, id, token, outcome FROM {}.settled").format(s)).fetchall()
    assert [r[1:] for r in mem] == [(ids[1], 1, "acked")]
    # ack's memory is LonnyMQ's: its own ack of that delivery is answered as a repeat.
    again = c.execute(sql.SQL("SELECT * FROM {}.ack('q', %s, %s)").format(s), ([ids[1]], [1])).fetchall()
    assert again == [(ids[1],)]
    acked = c.execute(sql.SQL("SELECT sum(acked)::int FROM {}.queue_stat").format(s)).fetchone()
    assert acked == (1,)
    # LonnyMQ's take(n, ack=previous) acknowledges the floor's deliveries (they are its leases).
    ack_ids, ack_toks = [got[0][0], *(r[0] for r in nxt)], [got[0][2], *(r[2] for r in nxt)]
    last = c.execute(
        sql.SQL("SELECT id FROM {}.take('q', 5, NULL, %s, %s)").format(s), (ack_ids, ack_toks)
    ).fetchall()
    assert [r[0] for r in last] == ids[4:]
    acked = c.execute(sql.SQL("SELECT sum(acked)::int FROM {}.queue_stat").format(s)).fetchone()
    assert acked == (4,)


def test_api_lease_floor_refuses_an_unknown_queue(client: Client, floor: tuple[Conn, sql.Identifier]) -> None:
    c, f = floor
    client.create_queue("q")
    with pytest.raises(errors.NoDataFound):
        c.execute(sql.SQL(TAKE_CALL).format(f=f), ("nope", 1, [], []))
