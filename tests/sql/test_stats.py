"""The per-queue, per-minute counters (queue_stat, sql/stats.sql) and the worker registry.

Every path that sends, acks, retries, dead-letters or cancels counts exactly what it did; a
rolled-back call counts nothing; a writer never waits for another's counter row; maintain folds
old minutes without changing the totals. The clock is driven through p_now where it matters.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import Sql
from lonnymq import Client

MINUTE = 60_000


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def totals(db: Sql, queue: str) -> dict[str, int]:
    [row] = db.q("SELECT * FROM {s}.stats_totals(ARRAY[%s])", (queue,))
    return {k: row[k] for k in ("sent", "acked", "nacked", "dead", "cancelled")}


def give_up(db: Sql, queue: str, msg_id: int, token: int) -> None:
    db.call("give_up", p_queue=queue, p_ids=[msg_id], p_tokens=[token], p_errors=["bad"])


def minutes(db: Sql, queue: str, since: int, until: int) -> list[dict[str, Any]]:
    return db.q("SELECT * FROM {s}.stats_minutes(ARRAY[%s], %s, %s, %s)", (queue, since, until, until))


def test_every_path_counts_exactly_what_it_did(client: Client, db: Sql) -> None:
    client.create_queue("dlq")
    client.create_queue("q", max_attempts=2, dead_letter_queue="dlq")
    client.send_batch("q", [b"1", b"2", b"3", b"4", b"5", b"6"])
    # Keyed: one created, one ignored (not sent again), one replaced (not a new message).
    client.send("q", b"k", key="k")
    client.send("q", b"k", key="k")
    client.send("q", b"k2", key="k", on_conflict="replace")
    # Channels: counted like the rest.
    client.send("q", b"c1", channel="tenant")
    client.send("q", b"c2", channel="tenant")
    assert totals(db, "q") == dict(sent=9, acked=0, nacked=0, dead=0, cancelled=0)

    ms = client.take("q", 9)
    assert len(ms) == 9
    client.ack(ms[:3])
    client.ack(ms[:3])  # a repeat acks nothing more
    client.nack(ms[3:5])  # failures, retried: nacked
    client.defer(ms[5:6])  # not a failure: not counted
    give_up(db, "q", ms[6].id, ms[6].token)  # dead, and sent to the dead-letter queue
    client.cancel("q", ids=[ms[7].id, 10**12])  # an unknown id cancels nothing
    assert totals(db, "q") == dict(sent=9, acked=3, nacked=2, dead=1, cancelled=1)
    assert totals(db, "dlq") == dict(sent=1, acked=0, nacked=0, dead=0, cancelled=0)

    # The two retried messages fail their last attempt: dead-lettered by nack.
    again = [m for m in client.take("q", 9) if m.id in (ms[3].id, ms[4].id)]
    client.nack(again)
    assert totals(db, "q") == dict(sent=9, acked=3, nacked=2, dead=3, cancelled=1)
    assert totals(db, "dlq")["sent"] == 3
    # Requeued dead messages are sent again.
    [d] = client.take("dlq", 1)
    give_up(db, "dlq", d.id, d.token)  # dlq has no dead-letter queue: archived as dead
    assert client.requeue_dead("dlq") == 1
    assert totals(db, "dlq") == dict(sent=4, acked=0, nacked=0, dead=1, cancelled=0)

    # The minutes add up to the totals.
    now = db.now()
    rows = minutes(db, "q", now - 10 * MINUTE, now + 1)
    assert {k: sum(r[k] for r in rows) for k in ("sent", "acked", "nacked", "dead", "cancelled")} == totals(
        db, "q"
    )
    assert all(r["minute_at"] % MINUTE == 0 for r in rows)


def test_archived_acks_and_take_acks_count(client: Client, db: Sql) -> None:
    client.create_queue("q", archive=True)
    client.send_batch("q", [b"1", b"2", b"3"])
    ms = client.take("q", 2)
    client.ack(ms[:1])  # archived as acked
    [_] = client.take("q", 1, ack=ms[1:])  # acked by the next take
    assert totals(db, "q") == dict(sent=3, acked=2, nacked=0, dead=0, cancelled=0)


def test_minutes_by_the_clock_and_maintain_folds_without_changing_totals(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    t0 = (db.now() // MINUTE - 3 * 1440) * MINUTE  # three days ago, on a minute
    db.send("q", [b"a", b"b"], t0 + 5)
    db.send("q", [b"c"], t0 + MINUTE + 5)
    [d] = db.take("q", 1, t0 + MINUTE + 10)
    db.call("ack", p_queue="q", p_ids=[d["id"]], p_tokens=[d["token"]], p_now=t0 + 2 * MINUTE)
    rows = minutes(db, "q", t0, t0 + 3 * MINUTE)
    assert [(r["minute_at"] - t0, r["sent"], r["acked"]) for r in rows] == [
        (0, 2, 0),
        (MINUTE, 1, 0),
        (2 * MINUTE, 0, 1),
    ]
    before = totals(db, "q")
    db.q("SELECT {s}.maintain()")
    assert minutes(db, "q", t0, t0 + 3 * MINUTE) == []  # older than a day: folded
    assert totals(db, "q") == before
    [folded] = db.q("SELECT * FROM {s}.queue_stat WHERE queue_id = %s", (db.queue_id("q"),))
    assert (folded["minute"], folded["sent"], folded["acked"]) == (0, 3, 1)
    db.send("q", [b"d"], t0 + 5)  # a late row of an old minute joins it on the next run
    db.q("SELECT {s}.maintain()")
    assert len(db.q("SELECT * FROM {s}.queue_stat WHERE queue_id = %s", (db.queue_id("q"),))) == 1
    assert totals(db, "q")["sent"] == 4


def test_a_rolled_back_send_counts_nothing(dsn: str, schema: str, db: Sql) -> None:
    db.call("queue_create", p_name="q")
    with psycopg.connect(dsn) as c:
        c.execute(sql.SQL("SELECT {}.send_batch('q', ARRAY['x'::bytea])").format(sql.Identifier(schema)))
        c.rollback()
    assert totals(db, "q")["sent"] == 0


def test_concurrent_writers_never_wait_for_a_counter_row(dsn: str, schema: str, db: Sql) -> None:
    db.call("queue_create", p_name="q")
    send = sql.SQL("SELECT {}.send_batch('q', ARRAY['x'::bytea])").format(sql.Identifier(schema))
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        a.execute(send)
        b.execute("SET lock_timeout = '2s'")
        b.execute(send)  # would time out if it waited for a row of a's
        b.execute(  # nor does a fold
            sql.SQL("SELECT {s}._stats_fold(0, ARRAY(SELECT id FROM {s}.queue))").format(
                s=sql.Identifier(schema)
            )
        )
        b.commit()
        a.commit()
    assert totals(db, "q")["sent"] == 2
    stat_rows = "SELECT * FROM {s}.queue_stat WHERE queue_id = %s"
    assert len(db.q(stat_rows, (db.queue_id("q"),))) == 2  # the fold did not see a's row
    # A worker's heartbeat folds the recent minutes into one row each.
    db.q("SELECT {s}.worker_beat('w', 'h', 1, ARRAY['q'], 1, 0)")
    assert len(db.q(stat_rows, (db.queue_id("q"),))) == 1
    assert totals(db, "q")["sent"] == 2


def test_dropping_a_queue_drops_its_counters(client: Client, db: Sql) -> None:
    client.create_queue("q")
    client.send("q", b"x")
    qid = db.queue_id("q")
    client.drop_queue("q")
    assert db.q("SELECT * FROM {s}.queue_stat WHERE queue_id = %s", (qid,)) == []


def test_stats_reads_check_their_window(client: Client, db: Sql) -> None:
    client.create_queue("q")
    with pytest.raises(psycopg.DatabaseError, match="7 days"):
        db.q("SELECT * FROM {s}.stats_minutes(NULL, 0, 8 * 86400000)")
    with pytest.raises(psycopg.DatabaseError, match="7 days"):
        db.q("SELECT * FROM {s}.stats_minutes(NULL, 10, 5)")
    assert db.q("SELECT * FROM {s}.stats_totals(ARRAY['nope'])") == []
    assert [r["queue"] for r in db.q("SELECT * FROM {s}.stats_totals()")] == ["q"]


def test_worker_registry_beats_expires_and_leaves(db: Sql) -> None:
    now = db.now() - 10 * MINUTE

    def beat(wid: str, at: int, in_flight: int = 0) -> None:
        db.q(
            "SELECT {s}.worker_beat(%s, 'host1', 42, ARRAY['a', 'b'], 8, %s, 30000, %s)",
            (wid, in_flight, at),
        )

    def listed(at: int) -> list[tuple[str, int, int, int]]:
        rows = db.q("SELECT * FROM {s}.worker_list(%s)", (at,))
        return [(r["id"], r["in_flight"], r["started_at"], r["heartbeat_at"]) for r in rows]

    beat("w1", now)
    beat("w2", now)
    beat("w1", now + 10_000, in_flight=3)
    assert listed(now + 20_000) == [("w1", 3, now, now + 10_000), ("w2", 0, now, now)]
    [w] = db.q("SELECT * FROM {s}.worker_list(%s) WHERE id = 'w1'", (now,))
    assert (w["host"], w["pid"], w["queues"], w["concurrency"]) == ("host1", 42, ["a", "b"], 8)
    # w2 stopped beating: stale after its TTL, gone after maintain.
    assert listed(now + 35_000) == [("w1", 3, now, now + 10_000)]
    db.q("SELECT {s}.maintain(p_now => %s)", (now + 35_000,))
    assert [r["id"] for r in db.q("SELECT id FROM {s}.worker")] == ["w1"]
    assert db.q("SELECT {s}.worker_leave('w1') AS x")[0]["x"] is True
    assert db.q("SELECT {s}.worker_leave('w1') AS x")[0]["x"] is False
    assert listed(now) == []
    with pytest.raises(psycopg.DatabaseError, match="worker id"):
        db.q("SELECT {s}.worker_beat('', 'h', 1, NULL, 1, 0)")


def test_message_list_pages_by_id_and_state(client: Client, db: Sql) -> None:
    client.create_queue("q")
    sent = [r.id for r in client.send_batch("q", [b"a", b"bb", b"ccc", b"d", b"e"])]
    client.send("q", b"later", delay=3600)
    [leased] = client.take("q", 1)

    def page(state: str | None, after: int | None, limit: int) -> list[tuple[int, str]]:
        rows = db.q("SELECT * FROM {s}.message_list('q', %s, %s, %s)", (state, after, limit))
        return [(r["id"], r["status"]) for r in rows]

    everything = page(None, None, 100)
    assert [s for _, s in everything] == ["leased", "ready", "ready", "ready", "ready", "scheduled"]
    assert page(None, None, 2) + page(None, everything[1][0], 100) == everything
    assert page("ready", None, 100) == [(i, "ready") for i in sent[1:]]
    assert page("leased", None, 100) == [(leased.id, "leased")]
    [row] = db.q("SELECT * FROM {s}.message_list('q', 'ready', NULL, 1)")
    assert row["payload_bytes"] == 2 and row["lease_until"] is None
    with pytest.raises(psycopg.DatabaseError, match="state must be"):
        db.q("SELECT * FROM {s}.message_list('q', 'dead')")
