"""The sweep of pending generations (sql/generations.sql, issue 19): a generation that left the
window stays pending while a row of it is held or a writer still holds it, and many small queues
keep it frozen. A rotation then does work for what is left there, not for the rows the frozen
queues keep (it used to walk every row of the generation three times a rotation: 60,000 rows
at 10,000 queues), and what was held or committed late is still delivered."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_scale import _rows_read

from core_helpers import Sql

QUEUES = 300  # small queues of 6 messages: 1,800 rows in one generation
MAX_MOVES = 50  # rotate()'s p_max_moves: most of those queues stay frozen there
WALK = QUEUES * 6  # the rows a walk of that generation reads


@pytest.fixture
def db(conn: psycopg.Connection[Any], schema: str) -> Sql:
    return Sql(conn, schema)


def _rotation_reads(db: Sql, now: int) -> int:
    """Message rows read by one forced rotation (in a transaction of its own). Sequential scans
    are ruled out: on this small table the planner would scan it whole for a move by ctid (a
    TID scan on a table of any size), which counts every row whatever the sweep visits."""
    with db.conn.transaction():
        db.q("SET LOCAL enable_seqscan = off")
        before = _rows_read(db.conn, db.schema, "message_logged")
        db.q("SELECT {s}.rotate(p_force => true, p_max_moves => %s, p_now => %s)", (MAX_MOVES, now))
        return _rows_read(db.conn, db.schema, "message_logged") - before


def _pending(db: Sql) -> list[int]:
    rows = db.q(
        "SELECT p.gen FROM {s}.message_gen_pending p, {s}.message_gen_seq s"
        " WHERE p.gen < s.last_value - 1 ORDER BY 1"
    )
    return [r["gen"] for r in rows]


def _many_small_queues(db: Sql, now: int) -> None:
    db.q(
        "SELECT count({s}.queue_create('q' || lpad(i::text, 4, '0'))) FROM generate_series(1, %s) i",
        (QUEUES,),
    )
    db.q(
        "SELECT count(*) FROM generate_series(1, %s) i, LATERAL {s}.send_batch("
        "'q' || lpad(i::text, 4, '0'), ARRAY['a', 'b', 'c', 'd', 'e', 'f']::bytea[], p_now => %s)",
        (QUEUES, now),
    )


def test_a_held_row_costs_a_rotation_its_queue_not_the_generation(dsn: str, db: Sql, schema: str) -> None:
    db.call("queue_create", p_name="held")
    now = db.now()
    [kept] = db.send("held", [b"x"], now)  # the smallest queue there: it is moved, not frozen
    _many_small_queues(db, now)
    with psycopg.connect(dsn) as holder:  # a take or an ack holding the row
        holder.execute(f'SELECT 1 FROM "{schema}".message WHERE id = %s FOR UPDATE', (kept["id"],))
        for _ in range(3):  # the generation leaves the window; its first sweep skips the row
            _rotation_reads(db, now)
        [stuck] = _pending(db)
        reads = [_rotation_reads(db, now) for _ in range(3)]
        assert _pending(db) == [stuck]
        holder.rollback()
    print(f"\nmessage rows read by a rotation while one row is held: {reads}")
    # Its queue's few rows and the thaw's round (MAX_MOVES frozen queues: their rows counted,
    # some moved), not the 1,800 rows of the generation that the frozen queues keep there
    # (walked three times a rotation before: 5,400 and more).
    assert max(reads) < WALK // 4, reads
    _rotation_reads(db, now)
    assert _pending(db) == []
    assert [d["id"] for d in db.take("held", 5, now)] == [kept["id"]]
    # The frozen queues' messages are all there, in order.
    assert [len(db.take(f"q{i:04d}", 10, now)) for i in (1, QUEUES // 2, QUEUES)] == [6, 6, 6]


def test_a_late_writer_costs_a_pass_over_the_queues_once(dsn: str, db: Sql, schema: str) -> None:
    db.call("queue_create", p_name="late")
    now = db.now()
    with psycopg.connect(dsn) as writer:  # a long transaction that sent into this generation
        [late] = Sql(writer, schema).send("late", [b"late"], now)
        _many_small_queues(db, now)
        for _ in range(3):
            _rotation_reads(db, now)
        [stuck] = _pending(db)
        waiting = [_rotation_reads(db, now) for _ in range(3)]
        assert _pending(db) == [stuck]  # the writer holds it
        writer.commit()
    # Once the writer is gone, the next rotation passes over the generation's queues once (up
    # to 10 * MAX_MOVES of them a rotation, one descent each, frozen queues' rows passed over),
    # finds its message and finishes the generation: a late message waits one rotation.
    passing = _rotation_reads(db, now)
    print(f"\nmessage rows read by a rotation: writer there {waiting}, pass {passing}")
    assert _pending(db) == []
    assert max(waiting) < WALK // 4, waiting
    assert passing < WALK // 4, passing
    assert [d["id"] for d in db.take("late", 5, now)] == [late["id"]]
    assert [len(db.take(f"q{i:04d}", 10, now)) for i in (1, QUEUES // 2, QUEUES)] == [6, 6, 6]


BACKLOG = 20_000  # a queue's backlog frozen in one generation


def _index_entries_read(db: Sql, table: str) -> int:
    """Index entries of ``table`` this transaction has read so far, all its indexes."""
    [row] = db.q(
        "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)::bigint AS n"
        " FROM pg_index i WHERE i.indrelid = %s::regclass",
        (sql.Identifier(db.schema, table).as_string(db.conn),),
    )
    return int(row["n"])


def _frozen_backlog(db: Sql) -> tuple[int, list[int]]:
    """Queue ``big`` with BACKLOG messages frozen in one generation, statistics taken while
    they were all in it. Returns (now, the frozen list)."""
    db.call("queue_create", p_name="big")
    now = db.now()
    db.q("SELECT {s}.rotate(p_force => true, p_now => %s)", (now,))
    for _ in range(0, BACKLOG, 5000):
        db.send("big", [b"x"] * 5000, now)
    db.q("ALTER TABLE {s}.message_logged SET (autovacuum_enabled = false)")
    db.q("ANALYZE {s}.message_logged")
    for _ in range(2):  # the backlog's generation leaves the window: frozen
        _rotation_entries(db, now)
    [frozen] = db.q("SELECT f.gens FROM {s}.message_gen_frozen f")
    assert len(frozen["gens"]) == 1
    return now, frozen["gens"]


def _rotation_entries(db: Sql, now: int) -> int:
    """Index entries of message_logged read by one forced rotation, with take()'s settings (a
    rotation runs inside a take: enable_seqscan = off)."""
    with db.conn.transaction():
        db.q("SET LOCAL enable_seqscan = off")
        before = _index_entries_read(db, "message_logged")
        db.q("SELECT {s}.rotate(p_force => true, p_max_moves => %s, p_now => %s)", (MAX_MOVES, now))
        return _index_entries_read(db, "message_logged") - before


def test_a_frozen_backlog_costs_a_rotation_its_bounded_counts_not_the_queue(db: Sql) -> None:
    """The thaw counts at most p_max_moves + 1 rows of a frozen generation, by the dequeue
    index. With statistics taken while the queue's rows were all in one generation (a backlog
    sent at once, as the producers benchmark's), the planner priced ``gen = $1`` as matching
    every row, and with take()'s settings read the count by a bitmap of the primary key's range
    of the queue: every message of the queue, twice, at every rotation (22-30 ms at 300,000
    messages in a drain's rotations; docs/benchmarks.md, branch longdrain)."""
    now, frozen = _frozen_backlog(db)
    reads = [_rotation_entries(db, now) for _ in range(2)]
    print(f"\nindex entries read by a rotation with a frozen backlog of {BACKLOG}: {reads}")
    # The thaw's count (MAX_MOVES + 1) and its probe of the generation (one), not 20,000 twice.
    assert max(reads) <= 2 * (MAX_MOVES + 1) + 10, reads
    assert [f["gens"] for f in db.q("SELECT f.gens FROM {s}.message_gen_frozen f")] == [frozen]
    assert len(db.take("big", BACKLOG, now)) == BACKLOG
