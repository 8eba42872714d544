"""The router's functions, generated from the catalog of an installed core (I/O-free).

Every public function of the core (one whose name does not start with ``_``) gets a PL/Proxy
function of the same name and signature in the router's schema. Where it runs:

* queue-scoped calls (an argument ``p_queue``, or ``p_name`` for the ``queue_*`` functions):
  ``RUN ON hashtext(<queue>)``, the shard that holds the queue;
* the calls without a queue: the rule in :data:`NO_QUEUE_ROUTES`, each chosen so that running
  on every shard and merging is the answer one server would give (listings are concatenated and
  re-sorted, counts are summed, "did it" flags are OR-ed), or on one shard for the clock.

A core function with neither a queue argument nor a rule stops the generation (:class:`NoRoute`):
a new API function needs a decision here, not a silent guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import sql

from .. import errors
from ..client.ops import ROUTER_MARKER
from . import partitions, pgmq_parts

__all__ = ["NO_QUEUE_ROUTES", "ROUTER_MARKER", "CoreFunction", "NoRoute", "Route"]

_PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")


class NoRoute(errors.LonnyMQError):
    """A public core function the generator does not know how to route."""


@dataclass(frozen=True, slots=True)
class CoreFunction:
    """One public function of the installed core, as ``pg_proc`` describes it."""

    name: str
    arguments: str  # pg_get_function_arguments: names, types and defaults
    identity: str  # pg_get_function_identity_arguments: names and types
    result: str  # pg_get_function_result: "SETOF x", "TABLE(...)" or a type
    retset: bool
    volatility: str  # 'i', 's' or 'v'
    strict: bool
    argnames: tuple[str, ...]  # IN arguments only
    grantees: tuple[str, ...]  # roles with EXECUTE (besides the owner)


@dataclass(frozen=True, slots=True)
class Route:
    """How the router runs a call: ``run`` is ``hash`` (by ``key``), ``all`` or ``one``.
    ``merge`` (for ``all``) is the SELECT over the rows of every shard, ``{all}`` standing for
    the call on all shards; None: the rows as they come."""

    run: str
    key: str | None = None
    merge: LiteralString | None = None


_SUM: LiteralString = "SELECT coalesce(sum(r), 0)::bigint FROM {all} AS r"
_OR: LiteralString = "SELECT coalesce(bool_or(r), false) FROM {all} AS r"

#: The counters of stats_minutes/stats_totals rows ``r``, summed over the shards.
_COUNTERS: LiteralString = ", ".join(
    f"sum(r.{c})::bigint" for c in ("sent", "acked", "nacked", "dead", "cancelled")
)

#: Routes of the public functions that take no queue name.
NO_QUEUE_ROUTES: dict[str, Route] = {
    # Listings: every shard's rows; queue_list pages by name, so the merged page is re-sorted and
    # cut to p_limit (each shard returned its first p_limit after p_after: enough).
    # A partitioned queue is on several shards: listed once (its settings are the same on each).
    "queue_list": Route(
        "all", merge="SELECT DISTINCT ON (r.name) * FROM {all} AS r ORDER BY r.name LIMIT p_limit"
    ),
    # The settings of the queues named: each plain queue's row from its shard, a partitioned
    # queue's once.
    "queue_info": Route("all", merge="SELECT DISTINCT ON (r.name) * FROM {all} AS r ORDER BY r.name"),
    "cron_list": Route("all", merge="SELECT * FROM {all} ORDER BY 1"),
    "worker_queues": Route("all", merge="SELECT DISTINCT ON (r.name) * FROM {all} AS r ORDER BY r.name"),
    # Per-queue rows (the dashboard's minute counters): each queue's rows come from its shard; a
    # partitioned queue's from each partition's, summed into one row (per minute).
    "stats_minutes": Route(
        "all",
        merge="SELECT r.queue, r.minute_at, " + _COUNTERS + " FROM {all} AS r GROUP BY 1, 2 ORDER BY 1, 2",
    ),
    "stats_totals": Route(
        "all", merge="SELECT r.queue, " + _COUNTERS + " FROM {all} AS r GROUP BY 1 ORDER BY 1"
    ),
    # The worker registry: a worker's row lives on the shard its id hashes to; the list is all.
    "worker_beat": Route("hash", key="p_id"),
    "worker_leave": Route("hash", key="p_id"),
    "worker_list": Route("all", merge="SELECT * FROM {all} ORDER BY 2, 3, 1"),
    # Housekeeping: each shard does its own share; the counts add up.
    "maintain": Route("all", merge=_SUM),
    "rotate": Route("all", merge=_SUM),
    "spark_prune": Route("all", merge=_SUM),
    "spark_sweep": Route(
        "all",
        merge="SELECT coalesce(sum(staged_rows), 0)::bigint, coalesce(sum(streams), 0)::bigint FROM {all}",
    ),
    # A cron schedule lives on the shard of its queue (cron_upsert routes by p_queue; a
    # partitioned queue's on its partition 0's shard, partitions.ROUTED); by name,
    # only that shard finds it, the others answer "not here" (NULL, false).
    "cron_fire": Route("all", merge="SELECT max(r) FROM {all} AS r"),
    "cron_delete": Route("all", merge=_OR),
    "cron_set_enabled": Route("all", merge=_OR),
    # A Spark stream lives on its queue's shard (spark_stream_next routes by p_queue); the others
    # have no such stream: no rows, 0 committed.
    "spark_stream_chunks": Route("all", merge="SELECT * FROM {all} ORDER BY 1, 2"),
    "spark_stream_read": Route("all"),
    "spark_stream_commit": Route("all", merge=_SUM),
    "spark_write_abort": Route("all", merge=_SUM),
    # Transactions still running among p_vxids: vxids are per server, so the union over the shards
    # may name a few more than the shard of the queue has: the caller only looks once more.
    "wait_pending": Route(
        "all", merge="SELECT coalesce(array_agg(DISTINCT v), '{{}}') FROM {all} AS r, unnest(r) AS v"
    ),
    # The clock: one server's, always the same one (shard 0).
    "now_ms": Route("one"),
}


#: The arguments that name a queue: calls keyed by them go through the queue's route.
QUEUE_KEYS = ("p_queue", "p_name")

#: The router's function that says which shard holds a queue (see ROUTE_STATEMENTS).
SHARD_OF = "_shard_of"
#: The same for queue_create, which also waits while ``shard add`` changes the shard count.
SHARD_OF_NEW = "_shard_of_new"
#: The router's function that gives the shard map to clients that go straight to the shards.
SHARD_MAP = "_shard_map"

#: The router's routing state, created by ``shard init`` next to the proxies. ``shard_route``
#: holds the queues that do not live where their hash says (moved by ``shard move``) and marks
#: the partitioned queues (shard -1, ``partitions.PARTITIONED_MARK``: their partitions are in
#: ``shard_partition``); a queue without a row lives on ``hashtext(name) & (shards - 1)``,
#: PL/Proxy's own rule.
#:
#: The fence: every queue-scoped call holds, while it runs (its transaction on the router, which
#: ends when the shard's reply is in), a shared advisory lock keyed by its queue, class
#: ``hashtext(schema || '/route')``; a move holds it exclusively while it copies the queue and
#: flips its route, so no call of that queue runs during the copy and every call after it reads
#: the new route. ``queue_create`` also holds key 0 of class ``hashtext(schema || '/map')``
#: shared, which ``shard add`` holds exclusively while it pins the existing queues and changes
#: the shard count. ``{s}`` is the schema identifier, ``{name}`` its name as a literal.
ROUTE_STATEMENTS: tuple[LiteralString, ...] = (
    """CREATE TABLE {s}.shard_route (
    queue    text PRIMARY KEY,
    -- -1: a partitioned queue's mark (lonnymq.shard.partitions.PARTITIONED_MARK), not a shard.
    shard    integer NOT NULL CHECK (shard >= -1),
    moved_at timestamptz NOT NULL DEFAULT now()
)""",
    """-- The shard of queue p_queue for PL/Proxy's RUN ON: its override in shard_route, else its
-- hash (PL/Proxy masks it to the shard count). Waits while a move of the queue holds its fence.
-- Raises LQ002 for a partitioned queue. Runs in the caller's role, without a SET clause
-- (lonnymq.shard.partitions.PLAIN_ROUTE). Reads shard_route (shard_partition only to refuse a
-- partitioned queue). Locks: advisory
-- (transaction, shared) on (hashtext(schema || '/route'), hashtext(p_queue)).
CREATE FUNCTION {s}._shard_of(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
"""
    + partitions.PLAIN_ROUTE
    + """    -- A partitioned queue (shard_partition, lonnymq.shard.partitions) has no one shard: the
    -- calls that would see one partition only are refused.
    RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = pg_catalog.format('queue %s is partitioned over'
        ' shards %s: this call would see one partition only and is not available for it'
        ' (docs/sharding.md, one hot queue over several shards)', p_queue, pg_catalog.array_to_string(
            (SELECT p.shards FROM {s}.shard_partition p WHERE p.queue OPERATOR(pg_catalog.=) p_queue), ', '));
END $fn$""",
    """-- _shard_of for queue_create: also waits while `shard add` changes the shard count (so no
-- queue is created on a shard its hash no longer names). Locks: advisory (transaction, shared)
-- on (hashtext(schema || '/map'), 0), then _shard_of's.
CREATE FUNCTION {s}._shard_of_new(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    -- Schema-qualified, as _shard_of: it runs in the caller's role and search_path.
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtext({name} OPERATOR(pg_catalog.||) '/map'), 0);
    RETURN {s}._shard_of(p_queue);
END $fn$""",
    """-- The shard map's version: bumped in the transaction of every change of where queues are
-- (shard init, each queue moved, shard add), so a client that goes straight to the shards
-- (Client(direct=True)) knows when what it remembers is out of date.
CREATE TABLE {s}.shard_map (
    version bigint NOT NULL,
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row)
)""",
    """-- The shard map for clients that go straight to the shards: its version and each shard's
-- conninfo in shard order (the cluster's partitions: host, port, dbname, no user or password,
-- which only the user mapping holds). SECURITY DEFINER: it reads the foreign server's options.
-- Reads shard_map, pg_foreign_server. Locks: none.
CREATE FUNCTION {s}._shard_map(OUT version bigint, OUT shards text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
SELECT (SELECT m.version FROM {s}.shard_map m),
       (SELECT array_agg(substr(o, strpos(o, '=') + 1) ORDER BY substr(o, 2, strpos(o, '=') - 2)::integer)
          FROM pg_foreign_server f, unnest(f.srvoptions) AS o
         WHERE f.srvname = {cluster} AND o ~ '^p[0-9]+=')
$fn$""",
)

#: Bumps the shard map's version (in the transaction that changes the map).
BUMP_VERSION: LiteralString = "UPDATE {s}.shard_map SET version = version + 1"


def route_statements(schema: str) -> list[sql.Composed]:
    """The statements of :data:`ROUTE_STATEMENTS` for ``schema``, then the partitioned queues'
    (:data:`lonnymq.shard.partitions.ROUTING_STATEMENTS`)."""
    return [
        sql.SQL(stmt).format(
            s=sql.Identifier(schema),
            name=sql.Literal(schema),
            cluster=sql.Literal(cluster_name(schema)),
            **partitions.PLAIN_RETURN,
        )
        for stmt in ROUTE_STATEMENTS
    ] + partitions.routing_statements(schema, cluster_name(schema))


def bump_version(schema: str) -> sql.Composed:
    """The statement of :data:`BUMP_VERSION` for ``schema``."""
    return sql.SQL(BUMP_VERSION).format(s=sql.Identifier(schema))


_INT_SUM: LiteralString = "SELECT coalesce(sum(r), 0)::integer FROM {all} AS r"

#: Routes of the pgmq facade's functions (schema ``pgmq``, docs/pgmq.md) that take no queue
#: name; the others run on the shard of their ``queue_name``, which is the LonnyMQ queue's.
PGMQ_ROUTES: dict[str, Route] = {
    # A partitioned queue (lonnymq.shard.partitions) is on several shards: listed once.
    "list_queues": Route(
        "all", merge="SELECT DISTINCT ON (r.queue_name) * FROM {all} AS r ORDER BY r.queue_name"
    ),
    # A partitioned queue's rows (one per partition) merged into one, as pgmq.metrics merges them.
    "metrics_all": Route("all", merge=pgmq_parts.METRICS_ALL),
    "list_notify_insert_throttles": Route("all", merge="SELECT * FROM {all} ORDER BY 1"),
    "list_topic_bindings": Route("all", merge="SELECT * FROM {all} ORDER BY 1, 2"),
    "test_routing": Route("all", merge="SELECT * FROM {all} ORDER BY 1, 2"),
    "create_fifo_indexes_all": Route("all", merge="SELECT count(*) FROM {all}"),
    # Topic sends: a binding lives on its queue's shard (bind_topic routes by queue_name), so
    # each shard sends to the queues bound there; the counts add up, the rows are concatenated.
    "send_topic": Route("all", merge=_INT_SUM),
    "send_batch_topic": Route("all"),
    "validate_routing_key": Route("one"),
    "validate_topic_pattern": Route("one"),
}

#: The schema of the pgmq facade, proxied on the router when the shards have it.
PGMQ_SCHEMA = "pgmq"


def route(fn: CoreFunction, *, pgmq: bool = False) -> Route:
    """Where a call of ``fn`` runs (raises NoRoute when the generator has no rule for it);
    ``pgmq``: a function of the pgmq facade."""
    if pgmq:
        if "queue_name" in fn.argnames:
            return Route("hash", key="queue_name")
        if fn.name in PGMQ_ROUTES:
            return PGMQ_ROUTES[fn.name]
        raise NoRoute(
            f"pgmq function {fn.name}({fn.identity}) has no queue argument and no routing rule"
            " (lonnymq.shard.catalog.PGMQ_ROUTES)"
        )
    if "p_queue" in fn.argnames:
        return Route("hash", key="p_queue")
    if fn.name.startswith("queue_") and "p_name" in fn.argnames:
        return Route("hash", key="p_name")
    try:
        return NO_QUEUE_ROUTES[fn.name]
    except KeyError:
        raise NoRoute(
            f"core function {fn.name}({fn.identity}) has no queue argument and no routing rule"
            " (lonnymq.shard.catalog.NO_QUEUE_ROUTES)"
        ) from None


#: The public functions of a schema with what the generator needs (one row per function).
CATALOG_QUERY: LiteralString = """
SELECT p.proname,
       pg_get_function_arguments(p.oid),
       pg_get_function_identity_arguments(p.oid),
       pg_get_function_result(p.oid),
       p.proretset,
       p.provolatile::text,
       p.proisstrict,
       coalesce((SELECT array_agg(n ORDER BY i)
                   FROM unnest(p.proargnames, coalesce(p.proargmodes, array_fill('i'::"char",
                               ARRAY[coalesce(cardinality(p.proargnames), 0)])))
                        WITH ORDINALITY AS a(n, m, i)
                  WHERE a.m IN ('i', 'b', 'v')), '{}'),
       coalesce((SELECT array_agg(DISTINCT r.rolname ORDER BY r.rolname)
                   FROM aclexplode(p.proacl) AS x JOIN pg_roles r ON r.oid = x.grantee
                  WHERE x.privilege_type = 'EXECUTE' AND x.grantee <> p.proowner), '{}')
  FROM pg_proc p
 WHERE p.pronamespace = %s::regnamespace AND p.prokind = 'f' AND NOT starts_with(p.proname, '_')
   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
 ORDER BY p.proname, p.oid
"""

#: The composite types of a schema (the ``delivery`` row of take and peek): name, then
#: (column, type) pairs in order.
TYPES_QUERY: LiteralString = """
SELECT t.typname,
       array_agg(a.attname::text ORDER BY a.attnum),
       array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
  FROM pg_type t
  JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE t.typnamespace = %s::regnamespace
 GROUP BY t.typname
 ORDER BY t.typname
"""


def functions(rows: Sequence[Sequence[Any]]) -> list[CoreFunction]:
    """CoreFunctions from the rows of :data:`CATALOG_QUERY`."""
    return [
        CoreFunction(
            name=r[0],
            arguments=r[1],
            identity=r[2],
            result=r[3],
            retset=bool(r[4]),
            volatility=r[5],
            strict=bool(r[6]),
            argnames=tuple(r[7]),
            grantees=tuple(r[8]),
        )
        for r in rows
    ]


def cluster_name(schema: str) -> str:
    """The PL/Proxy cluster (the SQL/MED server) of the router of ``schema``."""
    return f"lonnymq_{schema}"


def proxy_statements(
    schema: str, fns: Sequence[CoreFunction], *, core: str | None = None
) -> list[sql.Composed]:
    """CREATE FUNCTION statements of the router: one proxy per core function (plus, for calls
    merged over all shards, an internal ``_all_<name>`` that returns every shard's rows).
    ``core``: ``fns`` are the pgmq facade's (in ``schema``), over the LonnyMQ schema ``core``
    (its cluster and queue routes)."""
    s = sql.Identifier(schema)
    home = schema if core is None else core  # the LonnyMQ schema: cluster, _shard_of
    cluster = sql.Literal(cluster_name(home))
    out: list[sql.Composed] = []
    if core is not None and fns:  # the facade's partitioned queues: lonnymq.shard.pgmq_parts
        if not (_PLAIN.match(schema) and _PLAIN.match(home)):
            raise NoRoute(f"cannot name {schema} and {home} in PL/Proxy")
        out.extend(pgmq_parts.routing_statements(schema, home))
    for fn in fns:
        r = route(fn, pgmq=core is not None)
        if core is not None and pgmq_parts.dispatched(fn) is not None:
            if not (_PLAIN.match(fn.name) and all(map(_PLAIN.match, fn.argnames))):
                raise NoRoute(f"cannot name {schema}.{fn.name} and its arguments in PL/Proxy")
            out.extend(pgmq_parts.dispatcher_statements(fn, schema, home, cluster))
            continue
        # The signature text comes from pg_get_function_* of the core (names, types and defaults
        # exactly as installed): catalog output, not user input.
        args = sql.SQL(fn.arguments)
        result = sql.SQL(fn.result)
        # A call that visits every partition of a partitioned queue: the proxy is the plain
        # queue's path of a dispatcher (lonnymq.shard.partitions) that takes the public name.
        dispatched = core is None and fn.name in partitions.DISPATCHED
        name = sql.Identifier(f"_hash_{fn.name}" if dispatched else fn.name)
        if core is None and fn.name in partitions.ON_SHARD:
            if not (_PLAIN.match(schema) and _PLAIN.match(fn.name) and all(map(_PLAIN.match, fn.argnames))):
                raise NoRoute(f"cannot name {schema}.{fn.name} and its arguments in PL/Proxy")
            out.append(partitions.on_shard_statement(schema, cluster_name(schema), fn))
            if dispatched:
                out.extend(partitions.dispatcher_statements(schema, fn))
            if fn.name == "queue_create":
                out.append(partitions.create_statement(schema, cluster_name(schema), fn))
        # PL/Proxy functions must be VOLATILE (so is a merge over them): a proxy's result comes
        # from another server, never from this one's snapshot.
        attrs = sql.SQL("VOLATILE" + (" STRICT" if fn.strict else ""))
        if r.run == "hash":
            assert r.key is not None
            if not _PLAIN.match(r.key):  # PL/Proxy knows arguments by their bare names only
                raise NoRoute(f"cannot name argument {r.key!r} of {fn.name} in PL/Proxy")
            if r.key in QUEUE_KEYS or core is not None:
                # The queue's shard: its override (a moved queue) or its hash, behind the fence
                # that a move holds (see ROUTE_STATEMENTS).
                if not _PLAIN.match(home):
                    raise NoRoute(f"cannot name {schema}.{SHARD_OF} in PL/Proxy")
                of = SHARD_OF_NEW if fn.name == "queue_create" else SHARD_OF
                keys = [r.key]
                if core is None and fn.name in partitions.ROUTED:
                    # One message or one key of a queue that may be partitioned: its routing
                    # function picks the partition from the arguments (a plain queue: _shard_of).
                    of, wanted = partitions.ROUTED[fn.name]
                    keys = [k for k in wanted if k in fn.argnames]
                    if keys != list(wanted) or not all(map(_PLAIN.match, keys)):
                        raise NoRoute(f"{fn.name} lacks the arguments {wanted} its partition route needs")
                body = sql.SQL("CLUSTER {c}; RUN ON {f}({k});").format(
                    c=cluster, f=sql.SQL(f"{home}.{of}"), k=sql.SQL(", ".join(keys))
                )
                if core is not None:  # the facade: sends spread, calls on ids by their shard
                    body = pgmq_parts.proxy_body(fn, schema, cluster) or body
            else:
                body = sql.SQL("CLUSTER {c}; RUN ON hashtext({k});").format(c=cluster, k=sql.SQL(r.key))
        elif r.run == "one":
            body = sql.SQL("CLUSTER {c}; RUN ON 0;").format(c=cluster)
        elif r.merge is None:
            body = sql.SQL("CLUSTER {c}; RUN ON ALL;").format(c=cluster)
        else:
            all_name = sql.Identifier(f"_all_{fn.name}")
            all_result = result if fn.retset else sql.SQL("SETOF ") + result
            # TARGET takes a bare name (PL/Proxy's parser rejects quoted identifiers): both are
            # plain lower-case identifiers (check_schema; the core's names), checked here anyway.
            if not (_PLAIN.match(schema) and _PLAIN.match(fn.name)):
                raise NoRoute(f"cannot name {schema}.{fn.name} in a PL/Proxy TARGET")
            target = sql.SQL(f"{schema}.{fn.name}")
            out.append(
                sql.SQL(
                    "CREATE FUNCTION {s}.{n}({a}) RETURNS {r} LANGUAGE plproxy {attrs} AS $proxy$\n"
                    "CLUSTER {c}; RUN ON ALL; TARGET {t};\n$proxy$"
                ).format(
                    s=s,
                    n=all_name,
                    a=sql.SQL(fn.identity),
                    r=all_result,
                    attrs=attrs,
                    c=cluster,
                    t=target,
                )
            )
            call = sql.SQL("{}.{}({})").format(
                s, all_name, sql.SQL(", ").join(sql.Identifier(a) for a in fn.argnames)
            )
            merge = sql.SQL(r.merge).format(all=call)
            out.append(
                sql.SQL(
                    "CREATE FUNCTION {s}.{n}({a}) RETURNS {r} LANGUAGE sql {attrs} AS $merge$\n{m}\n$merge$"
                ).format(s=s, n=name, a=args, r=result, attrs=attrs, m=merge)
            )
            continue
        if dispatched:  # _hash_<name> calls <name> on the shard
            body = body + sql.SQL(" TARGET {};").format(sql.SQL(f"{schema}.{fn.name}"))
        out.append(
            sql.SQL(
                "CREATE FUNCTION {s}.{n}({a}) RETURNS {r} LANGUAGE plproxy {attrs} AS $proxy$\n{b}\n$proxy$"
            ).format(s=s, n=name, a=args, r=result, attrs=attrs, b=body)
        )
    return out


def type_statements(schema: str, rows: Sequence[Sequence[Any]]) -> list[sql.Composed]:
    """CREATE TYPE of the core's composite types (rows of :data:`TYPES_QUERY`)."""
    out: list[sql.Composed] = []
    for name, columns, types in rows:
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
            for c, t in zip(columns, types, strict=True)
        )
        out.append(
            sql.SQL("CREATE TYPE {}.{} AS ({})").format(sql.Identifier(schema), sql.Identifier(name), cols)
        )
    return out
