"""Dead letters of a partitioned queue (``create_queue(partitions=N)``), through the router and
with direct clients: each partition keeps its own (its archive's dead rows, or its dead-letter
queue's partition on the same shard), and listing, paging, requeueing and purging them visit
every partition; nothing is lost or duplicated."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from shard_helpers import kill_all

from lonnymq import Client, errors, shard
from lonnymq.client.direct import STRIDE, key_partition

pytestmark = [pytest.mark.once, pytest.mark.slow]

MODES = [pytest.param(False, id="router"), pytest.param(True, id="direct")]


def _keys_over(parts: list[int], n: int, prefix: str) -> list[str]:
    """``n`` keys, half of them in each of the two partitions ``parts``."""
    by_part: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in by_part.values()) < n // 2:
        k = f"{prefix}{i}"
        by_part[key_partition(k, len(parts))].append(k)
        i += 1
    return by_part[0][: n // 2] + by_part[1][: n // 2]


@pytest.mark.parametrize("direct", MODES)
def test_dead_letters_of_every_partition_listed_and_requeued(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """Messages of both partitions nacked past max_attempts: dead_letters() pages over every
    partition by id (each id once), metrics count them, requeue_dead() by ids puts back those
    of both shards, without ids the rest; a drain then finds each payload exactly once."""
    q = f"hot_dead_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        c.create_queue(q, partitions=2, max_attempts=1)
        parts = shard.status(sharded.dsn).partitioned[q]
        payloads = [f"m{i}" for i in range(30)]
        for p, k in zip(payloads, _keys_over(parts, 30, "dk"), strict=True):
            c.send(q, p, key=k)
        dead = kill_all(c, q, 30)
        assert {i % STRIDE for i in dead} == {0, 1}, "dead letters on both shards"
        assert c.metrics(q).dead == 30

        listed: list[int] = []
        after = 0
        while page := c.dead_letters(q, 7, after_id=after):
            assert len(page) <= 7
            listed += [d.id for d in page]
            assert [d.last_error for d in page] == ["boom"] * len(page)
            assert {d.id: d.payload for d in page} == {d.id: dead[d.id] for d in page}
            after = page[-1].id
        assert listed == sorted(dead), "every partition's dead letters, once each, by id"

        some = [i for i in sorted(dead) if i % STRIDE == 0][:3] + [
            i for i in sorted(dead) if i % STRIDE == 1
        ][:4]
        assert c.requeue_dead(q, some) == 7
        assert sorted(d.id for d in c.dead_letters(q, 100)) == sorted(set(dead) - set(some))
        assert c.requeue_dead(q) == 23
        assert c.dead_letters(q) == []
        assert c.metrics(q).dead == 0

        drained: list[str] = []
        while got := c.take(q, 10):
            drained += [m.payload for m in got]
            c.ack(got)
        assert Counter(drained) == Counter(payloads), "0 lost, 0 duplicated"

        # Dead again, then purged on every partition.
        for p, k in zip(payloads[:6], _keys_over(parts, 6, "pk"), strict=True):
            c.send(q, p, key=k)
        kill_all(c, q, 6)
        assert c.purge_dead(q) == 6
        assert c.dead_letters(q) == [] and c.metrics(q).dead == 0
        c.drop_queue(q)


def _dlq_rows(sharded, dlq: str) -> list[list[tuple[int, int, str]]]:  # type: ignore[no-untyped-def]
    """(id, original id, payload) of the dead-letter queue's messages on each shard."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT m.id, (m.headers -> 'lonnymq_dead_letter' ->> 'id')::bigint,"
                " convert_from(m.payload, 'UTF8')"
                " FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id WHERE q.name = %s",
                (dlq,),
            ).fetchall()
        out.append([(int(a), int(b), str(p)) for a, b, p in rows])
    return out


@pytest.mark.parametrize("direct", MODES)
def test_a_partitioned_dead_letter_queue_takes_each_partitions_dead(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """A partitioned queue's dead-letter queue is partitioned over the same shards: a message
    dead-lettered on shard k lands in the dead-letter queue's partition on shard k (one shard
    transaction), and the dead-letter queue's takes find all of them, once each."""
    q, dlq = f"hot_dlq_src_{int(direct)}", f"hot_dlq_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        c.create_queue(f"{dlq}_plain")
        with pytest.raises(errors.InvalidArgument, match="must be partitioned"):
            c.create_queue(q, partitions=2, dead_letter_queue=f"{dlq}_plain")
        assert q not in shard.status(sharded.dsn).partitioned  # nothing made
        c.create_queue(dlq, partitions=2)
        c.create_queue(q, partitions=2, max_attempts=1, dead_letter_queue=dlq)
        parts = shard.status(sharded.dsn).partitioned[q]
        payloads = [f"d{i}" for i in range(20)]
        for p, k in zip(payloads, _keys_over(parts, 20, "lk"), strict=True):
            c.send(q, p, key=k)
        dead = kill_all(c, q, 20)
        assert c.metrics(q).dead == 0 and c.dead_letters(q) == []  # in the dead-letter queue
        assert c.metrics(dlq).ready == 20

        rows = _dlq_rows(sharded, dlq)
        for i, on_shard in enumerate(rows):  # each on the shard of the message it was
            assert on_shard and all(new % STRIDE == i and old % STRIDE == i for new, old, _ in on_shard)
        assert sorted(old for r in rows for _, old, _ in r) == sorted(dead)

        drained: list[str] = []
        while got := c.take(dlq, 6):
            drained += [m.payload for m in got]
            assert {m.headers["lonnymq_dead_letter"]["queue"] for m in got} == {q}
            c.ack(got)
        assert Counter(drained) == Counter(payloads), "0 lost, 0 duplicated"


def test_a_queue_tied_to_a_partitioned_dead_letter_queue_does_not_move(sharded) -> None:  # type: ignore[no-untyped-def]
    """A plain queue dead-lettering into a partitioned queue (its partition on the plain queue's
    shard) cannot move: the move would take that partition with it."""
    dlq, q = "hot_dlq_tied", "hot_dlq_tied_src"
    with Client(sharded.dsn) as c:
        c.create_queue(dlq, partitions=2)
        c.create_queue(q, dead_letter_queue=dlq)
        here = next(s.index for s in shard.status(sharded.dsn).shards if q in s.queues)
        with pytest.raises(errors.InvalidArgument, match="partitioned"):
            shard.move(sharded.dsn, q, 1 - here)
        c.send(q, "still here")
        assert [m.payload for m in c.take(q)] == ["still here"]
