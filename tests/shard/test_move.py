"""``shard.move``: a queue with everything it holds moves to another shard exactly once, while
producers and consumers keep calling through the router; refusals; a long transaction on the
source makes the move give up after its lock_timeout instead of stalling the queue."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from psycopg import sql
from shard_helpers import Traffic, as_producer_then_consumer, drain, roles_on_router
from shard_helpers import home as hash_home

from lonnymq import Client, Envelope, Message, errors, shard
from lonnymq.cli import main
from lonnymq.client.direct import STRIDE

pytestmark = [pytest.mark.once, pytest.mark.slow]


def where_is(router: str, queue: str) -> int:
    """The shard that holds ``queue`` (status, which reads every shard)."""
    [i] = [s.index for s in shard.status(router).shards if queue in s.queues]
    return i


def name_on(router: str, prefix: str, shard_index: int) -> str:
    """A queue name that the hash puts on ``shard_index``."""
    i = 0
    while hash_home(router, f"{prefix}{i}") != shard_index:
        i += 1
    return f"{prefix}{i}"


def rows_on(dsn: str, queue: str) -> int:
    """Messages and archive rows of ``queue`` on one shard, read there directly."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
            "         WHERE q.name = %s)"
            "     + (SELECT count(*) FROM lonnymq.archive a JOIN lonnymq.queue q ON q.id = a.queue_id"
            "         WHERE q.name = %s)",
            (queue, queue),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_move_keeps_every_kind_of_message(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    home, other = 0, 1
    q, dlq = name_on(r, "mv_all", home), name_on(r, "mv_dlq", home)  # linked queues share a shard
    with Client(r) as c:
        c.create_queue(dlq)
        c.create_queue(q, dead_letter_queue=dlq, max_attempts=1)
        c.create_queue("mv_arch", archive=True)
        c.send_batch(q, [Envelope(f"ready{i}") for i in range(5)])
        c.send(q, "later", delay=3600)
        c.send(q, "keyed-v1", key="k1")
        c.send(q, "keyed-v2", key="k1", on_conflict="replace")
        c.send(q, "chan", channel="tenant-a")
        leased = c.take(q, 2)
        assert [m.payload for m in leased] == ["ready0", "ready1"]
        acked = c.take(q)
        c.ack(acked)  # acked before the move: must never come back
        failed = c.take(q)
        assert c.nack(failed) == {failed[0].id: "dead"}  # max_attempts=1: to mv_dlq
        c.send("mv_arch", "x")
        [a] = c.take("mv_arch")
        c.ack(a)  # archived
        # A cron schedule of the queue (through the router) and a Spark stream log (written on
        # the shard, as the Spark source does) go with it.
        with psycopg.connect(r, autocommit=True) as conn:
            conn.execute("SELECT lonnymq.cron_upsert('mv_cron', '* * * * *', %s, '\\x00'::bytea)", (q,))
        with psycopg.connect(sharded.shard_dsns[home]) as conn:
            conn.execute(
                "INSERT INTO lonnymq.spark_stream (stream_id, queue, created_at, seen_at)"
                " VALUES ('00000000-0000-0000-0000-00000000000a', %s, 1, 1)",
                (q,),
            )
            conn.execute(
                "INSERT INTO lonnymq.spark_stream_batch VALUES"
                " ('00000000-0000-0000-0000-00000000000a', 1, 0, '{7,8}', '{1,2}', 99)"
            )
        before = c.metrics(q)
        n_before = rows_on(sharded.shard_dsns[home], q) + rows_on(sharded.shard_dsns[home], dlq)

        result = shard.move(r, q, other)
        assert sorted(result.queues) == sorted([q, dlq])  # dead-letter links move together
        assert (result.source, result.target) == (home, other)
        assert result.rows["message"] == n_before and result.pause_ms > 0
        assert where_is(r, q) == where_is(r, dlq) == other
        assert rows_on(sharded.shard_dsns[home], q) == 0
        assert (result.rows["cron"], result.rows["spark_stream"], result.rows["spark_stream_batch"]) == (
            1,
            1,
            1,
        )
        for dsn, expected in ((sharded.shard_dsns[home], []), (sharded.shard_dsns[other], [(q, 1, [7, 8])])):
            with psycopg.connect(dsn) as conn:
                got = conn.execute(
                    "SELECT c.queue, b.batch_id, b.ids FROM lonnymq.cron c"
                    " JOIN lonnymq.spark_stream s ON s.queue = c.queue"
                    " JOIN lonnymq.spark_stream_batch b ON b.stream_id = s.stream_id WHERE c.name = 'mv_cron'"
                ).fetchall()
            assert got == expected
        with psycopg.connect(r, autocommit=True) as conn:  # not left for later tests' workers to fire
            assert conn.execute("SELECT lonnymq.cron_delete('mv_cron')").fetchone() == (True,)
        assert {k: v for k, v in shard.status(r).overrides.items() if k in (q, dlq)} == {q: other, dlq: other}
        assert shard.status(r).healthy  # nothing misplaced
        shard.init(r, sharded.shard_dsns)  # regenerating the router keeps the routes
        assert shard.status(r).overrides.get(q) == other

        after = c.metrics(q)
        assert (after.ready, after.scheduled, after.leased) == (before.ready, before.scheduled, before.leased)
        assert after.total_sent == before.total_sent
        # Leases taken on the source are acked on the target: same id, same fencing token.
        assert c.ack(leased) == {m.id for m in leased}
        # The dead letter is in the dead-letter queue, on the target too.
        assert [m.payload for m in c.take(dlq)] == [failed[0].payload]
        # Keys still de-duplicate: a new send with the key replaces the moved version.
        c.send(q, "keyed-v3", key="k1", on_conflict="replace")
        rest = c.take(q, 100)
        payloads = sorted(m.payload for m in rest)
        assert payloads == sorted(["ready4", "keyed-v3", "chan"]), payloads  # ready2 acked, ready3 dead
        assert acked[0].payload not in payloads  # not resurrected
        c.ack(rest)
        assert c.get(q, key="k1") is None
        # New messages get ids above every moved one (the target's sequence moved past them).
        new = c.send(q, "new")
        assert new.id > max(m.id for m in leased + rest)
        assert [m.payload for m in c.take(q)] == ["new"]

        # The archive moves with --archive; the archive of a queue moved without it is dropped.
        arch_home = where_is(r, "mv_arch")
        moved = shard.move(r, "mv_arch", 1 - arch_home, archive=True)
        assert moved.rows["archive"] == 1
        assert [m.payload for m in c.archived("mv_arch")] == ["x"]
        # And back home: the override goes (the hash says so again).
        shard.move(r, "mv_arch", arch_home)
        assert "mv_arch" not in shard.status(r).overrides
        assert where_is(r, "mv_arch") == arch_home
        assert [m.payload for m in c.archived("mv_arch")] == []


def test_refusals(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    with Client(r) as c:
        c.create_queue("mv_ref", if_not_exists=True)
    here = where_is(r, "mv_ref")
    with pytest.raises(errors.QueueNotFound, match="mv_nosuch"):
        shard.move(r, "mv_nosuch", 0)
    with pytest.raises(errors.InvalidArgument, match="no shard 7"):
        shard.move(r, "mv_ref", 7)
    with pytest.raises(errors.InvalidArgument, match="already on shard"):
        shard.move(r, "mv_ref", here)
    with pytest.raises(errors.InvalidArgument, match="already on shard"):
        shard.move(r, "mv_ref", sharded.shard_dsns[here])  # a shard named by its DSN
    with pytest.raises(errors.InvalidArgument, match="not a shard of this router"):
        shard.move(r, "mv_ref", "postgresql://postgres@127.0.0.1:1/test")
    for argv, expected in [
        (["mv_nosuch", "0"], "does not exist"),
        (["mv_ref", str(here)], "already on shard"),
        (["mv_ref", "9"], "no shard 9"),
    ]:
        assert main(["shard", "move", *argv, "--dsn", r]) == 1
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err and "Traceback" not in err, err
    # Through the CLI, and status shows the override.
    assert main(["shard", "move", "mv_ref", str(1 - here), "--dsn", r]) == 0
    assert f"to shard {1 - here}" in capsys.readouterr().out
    assert main(["shard", "status", "--dsn", r]) == 0
    assert "moved here (routed by override): " in capsys.readouterr().out
    assert main(["shard", "status", "--dsn", r, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overrides"]["mv_ref"] == 1 - here
    assert main(["shard", "move", "mv_ref", str(here), "--dsn", r, "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert (back["queues"], back["source"], back["target"]) == (["mv_ref"], 1 - here, here)


def test_move_under_load_loses_duplicates_and_resurrects_nothing(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    q = name_on(r, "mv_load", 0)
    with Client(r) as c:
        c.create_queue(q)
    moves: list[tuple[float, float, shard.MoveResult]] = []
    held: list[int] = []  # taken from the source by this thread, acked after the move
    mine: list[int] = []  # sent by this thread
    with Traffic(r, q) as traffic, Client(r) as c:
        traffic.progress(sent=30, acked=5)  # traffic around each move: waited for, not slept
        for target in (1, 0, 1):  # there, back, and there again
            lease: list[Message] = []
            while not lease:  # the consumer may have emptied the queue: add one of ours
                mine.append(-len(mine) - 1)
                c.send(q, {"n": mine[-1]})
                lease = c.take(q, 3)
            t0 = time.monotonic()
            result = shard.move(r, q, target)
            moves.append((t0, time.monotonic(), result))
            assert c.ack(lease) == {m.id for m in lease}  # same id and token on the target
            held += [m.payload["n"] for m in lease]
            traffic.progress(sent=30, acked=5)
    assert not traffic.errors, traffic.errors[:3]
    assert where_is(r, q) == 1
    rest = drain(r, q)
    delivered = [n for n, _ in traffic.delivered] + held + rest
    sent = set(traffic.sent) | set(mine)
    # Every message committed was delivered (0 lost), exactly once (0 duplicated); an ack
    # before a move is never followed by a delivery after it (0 resurrected).
    assert not sent - set(delivered), f"lost: {sorted(sent - set(delivered))[:10]}"
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    assert set(delivered) <= sent
    acked_at = dict(traffic.acked)
    for start, _, _ in moves:
        assert not [n for n, t in traffic.delivered if t > start and acked_at.get(n, t) < start]
    # The moves happened under traffic: messages crossed each one, and calls went on after it.
    assert len(sent) > 100 and sum(m.rows["message"] for _, _, m in moves) > 0
    for _, end, _ in moves:
        assert any(t > end for t, _ in traffic.calls)
    # Not stalled: the longest call overlapping a move is bounded (generously) by the move.
    assert max(traffic.stalls(s, e) for s, e, _ in moves) < 5.0


def test_a_long_transaction_makes_the_move_give_up_not_stall_the_queue(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    q = name_on(r, "mv_long", 0)
    with Client(r) as c:
        c.create_queue(q)
        c.send_batch(q, [{"n": -i} for i in range(1, 4)])
    lock_timeout = 0.3
    sent, delivered = {-1, -2, -3}, []
    # A transaction straight on the shard holding locks on the queue's rows (e.g. a report that
    # forgot to commit), and one on the router holding a call on the queue (a call inside an
    # explicit transaction holds the queue's route until it ends).
    for run, (holder_dsn, statement) in enumerate(
        [
            (
                sharded.shard_dsns[0],
                "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
                " WHERE q.name = %s FOR UPDATE OF m",
            ),
            (r, "SELECT * FROM lonnymq.queue_metrics(%s)"),
        ]
    ):
        with psycopg.connect(holder_dsn) as holder, Traffic(r, q, first=run * 1_000_000) as traffic:
            holder.execute(statement, (q,))
            time.sleep(0.2)
            t0 = time.monotonic()
            # Six attempts (3 s in all): room for the calls counted below on a loaded machine.
            with pytest.raises(shard.MoveBlocked, match="gave up after 6 attempt"):
                shard.move(r, q, 1, lock_timeout=lock_timeout, attempts=6, retry_delay=0.2)
            t1 = time.monotonic()
            time.sleep(0.2)
            holder.rollback()
        assert not traffic.errors, traffic.errors[:3]
        sent |= set(traffic.sent)
        delivered += [n for n, _ in traffic.delivered]
        assert t1 - t0 < 6 * (lock_timeout + 0.2) + 10.0  # it gave up (room for a loaded machine)
        # The queue kept moving during the failed attempts: no call waited much beyond one
        # lock_timeout (generous bound, well under the 3 s of all attempts), and calls completed
        # while the move was trying.
        assert traffic.stalls(t0, t1) < lock_timeout + 2.0, traffic.stalls(t0, t1)
        assert sum(1 for t, d in traffic.calls if t0 < t and t + d < t1) > 5
        assert where_is(r, q) == 0  # nothing moved
        with psycopg.connect(sharded.shard_dsns[1]) as conn:
            assert not conn.execute("SELECT FROM lonnymq.queue WHERE name = %s", (q,)).fetchall()
    # Once the transactions are gone, the move goes through with everything.
    with Client(r) as c:
        before = c.metrics(q)
        shard.move(r, q, 1, lock_timeout=lock_timeout)
        after = c.metrics(q)
    assert (after.ready, after.leased, after.total_sent) == (before.ready, before.leased, before.total_sent)
    delivered += drain(r, q)
    assert sorted(delivered) == sorted(sent)  # each exactly once


def test_an_unlogged_queue_with_channels_moves(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    q = name_on(r, "mv_unlogged", 0)
    with Client(r) as c:
        c.create_queue(q, unlogged=True, channel_max_concurrency=1)
        c.send_batch(q, [Envelope(i, channel=f"t{i % 2}") for i in range(6)])
        first = c.take(q, 10)  # one per channel: strict FIFO per channel
        assert sorted(m.payload for m in first) == [0, 1]
        shard.move(r, q, 1)
        # The channels kept their leases: nothing more is deliverable until the acks.
        assert c.take(q, 10) == []
        c.ack(first)
        assert sorted(m.payload for m in c.take(q, 10)) == [2, 3]
    with psycopg.connect(sharded.shard_dsns[1]) as conn:
        row = conn.execute("SELECT id, unlogged FROM lonnymq.queue WHERE name = %s", (q,)).fetchone()
    assert row is not None and row[0] < 0 and row[1]  # an unlogged queue's id, as queue_create gives


def test_a_route_that_cannot_be_recorded_leaves_the_queue_where_it_was(sharded) -> None:  # type: ignore[no-untyped-def]
    """A failure after the target committed its copy (here: the router refuses the route, a
    CHECK constraint added for the test) removes that copy; the queue stays whole on its shard."""
    r = sharded.dsn
    q = name_on(r, "mv_flip", 0)
    with Client(r) as c:
        c.create_queue(q)
        c.send_batch(q, [1, 2, 3])
        [m] = c.take(q)
    with psycopg.connect(r, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER TABLE lonnymq.shard_route ADD CONSTRAINT mv_test_no_flip CHECK (queue <> {})"
            ).format(sql.Literal(q))
        )
        try:
            with pytest.raises(psycopg.errors.CheckViolation):
                shard.move(r, q, 1)
        finally:
            conn.execute("ALTER TABLE lonnymq.shard_route DROP CONSTRAINT mv_test_no_flip")
    assert where_is(r, q) == 0 and rows_on(sharded.shard_dsns[1], q) == 0
    assert shard.status(r).healthy
    with Client(r) as c:
        assert c.ack(m) == {m.id}
        assert sorted(x.payload for x in c.take(q, 10)) == [2, 3]


def test_producer_and_consumer_roles_route_through_overrides(sharded) -> None:  # type: ignore[no-untyped-def]
    """The routing function and table are granted like the proxies: a producer and a consumer
    role (created on the router too, as docs/sharding.md says) reach a moved queue."""
    r = sharded.dsn
    roles_on_router(r, sharded.shard_dsns)
    q = name_on(r, "mv_roles", 0)
    with Client(r) as c:
        c.create_queue(q)
    shard.move(r, q, 1)
    with psycopg.connect(r, autocommit=True) as conn, Client(r) as c:
        as_producer_then_consumer(c, conn, q)
        conn.execute("RESET ROLE")
    assert where_is(r, q) == 1


def test_a_router_made_before_routes_is_refused(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    with Client(r) as c:
        c.create_queue("mv_old", if_not_exists=True)
    with psycopg.connect(r, autocommit=True) as conn:  # what an older shard init left: no fence
        conn.execute("DROP FUNCTION lonnymq._shard_of_new(text), lonnymq._shard_of(text)")
    try:
        with pytest.raises(errors.InvalidArgument, match="made by an older lonnymq"):
            shard.move(r, "mv_old", 1 - where_is(r, "mv_old"))
        with pytest.raises(errors.InvalidArgument, match="shard upgrade"):
            shard.add(r, sharded.shard_dsns)
    finally:
        shard.upgrade(r)  # the fence and routes back
    with Client(r) as c:
        c.send("mv_old", "routed again")


def test_the_target_keeps_naming_its_own_ids_after_a_move(sharded) -> None:  # type: ignore[no-untyped-def]
    """A queue whose ids are ahead of the target's sequence moves: the target's sequence goes
    past them and its new ids are still the target's index modulo STRIDE (a partitioned queue's
    ids name their shard), so a partition on the target keeps settling where its ids say."""
    q = name_on(sharded.dsn, "mv_ahead_", 0)
    part = "mv_ahead_part"
    with Client(sharded.dsn) as c:
        c.create_queue(q)
        c.create_queue(part, partitions=2)
        with psycopg.connect(sharded.shard_dsns[0], autocommit=True) as conn:  # shard 0 far ahead
            conn.execute(
                "SELECT setval('lonnymq.message_id_seq', last_value + %s * 5000) FROM lonnymq.message_id_seq",
                [STRIDE],
            )
        ahead = c.send(q, "ahead").id
        assert ahead % STRIDE == 0
        shard.move(sharded.dsn, q, 1)
        assert [m.id for m in c.take(q)] == [ahead]  # on shard 1, same id
        after = c.send(q, "after").id
        assert after > ahead and after % STRIDE == 1, (ahead, after)
        # A partitioned queue's messages made on shard 1 now still settle on shard 1.
        sent = [c.send(part, i, key=f"k{i}").id for i in range(8)]
        assert {i % STRIDE for i in sent} == {0, 1}
        got: list[Message] = []
        while batch := c.take(part, 8):
            got += batch
        assert sorted(m.id for m in got) == sorted(sent)
        assert c.ack(got) == set(sent)
        shard.move(sharded.dsn, q, 0)
        c.drop_queue(part)
