"""The pgmq facade's calls of a partitioned queue through the router (I/O-free).

The router's ``pgmq`` schema (``shard init --pgmq``) proxies each facade function of one queue
to the queue's shard (``_shard_of(queue_name)``), which refuses a partitioned queue
(:mod:`lonnymq.shard.partitions`). These calls route by more than the name, as the native ones
do:

* ``send``, ``send_batch`` (every overload): a partitioned queue's next partition in turn
  (pgmq has no key; the router-wide counter of unkeyed sends, ``_turn``): ``pgmq._send_shard``;
  but a message of a FIFO group (pgmq's header ``x-pgmq-group``, :data:`GROUP`) to its group's
  partition, the one a native send with the group as its key goes to (KEY_PARTITION of the
  group's name), so a group's messages are all on one partition, in order: ``send`` with
  headers by ``pgmq._send_shard(queue_name, headers)``, ``send_batch`` with headers by a
  plpgsql dispatcher (``split``) that calls each partition's shard with its messages (one
  transaction per shard; those without a group go with the batch's first grouped message, a
  batch without groups to the next partition in turn: one call) and returns the ids in the
  order of the messages; messages without the header (pgmq's one default group) keep
  spreading in turn, so that group's order holds per partition only;
* ``delete``, ``archive``, ``set_vt`` (every overload): the shard holding the id (the shard
  that made it, ``id % STRIDE``, or where its partition moved: ``_id_at``), ``pgmq._id_shard``;
  the array overloads are plpgsql dispatchers (``by_ids``) that call each partition's shard
  with its share of the ids (one transaction per shard; a plain queue's: one call), the rows
  coming back together (PL/Proxy's ``SPLIT`` would call the routing function once per id: a
  plain queue's delete of 10 ids cost the router 5.9 times as much, docs/sharding.md); an id
  of no partition goes to the first partition (where it is not found: false / no row, as pgmq
  answers for an unknown id);
* ``read``, ``pop``: the partitions one after another from the next in turn, until one hands
  out messages (``_turn``, as the native take): a read returns messages whenever a partition
  has ready ones, each read's from one partition; a partition whose shard cannot be reached is
  skipped (and left alone for a while by that router session), as the take's is;
* ``read_grouped``, ``read_grouped_rr``, ``read_grouped_head`` (pgmq's FIFO groups): as
  ``read``, each partition's grouped read (each group lives on one partition, so every group a
  read returns is in its order, and a group in flight is not read again);
* ``read_with_poll`` and the grouped reads' ``*_with_poll``: as ``read`` (pgmq's ``read``, or
  the grouped read, on each partition), again every poll_interval_ms until a read returns rows
  or max_poll_seconds pass (polling: no wake-up by sends, unlike a plain queue's, which waits on
  its shard);
* ``create_fifo_index`` (a no-op of the facade that checks the queue exists): the first
  partition;
* ``metrics``: every partition, merged (lengths and totals summed, the oldest age the oldest,
  the newest the newest); ``metrics_all`` merges a partitioned queue's rows into one
  (:data:`METRICS_ALL`).

* ``purge_queue``: every partition, the counts summed; ``drop_queue`` (both overloads): the
  router's ``queue_drop`` (every partition dropped, the router's record of them gone).

Every other facade call of one queue (``create``, ``create_non_partitioned``,
``create_partitioned``, ``create_unlogged``, notifications, topic bindings) stays refused for a
partitioned queue by ``_shard_of``. A plain queue's calls go where they went: the routing
functions and the dispatchers start with :data:`lonnymq.shard.partitions.PLAIN_ROUTE` (the
routing functions in the caller's role, no SET clause; the dispatchers are SECURITY DEFINER
with a pinned search_path, as the core's).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, LiteralString

from psycopg import sql

from .partitions import (
    _ALL_DOWN,
    _SKIP_INIT,
    KEY_PARTITION,
    PLAIN_RETURN,
    PLAIN_ROUTE,
    _skipping,
    dispatch_route,
)

if TYPE_CHECKING:
    from .catalog import CoreFunction

__all__ = [
    "DISPATCHED",
    "ROUTING_FUNCTIONS",
    "dispatched",
    "dispatcher_statements",
    "proxy_body",
    "routing_statements",
]

#: Facade calls sent to a partitioned queue's next partition in turn, or (with headers) to the
#: partition of their FIFO group (:data:`GROUP`).
SPREAD = ("send", "send_batch")
#: pgmq's FIFO group of a message: this header's value (pgmq and the facade read a message
#: without it as one default group). On a partitioned queue a group's messages all go to one
#: partition, the one a native send with the group as its key goes to (KEY_PARTITION), so the
#: grouped reads, each from one partition, keep each group's order.
GROUP = "x-pgmq-group"
#: Facade calls on message ids: to the shard holding them (array overloads split by shard).
BY_ID = ("delete", "archive", "set_vt")
#: Facade calls of one queue that a partitioned queue answers on its first partition:
#: ``create_fifo_index`` (a no-op of the facade that checks the queue exists, which every
#: partition does).
FIRST_PARTITION = ("create_fifo_index",)
#: The arguments of a ``*_with_poll`` call that are the poll's, not its read's.
POLL_ARGS = ("max_poll_seconds", "poll_interval_ms")
#: Facade calls that visit the partitions (plpgsql dispatchers): ``first`` (the partitions in
#: turn until one returns rows) or ``metrics`` (one merged row).
#: ``poll`` (``<read>_with_poll``: ``first`` over the partitions with pgmq's ``<read>``, again
#: every poll_interval_ms until a read returns rows or max_poll_seconds pass).
#: ``sum`` (purge_queue: every partition, the counts summed), ``drop`` (drop_queue, either
#: overload: the router's queue_drop, which drops every partition and forgets the queue).
#: (``send_batch`` with headers is ``split``, :func:`dispatched`: each message to its group's
#: partition.)
DISPATCHED: dict[str, str] = {
    "read": "first",
    "pop": "first",
    "read_with_poll": "poll",
    # pgmq's FIFO groups: each group lives on one partition (GROUP), so one partition's grouped
    # read keeps every group it returns in order.
    "read_grouped": "first",
    "read_grouped_rr": "first",
    "read_grouped_head": "first",
    "read_grouped_with_poll": "poll",
    "read_grouped_rr_with_poll": "poll",
    "read_grouped_head_with_poll": "poll",
    "metrics": "metrics",
    "purge_queue": "sum",
    "drop_queue": "drop",
}

#: The routing functions of the ``pgmq`` schema that PL/Proxy calls in the caller's role, and
#: the SECURITY DEFINER ones they call for a partitioned queue (EXECUTE granted to the roles of
#: the facade's functions).
ROUTING_FUNCTIONS = ("_send_shard", "_id_shard", "_parted_id_shard")

#: metrics_all over every shard: a partitioned queue's rows (one per partition) merged as
#: ``metrics`` merges them.
#: pgmq's metrics columns after queue_name, of rows ``r`` of one queue's partitions merged into
#: one (lengths and totals summed, the oldest age the oldest, the newest the newest).
METRICS_MERGE: LiteralString = (
    "sum(r.queue_length)::bigint, min(r.newest_msg_age_sec), max(r.oldest_msg_age_sec),"
    " sum(r.total_messages)::bigint, max(r.scrape_time), sum(r.queue_visible_length)::bigint,"
    " max(r.default_partition_length)"
)
METRICS_ALL: LiteralString = (
    "SELECT r.queue_name, " + METRICS_MERGE + " FROM {all} AS r GROUP BY r.queue_name ORDER BY r.queue_name"
)

#: The routing functions; ``{p}`` the pgmq schema, ``{s}`` LonnyMQ's (both identifiers),
#: ``{plain}`` a plain queue's route (PLAIN_ROUTE).
_ROUTING: tuple[LiteralString, ...] = (
    """-- The shard of a pgmq send (send, send_batch without headers): a plain queue's
-- (PLAIN_ROUTE, in the caller's role), else a partitioned queue's partition of the FIFO group
-- in headers (its x-pgmq-group: the native send's route of a message with that key), else its
-- next partition in turn: the native send's route of a message without a key or an
-- idempotency key (pgmq sends have neither).
CREATE FUNCTION {p}._send_shard(queue_name text, headers jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
{plain}    RETURN {s}._parted_send_shard(queue_name, headers OPERATOR(pg_catalog.->>) {group}::pg_catalog.text, NULL);
END $fn$""",
    """-- The shard holding message msg_id of partitioned queue queue_name (_id_at: the shard that
-- made it, or where its partition moved), the first partition's for an id of none (pgmq: not
-- found there); any other queue's: _shard_of. Locks: _partitions' fence.
CREATE FUNCTION {p}._parted_id_shard(queue_name text, msg_id bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(queue_name);
    v_at    integer;
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(queue_name);
    END IF;
    v_at := {s}._id_at(v_parts, {s}._moved_ids(queue_name), msg_id);
    RETURN CASE WHEN v_at = ANY (v_parts) THEN v_at ELSE v_parts[1] END;
END $fn$""",
    """-- The shard of a pgmq call on one id (delete, archive, set_vt): a plain queue's
-- (PLAIN_ROUTE), else _parted_id_shard.
CREATE FUNCTION {p}._id_shard(queue_name text, msg_id bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
{plain}    RETURN {p}._parted_id_shard(queue_name, msg_id);
END $fn$""",
)


def routing_statements(pgmq: str, core: str) -> list[sql.Composed]:
    """The routing functions of :data:`ROUTING_FUNCTIONS` in schema ``pgmq`` over LonnyMQ's
    router schema ``core``."""
    s = sql.Identifier(core)
    plain = sql.SQL(PLAIN_ROUTE).format(
        s=s, name=sql.Literal(core), **{**PLAIN_RETURN, "q": sql.SQL("queue_name")}
    )
    return [
        sql.SQL(stmt).format(p=sql.Identifier(pgmq), s=s, plain=plain, group=sql.Literal(GROUP))
        for stmt in _ROUTING
    ]


def proxy_body(fn: CoreFunction, pgmq: str, cluster: sql.Composable) -> sql.Composed | None:
    """The PL/Proxy body of facade function ``fn`` when it routes by more than the queue
    (:data:`SPREAD`, :data:`BY_ID`, :data:`FIRST_PARTITION`), else None (the queue's shard)."""
    if fn.name in SPREAD:  # a send with headers: its group's partition
        by = "queue_name, headers" if "headers" in fn.argnames else "queue_name"
        return sql.SQL("CLUSTER {c}; RUN ON {p}._send_shard({by});").format(
            c=cluster, p=sql.SQL(pgmq), by=sql.SQL(by)
        )
    if (fn.name in BY_ID and "msg_id" in fn.argnames) or fn.name in FIRST_PARTITION:
        # An id of no partition (NULL: create_fifo_index) goes to the first partition.
        by = "msg_id" if "msg_id" in fn.argnames else "NULL"
        return sql.SQL("CLUSTER {c}; RUN ON {p}._id_shard(queue_name, {by});").format(
            c=cluster, p=sql.SQL(pgmq), by=sql.SQL(by)
        )
    return None


def dispatched(fn: CoreFunction) -> str | None:
    """How the router's ``fn`` of the facade visits a partitioned queue's partitions when it is
    a plpgsql dispatcher (:data:`DISPATCHED`, ``by_ids`` for the array overloads of
    :data:`BY_ID`, ``split`` for the overloads of ``send_batch`` with headers), else None (a
    PL/Proxy function, :func:`proxy_body`)."""
    if fn.name in BY_ID and "msg_ids" in fn.argnames:
        return "by_ids"
    if fn.name == "send_batch" and "headers" in fn.argnames:  # each message to its group's partition
        return "split"
    return DISPATCHED.get(fn.name)


#: The start of a dispatcher's body: ``{route}`` a plain queue's call on its shard
#: (:func:`lonnymq.shard.partitions.dispatch_route`), then the partitions of a partitioned queue in ``v_parts``; ``{ret}`` the
#: call's return when it is no longer partitioned (dropped meanwhile).
_HEAD: LiteralString = """{route}    v_parts := {s}._partitions(queue_name);
    IF v_parts IS NULL THEN  -- no longer partitioned (dropped meanwhile)
        p_shard := {s}._shard_of(queue_name);
        {ret}
    END IF;
"""


def _digest(text: str) -> str:
    """A short stable name part for ``text`` (an overload's identity arguments)."""
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _args(fn: CoreFunction, shard: str | None = None, renames: dict[str, str] | None = None) -> sql.Composed:
    """``fn``'s arguments by name (``renames``: a variable in place of an argument), after
    ``shard``."""
    names = [(renames or {}).get(a, a) for a in fn.argnames]
    return sql.SQL(", ").join([*([sql.SQL(shard)] if shard else []), *map(sql.Identifier, names)])


def dispatcher_statements(
    fn: CoreFunction, pgmq: str, core: str, cluster: sql.Composable
) -> list[sql.Composed]:
    """For a call of :data:`DISPATCHED`: ``_on_<name>(p_shard, ...)`` (the call on one shard)
    and the public function, a plpgsql dispatcher: a plain queue's call on ``_shard_of``'s
    shard, a partitioned queue's on its partitions."""
    p, s = sql.Identifier(pgmq), sql.Identifier(core)
    how = dispatched(fn)
    # The overloads of a name (delete, archive, set_vt) each get their own _on_ function.
    overloaded = how in ("by_ids", "drop", "split")
    on_name = f"_on_{fn.name}_{_digest(fn.identity)}" if overloaded else f"_on_{fn.name}"
    on = sql.Identifier(on_name)
    # PL/Proxy's SELECT names the arguments bare (the facade's names: queue_name, vt, qty...).
    target = sql.SQL("{}.{}({})").format(
        sql.SQL(pgmq), sql.SQL(fn.name), sql.SQL(", ").join(sql.SQL(a) for a in fn.argnames)
    )
    proxy = sql.SQL(
        "CREATE FUNCTION {p}.{on}(p_shard integer, {a}) RETURNS {r} LANGUAGE plproxy VOLATILE AS $proxy$\n"
        "CLUSTER {c}; RUN ON p_shard; SELECT * FROM {t};\n$proxy$"
    ).format(p=p, on=on, a=sql.SQL(fn.identity), r=sql.SQL(fn.result), c=cluster, t=target)
    call = sql.SQL("{}.{}({})").format(p, on, _args(fn, "p_shard"))
    # A plain queue's call on its shard (PLAIN_ROUTE; _shard_of if the queue stopped being
    # partitioned meanwhile); then the partitioned queue's part of the body.
    ret = sql.SQL(
        "RETURN {};"
        if how in ("metrics", "sum", "drop")
        else "RETURN QUERY SELECT * FROM {};\n        RETURN;"
    ).format(call)
    head = sql.SQL(_HEAD).format(route=dispatch_route(core, sql.SQL("queue_name"), ret), s=s, ret=ret)
    if how == "by_ids":  # each partition's shard with the ids it holds (one call for a plain queue)
        ids = sql.SQL("{}.{}({})").format(p, on, _args(fn, "p_shard", {"msg_ids": "v_ids"}))
        body = sql.SQL(
            """DECLARE
    v_parts integer[];
    v_moved jsonb;
    v_ids   bigint[];
    p_shard integer;
BEGIN
{head}    v_moved := {s}._moved_ids(queue_name);
    -- The shard holding each id (_id_at), the first partition's for an id of none (not found).
    FOR p_shard, v_ids IN
        SELECT CASE WHEN a.at = ANY (v_parts) THEN a.at ELSE v_parts[1] END, array_agg(a.i ORDER BY a.n)
          FROM (SELECT t.i, t.n, {s}._id_at(v_parts, v_moved, t.i) AS at
                  FROM unnest(msg_ids) WITH ORDINALITY AS t(i, n)) a
         GROUP BY 1 ORDER BY 1
    LOOP
        RETURN QUERY SELECT * FROM {ids};
    END LOOP;
END"""
        ).format(s=s, ids=ids, head=head)
    elif how == "split":
        # send_batch with headers: each message to its group's partition (as send with headers,
        # _send_shard), the messages without a group with the batch's first grouped message
        # (so a batch of one partition's groups is one call: one transaction), or, in a batch
        # without groups, to the next partition in turn (as send_batch without headers). One
        # call per partition's shard with its messages in order, one transaction each; the ids
        # returned in the order of msgs, as pgmq returns them. A batch the send refuses for its
        # arrays (headers not one per message or not a JSON object, a NULL message) is not
        # split: it goes whole to one partition, whose send refuses it as a plain queue's does
        # (nothing sent anywhere).
        rows = sql.SQL("{}.{}({})").format(
            p, on, _args(fn, "p_shard", {"msgs": "v_msgs", "headers": "v_hdrs"})
        )
        # KEY_PARTITION of the batch's one group v_key, or of each of its groups d.g (SHA-256,
        # the costly part: once a group, not once a message).
        one, each = (
            sql.SQL(KEY_PARTITION).format(key=sql.SQL(k), n=sql.SQL("cardinality(v_parts)"))
            for k in ("v_key", "d.g")
        )
        body = sql.SQL(
            """DECLARE
    v_parts integer[];
    p_shard integer;
    v_key   text;
    v_last  text;
    v_first text;
    v_bad   boolean;
    v_names text[];
    v_pos   integer[];
    v_rest  integer;
    v_msgs  jsonb[];
    v_hdrs  jsonb[];
    v_at    bigint[];
    v_ord   bigint[] := '{{}}';
    v_ids   bigint[] := '{{}}';
BEGIN
{head}    -- The batch's groups: the least and the greatest, the first message's that has one
    -- (headers in the order of msgs, as unnest returns them), and whether the send refuses one.
    SELECT min(t.g), max(t.g), (array_agg(t.g) FILTER (WHERE t.g IS NOT NULL))[1],
           coalesce(bool_or(jsonb_typeof(t.h) <> 'object'), false)
      INTO v_key, v_last, v_first, v_bad
      FROM (SELECT h, h ->> {name} AS g FROM unnest(headers) AS h) AS t;
    IF v_bad OR msgs IS NULL OR cardinality(headers) IS DISTINCT FROM cardinality(msgs)
       OR array_position(msgs, NULL) IS NOT NULL OR v_key IS NOT DISTINCT FROM v_last THEN
        -- One call: refused whole (as a plain queue's batch), or of one group, or of none.
        p_shard := v_parts[1 + CASE WHEN v_key IS NULL OR v_bad THEN {s}._turn(cardinality(v_parts))
                                    ELSE {one} END];
        RETURN QUERY SELECT * FROM {whole};
        RETURN;
    END IF;
    -- Several groups: each message to its group's partition (v_pos of its name in v_names),
    -- those without a group with the first message that has one.
    SELECT array_agg(d.g), array_agg({each}) INTO v_names, v_pos
      FROM (SELECT DISTINCT h ->> {name} AS g FROM unnest(headers) AS h) AS d WHERE d.g IS NOT NULL;
    v_rest := v_pos[array_position(v_names, v_first)];
    FOR p_shard, v_msgs, v_hdrs, v_at IN
        SELECT v_parts[1 + coalesce(v_pos[array_position(v_names, t.h ->> {name})], v_rest)],
               array_agg(t.m ORDER BY t.n),
               array_agg(t.h ORDER BY t.n), array_agg(t.n ORDER BY t.n)
          FROM unnest(msgs, headers) WITH ORDINALITY AS t(m, h, n)
         GROUP BY 1 ORDER BY 1
    LOOP
        v_ord := v_ord || v_at;
        v_ids := v_ids || ARRAY(SELECT * FROM {rows});
    END LOOP;
    RETURN QUERY SELECT x.id FROM unnest(v_ord, v_ids) AS x(n, id) ORDER BY x.n;
END"""
        ).format(s=s, head=head, one=one, each=each, name=sql.Literal(GROUP), whole=call, rows=rows)
    elif how in ("first", "poll"):
        # The partitions in turn until one hands out messages; read_with_poll: again every
        # poll_interval_ms (pgmq.read on each partition) until max_poll_seconds pass. Its wait
        # holds the router's transaction, and so the queue's fence, as a plain queue's does.
        turn: LiteralString = """v_start := {s}._turn(cardinality(v_parts), true);
    v_got := 0;
    v_down := 0;
    {skip_init}
    FOR v_i IN 0 .. cardinality(v_parts) - 1 LOOP
        p_shard := v_parts[1 + (v_start + v_i) % cardinality(v_parts)];
        {attempt}
        EXIT WHEN v_got > 0;
    END LOOP;
    {all_down}"""
        if how == "poll":
            turn = (
                """v_until := clock_timestamp() + make_interval(secs => greatest(coalesce(max_poll_seconds, 0), 0));
    LOOP
    """
                + turn
                + """
    EXIT WHEN v_got > 0 OR clock_timestamp() >= v_until;
    PERFORM pg_sleep(least(greatest(coalesce(poll_interval_ms, 100), 1) / 1000.0,
                           greatest(extract(epoch FROM v_until - clock_timestamp()), 0)));
    END LOOP;"""
            )
            # Each partition read by <read> (read_with_poll: read; read_grouped_with_poll:
            # read_grouped...) with the call's arguments but the poll's.
            read = fn.name.removesuffix("_with_poll")
            call = sql.SQL("{}.{}({})").format(
                p,
                sql.Identifier(f"_on_{read}"),
                sql.SQL(", ").join(
                    [sql.SQL("p_shard"), *(sql.Identifier(a) for a in fn.argnames if a not in POLL_ARGS)]
                ),
            )
        body = sql.SQL(
            """DECLARE
    v_parts integer[];
    v_start integer;
    v_got   bigint;
    p_shard integer;
    v_skip  boolean;
    v_down  integer := 0;
    v_state text;
    v_msg   text;"""
            + ("\n    v_until timestamptz;" if how == "poll" else "")
            + """
BEGIN
{head}    """
            + turn
            + """
END"""
        ).format(
            s=s,
            head=head,
            # A partition whose shard cannot be reached is skipped, as the native take skips it.
            skip_init=sql.SQL(_SKIP_INIT).format(s=s),
            attempt=_skipping(
                s, sql.SQL("RETURN QUERY SELECT * FROM {};\n GET DIAGNOSTICS v_got = ROW_COUNT;").format(call)
            ),
            all_down=sql.SQL(_ALL_DOWN),
        )
    elif how in ("sum", "drop"):
        # purge_queue: each partition purged, the counts summed; drop_queue: the router's
        # queue_drop (every partition, then the router's record of them; pgmq's own state on
        # each shard follows its queue, as a plain queue's drop).
        part = (
            "RETURN (SELECT coalesce(sum(r.n), 0)::bigint FROM unnest(v_parts) AS x(shard),"
            " LATERAL {p}.{on}(x.shard, queue_name) AS r(n));"
            if how == "sum"
            else "RETURN {s}.queue_drop(queue_name, true);"
        )
        body = sql.SQL(
            "DECLARE\n    v_parts integer[];\n    p_shard integer;\nBEGIN\n{head}    " + part + "\nEND"
        ).format(s=s, p=p, on=on, head=head)
    else:  # metrics: one row, each partition's merged
        body = sql.SQL(
            """DECLARE
    v_parts integer[];
    v_q     text := queue_name;
    p_shard integer;
    v_out   {r};
BEGIN
{head}    SELECT v_q, {merge}
      INTO v_out
      FROM unnest(v_parts) AS x(shard), LATERAL {p}.{on}(x.shard, v_q) AS r;
    RETURN v_out;
END"""
        ).format(p=p, on=on, r=sql.SQL(fn.result), head=head, merge=sql.SQL(METRICS_MERGE))
    public = sql.SQL(
        "-- pgmq.{name} on the router: a plain queue's call on its shard, a partitioned queue's on its\n"
        "-- partitions (lonnymq.shard.pgmq_parts.dispatched: {how}). SECURITY DEFINER: it calls {on},\n"
        "-- granted to none, and the router's _partitions.\n"
        "CREATE FUNCTION {p}.{n}({a}) RETURNS {r} LANGUAGE plpgsql VOLATILE{strict} SECURITY DEFINER"
        " SET search_path = pg_catalog, pg_temp AS $fn$\n{b}\n$fn$"
    ).format(
        name=sql.SQL(fn.name),
        how=sql.SQL(how or ""),
        on=sql.SQL(on_name),
        p=p,
        n=sql.Identifier(fn.name),
        a=sql.SQL(fn.arguments),
        r=sql.SQL(fn.result),
        strict=sql.SQL(" STRICT" if fn.strict else ""),
        b=body,
    )
    return [proxy, public]
