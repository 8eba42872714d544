"""The frozen flag (sql/generations.sql, "The frozen flag"; migration 0023): a sequence that says
no queue has a frozen generation, so that take's and take_tx's first statement skips its probe
of message_gen_frozen. It may say "maybe" (1) wrongly, which costs the probe; it must never say
"none" (0) while a frozen row is committed, or takes would skip a backlog."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core_helpers import Sql, drop_schema, force_rotation, freeze_backlog, fresh_schema_name, table_scans
from lonnymq import Client


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def flag(db: Sql) -> int | None:
    return db.q("SELECT pg_sequence_last_value('{s}.message_gen_frozen_seq') AS v")[0]["v"]  # type: ignore[no-any-return]


def frozen_rows(db: Sql) -> int:
    return int(db.q("SELECT count(*) AS n FROM {s}.message_gen_frozen")[0]["n"])


@contextmanager
def rolled_back(db: Sql) -> Iterator[None]:
    """A transaction on ``db``'s connection that the block's end rolls back (by an error)."""
    with pytest.raises(psycopg.errors.RaiseException), db.conn.transaction():
        yield
        db.q("DO $$BEGIN RAISE EXCEPTION 'roll back'; END $$")


def no_rotation_due(db: Sql) -> None:
    """The last rotation set to now: no take rotates for the next 2 s (a rotation reads the table)."""
    db.q("SELECT setval('{s}.message_gen_started_seq', {s}.now_ms())")


def test_a_fresh_install_says_none_and_a_frozen_backlog_says_maybe_until_it_thaws(db: Sql) -> None:
    """Set with the first frozen row, kept while any is there, cleared by the rotation after the
    last thaw (not before: the thaw's own deletes are its transaction's, a rollback would undo them)."""
    assert flag(db) == 0
    db.call("queue_create", p_name="q")
    now = db.now()
    sent = freeze_backlog(db, "q", now)
    assert flag(db) == 1
    got = db.take("q", len(sent), now)
    assert [r["id"] for r in got] == sent
    db.call("ack", p_queue="q", p_ids=sent, p_tokens=[r["token"] for r in got], p_now=now)
    force_rotation(db, now)  # the thaw forgets the empty generation ...
    assert frozen_rows(db) == 0
    assert flag(db) == 1  # ... and leaves the flag to the next rotation
    force_rotation(db, now)
    assert flag(db) == 0


def test_a_row_written_by_hand_sets_the_flag(db: Sql) -> None:
    """Any writer of message_gen_frozen sets the flag (its column default), not only rotate()."""
    db.call("queue_create", p_name="q")
    qid = db.queue_id("q")
    db.q("INSERT INTO {s}.message_gen_frozen (queue_id, gens) VALUES (%s, ARRAY[1::bigint])", (qid,))
    assert flag(db) == 1
    db.q("DELETE FROM {s}.message_gen_frozen")
    db.q("SELECT setval('{s}.message_gen_frozen_seq', 0)")
    db.q(
        "INSERT INTO {s}.message_gen_frozen (queue_id, gens) VALUES (%s, ARRAY[2::bigint])"
        " ON CONFLICT (queue_id) DO UPDATE SET gens = excluded.gens",
        (qid,),
    )
    assert flag(db) == 1


def test_a_consumers_take_clears_the_flag_when_it_rotates(db: Sql, dsn: str) -> None:
    """The rotation that take() runs when one is due (through a driver, outside a caller's
    transaction: no transaction id yet) is one that may clear the flag; a take in a caller's
    transaction that has written does not rotate, and leaves it."""
    db.call("queue_create", p_name="q")
    db.q("SELECT setval('{s}.message_gen_frozen_seq', 1)")
    with psycopg.connect(dsn) as tx:  # a caller's transaction: send, then take
        Sql(tx, db.schema).send("q", [b"x", b"y"], db.now())
        db.q("SELECT setval('{s}.message_gen_started_seq', 1)")
        tx.execute(sql.SQL("SELECT * FROM {}.take('q', 1)").format(sql.Identifier(db.schema))).fetchall()
    assert flag(db) == 1
    with Client(dsn, schema=db.schema, pool_size=1) as client:
        assert len(client.take("q", 1)) == 1
    assert flag(db) == 0


def test_a_rotation_sets_a_flag_left_clear_beside_a_row(db: Sql) -> None:
    """A frozen row with the flag at 0 (a writer that raced a clearing rotation, a restored
    dump, a hand-made setval): the next rotation sets it."""
    db.call("queue_create", p_name="q")
    now = db.now()
    freeze_backlog(db, "q", now)
    db.q("SELECT setval('{s}.message_gen_frozen_seq', 0)")
    force_rotation(db, now)
    assert flag(db) == 1


def test_a_rolled_back_freeze_leaves_the_flag_set_and_a_later_rotation_clears_it(db: Sql) -> None:
    db.call("queue_create", p_name="q")
    now = db.now()
    db.send("q", [b"x"] * 20, now)
    with rolled_back(db):
        for _ in range(4):
            force_rotation(db, now)
        assert frozen_rows(db) == 1 and flag(db) == 1
    assert frozen_rows(db) == 0
    assert flag(db) == 1  # the safe side: a sequence is not rolled back
    db.q("SELECT {s}.queue_purge('q')")
    force_rotation(db, now)
    assert flag(db) == 0


def test_a_rotation_never_clears_on_its_own_uncommitted_deletes(
    db: Sql, conn: psycopg.Connection[Any]
) -> None:
    """A transaction that deleted the frozen rows itself (an earlier rotation's thaw in it, here
    by hand) must not clear the flag: a rollback would bring the rows back."""
    db.call("queue_create", p_name="q")
    now = db.now()
    freeze_backlog(db, "q", now)
    with rolled_back(db):
        db.q("DELETE FROM {s}.message_gen_frozen")
        force_rotation(db, now)
        assert flag(db) == 1
    assert frozen_rows(db) == 1 and flag(db) == 1


def test_a_rotation_in_repeatable_read_never_clears(db: Sql, dsn: str) -> None:
    """A REPEATABLE READ snapshot may predate a rotation's commit of a frozen row: a rotation
    there leaves the flag alone, even with the table empty."""
    db.call("queue_create", p_name="q")
    db.q("SELECT setval('{s}.message_gen_frozen_seq', 1)")
    now = db.now()
    with psycopg.connect(dsn) as tx:
        tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr = Sql(tx, db.schema)
        force_rotation(rr, now)
        assert flag(rr) == 1
    force_rotation(db, now)
    assert flag(db) == 0


@pytest.mark.parametrize("how", ["take", "take_tx", "drain"])
def test_takes_and_pops_find_a_frozen_backlog_first(db: Sql, how: str) -> None:
    """With the flag set, the head reads the frozen list: the backlog's oldest message comes
    before the window's, whether another queue or this one keeps it frozen."""
    db.call("queue_create", p_name="q")
    now = db.now()
    backlog = freeze_backlog(db, "q", now)
    newer = [r["id"] for r in db.send("q", [b"new"], now)]
    no_rotation_due(db)
    assert flag(db) == 1
    if how == "take":
        got = [r["id"] for r in db.take("q", 1, now)]
    elif how == "take_tx":
        got = [r["id"] for r in db.call("take_tx", p_queue="q", p_limit=1, p_now=now)]
    else:
        [first] = db.take("q", 1, now)
        assert first["id"] == backlog[0]
        got = [
            r["id"]
            for r in db.call(
                "take",
                p_queue="q",
                p_limit=1,
                p_ack_ids=[first["id"]],
                p_ack_tokens=[first["token"]],
                p_now=now,
            )
        ]
        backlog = backlog[1:]
    assert got == backlog[:1] and newer


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ"])
def test_a_pop_in_a_callers_transaction_finds_a_frozen_backlog(db: Sql, dsn: str, isolation: str) -> None:
    """take_tx in the caller's transaction (its snapshot taken by an earlier statement there):
    the flag read after it, the backlog's oldest message first; the rollback puts it back."""
    db.call("queue_create", p_name="q")
    now = db.now()
    backlog = freeze_backlog(db, "q", now)
    db.send("q", [b"new"], now)
    with psycopg.connect(dsn) as tx:
        tx.execute(sql.SQL("SET TRANSACTION ISOLATION LEVEL {}").format(sql.SQL(isolation)))
        caller = Sql(tx, db.schema)
        assert frozen_rows(caller) == 1 and flag(caller) == 1  # (the snapshot, in REPEATABLE READ)
        got = caller.call("take_tx", p_queue="q", p_limit=1, p_now=now)
        assert [r["id"] for r in got] == backlog[:1]
        tx.rollback()
    assert [r["id"] for r in db.call("take_tx", p_queue="q", p_limit=1, p_now=now)] == backlog[:1]


def test_a_hand_written_row_racing_a_clearing_rotation_is_flagged_by_the_next(db: Sql, dsn: str) -> None:
    """The limit of a writer outside rotate(): its row is not committed when a rotation sees the
    table empty and clears the flag; the next rotation sees the row and sets the flag again."""
    db.call("queue_create", p_name="q")
    now = db.now()
    db.q("SELECT setval('{s}.message_gen_frozen_seq', 1)")
    with psycopg.connect(dsn) as tx:
        writer = Sql(tx, db.schema)
        writer.q(
            "INSERT INTO {s}.message_gen_frozen (queue_id, gens) VALUES (%s, ARRAY[1::bigint])",
            (db.queue_id("q"),),
        )
        force_rotation(db, now)  # sees no committed row: clears
        assert flag(db) == 0
    assert frozen_rows(db) == 1
    force_rotation(db, now)
    assert flag(db) == 1


def test_a_rotation_waits_for_no_other_and_clears_nothing_under_one_in_flight(db: Sql, dsn: str) -> None:
    """A rotation whose freeze is not committed yet holds the rotation lock: another rotation
    returns at once (NULL) without touching the flag; once the freeze commits, rotations keep it."""
    db.call("queue_create", p_name="q")
    now = db.now()
    db.send("q", [b"x"] * 20, now)
    with psycopg.connect(dsn) as tx:
        first = Sql(tx, db.schema)
        for _ in range(4):
            force_rotation(first, now)
        assert flag(db) == 1 and frozen_rows(db) == 0  # set, the row not committed
        assert db.q("SELECT {s}.rotate(p_force => true, p_now => %s) AS g", (now,)) == [{"g": None}]
        assert flag(db) == 1
    assert frozen_rows(db) == 1
    force_rotation(db, now)
    assert flag(db) == 1


@pytest.mark.parametrize("frozen", [False, True], ids=["none frozen", "another queue frozen"])
def test_the_common_take_and_pop_do_not_read_the_frozen_table(
    db: Sql, conn: psycopg.Connection[Any], frozen: bool
) -> None:
    """take(1), take(1, ack=previous), take(10) and take_tx(1) (the lean pop) with no frozen
    generation anywhere: no scan of message_gen_frozen. With one (another queue's), they probe it.
    (A take that finds nothing in the window goes on to _lock_ready, which still reads the table.)"""
    db.call("queue_create", p_name="q")
    now = db.now()
    if frozen:
        db.call("queue_create", p_name="other")
        freeze_backlog(db, "other", now)
    db.send("q", [b"x"] * 20, now)
    no_rotation_due(db)
    with conn.transaction():
        before = table_scans(db, "message_gen_frozen")
        [one] = db.take("q", 1, now)
        db.call("take", p_queue="q", p_limit=1, p_ack_ids=[one["id"]], p_ack_tokens=[one["token"]], p_now=now)
        db.take("q", 10, now)
        db.call("take_tx", p_queue="q", p_limit=1, p_now=now)
        assert (table_scans(db, "message_gen_frozen") > before) is frozen


@pytest.mark.parametrize("seed", range(6))
def test_the_flag_never_says_none_beside_a_frozen_row(db: Sql, seed: int) -> None:
    """A random run of sends, takes (with and without acks), pops, forced and due rotations:
    after each step, a committed frozen row means the flag is set; every message sent is
    delivered (the frozen ones too) and, the backlogs gone, the flag clears."""
    rnd = random.Random(seed)
    queues = ["a", "b", "c"]
    for name in queues:
        db.call("queue_create", p_name=name, p_lease_ms=60_000)
    now = db.now()
    sent: set[int] = set()
    done: set[int] = set()
    leased: dict[str, list[dict[str, Any]]] = {name: [] for name in queues}
    froze = False
    for _ in range(60):
        q = rnd.choice(queues)
        step = rnd.choice(["send", "send", "take", "drain", "pop", "rotate", "rotate", "tick"])
        if step == "send":
            sent |= {r["id"] for r in db.send(q, [b"m"] * rnd.choice([1, 3, 12, 25]), now)}
        elif step == "take":
            leased[q] += db.take(q, rnd.choice([1, 4, 10]), now)
        elif step == "drain":
            prev = leased[q]
            got = db.call(
                "take",
                p_queue=q,
                p_limit=rnd.choice([1, 5]),
                p_ack_ids=[d["id"] for d in prev] or None,
                p_ack_tokens=[d["token"] for d in prev] or None,
                p_now=now,
            )
            done |= {d["id"] for d in prev}
            leased[q] = got
        elif step == "pop":
            done |= {r["id"] for r in db.call("take_tx", p_queue=q, p_limit=rnd.choice([1, 3]), p_now=now)}
        elif step == "rotate":
            force_rotation(db, now)
        else:
            now += 2500  # a rotation is due at the next take
        if frozen_rows(db):
            froze = True
            assert flag(db) == 1, f"step {step}: a frozen row and the flag at {flag(db)}"
    # Everything left, taken and acknowledged: the frozen rows are delivered too.
    for q in queues:
        db.call(
            "ack",
            p_queue=q,
            p_ids=[d["id"] for d in leased[q]],
            p_tokens=[d["token"] for d in leased[q]],
            p_now=now,
        )
        done |= {d["id"] for d in leased[q]}
        while got := db.call("take_tx", p_queue=q, p_limit=7, p_now=now):
            assert not {r["id"] for r in got} & done
            done |= {r["id"] for r in got}
            if frozen_rows(db):
                assert flag(db) == 1
    assert froze and done == sent
    for _ in range(3):
        force_rotation(db, now)
        if frozen_rows(db):
            assert flag(db) == 1
    assert frozen_rows(db) == 0 and flag(db) == 0


@pytest.fixture
def new_schema(dsn: str) -> Iterator[str]:
    """A schema name nothing has been installed into yet (dropped afterwards)."""
    name = fresh_schema_name()
    yield name
    drop_schema(dsn, name)


@pytest.mark.parametrize("rows", [0, 2])
def test_the_upgrade_sets_the_flag_from_the_frozen_rows_there(
    dsn: str, new_schema: str, conn: psycopg.Connection[Any], rows: int
) -> None:
    """Migration 0023 on a database with frozen generations leaves the flag set; on one without,
    clear."""
    with Client(dsn, schema=new_schema, pool_size=1) as c:
        c.migrate(target=22)
        db = Sql(conn, new_schema)
        for qid in range(rows):
            db.q("INSERT INTO {s}.message_gen_frozen (queue_id, gens) VALUES (%s, ARRAY[1::bigint])", (qid,))
        c.migrate()
    assert flag(db) == (1 if rows else 0)
    assert frozen_rows(db) == rows
