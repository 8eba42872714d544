"""The router generated from the core's catalog: every public function proxied with its
signature, queues spread by hashtext(name), status, init's refusals."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from shard_helpers import home

from lonnymq import Client, errors, shard
from lonnymq.client.direct import STRIDE
from lonnymq.shard import catalog, partitions

pytestmark = [pytest.mark.once, pytest.mark.slow]

_SIGNATURES = """
SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
  FROM pg_proc p
 WHERE p.pronamespace = 'lonnymq'::regnamespace AND NOT starts_with(p.proname, '_')
 ORDER BY 1, 2
"""


def test_every_public_function_has_a_proxy_with_its_signature(sharded) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(sharded.shard_dsns[0]) as s, psycopg.connect(sharded.dsn) as r:
        core = s.execute(_SIGNATURES).fetchall()
        router = r.execute(_SIGNATURES).fetchall()
        languages = dict(
            r.execute(
                "SELECT p.proname, l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
                " WHERE p.pronamespace = 'lonnymq'::regnamespace AND NOT starts_with(p.proname, '_')"
            ).fetchall()
        )
    assert len(core) > 40
    # The router's own public functions (partitioned queues) besides the proxies.
    assert [f for f in router if f[0] not in partitions.ROUTER_ONLY] == core
    assert {f[0] for f in router if f[0] in partitions.ROUTER_ONLY} == set(partitions.ROUTER_ONLY)
    # Each is PL/Proxy itself, SQL merging an internal PL/Proxy call on every shard, or (the
    # calls that visit every partition of a partitioned queue) plpgsql dispatching to either.
    assert set(languages.values()) <= {"plproxy", "sql", "plpgsql"}
    assert languages["send"] == languages["send_batch"] == languages["ack"] == "plproxy"
    assert languages["send_plain"] == "plproxy"  # routed as send: by its queue (or partition)
    assert languages["send_plain_once"] == "plproxy"  # by its queue (or its send key's partition)
    assert languages["queue_list"] == "sql"
    plpgsql = {n for n, lang in languages.items() if lang == "plpgsql"}
    assert plpgsql == {*partitions.DISPATCHED, *partitions.ROUTER_ONLY}


def test_send_plain_goes_to_its_queues_shard_or_the_partitions_in_turn(sharded) -> None:  # type: ignore[no-untyped-def]
    """The plain send through the router: a queue's message on the queue's shard, a partitioned
    queue's on its partitions in turn (as send() without a key, channel or send key); an
    unknown queue raises the shard's error."""
    names = [f"plain_{i}" for i in range(4)]
    with Client(sharded.dsn) as c:
        for n in names:
            c.create_queue(n)
        assert c.create_queue("plain_parts", partitions=2)
    with psycopg.connect(sharded.dsn, autocommit=True) as r:
        for n in names:
            row = r.execute("SELECT lonnymq.send_plain(%s, 'x'::bytea, 'text/plain')", (n,)).fetchone()
            assert row is not None
            with psycopg.connect(sharded.shard_dsns[home(sharded.dsn, n)]) as s:
                got = s.execute(
                    "SELECT m.payload, m.content_type FROM lonnymq.message m"
                    " JOIN lonnymq.queue q ON q.id = m.queue_id WHERE q.name = %s AND m.id = %s",
                    (n, row[0]),
                ).fetchone()
            assert got == (b"x", "text/plain")
        turns = []
        for _ in range(6):
            row = r.execute("SELECT lonnymq.send_plain('plain_parts', 'y'::bytea)").fetchone()
            assert row is not None
            turns.append(row[0] % STRIDE)  # the id names the shard that made it
        with pytest.raises(psycopg.Error) as info:
            r.execute("SELECT lonnymq.send_plain('plain_nope', 'z'::bytea)")
        assert info.value.sqlstate == "LQ001"
    assert turns in ([0, 1] * 3, [1, 0] * 3), turns
    with Client(sharded.dsn) as c:
        assert c.metrics("plain_parts").ready == 6


def test_send_plain_once_goes_where_send_with_its_key_goes(sharded) -> None:  # type: ignore[no-untyped-def]
    """The keyed plain send through the router: a queue's message on the queue's shard; a
    partitioned queue's on its send key's partition, as send() with that key, so that a repeat
    returns the first id and creates nothing."""
    with Client(sharded.dsn) as c:
        c.create_queue("once_one")
        assert c.create_queue("once_parts", partitions=2)
    once = "SELECT lonnymq.send_plain_once(%s, 'x'::bytea, %s, 'text/plain')"
    with psycopg.connect(sharded.dsn, autocommit=True) as r:
        key = uuid.uuid4()
        row = r.execute(once, ("once_one", key)).fetchone()
        assert row is not None and r.execute(once, ("once_one", key)).fetchone() == row
        with psycopg.connect(sharded.shard_dsns[home(sharded.dsn, "once_one")]) as s:
            got = s.execute(
                "SELECT m.content_type FROM lonnymq.message m JOIN lonnymq.queue q ON q.id = m.queue_id"
                " WHERE q.name = 'once_one' AND m.id = %s",
                row,
            ).fetchone()
        assert got == ("text/plain",)
        for _ in range(8):
            key = uuid.uuid4()
            [(first,)] = r.execute(once, ("once_parts", key)).fetchall()
            [(again,)] = r.execute(once, ("once_parts", key)).fetchall()
            [(by_send, outcome)] = r.execute(
                "SELECT * FROM lonnymq.send('once_parts', 'y'::bytea, p_send_key => %s)", (key,)
            ).fetchall()
            assert first == again == by_send and outcome == "created"
    with Client(sharded.dsn) as c:
        assert c.metrics("once_one").ready == 1 and c.metrics("once_parts").ready == 8


def test_a_function_without_queue_or_rule_stops_generation() -> None:
    fn = catalog.CoreFunction(
        "mystery", "p_x integer", "p_x integer", "bigint", False, "v", False, ("p_x",), ()
    )
    with pytest.raises(catalog.NoRoute, match="mystery"):
        catalog.proxy_statements("lonnymq", [fn])
    fn_q = catalog.CoreFunction(
        "mystery", "p_queue text", "p_queue text", "bigint", False, "v", False, ("p_queue",), ()
    )
    assert catalog.route(fn_q) == catalog.Route("hash", key="p_queue")


def test_queues_spread_by_hash_and_status_shows_them(sharded) -> None:  # type: ignore[no-untyped-def]
    names = [f"spread_{i}" for i in range(12)]
    with Client(sharded.dsn) as c:
        for n in names:
            c.create_queue(n)
        listed = [q.name for q in c.list_queues()]
        paged = [q.name for q in c.list_queues(limit=3, after="spread_1")]
    assert set(names) <= set(listed) and listed == sorted(listed)
    assert paged == sorted(n for n in listed if n > "spread_1")[:3]
    st = shard.status(sharded.dsn)
    assert st.healthy and [s.index for s in st.shards] == [0, 1]
    for n in names:
        holder = [s.index for s in st.shards if n in s.queues]
        assert holder == [home(sharded.dsn, n)]
    assert all(any(n in s.queues for n in names) for s in st.shards), "12 queues all on one shard"


def test_init_refusals(sharded) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.InvalidArgument, match="power-of-two"):
        shard.init(sharded.dsn, [*sharded.shard_dsns, sharded.shard_dsns[0]])
    with pytest.raises(errors.InvalidArgument, match="given twice"):
        shard.init(sharded.dsn, [sharded.shard_dsns[0], sharded.shard_dsns[0]])
    # A database holding a lonnymq install is not made a router; nor is a router made a shard.
    with pytest.raises(errors.InvalidArgument, match="not a lonnymq router"):
        shard.init(sharded.shard_dsns[0], [sharded.shard_dsns[1]])
    with psycopg.connect(sharded.shards[0].admin_dsn(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS refusal")
        conn.execute("CREATE DATABASE refusal")
    other = sharded.shards[0].admin_dsn().rsplit("/", 1)[0] + "/refusal"
    with pytest.raises(errors.InvalidArgument, match="itself a lonnymq router"):
        shard.init(other, [sharded.dsn])
    assert shard.status(sharded.dsn).healthy


def test_init_again_keeps_queues_and_messages(sharded) -> None:  # type: ignore[no-untyped-def]
    with Client(sharded.dsn) as c:
        c.create_queue("reinit")
        sent = c.send("reinit", "kept")
        shard.init(sharded.dsn, sharded.shard_dsns)
        got = c.take("reinit")
    assert [m.id for m in got] == [sent.id] and got[0].payload == "kept"
