"""A partitioned queue with one partition's shard down: takes (through the router and from
direct clients) skip that partition and keep serving the other, sends and settles that belong
to the down shard fail with ShardUnavailable naming it, ``shard status`` reports the queue as
degraded; once the shard is back, its partition's messages are all there."""

from __future__ import annotations

import json

import pytest

from lonnymq import Client, errors, shard
from lonnymq.cli import main
from lonnymq.client.direct import STRIDE, key_partition
from lonnymq.client.retry import RetryPolicy

pytestmark = [pytest.mark.once, pytest.mark.slow]


def _key_on(parts: list[int], shard_index: int, prefix: str) -> str:
    """A key whose partition is on shard ``shard_index``."""
    return next(
        f"{prefix}{i}" for i in range(1000) if parts[key_partition(f"{prefix}{i}", len(parts))] == shard_index
    )


def test_take_skips_a_partition_whose_shard_is_down(sharded, capsys) -> None:  # type: ignore[no-untyped-def]
    q = "hot_down"
    down_shard = sharded.shards[1]
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
        parts = shard.status(sharded.dsn).partitioned[q]
        up_key, down_key = _key_on(parts, 0, "up-"), _key_on(parts, 1, "down-")
        # 10 messages on each partition (one key each: FIFO per key), one of the down shard's leased.
        up_sent = [c.send(q, {"p": 0, "n": i}, key=_key_on(parts, 0, f"u{i}-")).id for i in range(10)]
        down_sent = [c.send(q, {"p": 1, "n": i}, key=_key_on(parts, 1, f"d{i}-")).id for i in range(10)]
        assert {i % STRIDE for i in up_sent} == {0} and {i % STRIDE for i in down_sent} == {1}
        held = None
        while held is None:
            got = c.take(q)
            if got and got[0].id % STRIDE == 1:
                held = got[0]
            elif got:
                c.nack(got, delay=0)
    router_client = Client(sharded.dsn, pool_size=1)
    # A direct call rides out an outage under the client's retry policy (30 s by default) before
    # ShardUnavailable: a short one here.
    direct_client = Client(sharded.dsn, pool_size=1, direct=True, retry=RetryPolicy(deadline=1))
    try:
        for c in (router_client, direct_client):
            assert c.metrics(q).ready == 19  # both partitions reachable, and the direct map read
        down_shard.stop()  # fast: a clean shutdown (these test clusters do not fsync every commit)
        try:
            taken: dict[str, list[int]] = {}
            for name, c in (("router", router_client), ("direct", direct_client)):
                got_ids: list[int] = []
                for _ in range(8):  # takes start at each partition in turn: none fails
                    batch = c.take(q, 1)
                    assert all(m.id % STRIDE == 0 for m in batch), "a message of the down shard"
                    got_ids += [m.id for m in batch]
                    c.nack(batch, delay=0)
                taken[name] = got_ids
                assert len(got_ids) == 8, f"{name}: takes came back empty while partition 0 had messages"
                # Settles and sends that belong to the down shard fail fast, typed, naming it.
                with pytest.raises(errors.ShardUnavailable) as e:
                    c.ack(held)
                assert f":{down_shard.port}" in e.value.shard or str(down_shard.port) in str(e.value)
                with pytest.raises(errors.ShardUnavailable):
                    c.send(q, {"late": True}, key=down_key)
                c.send(q, {"p": 0, "late": True}, key=up_key)  # the other partition takes sends
            for c in (router_client, direct_client):  # receive()'s wait: the live partition's
                assert c.run(c.ops.next_ready_in(q)) == 0
            st = shard.status(sharded.dsn)
            assert not st.healthy and st.degraded[q] == [1]
            assert not st.shards[1].healthy and st.shards[0].healthy
            capsys.readouterr()
            assert main(["shard", "status", sharded.dsn]) == 1
            assert f"partitioned queue {q}: partition(s) on shard(s) 1 unreachable" in capsys.readouterr().out
            assert main(["shard", "status", sharded.dsn, "--json"]) == 1
            assert json.loads(capsys.readouterr().out)["degraded"][q] == [1]
            # Every message of the up partition drains while the other is down.
            with Client(sharded.dsn, direct=True) as d:
                seen: list[int] = []
                while batch := d.take(q, 50):
                    seen += [m.id for m in batch]
                    d.ack(batch)
                assert set(up_sent) <= set(seen) and all(i % STRIDE == 0 for i in seen)
                assert d.take(q) == []  # the up partition is empty: an empty take, not an error
        finally:
            down_shard.start()
        # Back: a new session of each kind sees the partition's messages, the held lease settles.
        with Client(sharded.dsn) as c:
            assert c.ack(held) == {held.id}
            rest: list[int] = []
            while batch := c.take(q, 50):
                rest += [m.id for m in batch]
                c.ack(batch)
            assert sorted(rest) == sorted(set(down_sent) - {held.id})
            c.drop_queue(q)
    finally:
        router_client.close()
        direct_client.close()
