"""Cost flat in the number of queues (issue 19): a queue is a row of the shared message table,
so a call locks the same few relations whether one queue exists or ten thousand, and never one
that belongs to another queue (there are none). Under the old layout (a partition per queue) a
generic plan locked every partition: the sixth take in a transaction held 5,004 locks at 500
queues and raised ``out of shared memory`` at about 3,000.

Each call runs in a transaction of its own with generic plans (what PL/pgSQL uses after five
calls; the hot paths force them), twice on a fresh connection (the first call of a session also
plans, and planning locks every index of the tables it reads), and the relations the transaction
then holds are read from ``pg_locks``. With PostgreSQL's defaults (``max_locks_per_transaction``
64, ``max_connections`` 100) the shared lock table has room for 6,400 of them: a call that holds
fewer than 64 can run on every connection at once. The counts below are small (300 queues, which
the old layout's generic plans would all have locked); the slow variants use 10,000.

Creating and dropping a queue is row work too: no DDL, no lock on a shared object stronger than
the row locks every call takes, so neither waits for another queue's work nor holds it up; and
the listings read one page of an index, not every queue.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import Sql, drop_schema, fresh_schema_name
from lonnymq import Client

#: The issue's count (the old layout raised ``out of shared memory`` near 3,000).
MANY = 10_000
#: Enough that a relation per queue could not hide in the counts (the old layout's generic
#: plans locked a partition and its indexes per queue: thousands of locks here).
FEW = 300
#: PostgreSQL's default max_locks_per_transaction.
DEFAULT_MAX_LOCKS = 64
#: What a rotation reads and writes besides messages (sql/generations.sql): fixed tables.
ROTATION = {
    "message_gen_pending",
    "message_gen_frozen",
    "message_gen_seq",
    "message_gen_started_seq",
    "message_gen_thaw_seq",  # (the thaw's turn)
    "message_gen_frozen_seq",  # (the frozen flag, migration 0023)
    "message_unlogged",  # (a sweep or thaw moves rows over the partitioned table)
}
#: What worker_beat's fold of the counters locks when one is due (every 10 s, by the clock).
FOLD = {"queue", "queue_stat", "queue_stat_fold_seq"}
#: The relation lock modes that conflict with nothing a call takes (only with table-level DDL,
#: VACUUM FULL, explicit LOCK TABLE, ...): no call can hold up another queue's calls with them.
ROW_LEVEL = {"AccessShareLock", "RowShareLock", "RowExclusiveLock"}

_seq = itertools.count()


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def _unique(prefix: str) -> str:
    return f"{prefix}{next(_seq)}"


def _make_world(dsn: str, others: int) -> str:
    """A schema with the queues the scenarios use and ``others`` more (every tenth unlogged,
    every fiftieth holding two messages), analysed."""
    schema = fresh_schema_name()
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = Sql(conn, schema)
        if others:
            db.q(
                "SELECT count({s}.queue_create('other' || i, p_unlogged => i %% 10 = 0))"
                "  FROM generate_series(1, %s) i",
                (others,),
            )
            db.q(
                "SELECT count(*) FROM generate_series(50, %s, 50) i,"
                " LATERAL {s}.send_batch('other' || i, ARRAY['\\x01', '\\x02']::bytea[])",
                (others,),
            )
        db.call("queue_create", p_name="plain")
        db.q("SELECT {s}.queue_create('chan', p_channel_max_concurrency => 2)")
        db.q("ANALYZE {s}.queue")
        db.q("ANALYZE {s}.message")
    return schema


@pytest.fixture(scope="module")
def alone(dsn: str) -> Iterator[str]:
    """Only the queues the scenarios use."""
    schema = _make_world(dsn, 0)
    yield schema
    drop_schema(dsn, schema)


@pytest.fixture(scope="module", params=[FEW, pytest.param(MANY, marks=pytest.mark.slow)], ids=["few", "many"])
def crowded(request: pytest.FixtureRequest, dsn: str) -> Iterator[str]:
    """The same queues among FEW or MANY others."""
    schema = _make_world(dsn, request.param)
    yield schema
    drop_schema(dsn, schema)


def _held(conn: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    """(relation, mode) of every relation lock this session holds, the schema left out of the
    names (pg_locks' own lock left out)."""
    rows = conn.execute(
        "SELECT l.relation::regclass::text, l.mode FROM pg_locks l"
        " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'"
        "   AND l.relation <> 'pg_catalog.pg_locks'::regclass"
    ).fetchall()
    return {(str(rel).rsplit(".", 1)[-1], str(mode)) for rel, mode in rows}


# -- the calls ----------------------------------------------------------------------------------
#
# Each scenario prepares what its call needs (sends, takes: committed, outside the measured
# transaction) and returns the call itself.

Scenario = Callable[[Sql], Callable[[], object]]


def _delivered(db: Sql, queue: str, n: int = 1, channel: str | None = None) -> list[dict[str, Any]]:
    now = db.now()
    db.send(queue, [b"x"] * n, now - 10, **({"p_channels": [channel] * n} if channel else {}))
    got = db.take(queue, n, now)
    assert len(got) == n
    return got


def _ids(got: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {"p_ids": [d["id"] for d in got], "p_tokens": [d["token"] for d in got]}


def _take_ack(db: Sql) -> Callable[[], object]:
    held = _delivered(db, "plain", 10)
    db.send("plain", [b"y"] * 10, db.now() - 10)
    return lambda: db.call(
        "take",
        p_queue="plain",
        p_limit=10,
        p_ack_ids=[d["id"] for d in held],
        p_ack_tokens=[d["token"] for d in held],
    )


def _drop(db: Sql) -> Callable[[], object]:
    name = _unique("gone")
    db.call("queue_create", p_name=name)
    db.send(name, [b"x", b"y"], db.now())
    return lambda: db.call("queue_drop", p_name=name)


SCENARIOS: dict[str, Scenario] = {
    "send": lambda db: lambda: db.send("plain", [b"x"], db.now()),
    "send with a key": lambda db: lambda: db.send("plain", [b"x"], db.now(), p_keys=[_unique("k")]),
    "send to a channel": lambda db: lambda: db.send("chan", [b"x"], db.now(), p_channels=[_unique("tenant")]),
    "take": lambda db: (db.send("plain", [b"x"], db.now() - 10), lambda: db.take("plain", 1, db.now()))[1],
    "take 10, acking 10": _take_ack,
    "take from channels": lambda db: (
        db.send("chan", [b"x"] * 3, db.now() - 10, p_channels=[_unique("t") for _ in range(3)]),
        lambda: db.take("chan", 3, db.now()),
    )[1],
    "take_tx": lambda db: (
        db.send("plain", [b"x"], db.now() - 10),
        lambda: db.call("take_tx", p_queue="plain", p_limit=1),
    )[1],
    "ack": lambda db: (lambda got: lambda: db.call("ack", p_queue="plain", **_ids(got)))(
        _delivered(db, "plain")
    ),
    "ack on channels": lambda db: (lambda got: lambda: db.call("ack", p_queue="chan", **_ids(got)))(
        _delivered(db, "chan", channel=_unique("t"))
    ),
    "nack": lambda db: (lambda got: lambda: db.call("nack", p_queue="plain", **_ids(got)))(
        _delivered(db, "plain")
    ),
    "extend": lambda db: (lambda got: lambda: db.call("extend", p_queue="plain", **_ids(got)))(
        _delivered(db, "plain")
    ),
    "give_up": lambda db: (lambda got: lambda: db.call("give_up", p_queue="plain", **_ids(got)))(
        _delivered(db, "plain")
    ),
    "peek": lambda db: lambda: db.call("peek", p_queue="plain", p_limit=10),
    "next_ready_in": lambda db: lambda: db.call("next_ready_in", p_queue="chan"),
    "metrics": lambda db: lambda: db.call("queue_metrics", p_name="chan"),
    "message_get": lambda db: lambda: db.call("message_get", p_queue="plain", p_key="nope"),
    "message_cancel": lambda db: (
        lambda got: lambda: db.call("message_cancel", p_queue="plain", p_ids=[got[0]["id"]])
    )(db.send("plain", [b"x"], db.now())),
    "channel_set": lambda db: lambda: db.q("SELECT * FROM {s}.channel_set('chan', 'a', 1)"),
    "channels": lambda db: lambda: db.q("SELECT * FROM {s}.channel_list('chan', 50, 'a')"),
    "list_queues, a page": lambda db: lambda: db.q("SELECT * FROM {s}.queue_list(50, 'other5')"),
    "stats_minutes": lambda db: lambda: db.q("SELECT * FROM {s}.stats_minutes(ARRAY['plain', 'chan'])"),
    "stats_totals": lambda db: lambda: db.q("SELECT * FROM {s}.stats_totals(ARRAY['plain', 'chan'])"),
    "queue_info": lambda db: lambda: db.q("SELECT * FROM {s}.queue_info(ARRAY['plain'])"),
    "worker_beat": lambda db: (
        lambda: db.q("SELECT {s}.worker_beat(%s, 'h', 1, ARRAY['plain'], 1, 0)", (_unique("w"),))
    ),
    "queue_create": lambda db: lambda: db.call("queue_create", p_name=_unique("new")),
    "queue_drop": _drop,
    "queue_purge": lambda db: (
        db.send("plain", [b"x"], db.now()),
        lambda: db.call("queue_purge", p_name="plain"),
    )[1],
    "rotate": lambda db: lambda: db.q("SELECT {s}.rotate(p_force => true)"),
    "maintain": lambda db: lambda: db.q("SELECT {s}.maintain()"),
}


def _locks_of(dsn: str, schema: str, scenario: Scenario) -> list[set[tuple[str, str]]]:
    """The relation locks the scenario's call holds in its transaction: on the first call of a
    fresh session (which plans), and on the second (cached plans)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        db = Sql(conn, schema)
        rounds = []
        for _ in range(2):
            call = scenario(db)
            with conn.transaction():
                call()
                rounds.append(_held(conn))
        return rounds


def _names(locks: set[tuple[str, str]]) -> set[str]:
    return {rel for rel, _ in locks}


def _tables(dsn: str, schema: str, names: set[str]) -> set[str]:
    """The tables of ``names``: an index stands for its table (which indexes a call locks
    depends on its plan, which depends on the table's size; which tables, not)."""
    with psycopg.connect(dsn) as conn:
        of = dict(
            conn.execute(
                "SELECT i.relname, t.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                " JOIN pg_class t ON t.oid = x.indrelid WHERE t.relnamespace = %s::regnamespace",
                (schema,),
            ).fetchall()
        )
    return {of.get(n, n) for n in names}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_call_locks_the_same_few_relations_among_many_queues(
    dsn: str, alone: str, crowded: str, name: str
) -> None:
    few = _locks_of(dsn, alone, SCENARIOS[name])
    many = _locks_of(dsn, crowded, SCENARIOS[name])
    # No table appears among many queues that the same call did not lock with only its own.
    alone_tables = _tables(dsn, alone, _names(few[0] | few[1]))
    # take() and maintain() rotate when a generation is due, and worker_beat() folds the
    # counters when a fold is due: either may fall in either world (on a fresh database the
    # first take rotates, the first beat folds), whatever ran before this test.
    alone_tables |= ROTATION | FOLD
    for held in many:
        # (The catalogs' own indexes come and go with the session's catalog cache.)
        ours = {n for n in _names(held) if not n.startswith("pg_")}
        assert _tables(dsn, crowded, ours) <= alone_tables, sorted(_names(held))
        assert len(_names(held)) < DEFAULT_MAX_LOCKS, sorted(_names(held))
        # Row-level modes only, on every relation (shared by all queues): nothing that waits
        # for, or holds up, another queue's calls.
        assert {mode for _, mode in held} <= ROW_LEVEL, sorted(held)


def test_a_transaction_of_every_call_stays_within_the_default_lock_budget(dsn: str, crowded: str) -> None:
    """All the calls above in one transaction of a fresh session: fewer relations than
    max_locks_per_transaction, none of them one queue's own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        db = Sql(conn, crowded)
        relations = {
            r["relname"]
            for r in db.q("SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace", (crowded,))
        }
        calls = [scenario(db) for scenario in SCENARIOS.values()]
        with conn.transaction():
            for _ in range(3):  # and again, on the plans the first round cached
                for call in calls[:-4]:  # but the purge, the drop, rotate and maintain
                    call()
            for call in calls[-4:]:
                call()
            held = _names(_held(conn))
    ours = {r for r in held if r in relations}
    assert len(held) < DEFAULT_MAX_LOCKS, sorted(held)
    assert {"message", "message_logged", "message_logged_pkey", "queue", "channel"} <= ours
    assert not [r for r in ours if r.removeprefix("message_").isdigit()]


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


# -- queue lifecycle under load ------------------------------------------------------------------


def _no_wait(dsn: str, schema: str) -> psycopg.Connection[Any]:
    """A session that fails (LockNotAvailable) instead of waiting more than a second for a lock."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET lock_timeout = '1s'")
    return conn


def test_creating_dropping_and_purging_queues_never_wait_for_other_queues_work(dsn: str, schema: str) -> None:
    setup = Sql(psycopg.connect(dsn, autocommit=True), schema)
    for name in ("a", "b", "c", "d", "e", "f", "g"):
        setup.call("queue_create", p_name=name)
        setup.send(name, [b"1", b"2", b"3"], setup.now() - 10)
    setup.conn.close()
    # Session A is in the middle of work on a..e: sent, took in its transaction, leased, sent to
    # a channel, purged, none of it committed yet.
    with psycopg.connect(dsn) as busy:
        a = Sql(busy, schema)
        a.send("a", [b"new"], a.now())
        assert len(a.call("take_tx", p_queue="b", p_limit=2)) == 2
        assert len(a.take("c", 3, a.now())) == 3
        a.send("d", [b"x"], a.now(), p_channels=["tenant"])
        a.call("queue_purge", p_name="e")
        # Meanwhile queues come and go, and others are purged.
        with _no_wait(dsn, schema) as other:
            b = Sql(other, schema)
            started = time.perf_counter()
            for i in range(20):
                b.call("queue_create", p_name=f"new{i}", p_unlogged=i % 2 == 1)
                b.send(f"new{i}", [b"x"], b.now())
            b.call("queue_purge", p_name="f")
            b.call("queue_drop", p_name="g")
            for i in range(20):
                b.call("queue_drop", p_name=f"new{i}")
            assert [q["name"] for q in b.q("SELECT * FROM {s}.queue_list(3)")] == ["a", "b", "c"]
            assert b.call("queue_metrics", p_name="b")[0]["ready"] == 3  # as committed
            elapsed = time.perf_counter() - started
        busy.rollback()
    # A wait for A's locks would last until A ends (after this): _no_wait's lock_timeout raises
    # then. The bound is a backstop with room for a loaded CI machine (load 6-12).
    assert elapsed < 60, elapsed


def test_queue_work_never_waits_for_queues_being_created_dropped_or_purged(dsn: str, schema: str) -> None:
    setup = Sql(psycopg.connect(dsn, autocommit=True), schema)
    for name in ("a", "chan", "gone", "emptied"):
        setup.call("queue_create", p_name=name)
        setup.send(name, [b"1", b"2", b"3"], setup.now() - 10)
    setup.send("chan", [b"1", b"2"], setup.now() - 10, p_channels=["t1", "t2"])
    setup.conn.close()
    # Session A creates, drops and purges queues and has not committed yet.
    with psycopg.connect(dsn) as admin:
        a = Sql(admin, schema)
        a.call("queue_create", p_name="fresh")
        a.call("queue_drop", p_name="gone")
        a.call("queue_purge", p_name="emptied")
        # Every call on the other queues goes on without waiting.
        with _no_wait(dsn, schema) as other:
            b = Sql(other, schema)
            now = b.now()
            b.send("a", [b"x"], now - 10, p_keys=["k"])
            got = b.take("a", 2, now)
            b.call("ack", p_queue="a", **_ids(got[:1]))
            b.call("nack", p_queue="a", **_ids(got[1:]))
            with other.transaction():
                assert len(b.call("take_tx", p_queue="a", p_limit=1)) == 1
            for d in b.take("chan", 2, now):
                b.call("ack", p_queue="chan", **_ids([d]))
            b.send("chan", [b"y"], now, p_channels=["t3"])
            b.q("SELECT * FROM {s}.channel_set('chan', 't1', 1)")
            assert b.call("queue_metrics", p_name="a")[0]["ready"] >= 1
            assert [q["name"] for q in b.q("SELECT * FROM {s}.queue_list()")] == [
                "a",
                "chan",
                "emptied",
                "gone",
            ]
            b.q("SELECT {s}.maintain()")
        admin.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [q["name"] for q in Sql(conn, schema).q("SELECT * FROM {s}.queue_list()")]
    assert names == ["a", "chan", "emptied", "fresh"]


# -- listings read one page ------------------------------------------------------------------------


def _rows_read(conn: psycopg.Connection[Any], schema: str, table: str) -> int:
    """Rows this transaction has read from ``table`` so far (sequential scans and index fetches)."""
    row = conn.execute(
        "SELECT coalesce(sum(seq_tup_read + idx_tup_fetch), 0) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = %s AND relname = %s",
        (schema, table),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _reads(conn: psycopg.Connection[Any], schema: str, table: str, query: str, params: Any = ()) -> int:
    """Rows the query read from ``table``, from the transaction's own statistics; the query runs
    seven times first (PL/pgSQL's generic plans)."""
    with conn.transaction():
        for _ in range(7):
            conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchall()  # type: ignore[arg-type]
        before = _rows_read(conn, schema, table)
        conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchall()  # type: ignore[arg-type]
        return _rows_read(conn, schema, table) - before


@pytest.mark.parametrize("settings", ["", "-c enable_seqscan=off -c jit=off"], ids=["default", "dashboard"])
def test_listing_a_page_of_queues_reads_that_page(dsn: str, schema: str, settings: str) -> None:
    """With 2,000 queues, a page of 50 (list_queues, the dashboard's counters and totals of a
    page, their settings, one queue's metrics) reads about 50 queue rows, on generic plans and
    on the dashboard's session settings (sequential scans off) alike; the whole listing reads
    all 2,000."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        Sql(conn, schema).q(
            "SELECT count({s}.queue_create('q' || lpad(i::text, 4, '0'))) FROM generate_series(1, 2000) i"
        )
        conn.execute(sql.SQL("ANALYZE {}.queue").format(sql.Identifier(schema)))
    page = [f"q{i:04d}" for i in range(1001, 1051)]
    with psycopg.connect(dsn, options=f"-c plan_cache_mode=force_generic_plan {settings}") as conn:
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.queue_list(50, 'q1000')") <= 51
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.stats_minutes(%s::text[])", (page,)) <= 100
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.stats_totals(%s::text[])", (page,)) <= 100
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.queue_info(%s::text[])", (page,)) <= 51
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.queue_metrics('q1500', 1000)") <= 2
        assert _reads(conn, schema, "queue", "SELECT * FROM {s}.queue_list()") >= 2000


def test_queue_info_gives_the_named_queues_as_queue_list_does(db: Sql) -> None:
    db.q("SELECT {s}.queue_create('dlq'), {s}.queue_create('uses', p_dead_letter_queue => 'dlq')")
    db.q("SELECT {s}.queue_create('paused'), {s}.queue_pause('paused'), {s}.queue_create('other')")
    listed = {r["name"]: r for r in db.q("SELECT * FROM {s}.queue_list()")}
    got = db.q("SELECT * FROM {s}.queue_info(ARRAY['uses', 'nope', 'paused', 'dlq', 'uses'])")
    assert got == [listed["dlq"], listed["paused"], listed["uses"]]
    assert (got[2]["dead_letter_queue"], got[1]["paused"]) == ("dlq", True)
    assert db.q("SELECT * FROM {s}.queue_info(ARRAY[]::text[])") == []


def test_queue_metrics_plans_its_statements_once_a_session(db: Sql) -> None:
    """queue_metrics, which the dashboard's overview calls for each queue of a page, pins
    generic plans (as take and ack do): left to choose, PL/pgSQL priced its statements' generic
    plans above custom ones and planned them again on every call (most of the call)."""
    [row] = db.q(
        "SELECT p.proconfig FROM pg_proc p WHERE p.oid = '{s}.queue_metrics(text, integer, bigint)'::regprocedure"
    )
    assert {"plan_cache_mode=force_generic_plan", "enable_seqscan=off", "jit=off"} <= set(row["proconfig"])


def test_listing_a_page_of_channels_reads_that_page(dsn: str, schema: str) -> None:
    """With 3,000 channels in a queue, a page of 50 channels and one channel's settings read
    about that many channel rows, on generic plans."""
    with Client(dsn, schema=schema, pool_size=1) as c:
        c.create_queue("q")
        c.create_queue("other")
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = Sql(conn, schema)
        for queue in ("other", "q"):
            db.send(queue, [b"x"] * 3000, db.now(), p_channels=[f"t{i:04d}" for i in range(3000)])
        conn.execute(sql.SQL("ANALYZE {}.channel").format(sql.Identifier(schema)))
    with psycopg.connect(dsn, options="-c plan_cache_mode=force_generic_plan") as conn:
        assert _reads(conn, schema, "channel", "SELECT * FROM {s}.channel_list('q', 50, 't2000')") <= 51
        assert _reads(conn, schema, "channel", "SELECT * FROM {s}.channel_set('q', 't2500', 2)") <= 5


def test_dropping_a_queue_among_many_reads_a_few_queue_rows(dsn: str, schema: str) -> None:
    """With 2,000 queues, dropping one reads a few queue rows (its own; whether a queue names it
    as its dead-letter queue, asked by queue_drop and by the foreign key, is an index probe:
    migration 0016), on generic plans, where it used to read every queue row twice."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        Sql(conn, schema).q(
            "SELECT count({s}.queue_create('q' || lpad(i::text, 4, '0'))) FROM generate_series(1, 2000) i"
        )
        Sql(conn, schema).q(
            "SELECT {s}.queue_create('dlq'), {s}.queue_create('uses', p_dead_letter_queue => 'dlq')"
        )
        conn.execute(sql.SQL("ANALYZE {}.queue").format(sql.Identifier(schema)))

    with psycopg.connect(dsn, options="-c plan_cache_mode=force_generic_plan") as conn, conn.transaction():
        db = Sql(conn, schema)
        for i in range(1, 8):  # PL/pgSQL's generic plans
            db.q(f"SELECT {{s}}.queue_drop('q{i:04d}')")
        before = _rows_read(conn, schema, "queue")
        db.q("SELECT {s}.queue_drop('q1500')")
        assert _rows_read(conn, schema, "queue") - before <= 10
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.Error, match="is the dead-letter queue of"),
    ):
        Sql(conn, schema).q("SELECT {s}.queue_drop('dlq')")  # still refused while a queue names it


def test_maintain_and_heartbeats_read_a_round_of_queues(dsn: str, schema: str) -> None:
    """With 2,000 queues that all counted something (two rows of the current minute and two of
    three days ago each), maintain() reads a round of 500 queue rows and those queues' counters
    (it read every queue row twice, and every counter row), and the rounds fold every queue's
    past within 2,000 / 500 calls, totals unchanged; a heartbeat folds the recent minutes of
    every queue, and the next ones within 10 s read no queue row (every beat of every worker
    read them all); generic plans."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = Sql(conn, schema)
        db.q("SELECT count({s}.queue_create('q' || lpad(i::text, 4, '0'))) FROM generate_series(1, 2000) i")
        now = db.now()
        db.q(
            "INSERT INTO {s}.queue_stat (queue_id, minute, sent, acked)"
            " SELECT q.id, m, 1, 1 FROM {s}.queue q, unnest(ARRAY[%s, %s, %s, %s]::bigint[]) m",
            (now // 60000, now // 60000, now // 60000 - 3 * 1440, now // 60000 - 3 * 1440),
        )
        conn.execute(sql.SQL("ANALYZE {}.queue").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("ANALYZE {}.queue_stat").format(sql.Identifier(schema)))
        totals = db.q("SELECT sum(sent) AS sent, sum(acked) AS acked FROM {s}.queue_stat")

    with psycopg.connect(dsn, options="-c plan_cache_mode=force_generic_plan") as conn:
        db = Sql(conn, schema)
        reads = []
        for _ in range(4):
            with conn.transaction():
                before = (_rows_read(conn, schema, "queue"), _rows_read(conn, schema, "queue_stat"))
                db.q("SELECT {s}.maintain(p_now => %s)", (now,))
                reads.append(
                    (
                        _rows_read(conn, schema, "queue") - before[0],
                        _rows_read(conn, schema, "queue_stat") - before[1],
                    )
                )
        assert all(q <= 520 and s <= 2 * 4 * 500 for q, s in reads), reads  # 4 rows a queue
        with conn.transaction():
            before_q = _rows_read(conn, schema, "queue")
            db.q("SELECT {s}.worker_beat('w1', 'h', 1, ARRAY['q0001'], 1, 0, 30000, %s)", (now,))
            first = _rows_read(conn, schema, "queue") - before_q
        with conn.transaction():
            before_q = _rows_read(conn, schema, "queue")
            db.q("SELECT {s}.worker_beat('w2', 'h', 1, ARRAY['q0001'], 1, 0, 30000, %s)", (now + 5000,))
            again = _rows_read(conn, schema, "queue") - before_q
        assert (first, again) == (2000, 0)

    with psycopg.connect(dsn, autocommit=True) as conn:
        db = Sql(conn, schema)
        rows = db.q("SELECT minute, count(*) AS n FROM {s}.queue_stat GROUP BY minute ORDER BY minute")
        assert [(r["minute"], r["n"]) for r in rows] == [(0, 2000), (now // 60000, 2000)]
        assert db.q("SELECT sum(sent) AS sent, sum(acked) AS acked FROM {s}.queue_stat") == totals
