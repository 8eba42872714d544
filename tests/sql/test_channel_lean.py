"""The lean channel take (sql/take.sql, _take_channels; channels.sql, _channel_apply): a channel
consumer's take(1, ack=previous) acks by take()'s own statement and updates the channel inline,
and no take or batch ack computes ready_at through a nested _channel_ready_at() call (a plpgsql
frame and a statement a channel); with the counters, ready_at, round robin and the deletion of
emptied channels as before (docs/channels.md, "A cheaper channel take, counted")."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from channel_helpers import Db
from lonnymq import Client

_HELPERS = ("_ack", "_channel_apply", "_channel_apply_one", "_channel_ready_at", "_deliver")


def _calls(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """Calls of the channel helpers in this transaction (track_functions = 'pl')."""
    return {
        name: int(
            conn.execute(
                "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regproc), 0)", (f"{schema}.{name}",)
            ).fetchone()[0]  # type: ignore[index]
        )
        for name in _HELPERS
    }


def _take(
    db: Db, n: int, now: int, acks: list[dict[str, Any]], calls: Counter[str] | None = None
) -> list[dict[str, Any]]:
    """take('q', n, ack => acks); the helper calls it made are added to ``calls``."""
    before = _calls(db.conn, db.schema)
    got = db.q(
        "SELECT * FROM {s}.take('q', %s, NULL, %s, %s, %s)",
        (n, [d["id"] for d in acks] or None, [d["token"] for d in acks] or None, now),
    )
    if calls is not None:
        calls.update({k: v - before[k] for k, v in _calls(db.conn, db.schema).items()})
    return got


def test_take_one_with_ack_of_a_channel_queue_nests_no_channel_helper(
    client: Client, conn: psycopg.Connection[Any], schema: str
) -> None:
    """A drain of three channels by take(1, ack=previous): round robin, one _deliver() and one
    _channel_ready_at() (the ack's) a call, nothing else nested (the old path: _ack,
    _channel_apply, _channel_apply_one and two _channel_ready_at a call); the emptied channels
    are deleted, an explicit one stays, and the counters and ready_at equal a recount at every
    step."""
    db = Db(conn, schema)
    client.create_queue("q")
    t = db.now()
    db.send("q", [(c, f"{c}{i}") for c in "abc" for i in range(1, 4)], t)
    client.set_channel("q", "c")  # explicit: kept while empty
    got: list[str] = []
    previous: list[dict[str, Any]] = []
    calls: Counter[str] = Counter({name: 0 for name in _HELPERS})
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        previous = _take(db, 1, t, [])
        got.append(bytes(previous[0]["payload"]).decode())
        for _ in range(8):
            previous = _take(db, 1, t, previous, calls)
            got.append(bytes(previous[0]["payload"]).decode())
            db.check_channels("q")
    assert got == ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]
    # One _channel_ready_at() an ack: its UPDATE may wait for the channel's row, so ready_at
    # takes the fresh snapshot of that call; the served channel's is inline. a and b are
    # emptied by the acks of a3 and b3: deleted by _channel_apply_one().
    assert calls == {
        "_ack": 0,
        "_channel_apply": 0,
        "_channel_apply_one": 2,
        "_channel_ready_at": 8,
        "_deliver": 8,
    }, calls
    _take(db, 1, t, previous)
    assert db.channel("q", "a") is None and db.channel("q", "b") is None
    kept = db.channel("q", "c")
    assert kept is not None and kept["current_size"] == 0 and kept["ready_at"] is None
    db.check_channels("q")


def test_take_n_with_ack_of_a_channel_queue_computes_ready_at_inline(
    client: Client, conn: psycopg.Connection[Any], schema: str
) -> None:
    """take(10, ack=previous 10) over 20 channels: the served channels are updated by one
    statement with ready_at inline, and the batch ack's _channel_apply computes it inline too:
    no _channel_ready_at() call (the old path: one a served channel and one an acked channel);
    round robin by turn in serving order, the counters exact."""
    db = Db(conn, schema)
    client.create_queue("q", channel_max_concurrency=2)
    t = db.now()
    names = [f"c{i:02}" for i in range(20)]
    db.send("q", [(c, f"{c}-{i}") for i in range(3) for c in names], t)
    calls: Counter[str] = Counter()
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        previous = _take(db, 10, t, [])
        seen = [d["channel"] for d in previous]
        for _ in range(5):
            previous = _take(db, 10, t, previous, calls)
            seen += [d["channel"] for d in previous]
            db.check_channels("q")
    assert seen == names * 3
    assert calls["_channel_ready_at"] == 0 and calls["_channel_apply_one"] == 0, calls
    # The emptied channels are gone; the last ten hold a lease each, all expiring at once: the
    # turns, drawn in serving order, keep them in that order.
    rows = db.q("SELECT name FROM {s}.channel WHERE queue_id = %s ORDER BY ready_at, turn", (db.qid("q"),))
    assert [r["name"] for r in rows] == names[10:]
    count = sql.SQL("SELECT count(*) FROM {}.message").format(sql.Identifier(schema))
    assert conn.execute(count).fetchone() == (10,)
