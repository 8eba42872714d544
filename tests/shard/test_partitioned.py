"""One hot queue over several shards (``create_queue(partitions=N)``), through the router and
with direct clients: keyed sends land together, unkeyed ones spread, takes visit every
partition and never come back empty while one has messages, settles go to the shard the id
names, stale tokens are refused, and nothing is lost or delivered twice under concurrent
producers and consumers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import psycopg
import pytest

from lonnymq import AsyncClient, Client, errors, shard
from lonnymq.client.direct import STRIDE, key_partition
from lonnymq.worker import App, GiveUp, Worker
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow]

MODES = [pytest.param(False, id="router"), pytest.param(True, id="direct")]


def _on_shards(sharded, queue: str) -> list[list[tuple[int, str | None]]]:  # type: ignore[no-untyped-def]
    """(id, key) of the queue's live messages on each shard, read on the shard itself."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            exists = conn.execute("SELECT FROM lonnymq.queue WHERE name = %s", (queue,)).fetchone()
            rows = (
                conn.execute(
                    "SELECT m.id, m.key FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
                    " WHERE q.name = %s ORDER BY m.id",
                    (queue,),
                ).fetchall()
                if exists is not None
                else []
            )
        out.append([(int(i), k) for i, k in rows])
    return out


@pytest.mark.parametrize("direct", MODES)
def test_keyed_sends_land_together_unkeyed_spread(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_keys_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        assert c.create_queue(q, partitions=2)
        assert not c.create_queue(q, partitions=2, if_not_exists=True)
        with pytest.raises(errors.QueueExists):
            c.create_queue(q, partitions=2)
        parts = shard.status(sharded.dsn).partitioned[q]
        assert sorted(parts) == [0, 1]
        keys = [f"order-{i}" for i in range(20)]
        first = {k: c.send(q, {"k": k, "v": 1}, key=k) for k in keys}
        # The same key again: de-duplicated on its partition (ignored, the live id).
        again = {k: c.send(q, {"k": k, "v": 2}, key=k) for k in keys}
        assert all(again[k].outcome == "ignored" and again[k].id == first[k].id for k in keys)
        replaced = c.send(q, {"k": keys[0], "v": 3}, key=keys[0], on_conflict="replace")
        assert replaced.outcome == "updated"
        got = c.get(q, key=keys[0])
        assert got is not None and got.payload["v"] == 3
        # get and cancel by id and by key, on the partition that holds each.
        for k in keys[:4]:
            by_id = c.get(q, id=first[k].id)
            assert by_id is not None and by_id.key == k
        assert c.cancel(q, key=keys[1]) and c.get(q, key=keys[1]) is None
        mixed = [first[k].id for k in keys[2:8]]
        assert {i % STRIDE for i in mixed} == {0, 1}, "keys of one partition only"
        assert c.cancel(q, ids=mixed) == sorted(mixed)
        assert all(c.get(q, id=i) is None for i in mixed)
        unkeyed = [c.send(q, {"u": i}) for i in range(100)]
        # Without the client's idempotency keys: the partitions in turn.
        with Client(sharded.dsn, direct=direct, idempotent_sends=False) as plain:
            turns = [plain.send(q, {"t": i}).id % STRIDE for i in range(10)]
    for k in keys:  # the id names the shard of the key's partition
        assert first[k].id % STRIDE == parts[key_partition(k, 2)]
    live = [k for k in keys if k not in keys[1:8]]
    placed = _on_shards(sharded, q)
    for i, rows in enumerate(placed):
        assert {k for _, k in rows if k} == {k for k in live if parts[key_partition(k, 2)] == i}
    assert {k for rows in placed for _, k in rows if k} == set(live), "a key on no shard"
    # Each unkeyed send of the client carries an idempotency key, which picks its partition
    # (a repeat goes where the first went): spread at random, evenly.
    spread = Counter(r.id % STRIDE for r in unkeyed)
    assert spread[0] >= 30 and spread[1] >= 30, spread
    assert turns in ([0, 1] * 5, [1, 0] * 5), turns


@pytest.mark.parametrize("direct", MODES)
def test_takes_visit_every_partition_and_never_wait_on_an_empty_one(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_take_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        c.create_queue(q, partitions=2)
        parts = shard.status(sharded.dsn).partitioned[q]
        # Keys of each partition.
        by_part: dict[int, list[str]] = {0: [], 1: []}
        i = 0
        while min(len(v) for v in by_part.values()) < 20:
            by_part[key_partition(f"k{i}", 2)].append(f"k{i}")
            i += 1
        for p in (0, 1):
            for k in by_part[p][:20]:
                c.send(q, {"k": k}, key=k)
        # Fair: single-message takes alternate between the partitions while both have messages.
        got = [c.take(q, 1) for _ in range(20)]
        assert all(len(b) == 1 for b in got)
        shards_seen = Counter(b[0].id % STRIDE for b in got)
        assert shards_seen[parts[0]] >= 8 and shards_seen[parts[1]] >= 8, shards_seen
        c.ack([m for b in got for m in b])
        # Only one partition has messages now and then: every take still finds them.
        while rest := c.take(q, 100):  # the rest
            c.ack(rest)
        lonely = by_part[1][:1] + [f"only-{n}" for n in range(200) if key_partition(f"only-{n}", 2) == 1][:9]
        for k in lonely:
            c.send(q, {"k": k}, key=k)
        for _ in range(len(lonely)):
            b = c.take(q, 1)
            assert len(b) == 1 and b[0].id % STRIDE == parts[1]
            c.ack(b)
        assert c.take(q, 1) == []
        # receive() returns at once when one partition has a message, whichever it is.
        c.send(q, {"k": "late"}, key=by_part[0][0] + "-late")
        t0 = time.monotonic()
        b = c.receive(q, 1, timeout=60, poll=30)
        # At once, not at a later look (the map's 10 s, the poll): room for a loaded machine.
        assert len(b) == 1 and time.monotonic() - t0 < 5
        c.ack(b)


@pytest.mark.parametrize("direct", MODES)
def test_settles_route_by_id_and_stale_tokens_stay_refused(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_settle_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        c.create_queue(q, partitions=2, lease=30)
        for i in range(20):
            c.send(q, {"n": i})
        batch = c.take(q, 20) + c.take(q, 20)
        assert len(batch) == 20 and {m.id % STRIDE for m in batch} == {0, 1}
        assert set(c.extend(batch, lease=60)) == {m.id for m in batch}
        half, rest = batch[:10], batch[10:]
        assert c.nack(rest, delay=[0] * len(rest)) == {m.id: "retry" for m in rest}
        assert c.ack(half) == {m.id for m in half}
        again = c.take(q, 20) + c.take(q, 20)
        assert {m.id for m in again} == {m.id for m in rest}
        # The nacked deliveries' old tokens cannot settle the new ones.
        with pytest.raises(errors.LeaseLost):
            c.ack(rest[0])
        assert c.ack(rest) == set()
        assert c.ack(again) == {m.id for m in again}
        m = c.metrics(q)
        assert (m.ready, m.leased, m.total_sent) == (0, 0, 20)
        # An expired lease taken again: the first holder is refused, the second acks.
        c.send(q, {"n": "x"})
        [first] = c.take(q, 1, lease=0.2)
        time.sleep(0.4)
        second = c.take(q, 1) or c.take(q, 1)
        assert [s.id for s in second] == [first.id] and second[0].token != first.token
        with pytest.raises(errors.LeaseLost):
            c.extend(first)
        with pytest.raises(errors.LeaseLost):
            c.ack(first)
        assert c.ack(second) == {first.id}


def test_a_stale_settle_is_refused_on_the_shard_through_raw_sql(sharded) -> None:  # type: ignore[no-untyped-def]
    q = "hot_sql"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
        c.send(q, "a", key="a")
        c.send(q, "b", key="b")
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, token FROM lonnymq.take(%s, 10)", (q,)).fetchall()
        rows += conn.execute("SELECT id, token FROM lonnymq.take(%s, 10)", (q,)).fetchall()
        assert len(rows) == 2
        for i, t in rows:  # ack through the router, one call each: on the id's shard
            stale = conn.execute("SELECT * FROM lonnymq.ack(%s, %s, %s)", (q, [i], [t + 1])).fetchall()
            assert stale == []
            assert conn.execute("SELECT * FROM lonnymq.ack(%s, %s, %s)", (q, [i], [t])).fetchall() == [(i,)]
        if len({i % STRIDE for i, _ in rows}) == 2:  # several partitions in one call: a clear refusal
            with pytest.raises(psycopg.Error, match="settle each partition"):
                conn.execute("SELECT * FROM lonnymq.ack(%s, %s, %s)", (q, [i for i, _ in rows], [1, 1]))


def test_refusals(sharded) -> None:  # type: ignore[no-untyped-def]
    with Client(sharded.dsn) as c:
        with pytest.raises(errors.InvalidArgument, match="at most the number of shards"):
            c.create_queue("hot_too_many", partitions=4)
        with pytest.raises(errors.InvalidArgument, match="dead-letter queue of a partitioned queue must be"):
            c.create_queue("hot_dlq", partitions=2, dead_letter_queue="x")  # not a partitioned queue
        with pytest.raises(errors.InvalidArgument, match="positive"):
            c.create_queue("hot_zero", partitions=0)
        c.create_queue("hot_ref", partitions=2)
        # A call that would see one partition only is refused, not answered partly.
        # (dead letters, the archive, channels and message_list visit every partition:
        # test_partitioned_channels, test_partitioned_messages)
        with (
            psycopg.connect(sharded.dsn, autocommit=True) as conn,
            pytest.raises(psycopg.Error, match="this call would see one partition only"),
        ):
            conn.execute("SELECT lonnymq.spark_queue_check('hot_ref')")  # Spark's SQL functions
        # A partition moves only when named, and only to a shard holding none of the queue's
        # (here both shards hold one: tests/shard/test_partition_move.py moves them over 4).
        with pytest.raises(errors.InvalidArgument, match="say which partition moves"):
            shard.move(sharded.dsn, "hot_ref", 1)
        with pytest.raises(errors.InvalidArgument, match="already holds partition"):
            shard.move(
                sharded.dsn, "hot_ref", 1, partition=shard.status(sharded.dsn).partitioned["hot_ref"].index(0)
            )
        assert [q.name for q in c.list_queues()].count("hot_ref") == 1
        assert c.drop_queue("hot_ref")
        assert "hot_ref" not in shard.status(sharded.dsn).partitioned
        assert all("hot_ref" not in s.queues for s in shard.status(sharded.dsn).shards)
    with Client(sharded.shard_dsns[0]) as c, pytest.raises(errors.InvalidArgument, match="shard router"):
        c.create_queue("hot_single", partitions=2)


@pytest.mark.parametrize("direct", MODES)
def test_concurrent_producers_and_consumers_lose_nothing(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_load_{int(direct)}"
    per_producer = 150
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
    sent: list[int] = []
    acked: list[int] = []
    failures: list[BaseException] = []
    done = threading.Event()
    lock = threading.Lock()

    def produce(p: int) -> None:
        try:
            with Client(sharded.dsn, pool_size=1, direct=direct) as c:
                for i in range(per_producer):
                    n = p * per_producer + i
                    # Half keyed (unique keys), half not; a batch now and then.
                    if i % 10 == 9:
                        rs = c.send_batch(q, [{"n": n}])
                        assert rs[0].outcome == "created"
                    else:
                        c.send(q, {"n": n}, key=f"m{n}" if i % 2 else None)
                    with lock:
                        sent.append(n)
        except BaseException as e:
            failures.append(e)

    def consume() -> None:
        try:
            with Client(sharded.dsn, pool_size=1, direct=direct) as c:
                while not done.is_set() or c.metrics(q).ready:
                    got = c.take(q, 7)
                    if not got:
                        time.sleep(0.01)
                        continue
                    if c.ack(got) != {m.id for m in got}:
                        raise AssertionError("an ack was refused")
                    with lock:
                        acked.extend(m.payload["n"] for m in got)
        except BaseException as e:
            failures.append(e)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
    consumers = [threading.Thread(target=consume) for _ in range(2)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join(120)
    done.set()
    for t in consumers:
        t.join(120)
    assert not failures, failures
    assert len(sent) == 3 * per_producer
    dupes = [n for n, k in Counter(acked).items() if k > 1]
    assert dupes == [], f"{len(dupes)} delivered twice"
    assert sorted(acked) == sorted(sent), f"{len(set(sent) - set(acked))} lost"
    with Client(sharded.dsn) as c:
        m = c.metrics(q)
        assert (m.ready, m.scheduled, m.leased, m.total_sent) == (0, 0, 0, len(sent))
    assert all(rows == [] for rows in _on_shards(sharded, q))


@pytest.mark.parametrize(
    ("direct", "partitions"),
    [
        pytest.param(False, 2, id="router"),
        pytest.param(True, 2, id="direct"),
        pytest.param(True, None, id="direct-plain-queue"),
    ],
)
def test_worker_serves_a_partitioned_queue(sharded, direct: bool, partitions: int | None) -> None:  # type: ignore[no-untyped-def]
    """The worker on a partitioned queue: its takes visit both partitions, its acks, retries
    (nack), dead-lettering (give_up) and heartbeats settle on each delivery's shard. With a
    direct client, every one of those calls goes straight to the shards (of a partitioned
    queue, or of a plain one): the router's proxies of the data path are dropped while it runs."""
    q = f"hot_worker_{int(direct)}_{partitions or 1}"
    with Client(sharded.dsn) as c:
        # 3 s leases, heartbeats every second: 1 s leases left a loaded CI machine (load 6-12)
        # 0.67 s of slack for a heartbeat through the router to land.
        c.create_queue(q, partitions=partitions, lease=3)
        c.send_batch(q, [{"i": i} for i in range(0, 30)])
        c.send_batch(q, [{"i": i} for i in range(30, 60)])
    app = App()
    seen: list[int] = []

    @app.handler(q)
    async def work(job):  # type: ignore[no-untyped-def]
        i = job.payload["i"]
        if i % 10 == 3 and job.attempt == 1:
            raise RuntimeError("once")  # a retry: nack
        if i % 10 == 7:
            raise GiveUp("never")  # dead now: give_up
        if i % 10 == 5:
            await asyncio.sleep(4)  # outlives its lease unless a heartbeat extends it
        seen.append(i)

    dropped = ("send", "send_batch", "take", "ack", "nack", "extend", "give_up", "next_ready_in")

    async def main() -> None:
        async with AsyncClient(sharded.dsn, direct=direct) as client:
            await client.take(q, 1, lease=0.001)  # the route is known before the proxies go
            if direct:
                with psycopg.connect(sharded.dsn, autocommit=True) as conn:
                    for fn in dropped:
                        conn.execute(f"DROP FUNCTION lonnymq.{fn}")
            w = Worker(app, client, poll_interval=0.2, concurrency=8)
            await w.start()
            try:
                await eventually(lambda: len(seen) >= 48, 60, "the queue served")
                await asyncio.sleep(3.5)  # a late duplicate would show (past a lease)
            finally:
                await w.stop()

    try:
        asyncio.run(main())
    finally:
        if direct:
            shard.init(sharded.dsn, sharded.shard_dsns)  # regenerates the proxies
    assert sorted(seen) == [i for i in range(60) if i % 10 != 7]
    with Client(sharded.dsn) as c:
        m = c.metrics(q)
        assert (m.ready, m.leased, m.scheduled, m.dead) == (0, 0, 0, 6)
