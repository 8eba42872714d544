"""What a call through the shard router costs the router itself, counted in instructions
(deterministic, like benchmarks/server_instructions.py, which this follows).

Three throwaway clusters (tools/pgcluster.py: Debian's PostgreSQL 15, run as the ``postgres``
OS user): shard a, shard b and a router server holding one router database per source tree
(``--trees name=path/to/src,...``, each made by that tree's ``lonnymq.shard.init`` over the same
two shards, so the trees must share the core's SQL). The router's postmaster is then stopped and
each workload runs in a single-user ``postgres --single`` on the router database under valgrind's
callgrind, the shards serving as usual: prepared statements, ``EXECUTE``d ``--calls`` times (and
``--calls / 4`` times; the difference of the two counts over the difference of the calls is one
call, without start-up, connection to the shards and planning). Only the EXECUTEs are counted
(``--toggle-collect=ExecuteQuery``): not each statement's commit, and not the shard's work (another
process), so this is the router's own CPU work per call; waiting for the shard costs nothing here.

Workloads (``--workloads``), on a plain queue held by shard a unless named ``_parted``:

* ``send``, ``send_batch100`` (one call of 100 messages), ``take`` (one message), ``take_ack``
  (a take of one message, then its ack: two calls; ``ack`` is reported as take_ack - take):
  the router's public functions, as clients call them;
* ``bare_*``: the same calls through bare PL/Proxy functions with the same signatures (``RUN ON 0;
  TARGET lonnymq.<call>``): PL/Proxy's own part, with none of LonnyMQ's routing;
* ``route_send``, ``route_batch``, ``route_ack``: the routing function that PL/Proxy calls for
  ``send``, ``send_batch`` and ``ack`` (``_send_shard``, ``_batch_shard``, ``_id_shard``) alone;
  ``shard_of``: ``_shard_of`` alone (what ``_hash_take`` runs); ``partitions``: ``_partitions``;
  ``noop``: ``SELECT 1`` (what a top-level statement costs: subtract it from the ones alone);
* the dispatched calls (``lonnymq.shard.partitions.DISPATCHED``, plpgsql dispatchers on the
  router): ``peek``, ``queue_metrics``, ``next_ready_in``, ``dead_list``, ``dead_requeue``,
  ``archive_list``, ``message_list``, ``channel_list``, ``channel_recount`` (and ``take``, above)
  through their public dispatchers, and each as ``hash_<call>`` through its PL/Proxy function
  ``_hash_<call>`` (``RUN ON _shard_of(...)``: what the dispatcher costs over the same call
  routed by PL/Proxy alone); ``hash_take``, ``hash_take_ack``: take (and ack) so;
* ``floor_<route>_<call>`` (``<call>``: ``send``, ``send_batch100``, ``take``, ``take_ack``): the
  floors of a per-queue route, each a PL/Proxy function with the call's signature (``TARGET
  lonnymq.<call>``) routed by ``RUN ON`` (:data:`FLOORS`): ``hashtext`` (PL/Proxy's routing query
  with a built-in function: no plpgsql), ``plpgsql`` (a plpgsql function that only returns the
  hash: its frame), ``fence`` (that and the fence, the queue's shared advisory lock as a simple
  expression: the least that keeps a move exactly-once with a fence on the router), ``lookup``
  (that and one indexed statement on ``shard_route``), ``shardof`` (``lonnymq._shard_of``: the
  plain route every call runs, ``partitions.PLAIN_ROUTE``), ``guc`` (the fence and a setting
  read: the least a route cache kept in settings costs) and ``cache`` (a prototype of such a
  cache, its cost only: the fence, then the route from a setting of the session named by a
  sequence's last value (the version) and the queue's name in hex; a miss reads it as
  ``lookup`` and sets it);
* ``shard_send``, ``shard_send_batch100``, ``shard_take``, ``shard_take_ack``: the same calls
  made directly on shard a (its own single-user backend counted, its postmaster stopped
  meanwhile): with them, ``<call>: shard / (router + shard)`` is reported, the share of the
  shard's own work in a call through the router (the shard's side of a proxied call, a query
  with parameters from PL/Proxy, is taken as the direct call's: not counted);
* ``send_parted``, ``take_parted``: a queue with 2 partitions (one on each shard);
* ``send_plain``, ``send_plain_parted``, ``shard_send_plain``: the lean plain send
  (``send_plain(q, payload)``, what the Python client sends for a message without options)
  through the router, of the partitioned queue, and directly on shard a;
* ``send_plain_once``, ``send_plain_once_parted``, ``shard_send_plain_once``: the lean keyed
  plain send (``send_plain_once(q, payload, gen_random_uuid())``, what a pooled Python client
  sends for such a message: it keys each send), the same three ways; ``send_key``,
  ``send_key_parted``, ``shard_send_key``: ``send(q, payload, p_send_key => ...)``, what that
  client sent before;
* ``pgmq_send``, ``pgmq_read`` (one message), ``pgmq_read_delete`` (a read of one, then
  ``pgmq.delete`` of its id: ``pgmq_delete`` is reported as the difference), ``pgmq_read10``
  and ``pgmq_read10_delete10`` (the same with 10 messages and ``pgmq.delete`` of an array of
  their 10 ids: ``pgmq_delete10``), ``pgmq_metrics``;
  pgmq's FIFO groups: ``pgmq_send_group`` (a send with an ``x-pgmq-group`` header),
  ``pgmq_send_batch10_groups`` (a batch of 10 with headers, of two groups, one on each
  partition of ``pq``), ``pgmq_read_grouped_delete`` (a ``read_grouped`` of one, then
  ``pgmq.delete`` of its id), and ``pgmq_send_group_parted``, ``pgmq_send_batch10_groups_parted``
  (the sends on ``pq``, partitioned), ``pgmq_send_batch10_group_parted`` (a batch of 10 of one
  group: one partition):
  the pgmq facade's calls through the router (``shard init --pgmq``: with any of them, every
  tree's router is made with the facade, installed on the shards).

    python benchmarks/router_instructions.py --trees before=../main/src,after=src \\
        [--workloads send,take,...|floors] [--calls 200] [--json out.json]

Needs root (the servers run as the postgres OS user), valgrind and PL/Proxy (installed from
Debian when missing, as the tests do).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from contextlib import ExitStack, suppress
from pathlib import Path

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pgcluster
from server_instructions import collected

PAYLOAD = "\\x7b226f72646572223a203132333435362c20226e6f7465223a2022787878787878787878787878227d"
#: Keeps a take's ids and tokens in settings for the ack that follows.
_KEEP = (
    "set_config('b.ids', coalesce(array_agg(t.id)::text, '{}'), false),"
    " set_config('b.toks', coalesce(array_agg(t.token)::text, '{}'), false)"
)
_ACK = "current_setting('b.ids')::bigint[], current_setting('b.toks')::int[]"
#: A pgmq read of one message, its id kept for the delete that follows.
_PGMQ_READ = (
    "SELECT set_config('b.id', coalesce(max(t.msg_id), 0)::text, false) FROM pgmq.read('{q}', 30, 1) t"
)
#: A pgmq read of 10 messages, their ids kept for the delete (of an array) that follows.
_PGMQ_READ10 = "SELECT set_config('b.ids', coalesce(array_agg(t.msg_id)::text, '{}'), false) FROM pgmq.read('{q}', 30, 10) t"


def _group(k: int) -> str:
    """A FIFO group's name whose partition of 2 is ``k`` (lonnymq.client.direct.key_partition)."""
    return next(
        g
        for g in (f"g{i}" for i in range(100))
        if int.from_bytes(hashlib.sha256(g.encode()).digest()[:4], "big") % 2 == k
    )


#: A pgmq send of one message of a FIFO group; a batch of 10 of two groups (one a partition).
_PGMQ_GROUP = (
    """SELECT * FROM pgmq.send('{q}', '{"n": 1}'::jsonb,"""
    f""" jsonb_build_object('x-pgmq-group', '{_group(0)}'))"""
)
_PGMQ_GROUPS10 = (
    "SELECT count(*) FROM pgmq.send_batch('{q}', array_fill('{\"n\": 1}'::jsonb, ARRAY[10]),"
    f" ARRAY(SELECT jsonb_build_object('x-pgmq-group', CASE WHEN i % 2 = 0 THEN '{_group(0)}'"
    f" ELSE '{_group(1)}' END) FROM generate_series(1, 10) i))"
)


def _calls(fn: str) -> dict[str, tuple[str, ...]]:
    """The four calls' statements with ``fn`` the function's name pattern (``{}`` the call)."""
    send = f"SELECT * FROM {fn.format('send')}('{{q}}', '{PAYLOAD}'::bytea)"
    batch = (
        f"SELECT count(*) FROM {fn.format('send_batch')}('{{q}}', array_fill('{PAYLOAD}'::bytea, ARRAY[100]))"
    )
    take = f"SELECT {_KEEP} FROM {fn.format('take')}('{{q}}', 1) t"
    ack = f"SELECT * FROM {fn.format('ack')}('{{q}}', {_ACK})"
    return {"send": (send,), "send_batch100": (batch,), "take": (take,), "take_ack": (take, ack)}


#: The dispatched calls other than take, ``{fn}`` the function.
DISPATCHED_CALLS = {
    "peek": "SELECT count(*) FROM {fn}('{{q}}', 1)",
    "queue_metrics": "SELECT * FROM {fn}('{{q}}')",
    "next_ready_in": "SELECT {fn}('{{q}}')",
    "dead_list": "SELECT count(*) FROM {fn}('{{q}}', 10)",
    "dead_requeue": "SELECT {fn}('{{q}}', ARRAY[1]::bigint[])",
    "archive_list": "SELECT count(*) FROM {fn}('{{q}}', NULL, NULL, NULL, 10)",
    "message_list": "SELECT count(*) FROM {fn}('{{q}}', NULL, NULL, 10)",
    "channel_list": "SELECT count(*) FROM {fn}('{{q}}', 10)",
    "channel_recount": "SELECT {fn}('{{q}}')",
}


#: The floors of a per-queue route (``floor_<route>_<call>``): what each PL/Proxy function routes
#: by, cheapest first.
FLOORS = {
    "hashtext": "hashtext(p_queue)",
    "plpgsql": "public.floor_plpgsql(p_queue)",
    "fence": "public.floor_fence(p_queue)",
    "guc": "public.floor_guc(p_queue)",
    "cache": "public.floor_cache(p_queue)",
    "lookup": "public.floor_lookup(p_queue)",
    "shardof": "lonnymq._shard_of(p_queue)",
}
#: The fence of PLAIN_ROUTE (schema lonnymq), as a plpgsql simple expression.
_FENCE = """    IF pg_catalog.pg_advisory_xact_lock_shared(
           pg_catalog.hashtext('lonnymq' OPERATOR(pg_catalog.||) '/route'), pg_catalog.hashtext(p_queue)) IS NULL THEN
        NULL;
    END IF;
"""
#: The statement of the ``lookup`` floor: one indexed read of the route table, the hash else.
_LOOKUP = """    SELECT coalesce((SELECT r.shard FROM lonnymq.shard_route r WHERE r.queue OPERATOR(pg_catalog.=) p_queue),
                    pg_catalog.hashtext(p_queue)) INTO v_route;
"""
#: The routing functions of the floors (in the router database, public schema).
FLOOR_FUNCTIONS = (
    """CREATE OR REPLACE FUNCTION public.floor_plpgsql(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN pg_catalog.hashtext(p_queue);
END $fn$""",
    """CREATE OR REPLACE FUNCTION public.floor_fence(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
"""
    + _FENCE
    + """    RETURN pg_catalog.hashtext(p_queue);
END $fn$""",
    # Not a route (a floor of any cache kept in settings): the fence, then a setting of a
    # constant name read (never set in the counted session: a miss, as costly as a hit).
    """CREATE OR REPLACE FUNCTION public.floor_guc(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
"""
    + _FENCE
    + """    RETURN coalesce(pg_catalog.current_setting('lonnymq_route.floor', true)::pg_catalog.int4,
                    pg_catalog.hashtext(p_queue));
END $fn$""",
    # A prototype of a session's route cache (its cost only: nothing bumps the version here):
    # the fence, then the shard from a setting named by the version (a sequence's last value)
    # and the queue's name in hex (no hash to collide, nothing of the name in the setting's name
    # but hex digits); a miss reads the route (as ``lookup``) and sets it for the session.
    "CREATE SEQUENCE IF NOT EXISTS public.floor_route_version",
    "SELECT nextval('public.floor_route_version')",
    """CREATE OR REPLACE FUNCTION public.floor_cache(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_name  pg_catalog.text;
    v_route pg_catalog.int4;
BEGIN
"""
    + _FENCE
    + """    v_name := 'lonnymq_route.v' OPERATOR(pg_catalog.||)
        pg_catalog.pg_sequence_last_value('public.floor_route_version'::pg_catalog.regclass)
        OPERATOR(pg_catalog.||) 'q' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.convert_to(p_queue, 'UTF8'), 'hex');
    v_route := pg_catalog.current_setting(v_name, true)::pg_catalog.int4;
    IF v_route IS NOT NULL THEN
        RETURN v_route;
    END IF;
"""
    + _LOOKUP
    + """    PERFORM pg_catalog.set_config(v_name, v_route::pg_catalog.text, false);
    RETURN v_route;
END $fn$""",
    """CREATE OR REPLACE FUNCTION public.floor_lookup(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_route pg_catalog.int4;
BEGIN
"""
    + _FENCE
    + _LOOKUP
    + """    RETURN v_route;
END $fn$""",
)


#: A plain message's send as the Python client makes it (sql/send.sql, send_plain).
_SEND_PLAIN = f"SELECT lonnymq.send_plain('{{q}}', '{PAYLOAD}'::bytea)"
#: The same with an idempotency key, as a pooled client makes it (send_plain_once), and what
#: that client called before (send() with the key).
_SEND_ONCE = f"SELECT lonnymq.send_plain_once('{{q}}', '{PAYLOAD}'::bytea, gen_random_uuid())"
_SEND_KEY = f"SELECT * FROM lonnymq.send('{{q}}', '{PAYLOAD}'::bytea, p_send_key => gen_random_uuid())"

#: workload: the statements of one call (each EXECUTEd once a call), and whether the shard's
#: queue needs a backlog of messages.
WORKLOADS: dict[str, tuple[str, ...]] = {
    **_calls("lonnymq.{}"),
    **{f"bare_{k}": v for k, v in _calls("public.bare_{}").items()},
    **{f"floor_{r}_{k}": v for r in FLOORS for k, v in _calls(f"public.floor_{r}_{{}}").items()},
    "route_send": ("SELECT lonnymq._send_shard('{q}', NULL, NULL)",),
    "route_batch": ("SELECT lonnymq._batch_shard('{q}', NULL, NULL)",),
    "route_ack": ("SELECT lonnymq._id_shard('{q}', ARRAY[2]::bigint[])",),
    "shard_of": ("SELECT lonnymq._shard_of('{q}')",),
    "partitions": ("SELECT lonnymq._partitions('{q}')",),
    "noop": ("SELECT 1",),
    "send_parted": (_calls("lonnymq.{}")["send"][0].replace("{q}", "{pq}"),),
    # The lean plain send (send_plain: routed by _plain_shard), of a plain and of a partitioned
    # queue, and made directly on shard a.
    "send_plain": (_SEND_PLAIN,),
    "send_plain_parted": (_SEND_PLAIN.replace("{q}", "{pq}"),),
    "shard_send_plain": (_SEND_PLAIN,),
    # The lean keyed plain send (send_plain_once: routed by _once_shard) and send() with a key
    # (routed by _send_shard), of a plain and of a partitioned queue, and directly on shard a.
    "send_plain_once": (_SEND_ONCE,),
    "send_plain_once_parted": (_SEND_ONCE.replace("{q}", "{pq}"),),
    "shard_send_plain_once": (_SEND_ONCE,),
    "send_key": (_SEND_KEY,),
    "send_key_parted": (_SEND_KEY.replace("{q}", "{pq}"),),
    "shard_send_key": (_SEND_KEY,),
    "take_parted": (_calls("lonnymq.{}")["take"][0].replace("{q}", "{pq}"),),
    # The dispatched calls (plpgsql dispatchers, lonnymq.shard.partitions.DISPATCHED) of a plain
    # queue, each also through its PL/Proxy function _hash_<name> (RUN ON _shard_of(...)):
    "hash_take": _calls("lonnymq._hash_{}")["take"],
    "hash_take_ack": (_calls("lonnymq._hash_{}")["take"][0], _calls("lonnymq.{}")["take_ack"][1]),
    **{
        f"{pre}{call}": (stmt.format(fn=f"lonnymq.{pre.replace('hash_', '_hash_')}{call}"),)
        for pre in ("", "hash_")
        for call, stmt in DISPATCHED_CALLS.items()
    },
    # The same calls made directly on the shard (shard a's own backend counted, not the router's).
    **{f"shard_{k}": v for k, v in _calls("lonnymq.{}").items()},  # ON_SHARD
    "pgmq_send": ("""SELECT * FROM pgmq.send('{q}', '{"n": 1}'::jsonb)""",),
    "pgmq_read": (_PGMQ_READ,),
    "pgmq_read_delete": (_PGMQ_READ, "SELECT pgmq.delete('{q}', current_setting('b.id')::bigint)"),
    "pgmq_metrics": ("SELECT * FROM pgmq.metrics('{q}')",),
    "pgmq_read10": (_PGMQ_READ10,),
    "pgmq_read10_delete10": (
        _PGMQ_READ10,
        "SELECT count(*) FROM pgmq.delete('{q}', current_setting('b.ids')::bigint[])",
    ),
    "pgmq_send_group": (_PGMQ_GROUP,),
    "pgmq_send_batch10_groups": (_PGMQ_GROUPS10,),
    "pgmq_read_grouped_delete": (
        _PGMQ_READ.replace("pgmq.read(", "pgmq.read_grouped("),
        "SELECT pgmq.delete('{q}', current_setting('b.id')::bigint)",
    ),
    "pgmq_send_group_parted": (_PGMQ_GROUP.replace("{q}", "{pq}"),),
    "pgmq_send_batch10_groups_parted": (_PGMQ_GROUPS10.replace("{q}", "{pq}"),),
    "pgmq_send_batch10_group_parted": (_PGMQ_GROUPS10.replace("{q}", "{pq}").replace(_group(1), _group(0)),),
}
TAKES = (
    "take",
    "take_ack",
    "bare_take",
    "bare_take_ack",
    "hash_take",
    "hash_take_ack",
    "shard_take",
    "shard_take_ack",
    "peek",
    "hash_peek",
    "message_list",
    "hash_message_list",
    "take_parted",
    "pgmq_read",
    "pgmq_read_delete",
    "pgmq_read10",
    "pgmq_read10_delete10",
    "pgmq_read_grouped_delete",
    *(f"floor_{r}_{k}" for r in FLOORS for k in ("take", "take_ack")),
)
#: The workloads made directly on shard a (not through the router): ``shard_of`` is the router's.
ON_SHARD = (
    *(f"shard_{k}" for k in _calls("lonnymq.{}")),
    "shard_send_plain",
    "shard_send_plain_once",
    "shard_send_key",
)
#: ``--workloads floors``: the router target's floors (the shard's calls, ours and each floor's).
FLOOR_SET = ",".join(
    [
        *(f"{p}{k}" for p in ("shard_", "", "bare_") for k in ("send", "take", "take_ack")),
        "hash_take",
        "hash_take_ack",
        *(f"floor_{r}_{k}" for r in FLOORS for k in ("send", "take", "take_ack")),
    ]
)
DEFAULT = "send,send_batch100,take,take_ack,bare_send,bare_send_batch100,bare_take,bare_take_ack," + (
    "route_send,route_batch,route_ack,shard_of,partitions,noop,send_parted,take_parted"
)

#: The bare PL/Proxy functions (no routing: shard 0) of the calls, made in each router database.
BARE = ("send", "send_batch", "take", "ack")


def _single(cluster: pgcluster.Cluster, db: str, script: str, profile: Path | None = None) -> int:
    """Instructions callgrind counted in the EXECUTEs of ``script`` in a single-user backend
    (``profile``: callgrind's output file, for callgrind_annotate)."""
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={profile or '/dev/null'}",
        "--collect-atstart=no",
        "--toggle-collect=ExecuteQuery",
        str(pgcluster.BINDIR / "postgres"),
        "--single",
        "-D",
        str(cluster.datadir),
        db,
    ]
    out = subprocess.run(
        ["runuser", "-u", pgcluster.OS_USER, "--", *argv] if os.geteuid() == 0 else argv,
        input=script,
        capture_output=True,
        text=True,
    )
    return collected(out)


def _script(statements: tuple[str, ...], calls: int, names: dict[str, str]) -> str:
    texts = [s.replace("{q}", names["q"]).replace("{pq}", names["pq"]) for s in statements]
    prepared = [f"PREPARE w{i} AS {s}" for i, s in enumerate(texts)]
    once = "".join(f"EXECUTE w{i}\n" for i in range(len(statements)))
    # 20 first calls: plans made, connections to the shards opened.
    return (
        "SET b.ids = '{}'\nSET b.toks = '{}'\nSET b.id = '0'\n"
        + "\n".join(prepared)
        + "\n"
        + once * (20 + calls)
    )


def _fill(shards: list[tuple[str, str]], backlog: int) -> None:
    """Empty each (shard DSN, queue) and, with ``backlog``, give it that many ready messages."""
    for dsn, queue in shards:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT lonnymq.queue_purge(%s)", (queue,))
            if backlog:
                conn.execute(
                    "SELECT count(*) FROM lonnymq.send_batch(%s, array_fill(%s::bytea, ARRAY[%s]))",
                    (queue, b'{"n": 1}', backlog),
                )
            conn.execute("VACUUM ANALYZE lonnymq.message")


def _bare(dsn: str) -> None:
    """The bare PL/Proxy functions of :data:`BARE` in the router database ``dsn``, and those of
    the floors (:data:`FLOORS`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in FLOOR_FUNCTIONS:
            conn.execute(stmt)
        for name in BARE:
            sig = f"lonnymq.{name}"
            args, result = conn.execute(
                "SELECT pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) FROM pg_proc p"
                " WHERE p.oid = %s::regproc",
                (sig,),
            ).fetchone() or ("", "")
            conn.execute(
                sql.SQL(
                    "CREATE OR REPLACE FUNCTION public.{}({}) RETURNS {} LANGUAGE plproxy AS"
                    " $$ CLUSTER 'lonnymq_lonnymq'; RUN ON 0; TARGET lonnymq.{}; $$"
                ).format(sql.Identifier(f"bare_{name}"), sql.SQL(args), sql.SQL(result), sql.SQL(name))
            )
            for route, on in FLOORS.items():
                conn.execute(
                    sql.SQL(
                        "CREATE OR REPLACE FUNCTION public.{}({}) RETURNS {} LANGUAGE plproxy AS"
                        " $$ CLUSTER 'lonnymq_lonnymq'; RUN ON {}; TARGET lonnymq.{}; $$"
                    ).format(
                        sql.Identifier(f"floor_{route}_{name}"),
                        sql.SQL(args),
                        sql.SQL(result),
                        sql.SQL(on),
                        sql.SQL(name),
                    )
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="name=path/to/src,... (the first is the reference)")
    ap.add_argument("--workloads", default=DEFAULT)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--profiles",
        type=Path,
        help="also keep callgrind's output of each workload's longer run in this directory"
        " (callgrind.<workload>.<tree>: callgrind_annotate --inclusive=yes shows where it goes)",
    )
    args = ap.parse_args()
    if args.profiles:
        args.profiles.mkdir(parents=True, exist_ok=True)
        os.chmod(args.profiles, 0o777)  # written by the postgres OS user
    trees = [tuple(t.split("=", 1)) for t in args.trees.split(",")]
    workloads = (FLOOR_SET if args.workloads == "floors" else args.workloads).split(",")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    low, high = max(1, args.calls // 4), args.calls
    pgmq = any(w.startswith("pgmq_") for w in workloads)
    pgcluster.ensure_plproxy()
    settings = {"shared_preload_libraries": "''"}
    results: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        router, a, b = (
            stack.enter_context(pgcluster.temporary_cluster(settings, install=False)) for _ in range(3)
        )
        base = router.admin_dsn().rsplit("/", 1)[0]
        with psycopg.connect(router.admin_dsn(), autocommit=True) as conn:
            for name, _ in trees:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"router_{name}")))
            # A plain queue on shard 0 (a): PL/Proxy's rule, hashtext & (shards - 1).
            i = 0
            while conn.execute("SELECT hashtext(%s) & 1", (f"rq{i}",)).fetchone() != (0,):
                i += 1
        names = {"q": f"rq{i}", "pq": "pq"}
        for name, src in trees:
            code = (
                f"import sys; from lonnymq import shard; shard.init(sys.argv[1], sys.argv[2:], pgmq={pgmq})\n"
            )
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            subprocess.run(
                [sys.executable, "-c", code, f"{base}/router_{name}", a.dsn, b.dsn], env=env, check=True
            )
            _bare(f"{base}/router_{name}")
        first = f"{base}/router_{trees[0][0]}"
        with psycopg.connect(first, autocommit=True) as conn:
            conn.execute("SELECT lonnymq.queue_create(%s)", (names["q"],))
            conn.execute("SELECT lonnymq.queue_create_partitioned('pq', 2)")
            parts = conn.execute("SELECT shards FROM lonnymq.shard_partition WHERE queue = 'pq'").fetchone()
        for name, _ in trees[1:]:  # the same partitioned queue, known to the other routers
            with psycopg.connect(f"{base}/router_{name}", autocommit=True) as conn:
                conn.execute("INSERT INTO lonnymq.shard_partition (queue, shards) VALUES ('pq', %s)", parts)
                # Its mark in shard_route, where the router has them (partitions.PARTITIONED_MARK:
                # a plain queue's route reads shard_route only); an older router's CHECK refuses it.
                with suppress(pg_errors.CheckViolation):
                    conn.execute("INSERT INTO lonnymq.shard_route (queue, shard) VALUES ('pq', -1)")
        router.stop()
        try:
            for w in workloads:
                statements = WORKLOADS[w]
                targets = [(d, "pq") for d in (a.dsn, b.dsn)] if "parted" in w else [(a.dsn, names["q"])]
                backlog = (high + 40) * (20 if "10" in w else 2) if w in TAKES else 0
                # shard_*: the call on shard a's own backend (single-user there, its postmaster
                # stopped meanwhile), the same for every tree (the trees share the core's SQL).
                server, db = (a, pgcluster.DATABASE) if w in ON_SHARD else (router, None)
                for name, _ in trees:
                    counts = []
                    for n in (low, high):
                        _fill(targets, backlog)
                        profile = (
                            args.profiles / f"callgrind.{w}.{name}" if args.profiles and n == high else None
                        )
                        if server is a:
                            a.stop()
                        try:
                            counts.append(
                                _single(
                                    server, db or f"router_{name}", _script(statements, n, names), profile
                                )
                            )
                        finally:
                            if server is a:
                                a.start()
                    results.setdefault(w, {})[name] = (counts[1] - counts[0]) / (high - low)
                    print(f"{w:20} {name:8} {results[w][name] / 1000:9.1f}k instructions/call", flush=True)
        finally:
            router.start()  # temporary_cluster stops it on leaving
    ref = trees[0][0]
    if "take_ack" in results and "take" in results:
        results["ack (take_ack - take)"] = {
            n: results["take_ack"][n] - results["take"][n] for n in results["take"]
        }
    if "pgmq_read10_delete10" in results and "pgmq_read10" in results:
        results["pgmq_delete10 (pgmq_read10_delete10 - pgmq_read10)"] = {
            n: results["pgmq_read10_delete10"][n] - results["pgmq_read10"][n] for n in results["pgmq_read10"]
        }
    if "pgmq_read_delete" in results and "pgmq_read" in results:
        results["pgmq_delete (pgmq_read_delete - pgmq_read)"] = {
            n: results["pgmq_read_delete"][n] - results["pgmq_read"][n] for n in results["pgmq_read"]
        }
    calls = ("send", "send_batch100", "take", "take_ack")
    routed = [
        (w, call)
        for w in list(results)
        for call in calls
        if w in (call, f"bare_{call}", f"hash_{call}") or (w.startswith("floor_") and w.endswith(f"_{call}"))
    ]
    for w, call in routed:
        # A call through the router costs the router's instructions and the shard's, one made on
        # the shard its own: the share of the shard's is what a CPU-bound router + shard pair
        # would serve, relative to the shard alone (the shard's side of a proxied call, which
        # PL/Proxy sends as a query with parameters, is not counted: taken as the direct one's).
        if f"shard_{call}" in results:
            results[f"{w}: shard / (router + shard)"] = {
                n: results[f"shard_{call}"][n] / (results[f"shard_{call}"][n] + results[w][n])
                for n in results[w]
            }
    print(f"\ninstructions per call on the router (k); ratios to {ref}:")
    for w, row in results.items():
        if w.endswith("(router + shard)"):
            print(f"  {w:22} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
            continue
        print(f"  {w:22} " + "  ".join(f"{k} {v / 1000:8.1f}k ({v / row[ref]:.3f})" for k, v in row.items()))
    if args.json:
        args.json.write_text(
            json.dumps({"calls": args.calls, "trees": dict(trees), "results": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
