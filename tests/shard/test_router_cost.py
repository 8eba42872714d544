"""The router's plain-queue path: the functions a call of a plain queue runs on the router are
neither SECURITY DEFINER nor carry a SET clause (benchmarks/router_instructions.py counts what
that saves), yet they hold the queue's fence, route as the router does whatever the caller's
search_path holds, and work for the least-privileged roles."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from shard_helpers import as_producer_then_consumer, home, roles_on_router

from lonnymq import Client, shard
from lonnymq.shard import partitions

pytestmark = [pytest.mark.once, pytest.mark.slow]

#: The fence's keys of queue %s, as pg_locks shows them (the int4 keys' bits, unsigned), then
#: as given to pg_advisory_lock.
KEYS = (
    "SELECT hashtext('lonnymq/route')::bigint & 4294967295, hashtext(%s)::bigint & 4294967295,"
    " hashtext('lonnymq/route'), hashtext(%s)"
)

#: The router's functions that a call of a plain queue runs in the caller's role (besides
#: PL/Proxy's own); the dispatchers (partitions.DISPATCHED) are SECURITY DEFINER.
PLAIN_PATH = ("_shard_of", *partitions.FAST_ROUTES)


def _fence_locks(conn: psycopg.Connection[object]) -> list[tuple[int, int, str]]:
    """This session's advisory locks: (key 1, key 2, mode), the keys as pg_locks shows them
    (unsigned: :data:`KEYS`)."""
    rows = conn.execute(
        "SELECT classid::bigint, objid::bigint, mode FROM pg_locks"
        " WHERE locktype = 'advisory' AND pid = pg_backend_pid() ORDER BY 1, 2"
    ).fetchall()
    return [(int(a), int(b), str(m)) for a, b, m in rows]


def test_the_routing_functions_have_no_set_clause_and_every_definer_a_pinned_path(sharded) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(sharded.dsn) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc p"
            " WHERE p.pronamespace = 'lonnymq'::regnamespace"
        ).fetchall()
    by_name = {name: (definer, config) for name, definer, config in rows}
    assert {n: by_name[n] for n in PLAIN_PATH} == {n: (False, None) for n in PLAIN_PATH}
    definers = {name: config for name, definer, config in rows if definer}
    assert {*partitions.DISPATCHED, "_parted_send_shard", "_route_of", "queue_create_partitioned"} <= set(
        definers
    )
    assert {n for n, c in definers.items() if c != ["search_path=pg_catalog, pg_temp"]} == set()


def test_a_plain_queues_call_holds_its_fence_and_waits_for_a_move(sharded) -> None:  # type: ignore[no-untyped-def]
    r = sharded.dsn
    q = "cost_fence"
    with Client(r) as c:
        c.create_queue(q, if_not_exists=True)
        c.send_batch(q, ["a", "b"])
    with psycopg.connect(r) as conn:
        key = conn.execute(KEYS, (q, q)).fetchone()
        assert key is not None
        fence = (int(key[0]), int(key[1]), "ShareLock")
        lock_args = (int(key[2]), int(key[3]))
        # Each routed call of a plain queue, in one router transaction: the queue's fence, shared,
        # and no other advisory lock.
        got = conn.execute("SELECT id, token FROM lonnymq.take(%s, 1)", (q,)).fetchall()
        assert len(got) == 1 and _fence_locks(conn) == [fence]
        conn.rollback()
        conn.execute("SELECT lonnymq.send(%s, '\\x7b7d'::bytea)", (q,))
        assert _fence_locks(conn) == [fence]
        conn.rollback()
        conn.execute("SELECT count(*) FROM lonnymq.send_batch(%s, ARRAY['\\x7b7d'::bytea])", (q,))
        assert _fence_locks(conn) == [fence]
        conn.rollback()
        conn.execute("SELECT lonnymq.ack(%s, ARRAY[%s]::bigint[], ARRAY[%s]::integer[])", (q, *got[0]))
        assert _fence_locks(conn) == [fence]
        conn.rollback()
    # While a move holds the fence (exclusively), the queue's calls wait.
    with psycopg.connect(r, autocommit=True) as mover, psycopg.connect(r, autocommit=True) as conn:
        mover.execute("SELECT pg_advisory_lock(%s, %s)", lock_args)
        conn.execute("SET lock_timeout = '300ms'")
        for call in (
            "SELECT lonnymq.send(%s, '\\x7b7d'::bytea)",
            "SELECT count(*) FROM lonnymq.take(%s, 1)",
            "SELECT lonnymq.ack(%s, ARRAY[1]::bigint[], ARRAY[1]::integer[])",
            "SELECT lonnymq.queue_metrics(%s)",
        ):
            with pytest.raises(pg_errors.LockNotAvailable):
                conn.execute(call, (q,))
        mover.execute("SELECT pg_advisory_unlock(%s, %s)", lock_args)
        # a and b, less a (acked), plus the send and the batch of one above
        assert conn.execute("SELECT count(*) FROM lonnymq.take(%s, 5)", (q,)).fetchone() == (3,)


def test_routes_ignore_the_callers_search_path(sharded) -> None:  # type: ignore[no-untyped-def]
    """An operator or function of the caller's own schema, first on its search_path, changes
    neither the shard nor the lock a plain queue's call gets (they run in the caller's role)."""
    r = sharded.dsn
    plain, moved = "cost_path_plain", "cost_path_moved"
    with Client(r) as c:
        for q in (plain, moved):
            c.create_queue(q, if_not_exists=True)
    if moved not in shard.status(r).overrides:
        shard.move(r, moved, 1 - home(r, moved))
    calls = (
        "lonnymq._shard_of(%s)",
        "lonnymq._send_shard(%s, NULL, NULL)",
        "lonnymq._batch_shard(%s, NULL, NULL)",
        "lonnymq._id_shard(%s, '{}')",
        "lonnymq._cancel_shard(%s, '{}', '{}')",
        "lonnymq._msg_shard(%s, 1, NULL)",
    )
    with psycopg.connect(r, autocommit=True) as conn:
        want = {
            (call, q): conn.execute(sql.SQL("SELECT {} & 1").format(sql.SQL(call)), (q,)).fetchone()
            for call in calls
            for q in (plain, moved)
        }
        assert want[(calls[0], moved)] == (1 - home(r, moved),)
        conn.execute("DROP SCHEMA IF EXISTS lmq_evil CASCADE")
        conn.execute("CREATE SCHEMA lmq_evil")
        try:
            conn.execute(
                "CREATE FUNCTION lmq_evil.hashtext(text) RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 7'"
            )
            conn.execute(
                "CREATE FUNCTION lmq_evil.never(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE"
                " AS 'SELECT false'"
            )
            conn.execute(
                "CREATE OPERATOR lmq_evil.= (leftarg = text, rightarg = text, function = lmq_evil.never)"
            )
            conn.execute("SET search_path = lmq_evil, pg_catalog")
            assert conn.execute("SELECT hashtext('x'), 'x' = 'x'").fetchone() == (7, False)  # they do bite
            with conn.transaction():
                got = {
                    (call, q): conn.execute(
                        sql.SQL("SELECT {} OPERATOR(pg_catalog.&) 1").format(sql.SQL(call)), (q,)
                    ).fetchone()
                    for call in calls
                    for q in (plain, moved)
                }
                conn.execute("RESET search_path")  # the locks taken, read on the usual path
                keys = {conn.execute(KEYS, (q, q)).fetchone()[:2] for q in (plain, moved)}  # type: ignore[index]
                assert {(a, b) for a, b, _ in _fence_locks(conn)} == keys
            assert got == want
        finally:
            conn.execute("RESET search_path")
            conn.execute("DROP SCHEMA lmq_evil CASCADE")


def test_producer_and_consumer_roles_on_the_plain_path(sharded) -> None:  # type: ignore[no-untyped-def]
    """The least-privileged roles (created on the router too, as docs/sharding.md says) make the
    calls of each route: the routing functions (send, ack), a dispatcher (take, queue_metrics)
    and a call routed by _shard_of alone (cron_upsert, which a worker logged in as a consumer
    makes)."""
    r = sharded.dsn
    roles_on_router(r, sharded.shard_dsns)
    q = "cost_roles"
    with Client(r) as c:
        c.create_queue(q, if_not_exists=True)
    with psycopg.connect(r, autocommit=True) as conn, Client(r) as c:
        try:
            as_producer_then_consumer(c, conn, q)  # the routing functions and take's dispatcher
            assert c.metrics(q, conn=conn).ready == 0
            row = conn.execute(
                "SELECT lonnymq.cron_upsert('cost_roles_tick', '* * * * *', %s, '\\x7b7d'::bytea)", (q,)
            ).fetchone()
            assert row is not None and row[0]
        finally:
            conn.execute("RESET ROLE")
            # A due '* * * * *' schedule left in the session's clusters would be fired (and
            # counted) by later tests' workers.
            conn.execute("SELECT lonnymq.cron_delete('cost_roles_tick')")


def test_a_plain_queues_calls_read_shard_route_only(sharded) -> None:  # type: ignore[no-untyped-def]
    """A plain queue's route reads one table, shard_route (partitioned queues are marked in it,
    partitions.PARTITIONED_MARK): its calls go on while shard_partition is locked; a
    partitioned queue's calls read their partitions there, so they wait."""
    r = sharded.dsn
    plain, hot = "cost_one_plain", "cost_one_hot"
    with Client(r) as c:
        c.create_queue(plain, if_not_exists=True)
        c.create_queue(hot, partitions=2, if_not_exists=True)
        c.send_batch(plain, ["a", "b"])
    with psycopg.connect(r) as locker, psycopg.connect(r, autocommit=True) as conn:
        locker.execute("LOCK TABLE lonnymq.shard_partition IN ACCESS EXCLUSIVE MODE")
        conn.execute("SET lock_timeout = '300ms'")
        conn.execute("SELECT lonnymq.send(%s, '\\x7b7d'::bytea)", (plain,))
        got = conn.execute("SELECT id, token FROM lonnymq.take(%s, 1)", (plain,)).fetchall()
        assert len(got) == 1
        conn.execute("SELECT lonnymq.ack(%s, ARRAY[%s]::bigint[], ARRAY[%s]::integer[])", (plain, *got[0]))
        row = conn.execute("SELECT (lonnymq.queue_metrics(%s)).ready", (plain,)).fetchone()
        assert row == (2,)
        row = conn.execute("SELECT shard, partitions FROM lonnymq._route_of(%s)", (plain,)).fetchone()
        assert row is not None and row[0] & 1 == home(r, plain) and row[1] is None
        for call in ("SELECT lonnymq.send(%s, '\\x7b7d'::bytea)", "SELECT count(*) FROM lonnymq.take(%s, 1)"):
            with pytest.raises(pg_errors.LockNotAvailable):
                conn.execute(call, (hot,))
        locker.rollback()
        conn.execute("SELECT lonnymq.send(%s, '\\x7b7d'::bytea)", (hot,))
    with Client(r) as c:
        c.drop_queue(hot)
        c.drop_queue(plain)
