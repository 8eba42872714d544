"""The SQL side of the Spark connector (src/lonnymq/sql/spark.sql), called directly: no Spark needed.

Staging commit/abort/sweep for exactly-once writes, the sink commit log, and the per-stream
delivery log behind the streaming source. Time is passed as p_now, never slept."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client

Conn = psycopg.Connection[Any]


def call(conn: Conn, schema: str, function: str, **params: Any) -> list[tuple[Any, ...]]:
    """``SELECT * FROM schema.function(p_x => %s, ...)`` with explicit casts."""
    casts = {
        "p_run": "uuid",
        "p_stream": "uuid",
        "p_parts": "bigint[]",
        "p_counts": "bigint[]",
        "p_limit": "int",
        "p_chunk": "int",
        "p_archive": "bool",
        "p_queue": "text",
        "p_sink": "text",
        "p_on_conflict": "text",
        "p_retention_ms": "bigint",
        "p_content_type": "text",
    }
    args = sql.SQL(", ").join(
        sql.SQL("{} => %s::{}").format(sql.Identifier(k), sql.SQL(casts.get(k, "bigint")))  # type: ignore[arg-type]
        for k in params
    )
    query = sql.SQL("SELECT * FROM {}.{}({})").format(sql.Identifier(schema), sql.Identifier(function), args)
    return conn.execute(query, list(params.values())).fetchall()


def stream_ids(conn: Conn, schema: str, stream: uuid.UUID, chunks: list[tuple[Any, ...]]) -> list[int]:
    """The ids spark_stream_read returns for the (batch, chunk, n) rows of spark_stream_chunks."""
    return [
        r[1]
        for c in chunks
        for r in call(conn, schema, "spark_stream_read", p_stream=stream, p_batch=c[0], p_chunk=c[1])
    ]


def stage(conn: Conn, schema: str, run: uuid.UUID, part: int, payloads: list[str], queue: str = "q") -> int:
    s = sql.Identifier(schema)
    conn.execute(
        sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (%s, %s, %s)").format(s),
        (part, run, queue),
    )
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {}.spark_stage (part, seq, payload, content_type) VALUES (%s, %s, %s, 'text/plain; charset=utf-8')"
            ).format(s),
            [(part, i, p.encode()) for i, p in enumerate(payloads)],
        )
    return part


def staged(conn: Conn, schema: str) -> list[int]:
    rows = conn.execute(
        sql.SQL("SELECT DISTINCT part FROM {}.spark_stage ORDER BY 1").format(sql.Identifier(schema))
    )
    return [r[0] for r in rows]


def payloads(client: Client, queue: str = "q") -> list[str]:
    return [m.payload for m in sorted(client.peek(queue, 1000), key=lambda m: m.id)]


def test_commit_moves_exactly_the_reported_parts_in_order(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q")
    run, other = uuid.uuid4(), uuid.uuid4()
    a = stage(conn, schema, run, 11, ["a0", "a1", "a2"])
    b = stage(conn, schema, run, 22, ["b0", "b1"])
    stage(conn, schema, run, 33, ["failed-attempt"] * 4)  # a failed attempt: never reported
    d = stage(conn, schema, other, 44, ["other-write"])  # another write's staging
    [row] = call(conn, schema, "spark_write_commit", p_queue="q", p_run=run, p_parts=[b, a], p_counts=[2, 3])
    assert row[:4] == (5, 0, 0, False) and row[5] == 5
    assert payloads(client) == ["b0", "b1", "a0", "a1", "a2"]
    assert staged(conn, schema) == [d]
    assert len({m.enqueued_at for m in client.peek("q", 10)}) == 1


def test_commit_truncates_staging_only_when_it_holds_nothing_else(
    client: Client, conn: Conn, schema: str, dsn: str
) -> None:
    """A commit whose write is all that staging holds truncates it (a new file: no row is
    marked deleted). Another write's part, or a task still staging in an open transaction,
    keeps the row-by-row DELETE, without waiting for that task, and their rows survive."""
    client.create_queue("q")
    # A commit that waited for the open task below would fall back to the DELETE too, late: 30 s
    # late, far beyond the bound below (which leaves a loaded CI machine room).
    conn.execute("SET lock_timeout = '30s'")

    def relfile() -> int:
        q = "SELECT pg_relation_filenode(%s::regclass)"
        [(node,)] = conn.execute(q, (f'"{schema}".spark_stage',)).fetchall()
        return int(node)

    def commit(run: uuid.UUID, part: int, n: int) -> None:
        [row] = call(conn, schema, "spark_write_commit", p_queue="q", p_run=run, p_parts=[part], p_counts=[n])
        assert row[0] == n

    run = uuid.uuid4()
    stage(conn, schema, run, 1, ["a", "b"])
    stage(conn, schema, run, 2, ["failed attempt"])
    before = relfile()
    commit(run, 1, 2)
    assert relfile() != before and staged(conn, schema) == []

    run, other = uuid.uuid4(), uuid.uuid4()
    stage(conn, schema, run, 3, ["c"])
    stage(conn, schema, other, 4, ["other write"])
    before = relfile()
    commit(run, 3, 1)
    assert relfile() == before and staged(conn, schema) == [4]
    call(conn, schema, "spark_write_abort", p_run=other)

    run = uuid.uuid4()
    stage(conn, schema, run, 5, ["d"])
    with psycopg.connect(dsn) as task:  # a task of another write, mid-COPY
        stage(task, schema, uuid.uuid4(), 6, ["staging"])
        before = relfile()
        t = time.monotonic()
        commit(run, 5, 1)
        assert time.monotonic() - t < 20
        assert relfile() == before
        task.commit()
    assert staged(conn, schema) == [6]
    assert payloads(client) == ["a", "b", "c", "d"]


def test_commit_gives_rows_without_a_content_type_the_writes_own(
    client: Client, conn: Conn, schema: str
) -> None:
    """The writer stages no content type and gives it once per write (p_content_type); a row
    staged with its own keeps it, on the set-wise path and through send_batch (a key)."""
    client.create_queue("q")
    s = sql.Identifier(schema)
    for keyed in (False, True):
        run = uuid.uuid4()
        conn.execute(
            sql.SQL("INSERT INTO {}.spark_stage_part (part, run_id, queue) VALUES (1, %s, 'q')").format(s),
            (run,),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.spark_stage (part, seq, payload, content_type, key)"
                " VALUES (1, 0, 'a', NULL, %s), (1, 1, 'b', 'text/csv', NULL)"
            ).format(s),
            ("k" if keyed else None,),
        )
        call(
            conn, schema, "spark_write_commit", p_queue="q", p_run=run, p_parts=[1], p_counts=[2],
            p_content_type="application/json",
        )  # fmt: skip
        got = conn.execute(
            sql.SQL("SELECT m.key, m.content_type FROM {}.message m ORDER BY m.id DESC LIMIT 2").format(s)
        ).fetchall()
        assert got[::-1] == [("k" if keyed else None, "application/json"), (None, "text/csv")]


def test_commit_fails_loudly_if_staging_was_lost(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q")
    run = uuid.uuid4()
    stage(conn, schema, run, 7, ["x", "y", "z"])
    conn.execute(sql.SQL("DELETE FROM {}.spark_stage WHERE seq = 1").format(sql.Identifier(schema)))
    with pytest.raises(psycopg.Error, match="staged 3 rows but 2 are left") as e:
        call(conn, schema, "spark_write_commit", p_queue="q", p_run=run, p_parts=[7], p_counts=[3])
    assert e.value.sqlstate == "LQ101"
    assert payloads(client) == []


def test_sink_commit_happens_once_per_batch(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q")

    def commit(batch: int, text: str) -> tuple[Any, ...]:
        run = uuid.uuid4()
        part = stage(conn, schema, run, abs(hash((batch, text))) % 2**62 + 1, [text])
        [row] = call(
            conn,
            schema,
            "spark_write_commit",
            p_queue="q",
            p_run=run,
            p_parts=[part],
            p_counts=[1],
            p_sink="query:abc",
            p_batch=batch,
        )
        return row

    first = commit(0, "batch 0")
    assert first[:4] == (1, 0, 0, False)
    # A replay says what made it one: the original commit's time and message count.
    assert commit(0, "batch 0 replayed") == (0, 0, 0, True, first[4], 1)
    assert commit(1, "batch 1")[:4] == (1, 0, 0, False)
    assert commit(0, "batch 0 again")[:4] == (0, 0, 0, True)  # below the newest: done long ago
    assert payloads(client) == ["batch 0", "batch 1"]
    assert staged(conn, schema) == []  # duplicates' staging is dropped too


def test_write_ids_are_scoped_to_their_queue_and_expire(client: Client, conn: Conn, schema: str) -> None:
    """A write id is remembered per queue for its retention: the same id on another queue is
    another write, a rerun within the retention is skipped (and counted), one after it is a
    new write, and maintain() forgets expired ids."""
    client.create_queue("q")
    client.create_queue("q2")
    t0 = 10**13  # a fixed clock, far from the real one

    def write(queue: str, text: str, now: int, retention: int = 60_000) -> tuple[Any, ...]:
        run = uuid.uuid4()
        part = stage(conn, schema, run, abs(hash((queue, text, now))) % 2**62 + 1, [text], queue)
        [row] = call(
            conn,
            schema,
            "spark_write_commit",
            p_queue=queue,
            p_run=run,
            p_parts=[part],
            p_counts=[1],
            p_sink="write:daily",
            p_batch=0,
            p_retention_ms=retention,
            p_now=now,
        )
        return row

    def status(queue: str) -> list[tuple[Any, ...]]:
        q = sql.SQL("SELECT * FROM {}.spark_write_status(%s, 'daily')").format(sql.Identifier(schema))
        return conn.execute(q, (queue,)).fetchall()

    assert write("q", "one", t0) == (1, 0, 0, False, t0, 1)
    assert write("q2", "one on q2", t0 + 1)[:4] == (1, 0, 0, False)  # another queue: not a rerun
    assert status("q") == [(1, t0, t0 + 60_000, 0, None)]
    assert write("q", "rerun", t0 + 59_999) == (0, 0, 0, True, t0, 1)
    assert status("q") == [(1, t0, t0 + 60_000, 1, t0 + 59_999)]
    assert write("q", "after the retention", t0 + 60_000)[:4] == (1, 0, 0, False)
    assert payloads(client, "q") == ["one", "after the retention"]
    assert payloads(client, "q2") == ["one on q2"]
    assert status("q") == [(1, t0 + 60_000, t0 + 120_000, 0, None)]

    # maintain() prunes what expired (q2's record), at most p_limit per call.
    prune = sql.SQL("SELECT {}.spark_prune(p_limit => 1, p_now => %s)").format(sql.Identifier(schema))
    maintain = sql.SQL("SELECT {}.maintain(p_now => %s)").format(sql.Identifier(schema))
    assert conn.execute(prune, (t0 + 60_000,)).fetchall() == [(0,)]
    conn.execute(maintain, (t0 + 60_001,))
    assert status("q2") == [] and len(status("q")) == 1
    assert conn.execute(prune, (t0 + 10**9,)).fetchall() == [(1,)]
    assert status("q") == []


def test_abort_and_sweep_clear_staging(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q")
    run, old = uuid.uuid4(), uuid.uuid4()
    stage(conn, schema, run, 1, ["x"])
    stage(conn, schema, run, 2, ["y"])
    stage(conn, schema, old, 3, ["z"])
    assert call(conn, schema, "spark_write_abort", p_run=run, p_parts=None) == [(2,)]
    assert staged(conn, schema) == [3]
    assert call(conn, schema, "spark_sweep") == [(0, 0)]  # young staging is kept
    far = 10**15
    assert call(conn, schema, "spark_sweep", p_now=far) == [(1, 0)]
    assert staged(conn, schema) == []


@pytest.mark.parametrize("function", ["spark_write_abort", "spark_write_commit"])
def test_unstaging_never_orphans_a_task_that_commits_meanwhile(
    client: Client, conn: Conn, schema: str, dsn: str, function: str
) -> None:
    """A straggling task of the same write that commits its part while an abort (or a commit)
    is deleting the write's staging: both its part record and its rows stay, or both go. Never
    rows without their part record, which no sweep could find again (the CI failure this pins:
    1,000 staged rows left after abort and sweep). The abort is held on a row lock between its
    two steps while the task commits."""
    client.create_queue("q")
    run = uuid.uuid4()
    stage(conn, schema, run, 1, ["done"])
    s = sql.Identifier(schema)
    with psycopg.connect(dsn) as task, psycopg.connect(dsn) as holder, psycopg.connect(dsn) as aborter:
        stage(task, schema, run, 2, ["straggler"])  # mid-COPY: the NOWAIT truncate is off
        holder.execute(sql.SQL("SELECT FROM {}.spark_stage WHERE part = 1 FOR UPDATE").format(s))
        pid = aborter.info.backend_pid
        params: dict[str, Any] = {"p_run": run, "p_parts": [1]}
        if function == "spark_write_commit":
            params.update(p_queue="q", p_counts=[1])
        done: list[BaseException | None] = []

        def settle() -> None:
            try:
                call(aborter, schema, function, **params)
                aborter.commit()
                done.append(None)
            except BaseException as e:  # reported below
                done.append(e)

        worker = threading.Thread(target=settle)
        worker.start()
        deadline = time.monotonic() + 10
        while not conn.execute(
            "SELECT FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
        ).fetchall():
            assert time.monotonic() < deadline, "the abort never waited on the held row"
            time.sleep(0.02)
        task.commit()
        holder.rollback()
        worker.join(10)
        assert done == [None]
    orphans = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {s}.spark_stage st"
            " WHERE NOT EXISTS (SELECT FROM {s}.spark_stage_part p WHERE p.part = st.part)"
        ).format(s=s)
    ).fetchone()
    assert orphans == (0,)
    call(conn, schema, "spark_sweep", p_now=10**15)
    assert staged(conn, schema) == []


def test_stream_batches_are_planned_once_read_and_acked(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q", archive=True)
    ids = [r.id for r in client.send_batch("q", [f"m{i}" for i in range(5)])]
    stream = uuid.uuid4()
    nxt = {"p_stream": stream, "p_queue": "q", "p_limit": 3, "p_chunk": 2}
    assert call(conn, schema, "spark_stream_next", p_after=0, **nxt) == [(1, 3)]
    # The driver died before Spark logged the offset: asking again returns the same batch.
    assert call(conn, schema, "spark_stream_next", p_after=0, **nxt) == [(1, 3)]
    assert client.metrics("q").ready == 2
    chunks = call(conn, schema, "spark_stream_chunks", p_stream=stream, p_after=0, p_upto=1)
    assert chunks == [(1, 0, 2), (1, 1, 1)]
    read = stream_ids(conn, schema, stream, chunks)
    assert read == ids[:3]
    assert call(conn, schema, "spark_stream_commit", p_stream=stream, p_batch=1) == [(3,)]
    assert call(conn, schema, "spark_stream_commit", p_stream=stream, p_batch=1) == [(0,)]  # idempotent
    assert call(conn, schema, "spark_stream_next", p_after=1, **nxt) == [(2, 2)]
    assert call(conn, schema, "spark_stream_next", p_after=2, **nxt) == [(2, 0)]  # nothing new
    with pytest.raises(psycopg.Error, match="already committed batch 1"):
        call(conn, schema, "spark_stream_next", p_after=0, **nxt)
    client.create_queue("other")
    with pytest.raises(psycopg.Error, match="reads queue 'q', not 'other'"):
        call(conn, schema, "spark_stream_next", p_after=2, **{**nxt, "p_queue": "other"})
    archived = conn.execute(sql.SQL("SELECT id FROM {}.archive ORDER BY id").format(sql.Identifier(schema)))
    assert [r[0] for r in archived] == ids[:3]


def test_stream_leases_as_take_does_and_acks_the_whole_batch_at_once(
    client: Client, conn: Conn, schema: str
) -> None:
    """The set-wise lease of a plain queue keeps take()'s rules: delivery order, a message whose
    lease expired on its last attempt is dead-lettered, not delivered, and does not count against
    the batch's limit; the commit acks every chunk of the batch at once."""
    client.create_queue("q", max_attempts=1, archive=True)
    s = sql.Identifier(schema)
    t = 1_000_000_000_000
    send = sql.SQL("SELECT id FROM {}.send_batch(p_queue => 'q', p_payloads => %s::bytea[], p_now => %s)")
    [(first,)] = conn.execute(send.format(s), ([b"first"], t)).fetchall()
    take = sql.SQL("SELECT id FROM {}.take(p_queue => 'q', p_lease_ms => 1000, p_now => %s)")
    assert conn.execute(take.format(s), (t,)).fetchall() == [(first,)]  # its only attempt
    ids = [i for (i,) in conn.execute(send.format(s), ([b"m%d" % i for i in range(5)], t + 5000))]
    # Its lease expired (at t + 1000) before the others were sent: it is first in line, and dead.
    stream = uuid.uuid4()
    nxt = {"p_stream": stream, "p_queue": "q", "p_after": 0, "p_limit": 4, "p_chunk": 3, "p_now": t + 9000}
    assert call(conn, schema, "spark_stream_next", **nxt) == [(1, 4)]
    chunks = call(conn, schema, "spark_stream_chunks", p_stream=stream, p_after=0, p_upto=1)
    assert chunks == [(1, 0, 3), (1, 1, 1)]
    read = stream_ids(conn, schema, stream, chunks)
    assert read == ids[:4]  # in delivery order
    status = sql.SQL("SELECT id, status FROM {}.archive ORDER BY id").format(s)
    assert conn.execute(status).fetchall() == [(first, "dead")]
    live = sql.SQL("SELECT id, deliveries, leased, dequeue_at FROM {}.message ORDER BY id").format(s)
    lease_end = t + 9000 + 600_000
    assert conn.execute(live).fetchall() == [(i, 1, True, lease_end) for i in ids[:4]] + [
        (ids[4], 0, False, t + 5000)
    ]
    assert call(conn, schema, "spark_stream_commit", p_stream=stream, p_batch=1, p_now=t + 9500) == [(4,)]
    assert conn.execute(status).fetchall() == [(first, "dead")] + [(i, "acked") for i in ids[:4]]
    assert conn.execute(live).fetchall() == [(ids[4], 0, False, t + 5000)]


def test_stream_ready_bound_and_lease_renewal(client: Client, conn: Conn, schema: str) -> None:
    client.create_queue("q")
    t = 1_000_000_000_000
    conn.execute(
        sql.SQL("SELECT {}.send_batch(p_queue => 'q', p_payloads => ARRAY['x'::bytea], p_now => %s)").format(
            sql.Identifier(schema)
        ),
        (t,),
    )
    stream = uuid.uuid4()
    base = {"p_stream": stream, "p_queue": "q", "p_after": 0, "p_limit": 10}
    # availableNow started before the message was sent: it is not part of this run.
    assert call(conn, schema, "spark_stream_next", p_ready_at=t - 1, p_now=t + 10, **base) == [(0, 0)]
    assert call(conn, schema, "spark_stream_next", p_lease_ms=1000, p_now=t + 10, **base) == [(1, 1)]
    lease = "SELECT dequeue_at FROM {}.message"
    assert conn.execute(sql.SQL(lease).format(sql.Identifier(schema))).fetchone() == (t + 1010,)
    # Each planning call renews the leases of uncommitted batches past half their lease.
    assert call(conn, schema, "spark_stream_next", p_lease_ms=1000, p_now=t + 600, **base) == [(1, 1)]
    assert conn.execute(sql.SQL(lease).format(sql.Identifier(schema))).fetchone() == (t + 1600,)


def test_stream_read_and_commit_leave_deliveries_that_are_no_longer_ours(
    client: Client, conn: Conn, schema: str
) -> None:
    client.create_queue("q")
    client.send("q", "x")
    stream = uuid.uuid4()
    call(
        conn,
        schema,
        "spark_stream_next",
        p_stream=stream,
        p_queue="q",
        p_after=0,
        p_limit=10,
        p_lease_ms=1000,
    )
    # The query stayed down past its lease; another consumer took the message.
    assert client.take("q", 1) == []  # still leased by the stream now
    far = 10**15
    taken = conn.execute(
        sql.SQL("SELECT id, token FROM {}.take(p_queue => 'q', p_now => %s)").format(sql.Identifier(schema)),
        (far,),
    ).fetchall()
    assert len(taken) == 1
    assert call(conn, schema, "spark_stream_read", p_stream=stream, p_batch=1, p_chunk=0) == []
    assert call(conn, schema, "spark_stream_commit", p_stream=stream, p_batch=1) == [(0,)]
    assert client.metrics("q").leased + client.metrics("q").ready == 1  # the other's delivery stays


def test_privileges_follow_the_role_model(conn: Conn, schema: str) -> None:
    roles = dict(
        conn.execute(
            sql.SQL("SELECT kind, rolname FROM {}.security_role").format(sql.Identifier(schema))
        ).fetchall()
    )
    exists = {
        r[0]
        for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(roles.values())])
    }
    if roles.get("producer") not in exists or roles.get("consumer") not in exists:
        pytest.skip("the lonnymq roles do not exist on this server")
    producer, consumer = roles["producer"], roles["consumer"]

    def can(role: str, what: str, obj: str, priv: str) -> bool:
        q = f"SELECT has_{what}_privilege(%s, %s, %s)"
        row = conn.execute(q, (role, f'"{schema}".{obj}', priv)).fetchone()
        return bool(row and row[0])

    assert can(producer, "table", "spark_stage", "INSERT") and not can(
        producer, "table", "spark_stage", "SELECT"
    )
    assert can(
        producer,
        "function",
        "spark_write_commit(text,uuid,bigint[],bigint[],text,text,bigint,bigint,bigint,text)",
        "EXECUTE",
    )
    assert not can(
        producer,
        "function",
        "spark_stream_next(uuid,text,bigint,integer,integer,bigint,bigint,bigint)",
        "EXECUTE",
    )
    assert can(
        consumer,
        "function",
        "spark_stream_next(uuid,text,bigint,integer,integer,bigint,bigint,bigint)",
        "EXECUTE",
    )
    assert can(producer, "function", "spark_write_status(text,text)", "EXECUTE")
    archive_read = (
        "spark_read_archive(text,bigint,bigint,text,text[],text,text[],text[],text[]" + ",bigint" * 6 + ")"
    )
    assert not can(consumer, "function", archive_read, "EXECUTE")
