"""The archive of a partitioned queue (``create_queue(partitions=N, archive=True)``), through the
router and with direct clients (which read each partition's shard themselves): ``archived()``
reads every partition's archive (acked, dead and
cancelled rows), merged by id and paged by ``after_id`` as a single queue's archive is, with
its status filter and time window; the same rows as each shard's own archive read, merged."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from test_partitioned_dead import _keys_over

from lonnymq import Client, errors, shard
from lonnymq.client.direct import STRIDE

pytestmark = [pytest.mark.once, pytest.mark.slow]

MODES = [pytest.param(False, id="router"), pytest.param(True, id="direct")]


@pytest.mark.parametrize("direct", MODES)
def test_the_archive_of_every_partition_is_read_merged_by_id(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_archive_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        c.create_queue(q, partitions=2, max_attempts=1, archive=True)
        parts = shard.status(sharded.dsn).partitioned[q]
        keys = _keys_over(parts, 40, f"{q}_")
        for k in keys:
            c.send(q, k, key=k)
        taken = [m for _ in range(20) for m in c.take(q, 7)]
        assert len(taken) == 40 and {m.id % STRIDE for m in taken} == set(parts)
        acked, dead = taken[:28], taken[28:]
        assert c.ack(acked) == {m.id for m in acked}  # archived: the queue keeps its acks
        assert c.nack(dead, error="boom") == {m.id: "dead" for m in dead}
        later = _keys_over(parts, 6, f"{q}_later_")
        cancelled = [c.send(q, k, key=k, delay=3600).id for k in later]
        for i in cancelled:
            assert c.cancel(q, id=i, archive=True)
        expected = {m.id: ("acked", m.payload) for m in acked}
        expected.update({m.id: ("dead", m.payload) for m in dead})
        expected.update({i: ("cancelled", k) for i, k in zip(cancelled, later, strict=True)})
        assert {i % STRIDE for i in expected} == set(parts)

        # Pages of 7 by after_id: every archived message of both partitions once, in id order.
        pages: list[list[int]] = []
        after = None
        while page := c.archived(q, after_id=after, limit=7):
            pages.append([m.id for m in page])
            assert all((m.status, m.payload) == expected[m.id] for m in page)
            after = page[-1].id
        seen = [i for p in pages for i in p]
        assert seen == sorted(expected) and len(pages) == -(-len(expected) // 7)
        assert [len(p) for p in pages[:-1]] == [7] * (len(pages) - 1)
        # The same rows as each shard's own read of its partition, merged by id.
        on_shards: list[int] = []
        for dsn in sharded.shard_dsns:
            with Client(dsn) as sc:
                on_shards += [m.id for m in sc.archived(q, limit=1000)]
        assert sorted(on_shards) == seen
        # The status filter and the time window apply on every partition.
        assert [m.id for m in c.archived(q, status="dead", limit=100)] == sorted(m.id for m in dead)
        assert [m.id for m in c.archived(q, status="cancelled", limit=100)] == sorted(cancelled)
        stamps = sorted(m.archived_at for m in c.archived(q, limit=100))
        assert c.archived(q, since=stamps[-1] + 1, limit=100) == []
        window = c.archived(q, since=stamps[0], until=stamps[-1] + 1, limit=100)
        assert [m.id for m in window] == seen
        assert c.metrics(q).dead == len(dead)
        assert [d.id for d in c.dead_letters(q, 100)] == sorted(m.id for m in dead)
        if not direct:
            return
        # A direct client reads every partition's shard itself: not through the router.
        with psycopg.connect(sharded.dsn, autocommit=True) as conn:
            for fn in ("archive_list", "dead_list"):
                conn.execute(sql.SQL("DROP FUNCTION lonnymq.{}").format(sql.Identifier(fn)))
        try:
            with Client(sharded.dsn) as plain, pytest.raises(errors.NotInstalled):
                plain.archived(q)
            again: list[int] = []
            after = None
            while page := c.archived(q, after_id=after, limit=7):
                again += [m.id for m in page]
                after = page[-1].id
            assert again == seen
            pages5 = [c.dead_letters(q, 5, after_id=a) for a in (0, sorted(m.id for m in dead)[4])]
            assert [d.id for p in pages5 for d in p] == sorted(m.id for m in dead)[:10]
        finally:
            shard.init(sharded.dsn, sharded.shard_dsns)  # regenerates the proxies
