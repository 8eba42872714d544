"""Takes while another transaction rotates (sql/generations.sql, "The rotor"; migration 0024).

A rotation's nextval of message_gen_seq is seen by every session at once; what it does to the
generation leaving the window (G-2) is not, until it commits: a backlog it freezes there stays
committed and unlocked, but its frozen row is invisible. A take that read only the new window
and the frozen list came back empty while the backlog was ready. These tests hold the rotation
open on a second connection (A) by not committing it, and take on the first (B)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from core_helpers import FREEZE_MAX_MOVES, Sql, force_rotation


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


@pytest.fixture
def rotor(dsn: str, schema: str) -> Iterator[Sql]:
    """A second connection (not autocommit): its rotation stays open until the test commits or
    rolls it back."""
    with psycopg.connect(dsn) as other:
        yield Sql(other, schema)
        other.rollback()


def gen(db: Sql) -> int:
    return int(db.q("SELECT pg_sequence_last_value('{s}.message_gen_seq') AS g")[0]["g"])


def in_leaving_generation(db: Sql, queue: str, payloads: list[bytes], now: int) -> list[int]:
    """``payloads`` sent to ``queue`` (their ids returned), then one rotation: they are in G-1,
    the generation the next rotation pushes out of the window."""
    force_rotation(db, now)
    force_rotation(db, now)  # (both generations of the window on record: the next ones move it)
    sent = [r["id"] for r in db.send(queue, payloads, now)]
    g = gen(db)
    force_rotation(db, now)
    assert gen(db) == g + 1
    return sent


def rotate_open(rotor: Sql, now: int, max_moves: int = FREEZE_MAX_MOVES) -> int:
    """A rotation on ``rotor``'s connection, left uncommitted; returns the new generation."""
    got = rotor.q(
        "SELECT {s}.rotate(p_force => true, p_max_moves => %s, p_now => %s) AS g", (max_moves, now)
    )[0]["g"]
    assert got is not None
    return int(got)


def unsettled(db: Sql) -> bool:
    """Whether the rotor's rotation is unsettled for a statement of ``db``'s connection."""
    return bool(db.q("SELECT {s}._gen_rotor_unsettled() AS u")[0]["u"])


@pytest.mark.parametrize("how", ["batch", "take1", "drain", "take_tx", "take_tx_batch", "pop"])
def test_a_take_during_a_freezing_rotation_gets_the_backlog(db: Sql, rotor: Sql, how: str) -> None:
    """The reproduction: 10 messages in the generation that an uncommitted rotation freezes
    (p_max_moves 5 < 10). Before the rotor, every take here found nothing until it committed."""
    db.call("queue_create", p_name="rt")
    now = db.now()
    sent = in_leaving_generation(db, "rt", [b"%d" % i for i in range(11)], now)
    first = db.take("rt", 1, now) if how == "drain" else []  # a delivery for the drain to ack
    g = rotate_open(rotor, now)
    assert gen(db) == g  # the window moved for everyone ...
    assert db.q("SELECT count(*) AS n FROM {s}.message_gen_frozen")[0]["n"] == 0  # ... not the freeze
    if how == "batch":
        got = db.take("rt", 10, now)
        assert [r["id"] for r in got] == sent[:10]
    elif how == "take1":
        got = db.take("rt", 1, now)
        assert [r["id"] for r in got] == sent[:1]
    elif how == "drain":
        got = db.take("rt", 1, now, p_ack_ids=[first[0]["id"]], p_ack_tokens=[first[0]["token"]])
        assert [r["id"] for r in got] == sent[1:2]
        assert db.row("rt", first[0]["id"]) is None  # acknowledged
    else:
        limit = 1 if how in ("take_tx", "pop") else 4
        with db.conn.transaction():
            if how == "pop":
                got = db.call("pop", p_queue="rt", p_limit=limit, p_now=now)
            else:
                got = db.call("take_tx", p_queue="rt", p_limit=limit, p_now=now)
            assert [r["id"] for r in got] == sent[:limit]
        assert all(db.row("rt", i) is None for i in sent[:limit])
    assert unsettled(db) and not unsettled(rotor)  # (its own rotation: settled for it)
    rotor.conn.commit()
    rest = db.take("rt", 20, now)
    taken = {r["id"] for r in got} | {r["id"] for r in first}
    assert sorted(taken | {r["id"] for r in rest}) == sent  # each once
    assert not taken & {r["id"] for r in rest}


def test_the_general_path_takes_the_leaving_generation_first(db: Sql, rotor: Sql) -> None:
    """FIFO on the general path (_lock_ready: here take_tx with archiving): the backlog the
    rotation is pushing out (G-2) before the newer rows of the window. (The lean statements do
    not read G-2: during the rotation's flight they may hand out the window's rows first, and a
    batch they leave short goes on to G-2 on the general path; every row still comes once.)"""
    db.call("queue_create", p_name="rt")
    now = db.now()
    backlog = in_leaving_generation(db, "rt", [b"old%d" % i for i in range(10)], now)
    newer = [r["id"] for r in db.send("rt", [b"new%d" % i for i in range(3)], now)]
    rotate_open(rotor, now)
    got = [r["id"] for r in db.call("take_tx", p_queue="rt", p_limit=5, p_archive=True, p_now=now)]
    assert got == backlog[:5]
    got += [r["id"] for r in db.call("take_tx", p_queue="rt", p_limit=20, p_archive=True, p_now=now)]
    assert got == backlog + newer
    assert [r["id"] for r in db.archive("rt")] == backlog + newer


def test_a_short_lean_batch_goes_on_to_the_leaving_generation(db: Sql, rotor: Sql) -> None:
    """The lean batch finds the window's 3 rows, fewer than asked: the rotation is unsettled,
    so the general path reads G-2 for the rest, in the same call."""
    db.call("queue_create", p_name="rt")
    now = db.now()
    backlog = in_leaving_generation(db, "rt", [b"old%d" % i for i in range(10)], now)
    newer = [r["id"] for r in db.send("rt", [b"new%d" % i for i in range(3)], now)]
    rotate_open(rotor, now)
    got = [r["id"] for r in db.take("rt", 8, now)]
    assert got == newer + backlog[:5]
    rotor.conn.commit()
    got += [r["id"] for r in db.take("rt", 20, now)]
    assert sorted(got) == backlog + newer


def test_rows_a_rotation_moves_are_held_until_it_commits(db: Sql, rotor: Sql) -> None:
    """A queue whose few rows the rotation moves forward ('small': held by it, skipped, then
    taken after its commit with their ids and first attempt) beside one whose backlog it
    freezes ('big': taken at once). No row is delivered twice."""
    db.call("queue_create", p_name="small")
    db.call("queue_create", p_name="big")
    now = db.now()
    force_rotation(db, now)
    force_rotation(db, now)
    small = [r["id"] for r in db.send("small", [b"s%d" % i for i in range(3)], now)]
    big = [r["id"] for r in db.send("big", [b"b%d" % i for i in range(10)], now)]
    force_rotation(db, now)
    g = rotate_open(rotor, now)
    assert db.take("small", 10, now) == []  # held by the rotation (moved into G)
    assert [r["id"] for r in db.take("big", 10, now)] == big
    rotor.conn.commit()
    got = db.take("small", 10, now)
    assert [r["id"] for r in got] == small
    assert [(r["attempt"], r["token"]) for r in got] == [(1, 1)] * 3
    assert {db.row("small", i)["gen"] for i in small} == {g}  # type: ignore[index]
    assert db.take("small", 10, now) == [] and db.take("big", 10, now) == []


def test_a_rotation_that_rolls_back_after_its_nextval(db: Sql, rotor: Sql) -> None:
    """The window has moved, its freeze is undone: the backlog is back in G-2, unfrozen, until
    the next rotation sweeps it. Takes read G-2 meanwhile (the rotor's rotation aborted), and a
    committed rotation settles it again."""
    db.call("queue_create", p_name="rt")
    now = db.now()
    sent = in_leaving_generation(db, "rt", [b"%d" % i for i in range(10)], now)
    g = rotate_open(rotor, now)
    rotor.conn.rollback()
    assert gen(db) == g
    assert db.q("SELECT count(*) AS n FROM {s}.message_gen_frozen")[0]["n"] == 0
    got = [r["id"] for r in db.take("rt", 4, now)]
    assert got == sent[:4]
    assert unsettled(db)
    # The next rotation sweeps G-2 (pending: on record since before the window moved), which
    # freezes it for the queue, and puts the new generation on record, the window staying: the
    # rotor is still the aborted one, and G-2, now in the frozen list too, is read once.
    force_rotation(db, now)
    assert gen(db) == g and unsettled(db)
    assert db.q("SELECT {s}._gen_frozen_of(%s) AS f", (db.queue_id("rt"),))[0]["f"] == [g - 2]
    got += [r["id"] for r in db.take("rt", 3, now)]
    assert got == sent[:7]
    force_rotation(db, now)  # the window moves again, committed: settled
    assert gen(db) == g + 1 and not unsettled(db)
    got += [r["id"] for r in db.take("rt", 20, now)]
    assert got == sent


def test_after_the_commit_a_take_reads_the_frozen_list_not_the_rotor(db: Sql, rotor: Sql) -> None:
    """Settled: the rotation's frozen row is visible, the rotor says nothing more; a lean
    statement's frozen list read before that commit is stale (_gen_unsettled), one read after
    is not."""
    db.call("queue_create", p_name="rt")
    qid = db.queue_id("rt")
    now = db.now()
    in_leaving_generation(db, "rt", [b"%d" % i for i in range(10)], now)
    g = rotate_open(rotor, now)
    assert db.q("SELECT {s}._gen_unsettled(%s, NULL) AS u", (qid,))[0]["u"] is True
    rotor.conn.commit()
    assert not unsettled(db)
    frozen = db.q("SELECT {s}._gen_frozen_of(%s) AS f", (qid,))[0]["f"]
    assert frozen == [g - 2]
    assert db.q("SELECT {s}._gen_unsettled(%s, NULL) AS u", (qid,))[0]["u"] is True
    assert db.q("SELECT {s}._gen_unsettled(%s, %s) AS u", (qid, frozen))[0]["u"] is False


def test_a_rotating_take_does_not_read_the_generation_twice(db: Sql) -> None:
    """A take that rotated itself sees its own freeze: its own rotation is settled for it, and
    _lock_ready would not add G-2 again to a list that has it (a row locked twice by one
    transaction would be returned twice)."""
    db.call("queue_create", p_name="rt")
    now = db.now()
    sent = in_leaving_generation(db, "rt", [b"%d" % i for i in range(10)], now)
    with db.conn.transaction():
        force_rotation(db, now)
        got = [r["id"] for r in db.call("take_tx", p_queue="rt", p_limit=20, p_archive=True, p_now=now)]
        assert not unsettled(db)
    assert got == sent
