"""Fair channels on a partitioned queue (issue 23), through the router and with direct clients:
a channel's messages all go to its partition (``key_partition`` of its name), so its FIFO,
concurrency limit and fairness are that one shard's; channel_set/reset go to the channel's
partition, channel_list and channel_recount visit every partition; a batch whose channels span
partitions and a message with both a key and a channel are refused with InvalidArgument."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict

import psycopg
import pytest

from lonnymq import AsyncClient, Client, Envelope, errors, shard
from lonnymq.client.direct import STRIDE, key_partition
from lonnymq.worker import App, Worker
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow]

MODES = [pytest.param(False, id="router"), pytest.param(True, id="direct")]


def _channels_on_shards(sharded, queue: str) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """Each shard's channels of the queue with their live messages, read on the shard itself."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT c.name, (SELECT count(*) FROM lonnymq.message m"
                "                 WHERE m.queue_id = c.queue_id AND m.channel = c.name)"
                "  FROM lonnymq.channel c JOIN lonnymq.queue q ON q.id = c.queue_id WHERE q.name = %s",
                (queue,),
            ).fetchall()
        out.append({str(n): int(k) for n, k in rows})
    return out


def _names(n: int, prefix: str) -> dict[int, list[str]]:
    """Channel names of each of 2 partitions, n of each."""
    by: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in by.values()) < n:
        name = f"{prefix}{i}"
        if len(by[key_partition(name, 2)]) < n:
            by[key_partition(name, 2)].append(name)
        i += 1
    return by


def _queue(sharded, name: str, direct: bool, n: int, **settings):  # type: ignore[no-untyped-def]
    """Queue ``name`` over 2 partitions (made through the router) and n channel names of each
    partition: (queue, names by partition, all names)."""
    q = f"{name}_{int(direct)}"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2, **settings)
    by = _names(n, name + "-")
    return q, by, by[0] + by[1]


@pytest.mark.parametrize("direct", MODES)
def test_a_channels_messages_all_land_on_its_partition_in_order(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q, by, chans = _queue(sharded, "hot_ch_route", direct, 3)
    with Client(sharded.dsn, direct=direct) as c:
        parts = shard.status(sharded.dsn).partitioned[q]
        sent: dict[str, list[int]] = defaultdict(list)
        for i in range(10):  # single sends, each with its own idempotency key
            for ch in chans:
                sent[ch].append(c.send(q, {"ch": ch, "i": i}, channel=ch).id)
        for ch in chans:  # a batch per channel; and a batch of several channels of one partition
            sent[ch] += [
                r.id
                for r in c.send_batch(q, [Envelope({"ch": ch, "i": 10 + i}, channel=ch) for i in range(5)])
            ]
        for p in (0, 1):
            batch = [Envelope({"ch": ch, "i": 15}, channel=ch) for ch in by[p]]
            for ch, r in zip(by[p], c.send_batch(q, batch), strict=True):
                sent[ch].append(r.id)
        # Every message of a channel on its partition's shard: the id names it.
        for ch in chans:
            assert {i % STRIDE for i in sent[ch]} == {parts[key_partition(ch, 2)]}, ch
        placed = _channels_on_shards(sharded, q)
        for ch in chans:
            shard_of = parts[key_partition(ch, 2)]
            assert placed[shard_of][ch] == 16 and ch not in placed[1 - shard_of], (ch, placed)
        # FIFO per channel: with max_concurrency=1 each channel delivers in send order, taking
        # over both partitions.
        for ch in chans:
            c.set_channel(q, ch, max_concurrency=1)
        got: dict[str, list[int]] = defaultdict(list)
        for _ in range(200):
            b = c.take(q, 10)
            for m in b:
                got[m.channel or ""].append(m.payload["i"])
            c.ack(b)
            if sum(map(len, got.values())) == 16 * len(chans):
                break
        assert {ch: got[ch] for ch in chans} == {ch: list(range(16)) for ch in chans}


@pytest.mark.parametrize("direct", MODES)
def test_concurrency_limits_hold_exactly_across_partitions(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """4 threads take and ack over both partitions; no channel ever has more than its
    max_concurrency (2) leased, counted by the consumers (a lower bound of the server's count)."""
    q, _, chans = _queue(sharded, "hot_ch_limit", direct, 2, lease=30)
    limit = 2
    with Client(sharded.dsn, direct=direct) as c:
        for ch in chans:
            info = c.set_channel(q, ch, max_concurrency=limit)
            assert info.name == ch and info.max_concurrency == limit and info.explicit
        for ch in chans:
            c.send_batch(q, [Envelope({"ch": ch, "i": i}, channel=ch) for i in range(15)])
        held: Counter[str] = Counter()
        peak: Counter[str] = Counter()
        done: list[int] = []
        lock = threading.Lock()
        errs: list[BaseException] = []

        def consume() -> None:
            try:
                with Client(sharded.dsn, direct=direct) as mine:
                    idle = 0
                    while idle < 20:
                        b = mine.take(q, 3)
                        if not b:
                            idle += 1
                            time.sleep(0.02)
                            continue
                        idle = 0
                        with lock:
                            for m in b:
                                held[m.channel or ""] += 1
                                peak[m.channel or ""] = max(peak[m.channel or ""], held[m.channel or ""])
                        time.sleep(0.01)
                        with lock:
                            for m in b:
                                held[m.channel or ""] -= 1
                                done.append(m.id)
                        mine.ack(b)
            except BaseException as e:  # reported below
                errs.append(e)

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errs, errs
        assert len(done) == len(set(done)) == 15 * len(chans)
        assert all(peak[ch] <= limit for ch in chans), peak
        assert any(peak[ch] == limit for ch in chans), peak  # the limit was reached, not just kept
        listed = c.channels(q)
        assert [i.name for i in listed] == sorted(chans)
        assert all(i.leased == 0 and i.size == 0 and i.max_concurrency == limit for i in listed)


@pytest.mark.parametrize("direct", MODES)
def test_round_robin_among_channels_over_partitions(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """A busy channel does not hold up the small ones of either partition."""
    q, by, _ = _queue(sharded, "hot_ch_fair", direct, 2)
    busy, small = by[0][0], [by[0][1], *by[1]]
    with Client(sharded.dsn, direct=direct) as c:
        c.send_batch(q, [Envelope({"i": i}, channel=busy) for i in range(40)])
        for ch in small:
            c.send_batch(q, [Envelope({"i": i}, channel=ch) for i in range(5)])
        assert {i.name: i.size for i in c.channels(q)} == {busy: 40, **{ch: 5 for ch in small}}
        seen: Counter[str] = Counter()
        for _ in range(30):
            b = c.take(q, 1)
            assert len(b) == 1
            seen[b[0].channel or ""] += 1
            c.ack(b)
        # Round robin on each partition: the 15 small messages are out within 30 takes (FIFO
        # would have handed out the busy channel's 40 first on its partition).
        assert all(seen[ch] == 5 for ch in small), seen
        assert seen[busy] == 15, seen


@pytest.mark.parametrize("direct", MODES)
def test_channel_policy_calls_and_listing(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q, _, chans = _queue(sharded, "hot_ch_list", direct, 3, channel_max_size=100)
    chans.sort()
    with Client(sharded.dsn, direct=direct) as c:
        parts = shard.status(sharded.dsn).partitioned[q]
        for ch in chans:
            c.set_channel(q, ch, max_concurrency=3, max_size=7)
        # Each channel's policy on its partition's shard only.
        placed = _channels_on_shards(sharded, q)
        for ch in chans:
            assert (
                ch in placed[parts[key_partition(ch, 2)]]
                and ch not in placed[1 - parts[key_partition(ch, 2)]]
            )
        # Listed once each, by name, paged over both partitions.
        assert [i.name for i in c.channels(q)] == chans
        pages: list[str] = []
        after = None
        while page := c.channels(q, limit=4, after=after):
            pages += [i.name for i in page]
            after = page[-1].name
        assert pages == chans
        # The limits are the channel's partition's: the 8th message of a channel is refused.
        c.send_batch(q, [Envelope({"i": i}, channel=chans[0]) for i in range(7)])
        with pytest.raises(errors.ChannelFull):
            c.send(q, {"i": 7}, channel=chans[0])
        assert c.reset_channel(q, chans[1]) is True
        assert c.reset_channel(q, chans[1]) is False
        listed = {i.name: i for i in c.channels(q)}
        assert chans[1] not in listed  # back to the queue's defaults and empty: gone
        assert listed[chans[0]].size == 7 and listed[chans[0]].max_size == 7

    async def from_async() -> None:  # the async client routes the same way
        async with AsyncClient(sharded.dsn, direct=direct) as ac:
            info = await ac.set_channel(q, chans[2], max_concurrency=5)
            assert info.max_concurrency == 5
            sent = await ac.send(q, {"a": 1}, channel=chans[2])
            assert sent.id % STRIDE == parts[key_partition(chans[2], 2)]
            assert [i.name for i in await ac.channels(q)] == [ch for ch in chans if ch != chans[1]]
            assert await ac.reset_channel(q, chans[2]) is True

    asyncio.run(from_async())
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:  # raw SQL on the router
        assert conn.execute("SELECT lonnymq.channel_recount(%s)", (q,)).fetchone() == (0,)
        rows = conn.execute("SELECT name FROM lonnymq.channel_list(%s, 1000)", (q,)).fetchall()
        assert [r[0] for r in rows] == [ch for ch in chans if ch != chans[1]]


@pytest.mark.parametrize("direct", MODES)
def test_refusals_of_channels_on_partitioned_queues(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q, by, _ = _queue(sharded, "hot_ch_refuse", direct, 1)
    with Client(sharded.dsn, direct=direct) as c:
        with pytest.raises(errors.InvalidArgument, match="channels and keys of one batch fall in partitions"):
            c.send_batch(q, [Envelope({"i": 0}, channel=by[0][0]), Envelope({"i": 1}, channel=by[1][0])])
        # A channel and a keyed message of another partition in one batch: refused the same way.
        other = next(f"k{i}" for i in range(100) if key_partition(f"k{i}", 2) == 1)
        with pytest.raises(errors.InvalidArgument, match="one batch fall in partitions"):
            c.send_batch(q, [Envelope({"i": 0}, channel=by[0][0]), Envelope({"i": 1}, key=other)])
        with pytest.raises(errors.InvalidArgument, match="cannot also have a key"):
            c.send(q, {"i": 0}, channel=by[0][0], key="k")
        with pytest.raises(errors.InvalidArgument, match="cannot also have a key"):
            c.send_batch(q, [Envelope({"i": 0}, channel=by[0][0], key="k")])
        assert c.metrics(q).ready == 0  # nothing of the refused calls was written
        # One partition's channels and keys together are one batch.
        same = next(f"k{i}" for i in range(100) if key_partition(f"k{i}", 2) == 0)
        res = c.send_batch(q, [Envelope({"i": 0}, channel=by[0][0]), Envelope({"i": 1}, key=same)])
        assert len({r.id % STRIDE for r in res}) == 1
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM lonnymq.send(%s, 'x'::bytea, p_key => 'k', p_channel => 'c')", (q,))
        assert e.value.sqlstate == "LQ002"


@pytest.mark.parametrize("direct", MODES)
def test_worker_with_channel_limits_on_a_partitioned_queue(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """The worker's takes keep each channel's max_concurrency (1) over both partitions."""
    q, _, chans = _queue(sharded, "hot_ch_worker", direct, 2, lease=30)
    with Client(sharded.dsn, direct=direct) as c:
        for ch in chans:
            c.set_channel(q, ch, max_concurrency=1)
            c.send_batch(q, [Envelope({"ch": ch, "i": i}, channel=ch) for i in range(6)])
    app = App()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    order: dict[str, list[int]] = defaultdict(list)

    @app.handler(q)
    async def work(job):  # type: ignore[no-untyped-def]
        ch = job.payload["ch"]
        running[ch] += 1
        peak[ch] = max(peak[ch], running[ch])
        await asyncio.sleep(0.02)
        order[ch].append(job.payload["i"])
        running[ch] -= 1

    async def main() -> None:
        async with AsyncClient(sharded.dsn, direct=direct) as client:
            w = Worker(app, client, poll_interval=0.1, concurrency=8)
            await w.start()
            try:
                await eventually(lambda: sum(map(len, order.values())) >= 6 * len(chans), 60, "served")
            finally:
                await w.stop()

    asyncio.run(main())
    assert all(peak[ch] == 1 for ch in chans), peak
    assert {ch: order[ch] for ch in chans} == {ch: list(range(6)) for ch in chans}
