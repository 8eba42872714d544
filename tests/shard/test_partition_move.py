"""``shard move --partition``: one partition of a partitioned queue moves to another shard while
producers (keyed and not) and consumers call through the router and direct; every message is
consumed exactly once, leases taken before the move settle after it (by id and token, both
ways), keys still land on their partition, and the refusals are one clear line. A router over
four fresh databases of the session's two clusters (the other tests keep their two shards)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from shard_helpers import WAKE_LAG, Threads, home, kill_all, waiter_follows

from lonnymq import Client, errors, shard
from lonnymq.cli import main
from lonnymq.client.direct import STRIDE, ShardMap, key_partition
from lonnymq.client.ops import Op, Ops
from lonnymq.shard import admin

pytestmark = [pytest.mark.once, pytest.mark.slow]


def database(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


def four_shards(sharded, prefix: str) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """A router over 4 shards: new databases ``<prefix>_router``, ``<prefix>_s<i>`` of the
    session's two clusters, alternating."""
    a, b = sharded.shards
    router = database(sharded.router.dsn, f"{prefix}_router")
    shards = [database(c.dsn, f"{prefix}_s{i}") for i, c in enumerate([a, b, a, b])]
    shard.init(router, shards)
    return router, shards


@pytest.fixture(scope="module")
def four(sharded) -> Iterator[tuple[str, list[str]]]:  # type: ignore[no-untyped-def]
    """A router over 4 shards (:func:`four_shards`)."""
    yield four_shards(sharded, "pmove")


#: A queue's live message ids on a shard database, read there.
HELD = "SELECT m.id FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id WHERE q.name = %s ORDER BY 1"


def held_on(shard_dsn: str, queue: str) -> list[int]:
    with psycopg.connect(shard_dsn) as conn:
        return [int(r[0]) for r in conn.execute(HELD, (queue,))]


class Load(Threads):
    """A producer and a consumer through the router and direct each, in threads: the router's
    producer sends without a key, the direct one with a fresh key per message; each consumer
    takes up to 10, holds them briefly (leases in flight when the partition moves) and acks."""

    def __init__(self, router: str, queue: str) -> None:
        self.router, self.queue = router, queue
        self.stop = threading.Event()
        self.sent: list[str] = []
        self.delivered: list[str] = []
        self.errors: list[BaseException] = []
        self.calls: list[tuple[str, float, float]] = []  # (router|direct, start, seconds)
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=f, args=(direct,), daemon=True)
            for f in (self.produce, self.consume)
            for direct in (False, True)
        ]

    def timed(self, direct: bool, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            return f(*args, **kwargs)
        finally:
            self.calls.append(("direct" if direct else "router", t0, time.monotonic() - t0))

    def stalls(self, start: float, end: float) -> dict[str, float]:
        """The longest call of each kind of client that overlapped [start, end], in ms."""
        out: dict[str, float] = {}
        for who, t0, d in self.calls:
            if t0 <= end and t0 + d >= start:
                out[who] = max(out.get(who, 0.0), round(d * 1000, 1))
        return out

    def produce(self, direct: bool) -> None:
        tag = "d" if direct else "r"
        try:
            with Client(self.router, pool_size=1, direct=direct) as c:
                n = 0
                while not self.stop.is_set():
                    name = f"{tag}-{n}"
                    self.timed(direct, c.send, self.queue, {"n": name}, key=name if direct else None)
                    with self.lock:
                        self.sent.append(name)
                    n += 1
        except BaseException as e:
            self.errors.append(e)

    def consume(self, direct: bool) -> None:
        try:
            with Client(self.router, pool_size=1, direct=direct) as c:
                while not self.stop.is_set():
                    got = self.timed(direct, c.take, self.queue, 10)
                    with self.lock:
                        self.delivered.extend(m.payload["n"] for m in got)
                    if not got:
                        time.sleep(0.005)
                        continue
                    time.sleep(0.02)
                    done = self.timed(direct, c.ack, got)
                    if done != {m.id for m in got}:
                        raise AssertionError(f"ack refused for {sorted({m.id for m in got} - done)}")
        except BaseException as e:
            self.errors.append(e)


def test_a_partition_moves_under_traffic_exactly_once(four, capsys) -> None:  # type: ignore[no-untyped-def]
    router, shards = four
    q = "pmove_hot"
    with Client(router) as rc, Client(router, direct=True) as dc:
        assert rc.create_queue(q, partitions=2)
        parts = shard.status(router).partitioned[q]
        k = 0
        source = parts[k]
        target = next(i for i in range(4) if i not in parts)
        # Scheduled keyed messages on both partitions (not taken by the consumers).
        later = {
            f"later-{i}": rc.send(q, {"n": f"later-{i}"}, key=f"later-{i}", delay=3600) for i in range(12)
        }
        assert {r.id % STRIDE for r in later.values()} == set(parts)
        # Ready messages, and leases on the moving partition held across the move by each kind
        # of client (takes visit the partitions in turn).
        pre = [f"pre-{i}" for i in range(40)]
        for name in pre:
            rc.send(q, {"n": name})
        held = {}
        for who, c in (("router", rc), ("direct", dc), ("nack", rc)):
            for _ in range(4):
                got = c.take(q, 5)
                if got and got[0].id % STRIDE == source:
                    held[who] = got
                    break
                c.nack(got)
        assert set(held) == {"router", "direct", "nack"}, "no take from the moving partition"
        with Load(router, q) as load:
            time.sleep(1.5)
            t0 = time.monotonic()
            result = shard.move(router, q, target, partition=k)
            t1 = time.monotonic()
            time.sleep(1.5)
        assert not load.errors, load.errors[:3]
        assert (result.queues, result.partition, result.source, result.target) == ([q], k, source, target)
        assert result.rows["message"] > 0
        capsys.readouterr()
        assert main(["shard", "status", "--dsn", router, "--json"]) == 0

        moved = [*parts[:k], target, *parts[k + 1 :]]
        assert shard.status(router).partitioned[q] == moved
        assert held_on(shards[source], q) == []  # the source's partition is gone
        assert any(i % STRIDE == source for i in held_on(shards[target], q))  # ids of the source
        # Leases taken before the move settle after it, by id and token: the router's acked at
        # once, the direct one's extended (the direct client's map names the source: it finds
        # the partition gone there and follows) and then acked.
        assert rc.ack(held["router"]) == {m.id for m in held["router"]}
        assert set(dc.extend(held["direct"], lease=30)) == {m.id for m in held["direct"]}
        assert dc.ack(held["direct"]) == {m.id for m in held["direct"]}
        assert dc.nack(held["nack"]) == dict.fromkeys((m.id for m in held["nack"]), "retry")  # again below
        # Keys still land on their partition: the same key again is the same live message.
        for key, first in later.items():
            for c in (rc, dc):
                again = c.send(q, {"n": "dup"}, key=key, delay=3600)
                assert (again.outcome, again.id) == ("ignored", first.id), key
            got = dc.get(q, key=key)
            assert got is not None and got.id == first.id
            made = first.id % STRIDE  # the key's partition made it: it is where that partition is
            assert moved[key_partition(key, 2)] == (target if made == source else made), key
        # Cancel by ids (the moved partition's and the other's), through each kind of client.
        ids = sorted(r.id for r in later.values())
        moving = [i for i in ids if i % STRIDE == source]
        staying = [i for i in ids if i % STRIDE != source]
        assert dc.cancel(q, ids=moving[:3]) == moving[:3]
        assert rc.cancel(q, ids=moving[3:]) == moving[3:]
        assert rc.cancel(q, ids=staying) == staying
        # What is left: drained through the router.
        rest: list[str] = []
        while batch := rc.take(q, 500):
            rest.extend(m.payload["n"] for m in batch)
            assert rc.ack(batch) == {m.id for m in batch}
        time.sleep(0.2)
        assert rc.take(q, 500) == [] and dc.take(q, 500) == []  # nothing comes back
    delivered = Counter([*load.delivered, *rest, *(m.payload["n"] for m in held["router"] + held["direct"])])
    sent = Counter([*pre, *load.sent])
    assert delivered - sent == Counter(), "delivered but never sent, or twice"
    assert sent - delivered == Counter(), "lost"
    assert max(delivered.values()) == 1
    assert sum(n.startswith("d-") for n in load.sent) > 0 and sum(n.startswith("r-") for n in load.sent) > 0
    # The pause as measured (docs/sharding.md quotes runs of this test with -s).
    measured = {
        "pause_ms": round(result.pause_ms, 1),
        "move_ms": round((t1 - t0) * 1000, 1),
        "longest_call_during_move_ms": load.stalls(t0, t1),
        "messages_moved": result.rows["message"],
        "sent": len(load.sent) + len(pre),
    }
    print("partition move:", json.dumps(measured, sort_keys=True))


def test_the_refusals_are_clear_and_moves_survive_an_upgrade(four, capsys) -> None:  # type: ignore[no-untyped-def]
    """Each refusal is typed and one line from the CLI; a partition moves away and back and by
    the CLI; `shard upgrade` keeps where the moved partitions' ids are."""
    router, _ = four
    q, plain = "pmove_refuse", "pmove_plain"
    with Client(router) as c:
        c.create_queue(q, partitions=2)
        c.create_queue(plain)
        keys = [next(k for k in (f"r{i}" for i in range(100)) if key_partition(k, 2) == p) for p in (0, 1)]
        sent = {c.send(q, k, key=k).id: k for k in keys}  # one message in each partition
    parts = shard.status(router).partitioned[q]
    free = [i for i in range(4) if i not in parts]
    with pytest.raises(errors.InvalidArgument, match=r"partitioned over shards .*say which partition"):
        shard.move(router, q, free[0])
    with pytest.raises(errors.InvalidArgument, match=r"has no partition 2: its partitions are 0\.\.1"):
        shard.move(router, q, free[0], partition=2)
    with pytest.raises(errors.InvalidArgument, match=f"shard {parts[1]} already holds partition 1"):
        shard.move(router, q, parts[1], partition=0)
    with pytest.raises(errors.InvalidArgument, match="already on shard"):
        shard.move(router, q, parts[0], partition=0)
    with pytest.raises(errors.InvalidArgument, match="is not partitioned"):
        shard.move(router, plain, free[0], partition=0)
    # Partition 0 leaves shard parts[0]: the ids made there are partition 0's, so partition 1
    # cannot go there (an id would no longer say its partition); partition 0 can come back.
    shard.move(router, q, free[0], partition=0)
    with pytest.raises(errors.InvalidArgument, match="are now partition 0's"):
        shard.move(router, q, parts[0], partition=1)
    back = shard.move(router, q, parts[0], partition=0)
    assert (back.source, back.target) == (free[0], parts[0])
    assert shard.status(router).partitioned[q] == parts
    capsys.readouterr()
    assert main(["shard", "move", q, str(free[1]), "--partition", "7", "--dsn", router]) == 1
    err = capsys.readouterr().err.strip()
    assert "has no partition 7" in err and "\n" not in err
    # The CLI moves a partition too.
    assert main(["shard", "move", q, str(free[1]), "--partition", "1", "--dsn", router]) == 0
    assert shard.status(router).partitioned[q] == [parts[0], free[1]]
    with psycopg.connect(router) as conn:
        before = admin.moved_ids(conn, "lonnymq")[q]
    assert before == {parts[0]: 0, free[0]: 0, parts[1]: 1}
    shard.upgrade(router)
    with psycopg.connect(router) as conn:
        assert admin.moved_ids(conn, "lonnymq")[q] == before
    for direct in (False, True):  # the messages made before the moves, found by id
        with Client(router, direct=direct) as c:
            assert {i: (m.key if (m := c.get(q, id=i)) else None) for i in sent} == sent
    with Client(router) as c:
        got = [m for _ in range(2) for m in c.take(q, 5)]
        assert sorted(m.id for m in got) == sorted(sent) and c.ack(got) == set(sent)


def _keyed(c: Client, q: str, payloads: list[str]) -> None:
    for p in payloads:
        c.send(q, p, key=p)


def test_dead_letters_move_with_their_partition(four) -> None:  # type: ignore[no-untyped-def]
    """A partition's dead letters (its archive's dead rows) move with it: listed, counted and
    requeued by id after the move (router and direct), then consumed once each."""
    router, _ = four
    q = "pmove_dead"
    with Client(router) as rc, Client(router, direct=True) as dc:
        rc.create_queue(q, partitions=2, max_attempts=1)
        parts = shard.status(router).partitioned[q]
        free = next(i for i in range(4) if i not in parts)
        payloads = [f"x{i}" for i in range(24)]
        _keyed(rc, q, payloads)
        dead = kill_all(rc, q, 24)
        assert {i % STRIDE for i in dead} == set(parts)
        dc.take(q, 1)  # the direct client's map: from before the move
        result = shard.move(router, q, free, partition=1)
        assert result.rows["archive"] == sum(i % STRIDE == parts[1] for i in dead)
        for c in (rc, dc):
            assert c.metrics(q).dead == 24
            assert sorted(d.id for d in c.dead_letters(q, 100)) == sorted(dead)
        moved = [i for i in sorted(dead) if i % STRIDE == parts[1]]
        stayed = [i for i in sorted(dead) if i % STRIDE == parts[0]]
        assert dc.requeue_dead(q, moved[:3] + stayed[:2]) == 5
        assert rc.requeue_dead(q, moved[3:6]) == 3
        assert rc.requeue_dead(q) == 16
        drained: list[str] = []
        while got := dc.take(q, 10):
            drained += [m.payload for m in got]
            assert dc.ack(got) == {m.id for m in got}
        assert Counter(drained) == Counter(payloads), "0 lost, 0 duplicated"


def test_a_partition_dead_letters_into_its_dead_letter_queue_on_the_target(four) -> None:  # type: ignore[no-untyped-def]
    """With a dead-letter queue partitioned over every shard, a moved partition dead-letters
    into the dead-letter queue's partition on its new shard; the dead letters it made before
    stay in the one on its old shard (they are that queue's messages). The dead-letter queue's
    own partition there cannot move away from the queue's, and a dead-letter queue without a
    partition on the target keeps the queue's partition where it is."""
    router, shards = four
    q, dlq = "pmove_dlq_src", "pmove_dlq"
    with Client(router) as c:
        c.create_queue(dlq, partitions=4)
        c.create_queue(q, partitions=2, max_attempts=1, dead_letter_queue=dlq)
        parts = shard.status(router).partitioned[q]
        free = next(i for i in range(4) if i not in parts)
        before = [f"b{i}" for i in range(10)]
        _keyed(c, q, before)
        kill_all(c, q, 10)
        shard.move(router, q, free, partition=1)
        after = [f"a{i}" for i in range(10)]
        _keyed(c, q, after)
        dead = kill_all(c, q, 10)
        on_target = held_on(shards[free], dlq)
        moved_dead = [i for i in dead if i % STRIDE in (parts[1], free)]
        assert moved_dead and len(on_target) == len(moved_dead)
        assert all(i % STRIDE == free for i in on_target)  # made there, by the dead-lettering
        drained: list[str] = []
        while got := c.take(dlq, 10):
            drained += [m.payload for m in got]
            c.ack(got)
        assert Counter(drained) == Counter(before + after), "0 lost, 0 duplicated"

        # A dead-letter queue over the same two shards as its queue (names of the same home).
        narrow = "pmove_dlq_narrow"
        c.create_queue(narrow, partitions=2)
        parts = shard.status(router).partitioned[narrow]
        src = next(n for n in (f"pmove_narrow_src_{i}" for i in range(200)) if home(router, n, 4) == parts[0])
        c.create_queue(src, partitions=2, dead_letter_queue=narrow)
        assert shard.status(router).partitioned[src] == parts
        free = next(i for i in range(4) if i not in parts)
        with pytest.raises(errors.InvalidArgument, match=f"dead-letter queue '{narrow}' .* has no partition"):
            shard.move(router, src, free, partition=0)
        with pytest.raises(errors.InvalidArgument, match=f"is the dead-letter queue of {src} on shard"):
            shard.move(router, narrow, free, partition=0, feeders=False)
        assert shard.status(router).partitioned[src] == parts == shard.status(router).partitioned[narrow]


def test_a_dead_letter_queues_partition_moves_with_the_queues_feeding_it(four) -> None:  # type: ignore[no-untyped-def]
    """A partition of a partitioned dead-letter queue moves together with the partitions on its
    shard of the partitioned queues that dead-letter into it (one move: same fence, one router
    transaction): their live messages and the dead letters already made move once each, and
    the queue's moved partition dead-letters into the dead-letter queue's partition on the new
    shard. Without feeders, or with a plain queue feeding it there, it is refused."""
    router, shards = four
    dlq = "pmove_tog_dlq"
    with Client(router) as c, Client(router, direct=True) as dc:
        c.create_queue(dlq, partitions=2)
        parts = shard.status(router).partitioned[dlq]
        q = next(n for n in (f"pmove_tog_{i}" for i in range(200)) if home(router, n, 4) == parts[0])
        c.create_queue(q, partitions=2, max_attempts=1, dead_letter_queue=dlq)
        assert shard.status(router).partitioned[q] == parts
        free = [i for i in range(4) if i not in parts]
        before = [f"b{i}" for i in range(12)]
        _keyed(c, q, before)
        dead = kill_all(c, q, 12)
        assert {i % STRIDE for i in dead} == set(parts)
        live = [f"l{i}" for i in range(12)]
        _keyed(c, q, live)
        assert dc.get(q, key=live[0]) is not None  # the direct client's map: from before
        with pytest.raises(errors.InvalidArgument, match=f"is the dead-letter queue of {q} on shard"):
            shard.move(router, dlq, free[0], partition=0, feeders=False)
        result = shard.move(router, dlq, free[0], partition=0)
        assert (result.queues, result.partitions) == ([dlq, q], {dlq: 0, q: 0})
        assert result.source == parts[0] and result.target == free[0]
        assert result.rows["queue"] == 2 and result.rows["message"] > 0
        moved = [free[0], parts[1]]
        assert shard.status(router).partitioned[dlq] == moved == shard.status(router).partitioned[q]
        assert held_on(shards[parts[0]], dlq) == [] and held_on(shards[parts[0]], q) == []
        # The moved partition dead-letters into the dead-letter queue's partition on its new shard.
        after = [f"a{i}" for i in range(12)]
        _keyed(c, q, after)
        got: list[str] = []
        while len(got) < len(live) + len(after):
            batch = dc.take(q, 7)
            assert batch
            for m in batch:
                if m.payload.startswith("a"):
                    assert dc.nack([m], error="boom") == {m.id: "dead"}
                else:
                    assert dc.ack([m]) == {m.id}
            got += [m.payload for m in batch]
        assert Counter(got) == Counter(live + after), "0 lost, 0 duplicated"
        on_target = held_on(shards[free[0]], dlq)
        assert on_target and all(i % STRIDE in (free[0], parts[0]) for i in on_target)
        drained: list[str] = []
        while batch := c.take(dlq, 10):
            drained += [m.payload for m in batch]
            assert c.ack(batch) == {m.id for m in batch}
        assert Counter(drained) == Counter(before + after), "0 lost, 0 duplicated"
        assert c.take(q, 10) == [] and c.take(dlq, 10) == []
        # A plain queue dead-letters into the other partition: that one stays with it.
        plain = next(
            n for n in (f"pmove_tog_plain_{i}" for i in range(200)) if home(router, n, 4) == parts[1]
        )
        c.create_queue(plain, dead_letter_queue=dlq)
        with pytest.raises(errors.InvalidArgument, match=f"queue '{plain}', not partitioned, dead-letters"):
            shard.move(router, dlq, free[1], partition=1)
        assert shard.status(router).partitioned[dlq] == moved


def test_a_waiting_receive_follows_a_moving_partition(four) -> None:  # type: ignore[no-untyped-def]
    """A receive() (poll=30) waiting on a partitioned queue, registered on each partition's shard,
    is told by the move of one partition: it registers on the new shard at once and wakes for a
    send that lands in the moved partition."""
    router, shards = four
    q = "pmove_wait"
    with Client(router) as c:
        c.create_queue(q, partitions=2)
        parts = shard.status(router).partitioned[q]
        free = next(i for i in range(4) if i not in parts)
        key = next(k for k in (f"w{i}" for i in range(100)) if key_partition(k, 2) == 1)

        def move() -> None:
            assert shard.move(router, q, free, partition=1).target == free

        got, lag = waiter_follows(
            c, q, shards[parts[1]], shards[free], move, lambda: c.send(q, "moved partition", key=key)
        )
    assert got == ["moved partition"]
    assert lag < WAKE_LAG, lag


def test_a_direct_client_routes_a_moved_partitions_ids_to_its_shard() -> None:
    """ShardMap (no servers): partition 0 of a queue on shards [0, 3] moved to shard 2, as
    ``_route_of`` reports it (moved_ids {0: 0}): ids made on shard 0 and on shard 2 settle on
    shard 2, shard 3's on 3, ids of no partition go through the router (None)."""
    ops = Ops("lonnymq")
    m = ShardMap("lonnymq", ops.st)
    m.load(1, [f"host=h{i} dbname=d" for i in range(4)])
    assert m.remember("hot", None, [2, 3], {0: 0}) == -1

    def ack(*ids: int) -> list[int] | None:
        return m.plan(Op(ops.st.ack, ("hot", list(ids), [1] * len(ids), None), list), "hot")

    assert ack(5 * STRIDE, 6 * STRIDE) == [2]  # made on shard 0, moved with partition 0
    assert ack(7 * STRIDE + 2, 5 * STRIDE) == [2]  # made on the target after the move, and before
    assert ack(STRIDE + 3) == [3]
    assert ack(STRIDE + 1) is None and ack(STRIDE, STRIDE + 3) is None
    assert m.plan(ops.message_get("hot", id=9 * STRIDE), "hot") == [2]
    assert m.placement("hot") == ([2, 3], {0: 0})
    m.forget("hot")
    assert m.placement("hot") is None and m.route("hot") is None
