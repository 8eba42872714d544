"""Cost flat in the number of queues (issue 19): a queue is a row of the shared message table,
so a call locks the same relations whether one queue exists or thousands, and never one that
belongs to another queue. Under the old layout (a partition per queue) a generic plan locked
every partition: the sixth take in a transaction held 5,004 locks at 500 queues and raised
``out of shared memory`` at about 3,000."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from core_helpers import Sql

QUEUES = 3000


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def _relations_locked(db: Sql) -> list[str]:
    """The relations of the schema that this session holds locks on."""
    return sorted(
        {
            r["relname"]
            for r in db.q(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'"
                "   AND c.relnamespace = %s::regnamespace",
                (db.schema,),
            )
        }
    )


def _workload(db: Sql, plain: str, channels: str) -> list[str]:
    """Every hot call, eight times in one transaction with generic plans (what PL/pgSQL uses
    after five calls), then the relations the transaction holds locks on."""
    db.conn.execute("SET plan_cache_mode = force_generic_plan")
    now = db.now()
    with db.conn.transaction():
        for i in range(8):
            db.send(plain, [b"p"], now - 10, p_keys=[f"k{i}"])
            db.send(channels, [b"c"], now - 10, p_channels=[f"tenant{i % 3}"])
            for queue in (plain, channels):
                [d] = db.take(queue, 1, now)
                db.call("extend", p_queue=queue, p_ids=[d["id"]], p_tokens=[d["token"]], p_now=now)
                if i % 2:
                    db.call("ack", p_queue=queue, p_ids=[d["id"]], p_tokens=[d["token"]], p_now=now)
                else:
                    db.call("nack", p_queue=queue, p_ids=[d["id"]], p_tokens=[d["token"]], p_now=now)
            db.call("message_get", p_queue=plain, p_key=f"k{i}")
            db.call("queue_metrics", p_name=plain)
            db.call("take_tx", p_queue=plain, p_limit=1, p_now=now)
        held = _relations_locked(db)
    db.conn.execute("RESET plan_cache_mode")
    return held


@pytest.mark.slow
def test_calls_lock_the_same_relations_with_one_queue_or_thousands(db: Sql) -> None:
    db.call("queue_create", p_name="plain")
    db.call("queue_create", p_name="chan")
    few = _workload(db, "plain", "chan")
    db.q(
        "SELECT {s}.queue_create('other' || i, p_unlogged => i %% 10 = 0) FROM generate_series(1, %s) i",
        (QUEUES,),
    )
    db.call("queue_create", p_name="plain2")
    db.call("queue_create", p_name="chan2")
    many = _workload(db, "plain2", "chan2")
    # The first workload of a session also plans (and locks what planning reads); the second
    # runs cached generic plans. Either way no relation appears that one queue did not need.
    assert set(many) <= set(few), sorted(set(many) - set(few))
    assert len(many) < 40, many
    assert not [r for r in many if r.removeprefix("message_").isdigit()]
    assert {"message", "message_logged", "message_logged_pkey"} <= set(many)


def test_creating_and_dropping_a_queue_is_no_ddl(db: Sql) -> None:
    relations = "SELECT count(*) AS n FROM pg_class WHERE relnamespace = %s::regnamespace"
    before = db.q(relations, (db.schema,))
    db.call("queue_create", p_name="a")
    db.call("queue_create", p_name="b", p_unlogged=True)
    assert db.q(relations, (db.schema,)) == before
    db.send("a", [b"x"], db.now())
    db.send("b", [b"y"], db.now())
    db.call("queue_purge", p_name="a")
    db.call("queue_drop", p_name="a")
    db.call("queue_drop", p_name="b")
    assert db.q(relations, (db.schema,)) == before
    assert db.q("SELECT count(*) AS n FROM {s}.message") == [{"n": 0}]


def test_purge_and_drop_leave_other_queues_alone(db: Sql) -> None:
    for name, unlogged in (("a", False), ("b", False), ("u", True), ("v", True)):
        db.call("queue_create", p_name=name, p_unlogged=unlogged)
        db.send(name, [b"1", b"2"], db.now())
    db.call("queue_purge", p_name="a")
    db.call("queue_drop", p_name="u")
    counts = db.q("SELECT q.name, count(m.id) AS n FROM {s}.queue q LEFT JOIN {s}.message m ON m.queue_id = q.id"
                  " GROUP BY q.name ORDER BY q.name")  # fmt: skip
    assert [(r["name"], r["n"]) for r in counts] == [("a", 0), ("b", 2), ("v", 2)]
