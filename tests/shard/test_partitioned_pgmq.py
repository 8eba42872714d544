"""The pgmq facade's calls of a partitioned queue through the router (SQL, and the official
``pgmq`` Python client): sends spread over the partitions, reads and pops visit them in turn
and never come back empty while one has messages, delete, archive and set_vt go to the shard
each id names (an array of ids of several partitions split by shard), metrics and metrics_all
merge the partitions; the calls that would see one partition stay refused."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from shard_helpers import roles_on_router
from test_pgmq_router import pgmq_client

from lonnymq import Client, shard
from lonnymq.client.direct import STRIDE

pytestmark = [pytest.mark.once, pytest.mark.slow]

#: As pgmq.create makes a queue: no attempt limit (a pgmq read is an attempt).
NO_LIMIT = 2147483647


def _ids(conn: psycopg.Connection[Any], query: str, *args: Any) -> list[int]:
    return [int(r[0]) for r in conn.execute(query, args)]


def test_pgmq_calls_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    q = "pgq_parted"
    with Client(with_pgmq.dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=NO_LIMIT)
    parts = shard.status(with_pgmq.dsn).partitioned[q]
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        # Sends spread: the partitions in turn (single sends and batches, every overload).
        sent = [_ids(conn, "SELECT * FROM pgmq.send(%s, %s)", q, json.dumps({"n": n}))[0] for n in range(10)]
        sent += _ids(conn, "SELECT * FROM pgmq.send(%s, %s, 0)", q, json.dumps({"n": 10}))
        sent += _ids(conn, "SELECT * FROM pgmq.send(%s, %s, '{}'::jsonb)", q, json.dumps({"n": 11}))
        for b in range(4):
            sent += _ids(
                conn,
                "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])",
                q,
                [json.dumps({"b": b, "i": i}) for i in range(3)],
            )
        assert len(sent) == len(set(sent)) == 24
        spread = Counter(i % STRIDE for i in sent)
        assert set(spread) == set(parts) and min(spread.values()) >= 8, spread
        # metrics: every partition, merged; metrics_all: the queue once, merged.
        row = conn.execute("SELECT * FROM pgmq.metrics(%s)", (q,)).fetchone()
        assert row is not None and row[0] == q and (row[1], row[4], row[6]) == (24, 24, 24)
        rows = [r for r in conn.execute("SELECT * FROM pgmq.metrics_all()") if r[0] == q]
        assert len(rows) == 1 and rows[0][:2] == (q, 24) and rows[0][6] == 24
        # Reads visit the partitions in turn, each read's messages from one partition.
        seen: list[int] = []
        origins = []
        for _ in range(4):
            got = _ids(conn, "SELECT msg_id FROM pgmq.read(%s, 30, 3)", q)
            assert len(got) == 3 and len({i % STRIDE for i in got}) == 1
            origins.append(got[0] % STRIDE)
            seen += got
        assert set(origins) == set(parts)
        # delete and archive by id: on each id's shard; an array of both partitions' ids split.
        mixed = [seen[0], seen[3], seen[6], seen[9]]
        assert {i % STRIDE for i in mixed} == set(parts)
        assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, mixed)) == sorted(mixed)
        assert conn.execute("SELECT pgmq.delete(%s, %s::bigint)", (q, seen[1])).fetchone() == (True,)
        assert conn.execute("SELECT pgmq.delete(%s, %s::bigint)", (q, seen[1])).fetchone() == (False,)
        assert conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (q, seen[4])).fetchone() == (True,)
        both = [seen[2], seen[5]]
        assert sorted(_ids(conn, "SELECT * FROM pgmq.archive(%s, %s::bigint[])", q, both)) == sorted(both)
        # An id no partition made: not found (pgmq's answer), not an error.
        stray = STRIDE * 1000 + next(k for k in range(STRIDE) if k not in parts)
        assert conn.execute("SELECT pgmq.delete(%s, %s::bigint)", (q, stray)).fetchone() == (False,)
        assert _ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, [stray]) == []
        assert _ids(conn, "SELECT * FROM pgmq.archive(%s, %s::bigint[])", q, []) == []
        # set_vt by ids of both partitions (both overloads of an array): made visible now.
        rest = [seen[7], seen[8], seen[10], seen[11]]
        later = _ids(
            conn, "SELECT msg_id FROM pgmq.set_vt(%s, %s::bigint[], now() + interval '1 hour')", q, rest
        )
        assert sorted(later) == sorted(rest)
        changed = _ids(conn, "SELECT msg_id FROM pgmq.set_vt(%s, %s::bigint[], 0)", q, rest)
        assert sorted(changed) == sorted(rest)
        # pop: the partitions in turn, never empty while one has messages.
        popped: list[int] = []
        while got := _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 5)", q):
            assert len({i % STRIDE for i in got}) == 1
            popped += got
        gone = {*mixed, seen[1], seen[4], *both}
        assert sorted(popped) == sorted(set(sent) - gone)
        assert _ids(conn, "SELECT msg_id FROM pgmq.read(%s, 30, 3)", q) == []
        row = conn.execute("SELECT * FROM pgmq.metrics(%s)", (q,)).fetchone()
        assert row is not None and (row[1], row[4]) == (0, 24)
        # Calls of one partition only are never answered from one partition: still refused
        # (the grouped reads are not: test_partitioned_pgmq_groups.py).
        for call in ("SELECT pgmq.create(%s)", "SELECT pgmq.bind_topic('parted.*', %s)"):
            with pytest.raises(psycopg.Error, match="this call would see one partition only"):
                conn.execute(call, (q,))
    # Each partition's shard holds its own archived ids.
    for i, dsn in enumerate(with_pgmq.shard_dsns):
        with Client(dsn) as sc:
            archived = {m.id for m in sc.archived(q, limit=100)}
        assert archived == {x for x in (seen[4], *both) if x % STRIDE == i}


# pgmq 1.x's client warns on every list_queues() call that its result type changed.
@pytest.mark.filterwarnings("ignore:list_queues\\(\\) now returns:UserWarning")
def test_the_pgmq_client_on_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    q = "pgq_parted_client"
    with Client(with_pgmq.dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=NO_LIMIT)
    parts = shard.status(with_pgmq.dsn).partitioned[q]
    pq = pgmq_client(with_pgmq.dsn)
    try:
        ids = [pq.send(q, {"n": n}) for n in range(8)]
        ids += pq.send_batch(q, [{"n": 8}, {"n": 9}])
        assert len(set(ids)) == 10 and {i % STRIDE for i in ids} == set(parts)
        assert pq.metrics(q).queue_length == 10
        got: dict[int, Any] = {}
        while m := pq.read(q, vt=30):
            got[m.msg_id] = m.message["n"]
            assert pq.delete(q, m.msg_id) if len(got) % 2 else pq.archive(q, m.msg_id)
        assert sorted(got.values()) == list(range(10)) and sorted(got) == sorted(ids)
        assert pq.pop(q) is None
        assert pq.metrics(q).queue_length == 0 and pq.metrics(q).total_messages == 10
        assert [m.queue_name for m in pq.metrics_all()].count(q) == 1
        assert [r.queue_name for r in pq.list_queues()].count(q) == 1
    finally:
        pq.pool.close()


def test_pgmq_calls_of_a_partitioned_queue_in_the_lonnymq_roles(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """A producer's sends and a consumer's reads, deletes, archives, set_vt and pops through
    the router, of a partitioned queue and of a plain one: the routing functions they run in
    their own role are granted with the facade's functions."""
    roles_on_router(with_pgmq.dsn, with_pgmq.shard_dsns)
    names = ("pgq_roles_parted", "pgq_roles_plain")
    with Client(with_pgmq.dsn) as c:
        c.create_queue(names[0], partitions=2, max_attempts=NO_LIMIT)
        c.create_queue(names[1], max_attempts=NO_LIMIT)
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        for q in names:
            conn.execute("SET ROLE lonnymq_producer")
            sent = [_ids(conn, "SELECT * FROM pgmq.send(%s, '{}')", q)[0] for _ in range(4)]
            sent += _ids(conn, "SELECT * FROM pgmq.send_batch(%s, ARRAY['{}', '{}']::jsonb[])", q)
            conn.execute("SET ROLE lonnymq_consumer")
            got = [i for _ in range(3) for i in _ids(conn, "SELECT msg_id FROM pgmq.read(%s, 30, 2)", q)]
            assert sorted(got) == sorted(sent)
            assert conn.execute("SELECT pgmq.delete(%s, %s::bigint)", (q, got[0])).fetchone() == (True,)
            assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, got[1:3])) == sorted(
                got[1:3]
            )
            assert conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (q, got[3])).fetchone() == (True,)
            assert len(_ids(conn, "SELECT msg_id FROM pgmq.set_vt(%s, %s::bigint[], 0)", q, got[4:])) == 2
            assert sorted(
                _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 5)", q)
                + _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 5)", q)
            ) == sorted(got[4:])
            conn.execute("RESET ROLE")
            row = conn.execute("SELECT queue_length, total_messages FROM pgmq.metrics(%s)", (q,)).fetchone()
            assert row == (0, 6)


def test_pgmq_reads_skip_a_partition_whose_shard_is_down(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """With one partition's shard stopped, pgmq reads and pops through the router serve the
    other partition (never empty while it has messages, never an error); deletes of its ids go
    on; back up, the stopped partition's messages are all there."""
    q = "pgq_parted_down"
    with Client(with_pgmq.dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=NO_LIMIT)
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        sent = [_ids(conn, "SELECT * FROM pgmq.send(%s, '{}')", q)[0] for _ in range(20)]
    assert Counter(i % STRIDE for i in sent) == {0: 10, 1: 10}
    with_pgmq.shards[1].stop()
    try:
        with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
            got = []
            for _ in range(4):  # reads start at each partition in turn: none fails, none empty
                batch = _ids(conn, "SELECT msg_id FROM pgmq.read(%s, 30, 2)", q)
                assert len(batch) == 2 and all(i % STRIDE == 0 for i in batch), batch
                got += batch
            assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, got)) == sorted(got)
            popped = _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 5)", q)
            popped += _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 5)", q)
            assert len(popped) == 2 and all(i % STRIDE == 0 for i in popped)
            assert _ids(conn, "SELECT msg_id FROM pgmq.read(%s, 30, 2)", q) == []  # shard 0's drained
    finally:
        with_pgmq.shards[1].start()
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:  # a new router session
        rest = _ids(conn, "SELECT msg_id FROM pgmq.pop(%s, 20)", q)
    assert sorted(rest) == sorted(i for i in sent if i % STRIDE == 1)


def test_pgmq_read_with_poll_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """read_with_poll through the router: on a partitioned queue, a message sent to either
    partition while it waits is returned within a poll interval or two, an empty queue returns
    nothing after max_poll_seconds; on a plain queue as before."""
    q, plain = "pgq_parted_poll", "pgq_plain_poll"
    with Client(with_pgmq.dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=NO_LIMIT)
        c.create_queue(plain, max_attempts=NO_LIMIT)
    # max_poll_seconds 30: the send below (in a thread, 0.3 s later) lands before it however slow
    # a loaded CI machine is; the bounds leave it room too.
    poll = "SELECT msg_id FROM pgmq.read_with_poll(%s, 30, 5, 30, 50)"
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        for name in (q, plain):
            started = time.monotonic()
            assert _ids(conn, poll.replace(", 30, 50)", ", 1, 50)"), name) == []
            assert 0.9 < time.monotonic() - started < 20  # at max_poll_seconds (1 s), not stuck
        for name in (q, plain, q, q):  # the turn of sends: both partitions, one after the other
            sent: list[int] = []

            def send_later(name: str = name, sent: list[int] = sent) -> None:
                time.sleep(0.3)
                with psycopg.connect(with_pgmq.dsn, autocommit=True) as other:
                    sent += _ids(other, "SELECT * FROM pgmq.send(%s, '{}')", name)

            t = threading.Thread(target=send_later)
            started = time.monotonic()
            t.start()
            got = _ids(conn, poll, name)
            waited = time.monotonic() - started
            t.join()
            assert got == sent and 0.25 < waited < 20, (got, sent, waited)  # not the 30 s
            if name == q:
                assert _ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, got) == got


def test_pgmq_purge_and_drop_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """purge_queue empties every partition (the count summed); drop_queue (both overloads)
    drops every partition and the router's record of them; a plain queue's as before."""
    names = ("pgq_drop_a", "pgq_drop_b", "pgq_drop_plain")
    with Client(with_pgmq.dsn) as c:
        for name in names[:2]:
            c.create_queue(name, partitions=2, max_attempts=NO_LIMIT)
        c.create_queue(names[2], max_attempts=NO_LIMIT)
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        for name in names:
            sent = _ids(conn, "SELECT * FROM pgmq.send_batch(%s, ARRAY['{}', '{}', '{}']::jsonb[])", name)
            sent += _ids(conn, "SELECT * FROM pgmq.send_batch(%s, ARRAY['{}', '{}', '{}']::jsonb[])", name)
            if name != names[2]:
                assert {i % STRIDE for i in sent} == {0, 1}
            assert conn.execute("SELECT pgmq.purge_queue(%s)", (name,)).fetchone() == (6,)
            assert conn.execute("SELECT queue_length FROM pgmq.metrics(%s)", (name,)).fetchone() == (0,)
        assert conn.execute("SELECT pgmq.drop_queue(%s)", (names[0],)).fetchone() == (True,)
        assert conn.execute("SELECT pgmq.drop_queue(%s, false)", (names[1],)).fetchone() == (True,)
        assert conn.execute("SELECT pgmq.drop_queue(%s)", (names[2],)).fetchone() == (True,)
        for name in names:
            assert conn.execute("SELECT pgmq.drop_queue(%s)", (name,)).fetchone() == (False,)
    st = shard.status(with_pgmq.dsn)
    assert not set(names) & set(st.partitioned)
    assert all(not set(names) & set(s.queues) for s in st.shards)
