"""pgmq's FIFO groups (the ``x-pgmq-group`` header) of a partitioned queue through the router:
a group's messages all go to its partition (KEY_PARTITION of the group's name, where a native
send with that key goes), sends without a group keep spreading in turn, ``send_batch`` with
headers splits its messages by group and returns their ids in order, and the grouped reads
(all six) visit the partitions in turn, each read's messages from one partition: every group
read in its order, every message exactly once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest
from shard_helpers import roles_on_router
from test_partitioned_pgmq import NO_LIMIT, _ids
from test_pgmq_router import pgmq_client

from lonnymq import Client, shard
from lonnymq.client.direct import STRIDE, key_partition

pytestmark = [pytest.mark.once, pytest.mark.slow]

GROUP = "x-pgmq-group"


def _groups(prefix: str, n: int, per: int) -> dict[int, list[str]]:
    """``per`` group names of each partition k of ``n`` (key_partition of the name)."""
    out: dict[int, list[str]] = {k: [] for k in range(n)}
    i = 0
    while min(len(v) for v in out.values()) < per:
        name = f"{prefix}{i}"
        if len(out[key_partition(name, n)]) < per:
            out[key_partition(name, n)].append(name)
        i += 1
    return out


def _made(
    dsn: str, q: str, plain: str | None, prefix: str, per: int
) -> tuple[list[int], dict[int, list[str]]]:
    """Queue ``q`` of 2 partitions (and ``plain``, a plain queue), with pgmq's unlimited
    attempts: the shards of q's partitions, and ``per`` group names of each (:func:`_groups`)."""
    with Client(dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=NO_LIMIT)
        if plain is not None:
            c.create_queue(plain, max_attempts=NO_LIMIT)
    return shard.status(dsn).partitioned[q], _groups(prefix, 2, per)


def _headers(group: str | None) -> str:
    return json.dumps({GROUP: group} if group is not None else {"other": 1})


def _read(conn: psycopg.Connection[Any], query: str, q: str) -> list[tuple[int, dict[str, Any]]]:
    return [(int(r[0]), r[1]) for r in conn.execute(query, (q,))]


def test_pgmq_fifo_groups_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """Six groups (three on each partition) sent interleaved, round after round (send with
    headers, three overloads, then send_batch with headers of every group and a message
    without a group, three overloads), and messages without a group: each group's messages on
    its partition, the others on both; read by the six grouped reads in turn, deleting each
    batch: a group in flight is not read again, each read from one partition, both partitions
    visited, every group in its order, every message exactly once, each id's message the one
    sent with it."""
    q = "pgq_groups"
    parts, groups = _made(with_pgmq.dsn, q, None, "grp", 3)
    every = [g for pair in zip(groups[0], groups[1], strict=True) for g in pair]  # interleaved
    sent: dict[int, dict[str, Any]] = {}  # id -> the message sent with it
    seq: Counter[str | None] = Counter()

    def msg(group: str | None) -> dict[str, Any]:
        m = {"g": group, "s": seq[group]}
        seq[group] += 1
        return m

    sends = (
        "SELECT * FROM pgmq.send(%s, %s, %s::jsonb)",
        "SELECT * FROM pgmq.send(%s, %s, %s::jsonb, 0)",
        "SELECT * FROM pgmq.send(%s, %s, %s::jsonb, clock_timestamp() - interval '1 second')",
    )
    batches = (
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])",
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[], 0)",
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[], clock_timestamp() - interval '1 second')",
    )
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        for r in range(3):
            for g in every:
                m = msg(g)
                (i,) = _ids(conn, sends[r], q, json.dumps(m), _headers(g))
                sent[i] = m
            for _ in range(2):  # without a group: spread in turn
                m = msg(None)
                (i,) = _ids(conn, "SELECT * FROM pgmq.send(%s, %s)", q, json.dumps(m))
                sent[i] = m
            # A batch of every group (both partitions, in another order) and one without.
            rows = [msg(g) for g in [*reversed(every[:3]), None, *every[3:]]]
            ids = _ids(conn, batches[r], q, [json.dumps(m) for m in rows], [_headers(m["g"]) for m in rows])
            assert len(ids) == len(rows) == len(set(ids))
            sent.update(zip(ids, rows, strict=True))
    # Each group's messages on its partition; those without a group on both.
    for i, m in sent.items():
        if m["g"] is not None:
            assert i % STRIDE == parts[key_partition(m["g"], 2)], (i, m)
    assert {i % STRIDE for i, m in sent.items() if m["g"] is None} == set(parts)

    read: list[tuple[int, dict[str, Any]]] = []
    origins: list[int] = []
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        # The heads of one partition's groups, then the other's; then none: every group is in
        # flight (a grouped read never takes a group's next message while one is leased).
        head = "SELECT msg_id, message FROM pgmq.read_grouped_head(%s, 30, 100)"
        first, second = _read(conn, head, q), _read(conn, head, q)
        assert _read(conn, head, q) == []
        for batch in (first, second):
            assert len({i % STRIDE for i, _ in batch}) == 1
            assert len(batch) == 4 and all(m["s"] == 0 or m["g"] is None for _, m in batch)
            origins.append(batch[0][0] % STRIDE)
            read += batch
        assert sorted(origins) == sorted(parts)
        done = [i for i, _ in read]
        assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, done)) == sorted(done)
        reads = (
            "SELECT msg_id, message FROM pgmq.read_grouped(%s, 30, 5)",
            "SELECT msg_id, message FROM pgmq.read_grouped_rr(%s, 30, 5)",
            "SELECT msg_id, message FROM pgmq.read_grouped_head(%s, 30, 5)",
            "SELECT msg_id, message FROM pgmq.read_grouped_with_poll(%s, 30, 5, 1, 10)",
            "SELECT msg_id, message FROM pgmq.read_grouped_rr_with_poll(%s, 30, 5, 1, 10)",
            "SELECT msg_id, message FROM pgmq.read_grouped_head_with_poll(%s, 30, 5, 1, 10)",
        )
        k = 0
        while batch := _read(conn, reads[k % len(reads)], q):
            assert len({i % STRIDE for i, _ in batch}) == 1, batch  # one partition's
            origins.append(batch[0][0] % STRIDE)
            read += batch
            ids = [i for i, _ in batch]
            assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, ids)) == sorted(ids)
            k += 1
        assert k >= len(reads)  # every grouped read took its turn
        assert set(origins[2:]) == set(parts)
        row = conn.execute("SELECT queue_length, total_messages FROM pgmq.metrics(%s)", (q,)).fetchone()
        assert row == (0, len(sent))
    # Every message exactly once, each id with the message sent with it (send_batch's ids in
    # the order of its messages), and every group in its order.
    assert Counter(i for i, _ in read) == Counter(set(sent))
    assert all(sent[i] == m for i, m in read)
    order: defaultdict[str, list[int]] = defaultdict(list)
    for _, m in read:
        if m["g"] is not None:
            order[m["g"]].append(m["s"])
    assert set(order) == set(every)
    assert all(s == list(range(seq[g])) for g, s in order.items()), dict(order)
    # Without a group (pgmq's default group): in order per partition (ids grow per shard).
    for p in parts:
        ids = [i for i, m in read if m["g"] is None and i % STRIDE == p]
        assert ids == sorted(ids)


def test_pgmq_send_batch_with_headers_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """send_batch with headers: a batch of one partition's groups (with messages without a
    group) goes whole to that partition, a batch without groups to the partitions in turn;
    headers the send refuses (not one per message, or not an object) are refused as on a plain
    queue, nothing sent on any partition; a plain queue's batch through the router as before
    (ids in order)."""
    q, plain = "pgq_groups_batch", "pgq_groups_batch_plain"
    parts, groups = _made(with_pgmq.dsn, q, plain, "bgrp", 2)
    batch = "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])"
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        for k in (0, 1, 0, 1):
            hdrs = [_headers(groups[k][0]), _headers(None), "{}", _headers(groups[k][1])]
            ids = _ids(conn, batch, q, ['{"n": 1}'] * 4, hdrs)
            assert len(set(ids)) == 4 and {i % STRIDE for i in ids} == {parts[k]}, (k, ids)
        spread = []
        for _ in range(4):
            ids = _ids(conn, batch, q, ['{"n": 2}'] * 3, [_headers(None), "{}", _headers(None)])
            assert len({i % STRIDE for i in ids}) == 1
            spread.append(ids[0] % STRIDE)
        assert Counter(spread) == {parts[0]: 2, parts[1]: 2}
        two = [_headers(groups[0][0]), _headers(groups[1][0])]  # one group of each partition
        refused = (
            (['{"n": 3}'] * 3, two),  # headers not one per message
            (['{"n": 3}'] * 3, [two[0], "[1]", two[1]]),  # one not an object
            (['{"n": 3}', None, '{"n": 3}'], [two[0], "{}", two[1]]),  # a NULL message
        )
        for msgs, hdrs in refused:
            errs = []
            for name in (q, plain):
                with pytest.raises(psycopg.Error) as e:
                    conn.execute(batch, (name, msgs, hdrs))
                errs.append((e.value.sqlstate, str(e.value).split("\n")[0].replace(name, "<queue>")))
            assert errs[0] == errs[1] and errs[0][0] is not None, errs
        row = conn.execute("SELECT total_messages FROM pgmq.metrics(%s)", (q,)).fetchone()
        assert row == (28,)
        # A plain queue's batch with headers: its shard's, the ids in order.
        msgs = [json.dumps({"n": n}) for n in range(5)]
        ids = _ids(conn, batch, plain, msgs, [_headers(g) for g in ("a", "b", None, "a", "c")])
        got = {
            int(r[0]): r[1]["n"]
            for r in conn.execute("SELECT msg_id, message FROM pgmq.pop(%s, 10)", (plain,))
        }
        assert [got[i] for i in ids] == list(range(5))
        row = conn.execute("SELECT total_messages FROM pgmq.metrics(%s)", (plain,)).fetchone()
        assert row == (5,)


def _sleeping(conn: psycopg.Connection[Any], pid: int) -> None:
    """Wait until backend ``pid`` (a poll on the router) sleeps between two looks."""
    deadline = time.monotonic() + 60
    while conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (
        "PgSleep",
    ):
        assert time.monotonic() < deadline, "the poll never slept"
        time.sleep(0.01)


def test_pgmq_grouped_reads_with_poll_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """The three grouped ``*_with_poll`` through the router: on a partitioned queue, an empty
    queue returns nothing after max_poll_seconds; a message sent to a group on either partition
    while the poll sleeps is returned by it; on a plain queue as before."""
    q, plain = "pgq_groups_poll", "pgq_groups_poll_plain"
    parts, groups = _made(with_pgmq.dsn, q, plain, "pgrp", 1)
    polls = ("read_grouped_with_poll", "read_grouped_rr_with_poll", "read_grouped_head_with_poll")
    with (
        psycopg.connect(with_pgmq.dsn, autocommit=True) as conn,
        psycopg.connect(with_pgmq.dsn, autocommit=True) as other,
    ):
        for fn in polls:
            started = time.monotonic()
            assert _ids(conn, f"SELECT msg_id FROM pgmq.{fn}(%s, 30, 5, 1, 50)", q) == []
            assert time.monotonic() - started >= 0.9  # waited max_poll_seconds
            for k in (0, 1):
                got: list[int] = []
                pid = conn.info.backend_pid

                def poll(fn: str = fn, got: list[int] = got) -> None:
                    got += _ids(conn, f"SELECT msg_id FROM pgmq.{fn}(%s, 30, 5, 60, 20)", q)

                t = threading.Thread(target=poll)
                t.start()
                try:
                    _sleeping(other, pid)
                    sent = _ids(
                        other, "SELECT * FROM pgmq.send(%s, '{}', %s::jsonb)", q, _headers(groups[k][0])
                    )
                finally:
                    t.join()
                assert got == sent and sent[0] % STRIDE == parts[k], (fn, got, sent)
                assert _ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, got) == got
            sent = _ids(conn, "SELECT * FROM pgmq.send(%s, '{}', %s::jsonb)", plain, _headers("a"))
            assert _ids(conn, f"SELECT msg_id FROM pgmq.{fn}(%s, 30, 5, 5, 20)", plain) == sent
            assert _ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", plain, sent) == sent


# pgmq 1.x's client warns on every list_queues() call that its result type changed.
@pytest.mark.filterwarnings("ignore:list_queues\\(\\) now returns:UserWarning")
def test_the_pgmq_client_with_fifo_groups_of_a_partitioned_queue(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    """The official pgmq client on the router's DSN: create_fifo_index, sends and batches with
    group headers, grouped reads (fill, round robin, with poll): each group in its order, every
    message once; in the LonnyMQ roles (producer sends, consumer reads) too."""
    q = "pgq_groups_client"
    _, groups = _made(with_pgmq.dsn, q, None, "cgrp", 2)
    every = [*groups[0], *groups[1]]
    pq = pgmq_client(with_pgmq.dsn)
    try:
        pq.create_fifo_index(q)
        with pytest.raises(Exception, match="pgq_groups_nope"):  # as a plain queue's: unknown
            pq.create_fifo_index("pgq_groups_nope")
        ids: dict[int, tuple[str, int]] = {}
        for n in range(3):
            for g in every:
                ids[pq.send(q, {"g": g, "n": n}, headers={GROUP: g})] = (g, n)
        rows = [(g, n) for n in range(3, 5) for g in reversed(every)]
        got_ids = pq.send_batch(q, [{"g": g, "n": n} for g, n in rows], headers=[{GROUP: g} for g, _ in rows])
        ids.update(zip(got_ids, rows, strict=True))
        seen: defaultdict[str, list[int]] = defaultdict(list)
        reads = (
            lambda: pq.read_grouped(q, vt=30, qty=3),
            lambda: pq.read_grouped_rr(q, vt=30, qty=3),
            lambda: pq.read_grouped_with_poll(q, vt=30, qty=3, max_poll_seconds=1, poll_interval_ms=10),
        )
        k = 0
        while batch := reads[k % 3]():
            for m in batch:
                assert ids.pop(m.msg_id) == (m.message["g"], m.message["n"])
                seen[m.message["g"]].append(m.message["n"])
            assert pq.delete_batch(q, [m.msg_id for m in batch]) == [m.msg_id for m in batch]
            k += 1
        assert ids == {} and {g: s for g, s in seen.items()} == {g: list(range(5)) for g in every}
    finally:
        pq.pool.close()
    # As the LonnyMQ roles on the router: the routing function of a send with headers and the
    # dispatchers of send_batch with headers and of the grouped reads are theirs to call.
    roles_on_router(with_pgmq.dsn, with_pgmq.shard_dsns)
    with psycopg.connect(with_pgmq.dsn, autocommit=True) as conn:
        conn.execute("SET ROLE lonnymq_producer")
        sent = _ids(conn, "SELECT * FROM pgmq.send(%s, '{}', %s::jsonb)", q, _headers(every[0]))
        sent += _ids(
            conn,
            "SELECT * FROM pgmq.send_batch(%s, ARRAY['{}', '{}']::jsonb[], %s::jsonb[])",
            q,
            [_headers(every[0]), _headers(every[-1])],
        )
        conn.execute("SET ROLE lonnymq_consumer")
        got = [
            i for _ in range(3) for i in _ids(conn, "SELECT msg_id FROM pgmq.read_grouped_rr(%s, 30, 5)", q)
        ]
        assert sorted(got) == sorted(sent)
        assert sorted(_ids(conn, "SELECT * FROM pgmq.delete(%s, %s::bigint[])", q, got)) == sorted(got)
