"""``Client(router_dsn, direct=True)``: a queue's calls go straight to its shard (no router hop),
the client follows a queue that moves (0 lost, 0 duplicated), calls across queues and the
caller's transactions keep the router's rules."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from shard_helpers import Traffic, drain, home, map_version

from lonnymq import AsyncClient, Client, Message, errors, shard
from lonnymq.client.direct import DIRECT, ShardMap, key_partition
from lonnymq.client.ops import Op, Ops, new_send_key

pytestmark = [pytest.mark.once, pytest.mark.slow]


def one_on_each(router: str, prefix: str) -> list[str]:
    """Two queue names, the first held by shard 0, the second by shard 1, new to the shards (the
    clusters serve the whole module group: tests before this one leave their queues there)."""
    prefix = f"{prefix}{uuid.uuid4().hex[:8]}_"
    found: dict[int, str] = {}
    i = 0
    while len(found) < 2:
        found.setdefault(home(router, f"{prefix}{i}"), f"{prefix}{i}")
        i += 1
    return [found[0], found[1]]


def test_calls_of_a_queue_go_straight_to_its_shard(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    queues = one_on_each(r, "direct_")
    with Client(r, direct=True) as c:
        for q in queues:
            c.create_queue(q, if_not_exists=True)  # through the router
            c.send(q, {"n": 1})  # loads the map and the queue's route
        # The router's proxies of the data path are gone: a call through the router fails,
        # the direct client's calls do not touch it.
        with psycopg.connect(r, autocommit=True) as conn:
            for fn in ("send", "send_plain_once", "send_batch", "take", "ack", "peek", "queue_metrics"):
                conn.execute(f"DROP FUNCTION lonnymq.{fn}")
        try:
            with Client(r) as plain, pytest.raises(errors.NotInstalled):
                plain.send(queues[0], {"n": 0})
            for i, q in enumerate(queues):
                c.send(q, {"n": 2})
                assert [m.payload["n"] for m in c.peek(q)] == [1, 2]
                got = c.take(q, 10)
                assert [m.payload["n"] for m in got] == [1, 2]
                assert c.ack(got) == {m.id for m in got}
                assert c.metrics(q).ready == 0
                # Each landed on the shard that holds the queue, read there directly.
                with psycopg.connect(sharded.shard_dsns[i]) as conn:
                    row = conn.execute(
                        "SELECT total_sent FROM lonnymq.queue_metrics(%s, NULL)", (q,)
                    ).fetchone()
                assert row is not None and row[0] == 2
            # Across queues: still the router's (its queue_list proxy is untouched).
            assert set(queues) <= {x.name for x in c.list_queues()}
        finally:
            shard.init(r, sharded.shard_dsns)  # regenerates the proxies
        assert c.is_router()


def test_async_direct_client_and_refusals(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    queues = one_on_each(r, "adirect_")

    async def go() -> None:
        async with AsyncClient(r, direct=True) as c:
            for q in queues:
                await c.create_queue(q, if_not_exists=True)
                await c.send(q, "x")
                [m] = await c.take(q)
                assert m.payload == "x"
                assert await c.ack(m) == {m.id}
            with pytest.raises(errors.RouterTransaction):
                await c.take_tx(queues[0])
            with pytest.raises(errors.QueueNotFound):
                await c.send("direct_nosuch", "x")

    asyncio.run(go())
    with psycopg.connect(r) as conn, pytest.raises(errors.InvalidArgument, match="direct=True"):
        Client(conn, direct=True)  # type: ignore[arg-type]


def test_map_version_moves_on_each_change(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    q = one_on_each(r, "dver_")[0]
    with Client(r) as c:
        c.create_queue(q, if_not_exists=True)
    v0 = map_version(r)
    shard.move(r, q, 1)
    assert map_version(r) == v0 + 1
    shard.move(r, q, 0)
    assert map_version(r) == v0 + 2
    shard.init(r, sharded.shard_dsns)
    assert map_version(r) == v0 + 3


def test_direct_clients_follow_a_moving_queue(sharded) -> None:  # type: ignore[no-untyped-def]
    """A producer and a consumer (direct clients) while the queue moves 0 -> 1 -> 0 -> 1: the
    calls that land on the shard the queue left follow it; every message once."""
    r = sharded.dsn
    q = one_on_each(r, "dmove_")[0]
    with Client(r) as c:
        c.create_queue(q, if_not_exists=True)
    before = map_version(r)
    with Traffic(r, q, direct=True) as t:
        t.progress(sent=11, acked=6)  # traffic before and after each move: waited for, not slept
        for target in (1, 0, 1):
            shard.move(r, q, target)
            t.progress(sent=15, acked=6)
        assert not t.errors, t.errors
    assert not t.errors, t.errors
    assert map_version(r) == before + 3
    left = drain(r, q)
    sent = t.sent
    delivered = [n for n, _ in t.acked] + left
    assert len(sent) > 50 and len(t.acked) > 20
    assert sorted(delivered) == sorted(set(delivered)), "a message delivered twice"
    # The producer may be stopped between a send that committed and its record: at most one more.
    assert set(sent) <= set(delivered) and len(set(delivered) - set(sent)) <= 1
    # Nothing acked was delivered again; every delivery was acked or drained.
    assert {n for n, _ in t.delivered} <= set(delivered)
    shard.move(r, q, 0)


def test_a_call_during_the_move_waits_for_it_and_follows(sharded) -> None:  # type: ignore[no-untyped-def]
    """The move is held inside its source transaction (the queue's messages deleted there, not
    yet committed) while a direct client extends a lease it took before: the call waits on the
    shard's fence, finds the queue gone and runs on the target (without the fence it would act on
    nothing there: LeaseLost)."""
    r = sharded.dsn
    q = one_on_each(r, "dfence_")[0]
    with Client(r, direct=True) as c:
        c.create_queue(q, if_not_exists=True)
        c.send_batch(q, ["a", "b", "c"])
        [m] = c.take(q)
        moved: list[object] = []
        acked: list[object] = []  # what the extend returned (or raised)
        with psycopg.connect(sharded.shard_dsns[1]) as blocker:
            # The move's copy into the target's settled table (after the messages) waits on this.
            blocker.execute("LOCK TABLE lonnymq.settled IN SHARE MODE")
            mover = threading.Thread(target=lambda: moved.append(shard.move(r, q, 1, lock_timeout=5)))
            mover.start()
            with psycopg.connect(sharded.shard_dsns[1], autocommit=True) as watch:
                deadline = time.monotonic() + 60
                while not watch.execute(
                    "SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'COPY%%settled%%'"
                ).fetchall():
                    assert time.monotonic() < deadline, "the move never reached the settled table"
                    time.sleep(0.02)

            def ack() -> None:
                try:
                    acked.append(c.extend(m, lease=60))
                except BaseException as e:
                    acked.append(e)

            acker = threading.Thread(target=ack)
            acker.start()
            time.sleep(0.3)
            assert acker.is_alive() and not acked  # held until the source lets the queue go
            blocker.rollback()
        mover.join(60)
        acker.join(60)
        assert len(moved) == 1 and len(acked) == 1
        assert isinstance(acked[0], dict) and list(acked[0]) == [m.id], acked
        assert sorted(x.payload for x in c.take(q, 10)) == ["b", "c"]
        shard.move(r, q, 0)


def test_what_goes_direct_and_how_a_shard_is_logged_into() -> None:
    ops = Ops("lonnymq")
    m = ShardMap("lonnymq", ops.st)
    for name in DIRECT:
        fenced = m.fenced(Op(getattr(ops.st, name), ("q",), list)).query.as_string(None)
        assert fenced.count("pg_advisory_xact_lock_shared") == 1 and f".{name}((SELECT l.q" in fenced
    assert m.queue_of(ops.take("orders")) == "orders"
    assert m.queue_of(ops.send_batch("orders", ["x"])) == "orders"
    # A plain message's send is the lean plain send (send_plain), straight to the queue's shard.
    plain = ops.send("orders", "x")
    assert plain.query is ops.st.send_plain and m.queue_of(plain) == "orders"
    # With an idempotency key (a pooled client's default): the lean keyed send, straight too.
    once = ops.send("orders", "x", send_key=new_send_key())
    assert once.query is ops.st.send_plain_once and m.queue_of(once) == "orders"
    assert ops.send("orders", "x", priority=1, send_key=new_send_key()).query is ops.st.send
    for op in (ops.queue_create("orders"), ops.queue_drop("orders"), ops.take_tx("orders"), ops.queue_list()):
        assert m.queue_of(op) is None  # through the router
    # One delivery's ack and take(ack=) send scalars; routed as the array statements they are.
    one = Message("orders", 1025, 2, 1, None, 0, 0, 0, None, None, None, None, None, None, None, b"")
    ack = m.canonical(ops.ack([one]))
    assert (
        ack.query is ops.st.ack
        and ack.params == ("orders", [1025], [2], None)
        and m.queue_of(ack) == "orders"
    )
    take = m.canonical(ops.take("orders", 1, ack=[one]))
    assert take.query is ops.st.take and take.params[3:] == ([1025], [2]) and m.queue_of(take) == "orders"
    assert m.canonical(ops.ack([one, one])).query is ops.st.ack  # already arrays
    m.load(3, ["host=h1 port=6000 dbname=d1 connect_timeout=5", "host=h2 port=6001 dbname=d2"])
    got = conninfo_to_dict(m.conninfo(1, "postgresql://app:s3cret@router:5432/r?sslmode=require"))
    assert got == {
        "host": "h2",
        "port": "6001",
        "dbname": "d2",
        "user": "app",
        "password": "s3cret",
        "sslmode": "require",
    }
    assert m.remember("orders", -7) == 1 and m.route("orders") == 1  # a hash, masked
    assert not m.load(3, m.shards) and m.route("orders") == 1
    assert m.load(4, m.shards) and m.route("orders") is None  # a new version forgets routes


def test_a_least_privileged_role_goes_direct(sharded) -> None:  # type: ignore[no-untyped-def]
    """A login role with only lonnymq_producer and lonnymq_consumer (on the router and the
    shards, same password) uses a direct client: the map gives no password, the client logs into
    the shards as itself; the router's user mapping stays unreadable to it."""
    r = sharded.dsn
    for dsn in [r, *sharded.shard_dsns]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for role in ("lonnymq_producer", "lonnymq_consumer"):
                if not conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchall():
                    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
            if not conn.execute("SELECT FROM pg_roles WHERE rolname = 'lmq_direct_app'").fetchall():
                conn.execute("CREATE ROLE lmq_direct_app LOGIN PASSWORD 'app-pw'")
            conn.execute("GRANT lonnymq_producer, lonnymq_consumer TO lmq_direct_app")
    shard.init(r, sharded.shard_dsns)  # the router's grants for the roles that now exist there
    app = make_conninfo(r, user="lmq_direct_app", password="app-pw")
    queues = one_on_each(r, "dpriv_")
    with Client(r) as admin:
        for q in queues:
            admin.create_queue(q, if_not_exists=True)
    with Client(app, direct=True) as c:
        for q in queues:
            c.send(q, {"n": 1})
            [m] = c.take(q)
            assert c.ack(m) == {m.id}
        assert c._map is not None and all("app-pw" not in s and "password" not in s for s in c._map.shards)
    with psycopg.connect(app) as conn:
        row = conn.execute(
            "SELECT umoptions FROM pg_user_mappings WHERE srvname = 'lonnymq_lonnymq'"
        ).fetchone()
        assert row is not None and row[0] is None  # the shards' password: superusers only


def test_a_keyed_plain_send_goes_to_its_keys_partition() -> None:
    """ShardMap (no servers): a plain message with an idempotency key (send_plain_once) goes
    to the partition of its key, where send() with that key goes (the router's _once_shard and
    _send_shard agree), so a repeat finds the first; without a key, the partitions in turn."""
    ops = Ops("lonnymq")
    m = ShardMap("lonnymq", ops.st)
    m.load(1, [f"host=h{i} dbname=d" for i in range(4)])
    parts = [1, 3, 0]
    m.remember("hot", None, parts, None)
    for _ in range(20):
        key = new_send_key()
        once = ops.send("hot", "x", send_key=key)
        assert once.query is ops.st.send_plain_once
        keyed = ops.send("hot", "x", priority=1, send_key=key)  # send(): the general path
        want = [parts[key_partition(str(key), len(parts))]]
        assert m.plan(once, "hot") == m.plan(keyed, "hot") == want
