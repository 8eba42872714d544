"""One hot queue over several shards: the router's side of partitioned queues (I/O-free).

A queue created with ``partitions=N`` (``queue_create_partitioned`` on the router,
``Client.create_queue(..., partitions=N)``) is N queues of the same name, one on each of N
distinct shards (its *partitions*): partition k on shard ``(home + k) mod shards``, ``home`` the
shard its name hashes to. The router records them in ``shard_partition`` (and marks the queue
in ``shard_route``, :data:`PARTITIONED_MARK`, which a plain queue's route reads) and routes each
call:

* a send with a channel to the partition of the channel's name, computed as a key's (so a
  channel's FIFO, limits and round robin are one shard's, and channel_set/channel_reset go
  there too; a message with both a channel and a key is refused: get and cancel by key look in
  the key's partition); a send with a key to the partition of the key (:data:`KEY_PARTITION`:
  the first 4 bytes of the SHA-256 of the key's UTF-8 bytes, big-endian, modulo N; the same in
  Python, :func:`key_partition`), so de-duplication and keyed updates act on one server; a send
  without either to the partition of its idempotency key (a repeat of the call lands where the
  first did), else to the next partition in turn (a router-wide counter);
* a settle (ack, nack, extend, give_up), ``get`` by id and ``cancel`` by ids to the shard that made the
  id: each shard's message ids are ``shard index (mod STRIDE)`` (``shard init`` sets the
  increment of each shard's id sequence to :data:`STRIDE`), so the id says where the message is
  without a look-up; a stale token is refused there as on one server;
* take: the partitions one after another from the next in turn, until one hands out messages
  (so a take never returns empty while a partition has ready messages, and takes visit every
  partition in turn); each take's deliveries come from one partition, so they settle in one call;
  a partition whose shard cannot be reached is skipped (and then left alone for
  :data:`DOWN_SKIP` seconds by that router session), the take fails only when every partition's
  shard is unreachable; ``next_ready_in`` the same (:data:`SKIPS_DOWN`);
* metrics, peek, next_ready_in, drop, purge, pause, resume, wait_begin/end, the dead
  letters (dead_list, dead_requeue, dead_purge), the archive (archive_list), the live messages'
  listing (message_list, merged by id as the archive's) and the channels
  (channel_list, merged by name; channel_recount): every partition, merged (:data:`DISPATCHED`);
  a partitioned queue's dead-letter queue is partitioned over (at least) the same shards, and
  each partition dead-letters into the dead-letter queue's partition on its own shard;
* a schedule (cron_upsert) to partition 0's shard: one row on one shard, so each tick is sent
  once (cron_fire's compare-and-set there), to partition 0;
* every other call of one queue is refused for a partitioned queue (its route ``_shard_of``
  raises InvalidArgument): it would see one partition only.

A partition moves with ``shard move QUEUE SHARD --partition K`` (:func:`lonnymq.shard.move.move`,
``partition=K``): its messages keep their ids, so ``shard_partition.moved_ids`` records which
partition now holds the ids each former shard made (:data:`ROUTING_STATEMENTS`: ``_id_at``), and
every partitioned call holds the queue's fence (``_partitions``), as a plain queue's
``_shard_of`` does. ``shard add`` moves the partitions whose place under the new shard count
(partition k on ``(hash + k) mod shards``) is a new shard (:mod:`lonnymq.shard.add`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, LiteralString

from psycopg import sql

from ..client.direct import DOWN_SKIP, STRIDE, key_partition
from ..client.ops import _PLPROXY_LOST as PLPROXY_LOST

if TYPE_CHECKING:
    from .catalog import CoreFunction

__all__ = [
    "DISPATCHED",
    "ROUTING_FUNCTIONS",
    "ON_SHARD",
    "ROUTED",
    "ROUTER_ONLY",
    "STRIDE",
    "key_partition",
    "routing_statements",
]

#: The partition of a key among p_n, in SQL (first 4 bytes of SHA-256, big-endian, mod p_n).
KEY_PARTITION: LiteralString = (
    "((('x' || encode(substr(sha256(convert_to({key}, 'UTF8')), 1, 4), 'hex'))::bit(32)::bigint"
    " % {n})::integer)"
)


#: Calls of one message or one key: the router sends them to one shard, chosen by the routing
#: function named here from the arguments given (plain queues: the queue's shard).
ROUTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "send": ("_send_shard", ("p_queue", "p_key", "p_send_key", "p_channel")),
    # A plain send (no key, channel or send key): a partitioned queue's next partition in turn.
    "send_plain": ("_plain_shard", ("p_queue",)),
    # A plain send with a send key: a partitioned queue's partition of the key (as send's).
    "send_plain_once": ("_once_shard", ("p_queue", "p_send_key")),
    "send_batch": ("_batch_shard", ("p_queue", "p_keys", "p_send_key", "p_channels")),
    "ack": ("_id_shard", ("p_queue", "p_ids")),
    "nack": ("_id_shard", ("p_queue", "p_ids")),
    "extend": ("_id_shard", ("p_queue", "p_ids")),
    "give_up": ("_id_shard", ("p_queue", "p_ids")),
    "message_get": ("_msg_shard", ("p_queue", "p_id", "p_key")),
    "message_cancel": ("_cancel_shard", ("p_queue", "p_ids", "p_keys")),
    # A channel's policy: on the channel's partition, the one shard that enforces it.
    "channel_set": ("_channel_shard", ("p_queue", "p_channel")),
    "channel_reset": ("_channel_shard", ("p_queue", "p_channel")),
    # A schedule (cron) of a partitioned queue: stored on its partition 0's shard, where that
    # shard's cron_fire sends each tick once, to partition 0 (cron_fire runs on every shard and
    # only the schedule's finds it: catalog.NO_QUEUE_ROUTES).
    "cron_upsert": ("_cron_shard", ("p_queue",)),
}

#: Calls that visit every partition of a partitioned queue: the router's function is a plpgsql
#: dispatcher (plain queues: the PL/Proxy call ``_hash_<name>``, as before), with what it does
#: for a partitioned queue: ``first`` (take: partitions in turn until one answers with rows),
#: ``concat`` (rows of each, up to p_limit), or a merge of each partition's row/value.
DISPATCHED: dict[str, str] = {
    "take": "first",
    "peek": "concat",
    "queue_metrics": "metrics",
    "next_ready_in": "min",
    "queue_drop": "or",
    "queue_purge": "void",
    "queue_pause": "or",
    "queue_resume": "or",
    "dead_purge": "sum",
    # Dead letters: each partition keeps its own (the archive's dead rows, or its dead-letter
    # queue's partition on the same shard); a listing merges them by id (ids are unique across
    # shards, id % STRIDE the shard: keyset paging by id holds), a requeue asks each partition
    # (given ids: each partition those its shard made).
    "dead_list": "by_id",
    # The archive (acked with archiving on, dead, cancelled with archive): each partition keeps
    # its own; a listing merges them by id as dead_list's (the same keyset paging by id, the
    # time window and status applied on each partition).
    "archive_list": "by_id",
    # The live messages (the dashboard's browse): each partition's first p_limit after
    # p_after_id (of p_state), merged by id and cut to p_limit: the same keyset paging by id.
    "message_list": "by_id",
    "dead_requeue": "by_ids",
    # Channels: each lives on one partition (its name's, CHANNEL_PARTITION), so a listing
    # merges each partition's first p_limit after p_after by name (each channel once), and a
    # recount recounts every partition's, the corrections summed.
    "channel_list": "by_name",
    "channel_recount": "sum",
    # receive()'s registration as a waiter: NOTIFY is sent on the shards, where no one listens
    # through a router (receive polls), so a partitioned queue's registers nowhere.
    "wait_begin": "none",
    "wait_end": "or",
}

#: The dispatched calls that skip a partition whose shard cannot be reached (failing only when
#: every partition's does): a take serves the partitions that answer.
SKIPS_DOWN = ("take", "next_ready_in")

#: A PL/Proxy error of a shard it cannot reach (the client's test, ops._shard_unavailable, in
#: SQL): ``{state}`` and ``{msg}`` the error's SQLSTATE and message.
UNREACHABLE: LiteralString = (
    "({state} LIKE '08%' OR {state} LIKE '57P%' OR {msg} ~ '" + "|".join(PLPROXY_LOST) + "')"
)

#: The router's public functions that are not proxies of the core's.
ROUTER_ONLY = ("queue_create_partitioned",)

#: The calls the router can make on one given shard (``_on_<name>(p_shard, ...)``).
ON_SHARD = (*DISPATCHED, "queue_create")

#: The routing functions of :data:`ROUTED` written in plpgsql, with their arguments: each is a
#: plain queue's route (:data:`PLAIN_ROUTE`) in front of ``_parted<name>``, a partitioned
#: queue's (SECURITY DEFINER).
FAST_ROUTES: dict[LiteralString, LiteralString] = {
    "_send_shard": "p_queue text, p_key text, p_send_key uuid, p_channel text DEFAULT NULL",
    "_plain_shard": "p_queue text",
    "_once_shard": "p_queue text, p_send_key uuid",
    "_batch_shard": "p_queue text, p_keys text[], p_send_key uuid, p_channels text[] DEFAULT NULL",
    "_channel_shard": "p_queue text, p_channel text",
    "_id_shard": "p_queue text, p_ids bigint[]",
    "_cancel_shard": "p_queue text, p_ids bigint[], p_keys text[]",
    "_cron_shard": "p_queue text",
}

#: The routing functions that PL/Proxy calls in the caller's role (EXECUTE granted with the
#: queue functions); ``_route_of`` is for clients that go straight to the shards.
ROUTING_FUNCTIONS = (
    *FAST_ROUTES,
    *(f"_parted{name}" for name in FAST_ROUTES),
    "_msg_shard",
    "_route_of",
)

#: The shard_route row of a partitioned queue: its mark, not a shard (a moved plain queue's row
#: holds its shard, >= 0). Written with the queue's shard_partition row, in the same transaction
#: (queue_create_partitioned, a partitioned queue_drop, shard init/upgrade), so that a plain
#: queue's route reads one table (:data:`PLAIN_ROUTE`).
PARTITIONED_MARK = -1

#: The start of the body of every function that routes a call of one queue ``{q}`` (``_shard_of``,
#: the routing functions of :data:`FAST_ROUTES`, the dispatchers of :data:`DISPATCHED`): a plain
#: queue's shard, given to ``{then}`` (RETURN it, or ``p_shard :=`` and the call ``{plain}``). That is
#: its override in shard_route (a moved queue) or its hash, behind the queue's fence (a shared
#: advisory lock, which a move of the queue holds exclusively). A partitioned queue (its row in
#: shard_route is :data:`PARTITIONED_MARK`, written with its row in shard_partition) goes on to the
#: rest of the body (where _partitions takes the fence again: a lock a transaction holds is
#: granted again at once, and reads shard_partition). The fence is taken first, in an IF whose
#: condition is the lock's call alone: a plpgsql "simple expression", evaluated without a query
#: (a PERFORM runs one; the two statements this replaced, the lock with the partition check and
#: then the route, cost each call 4-5k instructions more on the router: docs/sharding.md, the
#: router's per-call cost); then one statement of one table, after the lock (so it sees what a
#: move or a create committed before releasing it), reads shard_route only (a second table in
#: it cost 20.8k more: docs/sharding.md, the floors): no row, the queue's hash; a shard >= 0, a
#: moved queue's; the mark, a partitioned queue (a plain SELECT INTO and FOUND: 5k a route less
#: than a coalesce of a subquery and the hash, docs/sharding.md). ``{plain}`` is written twice
#: (plpgsql plans a statement when it first runs it: the branch not taken costs nothing). A
#: partitioned queue's call then reads shard_partition (_partitions): shard_route then
#: shard_partition, the order `shard init` locks them in. These
#: functions run in the caller's role and search_path (not SECURITY DEFINER, no SET clause), so
#: every operator, function and type here is schema-qualified: no object on the caller's
#: search_path changes where a call goes or which lock it takes.
PLAIN_ROUTE: LiteralString = """    DECLARE
        v_route pg_catalog.int4;
    BEGIN
        -- The fence (the lock returns void, never NULL: the IF only makes it a simple expression).
        IF pg_catalog.pg_advisory_xact_lock_shared(
               pg_catalog.hashtext({name} OPERATOR(pg_catalog.||) '/route'), pg_catalog.hashtext({q})) IS NULL THEN
            NULL;
        END IF;
        -- After the lock: the route that a move or a create committed before releasing it: no
        -- row, a shard (moved) or -1 (PARTITIONED_MARK: partitioned, the rest of the body).
        SELECT r.shard INTO v_route FROM {s}.shard_route r WHERE r.queue OPERATOR(pg_catalog.=) {q};
        IF NOT FOUND THEN  -- where its hash says (PL/Proxy masks it to the shard count)
            {then} pg_catalog.hashtext({q});{plain}
        ELSIF v_route OPERATOR(pg_catalog.>=) 0 THEN  -- moved
            {then} v_route;{plain}
        END IF;
    END;
"""

#: How :data:`PLAIN_ROUTE` reads in a routing function: the queue is p_queue, its shard returned.
PLAIN_RETURN = {"q": sql.SQL("p_queue"), "then": sql.SQL("RETURN"), "plain": sql.SQL("")}


def _fast(name: LiteralString, args: LiteralString) -> LiteralString:
    """Routing function ``name`` (:data:`FAST_ROUTES`): :data:`PLAIN_ROUTE`, else
    ``_parted<name>`` with the same arguments."""
    call = ", ".join(a.split()[0] for a in args.split(", "))
    return (
        "-- " + name + ": a plain queue's shard (PLAIN_ROUTE: in the caller's role, no SET clause);\n"
        "-- a partitioned queue's: _parted" + name + ". Locks: _shard_of's, or _partitions'.\n"
        "CREATE FUNCTION {s}." + name + "(" + args + ") RETURNS integer\n"
        "LANGUAGE plpgsql VOLATILE AS $fn$\nBEGIN\n"
        + PLAIN_ROUTE
        + "    RETURN {s}._parted"
        + name
        + "("
        + call
        + ");\nEND $fn$"
    )


_MERGE_SCALAR = {
    "or": "SELECT coalesce(bool_or(r), false) FROM unnest(v_vals) AS r",
    "sum": "SELECT coalesce(sum(r), 0)::bigint FROM unnest(v_vals) AS r",
    "min": "SELECT min(r) FROM unnest(v_vals) AS r",
}

#: The router's partition state and routing functions; ``{s}`` the schema identifier, ``{name}``
#: its name as a literal, ``{cluster}`` the cluster's name as a literal, ``{stride}`` STRIDE,
#: ``{kp}`` KEY_PARTITION of (key, n) with ``p_key``/``v_n``. The internal functions without
#: SECURITY DEFINER or a SET clause besides those of a plain queue's path (PLAIN_ROUTE's):
#: ``_partitions``, ``_moved_ids``, ``_id_at``, ``_shard_down``, ``_mark_down`` and ``_turn``,
#: which only the router's SECURITY DEFINER functions call (EXECUTE granted to none), on their
#: pinned search_path.
ROUTING_STATEMENTS: tuple[LiteralString, ...] = (
    """-- The partitioned queues: each partition's shard, partition k at shards[k + 1].
-- moved_ids: where the message ids of a partition that moved (lonnymq.shard.move, partition=)
-- are: {{"<shard that made them>": <partition now holding them>}} (ids name the shard that made
-- them, id mod {stride}); a shard not named there holds its own ids' partition.
CREATE TABLE {s}.shard_partition (
    queue      text PRIMARY KEY,
    shards     integer[] NOT NULL CHECK (cardinality(shards) > 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    moved_ids  jsonb NOT NULL DEFAULT '{{}}'
)""",
    """-- Whose turn: an unkeyed send of a partitioned queue goes to the next partition.
CREATE SEQUENCE {s}.partition_send_turn AS bigint CYCLE""",
    """-- Whose turn: a take of a partitioned queue starts at the next partition.
CREATE SEQUENCE {s}.partition_take_turn AS bigint CYCLE""",
    """-- The shards of partitioned queue p_queue (partition order), NULL for any other queue.
-- Behind the queue's fence, as _shard_of: a partitioned queue's call waits while a move of one
-- of its partitions holds it, then reads the partitions again (the move's commit).
-- Not SECURITY DEFINER, no SET clause: only the router's SECURITY DEFINER functions call it
-- (EXECUTE granted to none), on their pinned search_path. Reads shard_partition. Locks:
-- advisory (transaction, shared) on (hashtext(schema || '/route'), hashtext(p_queue)), which
-- every call of a queue holds (_shard_of's for a plain queue).
CREATE FUNCTION {s}._partitions(p_queue text) RETURNS integer[]
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext({name} || '/route'), hashtext(p_queue));
    -- A statement after the lock: it sees what the move committed before releasing it.
    RETURN (SELECT p.shards FROM {s}.shard_partition p WHERE p.queue = p_queue);
END $fn$""",
    """-- Where the ids of partitioned queue p_queue's moved partitions are (shard_partition.moved_ids;
-- '{{}}' for any other queue). Call it after _partitions (which holds the fence). Locks: none.
CREATE FUNCTION {s}._moved_ids(p_queue text) RETURNS jsonb
LANGUAGE sql STABLE AS $fn$
SELECT coalesce((SELECT p.moved_ids FROM {s}.shard_partition p WHERE p.queue = p_queue), '{{}}')
$fn$""",
    """-- The shard holding message p_id of a partitioned queue with partitions on p_parts and moved
-- ids p_moved (_moved_ids): the partition its ids moved with, else the shard that made it.
CREATE FUNCTION {s}._id_at(p_parts integer[], p_moved jsonb, p_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$
SELECT coalesce(p_parts[(p_moved ->> (p_id % {stride})::text)::integer + 1], (p_id % {stride})::integer)
$fn$""",
    """-- Whether this session found shard p_shard unreachable less than {down_skip} s ago (a take
-- then skips its partition). Session state (a setting), no table: a router session finds out
-- for itself. Locks: none.
CREATE FUNCTION {s}._shard_down(p_shard integer) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
SELECT coalesce(nullif(current_setting('lonnymq_shard.down_' || {name} || '_' || p_shard, true), ''),
                '0')::float8 > extract(epoch FROM clock_timestamp())
$fn$""",
    """-- Remember for {down_skip} s in this session that shard p_shard cannot be reached.
CREATE FUNCTION {s}._mark_down(p_shard integer) RETURNS void
LANGUAGE sql VOLATILE AS $fn$
SELECT set_config('lonnymq_shard.down_' || {name} || '_' || p_shard,
                  (extract(epoch FROM clock_timestamp()) + {down_skip})::text, false)
$fn$""",
    """-- The next partition in turn among p_n, for a send or (p_take) a take. Locks: none.
CREATE FUNCTION {s}._turn(p_n integer, p_take boolean DEFAULT false) RETURNS integer
LANGUAGE sql VOLATILE AS $fn$
SELECT (CASE WHEN p_take THEN nextval('{s}.partition_take_turn')
             ELSE nextval('{s}.partition_send_turn') END % p_n)::integer
$fn$""",
    """-- Where a client that goes straight to the shards sends a queue's calls: its shard (a
-- plain queue, as _shard_of, behind the router's fence) or its partitions' shards.
-- moved_ids: where a partitioned queue's moved partitions' ids are (_moved_ids).
CREATE FUNCTION {s}._route_of(p_queue text, OUT shard integer, OUT partitions integer[], OUT moved_ids jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    -- shard_route (a partitioned queue's mark), then shard_partition: the order every call
    -- reads them in. Behind the fence: a partitioned create of the name (which holds it
    -- exclusively) commits before or after both reads.
    PERFORM pg_advisory_xact_lock_shared(hashtext({name} || '/route'), hashtext(p_queue));
    IF EXISTS (SELECT FROM {s}.shard_route r WHERE r.queue = p_queue AND r.shard = {mark}) THEN
        partitions := {s}._partitions(p_queue);
    END IF;
    IF partitions IS NULL THEN
        shard := {s}._shard_of(p_queue);
    ELSE
        moved_ids := {s}._moved_ids(p_queue);
    END IF;
END $fn$""",
    """-- The shard of a send: a plain queue's; a partitioned queue's partition of its channel
-- p_channel (all of a channel's messages on one partition: its FIFO, limits and fairness are
-- that shard's; a key and a channel together are refused: get and cancel by key look in the
-- key's partition), else of p_key, else of its idempotency key p_send_key (so a repeat of the
-- call finds the first), else the next partition in turn. Reads shard_partition, shard_route.
-- Locks: _shard_of's.
CREATE FUNCTION {s}._parted_send_shard(p_queue text, p_key text, p_send_key uuid, p_channel text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(p_queue);
    v_n     integer := cardinality(v_parts);
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    ELSIF p_channel IS NOT NULL AND p_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned: a'
            ' message goes to its channel''s partition, so it cannot also have a key (get and'
            ' cancel by key look in the key''s partition); send it with a channel or a key',
            p_queue);
    ELSIF p_channel IS NOT NULL THEN
        p_key := p_channel;
    ELSIF p_key IS NULL AND p_send_key IS NULL THEN
        RETURN v_parts[1 + {s}._turn(v_n)];
    END IF;
    p_key := coalesce(p_key, p_send_key::text);
    RETURN v_parts[1 + {kp}];
END $fn$""",
    """-- The shard of a plain send (send_plain: no key, channel or send key): as _send_shard's,
-- a plain queue's shard, a partitioned queue's next partition in turn.
CREATE FUNCTION {s}._parted_plain_shard(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN {s}._parted_send_shard(p_queue, NULL, NULL);
END $fn$""",
    """-- The shard of a plain send with a send key (send_plain_once): as _send_shard's, a plain
-- queue's shard, a partitioned queue's partition of the send key (where a repeat goes).
CREATE FUNCTION {s}._parted_once_shard(p_queue text, p_send_key uuid) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RETURN {s}._parted_send_shard(p_queue, NULL, p_send_key);
END $fn$""",
    """-- The shard of a batch send: as _send_shard, for the whole batch: the partitions of its
-- items' channels (an item with both a channel and a key is refused) and of the keys of its
-- items without a channel must be one (items with neither go with them; a batch with neither:
-- its idempotency key's partition, else the next in turn).
CREATE FUNCTION {s}._parted_batch_shard(p_queue text, p_keys text[], p_send_key uuid,
                                        p_channels text[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(p_queue);
    v_n     integer := cardinality(v_parts);
    v_ks    integer[];
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    END IF;
    IF EXISTS (SELECT FROM unnest(p_keys, p_channels) AS t(k, c) WHERE t.k IS NOT NULL AND t.c IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned: a'
            ' message goes to its channel''s partition, so it cannot also have a key (get and'
            ' cancel by key look in the key''s partition); send it with a channel or a key',
            p_queue);
    END IF;
    v_ks := ARRAY(SELECT DISTINCT (SELECT {kp} FROM (SELECT coalesce(t.c, t.k) AS p_key) x)
                    FROM unnest(p_keys, p_channels) AS t(k, c) WHERE coalesce(t.c, t.k) IS NOT NULL);
    IF cardinality(v_ks) = 0 AND p_send_key IS NOT NULL THEN
        RETURN {s}._parted_send_shard(p_queue, NULL, p_send_key);
    ELSIF cardinality(v_ks) = 0 THEN
        RETURN v_parts[1 + {s}._turn(v_n)];
    ELSIF cardinality(v_ks) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned: the'
            ' channels and keys of one batch fall in partitions %s; send a batch per partition'
            ' (lonnymq.shard.partitions.KEY_PARTITION, of the channel or else the key)', p_queue,
            array_to_string(v_ks, ', '));
    END IF;
    RETURN v_parts[1 + v_ks[1]];
END $fn$""",
    """-- The shard of a channel's policy call (channel_set, channel_reset): a plain queue's; a
-- partitioned queue's partition of p_channel, where its messages are and its limits are
-- enforced (a NULL channel: the first partition, whose core refuses it).
CREATE FUNCTION {s}._parted_channel_shard(p_queue text, p_channel text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(p_queue);
    v_n     integer := cardinality(v_parts);
    p_key   text := p_channel;
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    ELSIF p_channel IS NULL THEN
        RETURN v_parts[1];
    END IF;
    RETURN v_parts[1 + {kp}];
END $fn$""",
    """-- The shard of a call on message ids (settles): a plain queue's; for a partitioned queue
-- the shard holding the ids (_id_at: the shard that made them, id mod {stride}, or where their
-- partition moved), which must be one of its partitions' and the same for all (empty: the
-- first partition).
CREATE FUNCTION {s}._parted_id_shard(p_queue text, p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(p_queue);
    v_moved jsonb;
    v_at    integer[];
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    END IF;
    v_moved := {s}._moved_ids(p_queue);
    v_at := ARRAY(SELECT DISTINCT {s}._id_at(v_parts, v_moved, i) FROM unnest(p_ids) AS i WHERE i IS NOT NULL);
    IF cardinality(v_at) = 0 THEN
        RETURN v_parts[1];
    ELSIF cardinality(v_at) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned: the'
            ' messages of one call come from shards %s; settle each partition''s in its own call'
            ' (the Python client does)', p_queue, array_to_string(v_at, ', '));
    ELSIF NOT v_at[1] = ANY (v_parts) THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned over'
            ' shards %s: message ids of shard %s are not its', p_queue,
            array_to_string(v_parts, ', '), v_at[1]);
    END IF;
    RETURN v_at[1];
END $fn$""",
    """-- The shard of message_cancel: every id and key given must be of one partition.
CREATE FUNCTION {s}._parted_cancel_shard(p_queue text, p_ids bigint[], p_keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_at integer[];
BEGIN
    IF {s}._partitions(p_queue) IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    END IF;
    v_at := ARRAY(SELECT DISTINCT x FROM (
        SELECT {s}._parted_id_shard(p_queue, ARRAY[i]) FROM unnest(p_ids) AS i WHERE i IS NOT NULL
        UNION ALL
        SELECT {s}._parted_send_shard(p_queue, k, NULL) FROM unnest(p_keys) AS k WHERE k IS NOT NULL) AS t(x));
    IF cardinality(v_at) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('queue %s is partitioned: the'
            ' messages of one cancel are on shards %s; cancel per partition', p_queue,
            array_to_string(v_at, ', '));
    END IF;
    RETURN coalesce(v_at[1], {s}._parted_id_shard(p_queue, '{{}}'));
END $fn$""",
    """-- The shard of a schedule (cron_upsert): a plain queue's; a partitioned queue's partition 0
-- (shards[1]), which holds the queue under its name as every partition does: the schedule is
-- one row on one shard, so cron_fire (run on every shard, only this one finds it) sends each
-- tick once, to partition 0. The row moves with partition 0 (shard move copies a queue's cron
-- rows by name), where later upserts follow it.
CREATE FUNCTION {s}._parted_cron_shard(p_queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_parts integer[] := {s}._partitions(p_queue);
BEGIN
    IF v_parts IS NULL THEN
        RETURN {s}._shard_of(p_queue);
    END IF;
    RETURN v_parts[1];
END $fn$""",
    *(_fast(name, args) for name, args in FAST_ROUTES.items()),
    """-- The shard of message_get: by id (as _id_shard) or by key (as _send_shard).
CREATE FUNCTION {s}._msg_shard(p_queue text, p_id bigint, p_key text) RETURNS integer
LANGUAGE sql VOLATILE AS $fn$
SELECT CASE WHEN p_id IS NOT NULL OR p_key IS NULL THEN {s}._id_shard(p_queue, ARRAY[p_id])
            ELSE {s}._send_shard(p_queue, p_key, NULL) END
$fn$""",
)


def _fmt(stmt: LiteralString, schema: str, cluster: str) -> sql.Composed:
    s = sql.Identifier(schema)
    kp = sql.SQL(KEY_PARTITION).format(key=sql.SQL("p_key"), n=sql.SQL("v_n"))
    return sql.SQL(stmt).format(
        s=s,
        name=sql.Literal(schema),
        cluster=sql.Literal(cluster),
        stride=sql.SQL(str(STRIDE)),
        kp=kp,
        down_skip=sql.SQL(str(DOWN_SKIP)),
        mark=sql.SQL(str(PARTITIONED_MARK)),
        **PLAIN_RETURN,
    )


def dispatch_route(schema: str, queue: sql.Composable, call: sql.Composable) -> sql.Composed:
    """A dispatcher's plain queue's path (the core's here, the pgmq facade's in pgmq_parts):
    :data:`PLAIN_ROUTE` into ``p_shard`` for the queue named by ``queue``, then ``call`` (the
    call on that shard, returning)."""
    return sql.SQL(PLAIN_ROUTE).format(
        s=sql.Identifier(schema),
        name=sql.Literal(schema),
        q=queue,
        then=sql.SQL("p_shard :="),
        plain=sql.Composed([sql.SQL("\n        "), call]),
    )


def routing_statements(schema: str, cluster: str) -> list[sql.Composed]:
    """The statements of :data:`ROUTING_STATEMENTS` for ``schema``."""
    return [_fmt(stmt, schema, cluster) for stmt in ROUTING_STATEMENTS]


def _call(schema: str, name: str, args: Sequence[str], shard: str | None = None) -> sql.Composed:
    """``schema.name([shard, ]args...)``: a call of the router's internal functions."""
    params: list[sql.Composable] = [sql.SQL(shard)] if shard else []
    params += [sql.Identifier(a) for a in args]
    return sql.SQL("{}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(name), sql.SQL(", ").join(params)
    )


def _returns_rows(fn: CoreFunction) -> bool:
    return fn.retset or fn.result.startswith("TABLE")


def on_shard_statement(schema: str, cluster: str, fn: CoreFunction) -> sql.Composed:
    """``_on_<name>(p_shard integer, <fn's arguments>)``: the call on shard p_shard."""
    # PL/Proxy's SELECT names the arguments bare; schema and function names are plain
    # lower-case identifiers (check_schema; the core's names), checked by the caller.
    target = sql.SQL("{}.{}({})").format(
        sql.SQL(schema), sql.SQL(fn.name), sql.SQL(", ").join(sql.SQL(a) for a in fn.argnames)
    )
    select = sql.SQL("SELECT * FROM {}" if _returns_rows(fn) else "SELECT {}").format(target)
    return sql.SQL(
        "CREATE FUNCTION {s}.{n}(p_shard integer, {a}) RETURNS {r} LANGUAGE plproxy VOLATILE AS $proxy$\n"
        "CLUSTER {c}; RUN ON p_shard; {sel};\n$proxy$"
    ).format(
        s=sql.Identifier(schema),
        n=sql.Identifier(f"_on_{fn.name}"),
        a=sql.SQL(fn.identity),
        r=sql.SQL(fn.result),
        c=sql.Literal(cluster),
        sel=select,
    )


#: Before the partitions of a call of SKIPS_DOWN: skip those this session found down lately
#: only if some partition is not (else try them all, so the error is the shards' own).
_SKIP_INIT: LiteralString = "v_skip := NOT (SELECT bool_and({s}._shard_down(x)) FROM unnest(v_parts) AS x);"
#: After them: every partition unreachable fails the call with the last shard's error.
_ALL_DOWN: LiteralString = (
    "IF v_down = cardinality(v_parts) THEN\n"
    "        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_msg;\n"
    "    END IF;"
)


def _skipping(s: sql.Identifier, call: sql.Composable) -> sql.Composed:
    """``call`` on partition p_shard, skipped when its shard cannot be reached (PL/Proxy's
    error), counted in v_down, the shard remembered as down (:data:`DOWN_SKIP` s)."""
    return sql.SQL(
        "IF v_skip AND {s}._shard_down(p_shard) THEN\n"
        "            v_down := v_down + 1;\n"
        "            CONTINUE;\n"
        "        END IF;\n"
        "        v_got := 0;\n"
        "        BEGIN\n"
        "            {call}\n"
        "        EXCEPTION WHEN OTHERS THEN\n"
        "            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;\n"
        "            IF NOT {unreachable} THEN\n"
        "                RAISE;\n"
        "            END IF;\n"
        "            PERFORM {s}._mark_down(p_shard);\n"
        "            v_down := v_down + 1;\n"
        "        END;"
    ).format(
        s=s,
        call=call,
        unreachable=sql.SQL(UNREACHABLE).format(state=sql.SQL("v_state"), msg=sql.SQL("v_msg")),
    )


def dispatcher_statements(schema: str, fn: CoreFunction) -> list[sql.Composed]:
    """The router's public function for a call of :data:`DISPATCHED`: a plain queue's call goes
    to its shard (``_on_<name>``, routed as by ``_shard_of``), a partitioned queue's to each
    partition."""
    how = DISPATCHED[fn.name]
    key = "p_queue" if "p_queue" in fn.argnames else "p_name"
    s = sql.Identifier(schema)
    hashed = _call(schema, f"_hash_{fn.name}", fn.argnames)
    on = _call(schema, f"_on_{fn.name}", fn.argnames, "p_shard")
    decl = "v_parts integer[]; p_shard integer; v_i integer; v_got bigint; v_start integer;"
    if fn.name in SKIPS_DOWN:
        decl += " v_skip boolean; v_down integer := 0; v_state text; v_msg text;"
    # How the body returns the result of a call ``{}``: rows, a value, or nothing.
    ret: LiteralString = "RETURN QUERY SELECT * FROM {};\n        RETURN;"
    after: sql.Composable = sql.SQL("")
    if how == "first":  # take: the partitions in turn until one hands out messages
        part = sql.SQL(
            "IF p_ack_ids IS NOT NULL THEN  -- the acks riding on the take: each on its shard\n"
            "        PERFORM count(*)\n"
            "           FROM (SELECT array_agg(t.i) AS i, array_agg(t.k) AS k\n"
            "                   FROM unnest(p_ack_ids, p_ack_tokens) AS t(i, k) GROUP BY t.i % {stride}) g,\n"
            "                LATERAL {s}.ack(p_queue, g.i, g.k, NULL, p_now) AS a;\n"
            "        p_ack_ids := NULL;\n"
            "        p_ack_tokens := NULL;\n"
            "    END IF;\n"
            "    v_start := {s}._turn(cardinality(v_parts), true);\n"
            "    {skip_init}\n"
            "    FOR v_i IN 0 .. cardinality(v_parts) - 1 LOOP\n"
            "        p_shard := v_parts[1 + (v_start + v_i) % cardinality(v_parts)];\n"
            "        {attempt}\n"
            "        EXIT WHEN v_got > 0;\n"
            "    END LOOP;\n"
            "    {all_down}"
        ).format(
            s=s,
            stride=sql.SQL(str(STRIDE)),
            skip_init=sql.SQL(_SKIP_INIT).format(s=s),
            attempt=_skipping(
                s,
                sql.SQL("RETURN QUERY SELECT * FROM {on};\n GET DIAGNOSTICS v_got = ROW_COUNT;").format(
                    on=on
                ),
            ),
            all_down=sql.SQL(_ALL_DOWN),
        )
    elif how == "concat":  # peek: each partition's next, up to p_limit in all
        part = sql.SQL(
            "v_got := 0;\n"
            "    FOREACH p_shard IN ARRAY v_parts LOOP\n"
            "        EXIT WHEN v_got >= p_limit;\n"
            "        RETURN QUERY SELECT * FROM {on} LIMIT p_limit - v_got;\n"
            "        GET DIAGNOSTICS v_i = ROW_COUNT;\n"
            "        v_got := v_got + v_i;\n"
            "    END LOOP;"
        ).format(on=on)
    elif how in ("by_id", "by_name"):
        # dead_list, archive_list: each partition's first p_limit after p_after_id, by id;
        # channel_list: each partition's first p_limit after p_after, by name.
        part = sql.SQL(
            "RETURN QUERY SELECT m.* FROM unnest(v_parts) AS x(shard), LATERAL {on} AS m\n"
            "     ORDER BY m.{col} LIMIT p_limit;"
        ).format(
            on=_call(schema, f"_on_{fn.name}", fn.argnames, "x.shard"),
            col=sql.Identifier(how[3:]),
        )
    elif how == "by_ids":  # dead_requeue: every partition, or the ids each partition's shard made
        ret = "RETURN {};"
        decl += f" v_vals {fn.result}[] := '{{}}'; v_ids bigint[]; v_moved jsonb;"
        on_ids = _call(
            schema, f"_on_{fn.name}", [a if a != "p_ids" else "v_ids" for a in fn.argnames], "p_shard"
        )
        part = sql.SQL(
            "v_moved := {s}._moved_ids({key});\n"
            "    FOREACH p_shard IN ARRAY v_parts LOOP\n"
            "        v_ids := CASE WHEN p_ids IS NOT NULL THEN\n"
            "                      ARRAY(SELECT i FROM unnest(p_ids) AS i\n"
            "                             WHERE {s}._id_at(v_parts, v_moved, i) = p_shard) END;\n"
            "        IF p_ids IS NULL OR cardinality(v_ids) > 0 THEN\n"
            "            v_vals := v_vals || {on};\n"
            "        END IF;\n"
            "    END LOOP;"
        ).format(s=s, key=sql.Identifier(key), on=on_ids)
        after = sql.SQL("\n    RETURN ({});").format(sql.SQL(_MERGE_SCALAR["sum"]))
    elif how == "metrics":  # counts summed, ages of the oldest/newest over all partitions
        part = sql.SQL(
            "RETURN QUERY SELECT p_name, sum(m.ready)::bigint, sum(m.scheduled)::bigint,"
            " sum(m.leased)::bigint, sum(m.dead)::bigint, max(m.oldest_ready_age_ms),"
            " min(m.next_scheduled_at), sum(m.total_sent)::bigint, max(m.oldest_age_ms),"
            " min(m.newest_age_ms), bool_or(m.ready_at_least), bool_or(m.scheduled_at_least),"
            " bool_or(m.leased_at_least), bool_or(m.dead_at_least), bool_or(m.paused)\n"
            "      FROM unnest(v_parts) AS x(shard), LATERAL {on} AS m;"
        ).format(on=_call(schema, f"_on_{fn.name}", fn.argnames, "x.shard"))
    elif how == "none":
        ret = "RETURN {};"
        part = sql.Composed([sql.SQL("RETURN '{}';")])
    elif how == "void":
        ret = "PERFORM {};\n        RETURN;"
        part = sql.SQL("FOREACH p_shard IN ARRAY v_parts LOOP\n        PERFORM {on};\n    END LOOP;").format(
            on=on
        )
    elif fn.name in SKIPS_DOWN:  # one value from each partition that answers, merged
        ret = "RETURN {};"
        decl += f" v_vals {fn.result}[] := '{{}}';"
        part = sql.SQL(
            "{skip_init}\n    FOREACH p_shard IN ARRAY v_parts LOOP\n        {attempt}\n    END LOOP;\n    {all_down}"
        ).format(
            skip_init=sql.SQL(_SKIP_INIT).format(s=s),
            attempt=_skipping(s, sql.SQL("v_vals := v_vals || {on};").format(on=on)),
            all_down=sql.SQL(_ALL_DOWN),
        )
        after = sql.SQL("\n    RETURN ({});").format(sql.SQL(_MERGE_SCALAR[how]))
    else:  # one value from each partition, merged
        ret = "RETURN {};"
        decl += f" v_vals {fn.result}[] := '{{}}';"
        part = sql.SQL(
            "FOREACH p_shard IN ARRAY v_parts LOOP\n        v_vals := v_vals || {on};\n    END LOOP;"
        ).format(on=on)
        after = sql.SQL("\n    RETURN ({});").format(sql.SQL(_MERGE_SCALAR[how]))
    if fn.name == "queue_drop":  # the partitions are gone: so is the record of them
        part = sql.Composed(
            [
                part,
                sql.SQL(
                    "\n    DELETE FROM {s}.shard_partition WHERE queue = p_name;"
                    "\n    DELETE FROM {s}.shard_route WHERE queue = p_name AND shard = {mark};"
                    "\n    UPDATE {s}.shard_map SET version = version + 1;"
                ).format(s=s, mark=sql.SQL(str(PARTITIONED_MARK))),
            ]
        )
    # A plain queue's call: on its shard (PLAIN_ROUTE, as _shard_of routes it, behind the fence)
    # by _on_<name>, with no routing function for PL/Proxy to call.
    route = dispatch_route(schema, sql.Identifier(key), sql.SQL(ret).format(on))
    body = sql.SQL(
        "DECLARE {decl}\nBEGIN\n{route}    v_parts := {s}._partitions({key});\n"
        "    IF v_parts IS NULL THEN  -- no longer partitioned (dropped meanwhile)\n        {plain}\n"
        "    END IF;\n    {part}{after}\nEND"
    ).format(
        decl=sql.SQL(decl),
        route=route,
        s=s,
        key=sql.Identifier(key),
        plain=sql.SQL(ret).format(hashed),
        part=part,
        after=after,
    )
    return [
        sql.SQL(
            "-- {name} on the router: a plain queue's call on its shard; a partitioned queue's on each\n"
            "-- partition (lonnymq.shard.partitions.DISPATCHED: {how}). SECURITY DEFINER: it calls the\n"
            "-- _on_<name> functions, granted to none.\n"
            "CREATE FUNCTION {s}.{n}({a}) RETURNS {r} LANGUAGE plpgsql VOLATILE{strict} SECURITY DEFINER"
            " SET search_path = pg_catalog, pg_temp AS $fn$\n{b}\n$fn$"
        ).format(
            name=sql.SQL(fn.name),
            how=sql.SQL(how),
            s=s,
            n=sql.Identifier(fn.name),
            a=sql.SQL(fn.arguments),
            r=sql.SQL(fn.result),
            strict=sql.SQL(" STRICT" if fn.strict else ""),
            b=body,
        )
    ]


def create_statement(schema: str, cluster: str, fn: CoreFunction) -> sql.Composed:
    """``queue_create_partitioned(p_name, p_partitions, <queue_create's other arguments>)``:
    the queue on p_partitions distinct shards (1: a plain queue, as queue_create)."""
    s = sql.Identifier(schema)
    rest = fn.arguments.split(",", 1)[1].strip()  # queue_create's arguments after p_name
    args = sql.SQL(", ").join(sql.Identifier(a) for a in fn.argnames)
    created = _call(schema, "_on_queue_create", fn.argnames, "p_shard")
    body = sql.SQL(
        """DECLARE
    v_n     integer;
    v_home  integer;
    v_parts integer[];
    v_dlq   integer[];
    v_done  integer[] := '{{}}';
    p_shard integer;
BEGIN
    IF p_partitions IS NULL OR p_partitions < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = 'partitions must be a positive integer';
    ELSIF p_partitions = 1 THEN
        RETURN {s}.queue_create({args});
    END IF;
    -- As queue_create: not while `shard add` changes the shard count; one create of a name at a time.
    PERFORM pg_advisory_xact_lock_shared(hashtext({name} || '/map'), 0);
    PERFORM pg_advisory_xact_lock(hashtext({name} || '/route'), hashtext(p_name));
    SELECT count(*) INTO v_n FROM pg_foreign_server f, unnest(f.srvoptions) AS o
     WHERE f.srvname = {cluster} AND o ~ '^p[0-9]+=';
    IF p_partitions > v_n THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('partitions must be at most the'
            ' number of shards (%s): each partition is on its own shard', v_n);
    END IF;
    IF EXISTS (SELECT FROM {s}.shard_partition p WHERE p.queue = p_name) THEN
        IF p_if_not_exists THEN
            RETURN false;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LQ005', MESSAGE = format('queue %s already exists', p_name);
    END IF;
    v_home := {s}._shard_of(p_name) & (v_n - 1);
    v_parts := ARRAY(SELECT ((v_home + k) % v_n)::integer FROM generate_series(0, p_partitions - 1) k);
    -- Dead-lettering is one transaction on a partition's shard: the dead-letter queue needs a
    -- partition on each of them (the partition on shard k takes the dead letters of shard k).
    v_dlq := {s}._partitions(p_dead_letter_queue);
    IF p_dead_letter_queue IS NOT NULL AND NOT coalesce(v_parts <@ v_dlq, false) THEN
        RAISE EXCEPTION USING ERRCODE = 'LQ002', MESSAGE = format('the dead-letter queue of a'
            ' partitioned queue must be partitioned with a partition on each of its shards (%s);'
            ' %s is %s: create it first with partitions=%s (a partition on every shard)',
            array_to_string(v_parts, ', '), p_dead_letter_queue,
            CASE WHEN v_dlq IS NULL THEN 'not a partitioned queue'
                 ELSE 'partitioned over shards ' || array_to_string(v_dlq, ', ') END, v_n);
    END IF;
    BEGIN
        FOREACH p_shard IN ARRAY v_parts LOOP
            -- The home shard first: a plain queue of that name there stops it before any other.
            IF NOT {created} THEN
                IF p_shard = v_home AND p_if_not_exists THEN
                    RETURN false;  -- a plain queue of that name
                END IF;
                RAISE EXCEPTION USING ERRCODE = 'LQ005', MESSAGE = format('queue %s already exists'
                    ' on shard %s', p_name, p_shard);
            END IF;
            v_done := v_done || p_shard;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        -- Each shard committed its create: undo those (they are empty) before failing.
        FOREACH p_shard IN ARRAY v_done LOOP
            PERFORM {s}._on_queue_drop(p_shard, p_name, true);
        END LOOP;
        RAISE;
    END;
    INSERT INTO {s}.shard_partition (queue, shards) VALUES (p_name, v_parts);
    -- Its mark in shard_route (PARTITIONED_MARK), which a plain queue's route reads: in place of
    -- an override left by a plain queue of that name (dropped: its home shard had none above).
    INSERT INTO {s}.shard_route (queue, shard) VALUES (p_name, {mark})
        ON CONFLICT (queue) DO UPDATE SET shard = {mark}, moved_at = now();
    UPDATE {s}.shard_map SET version = version + 1;
    RETURN true;
END"""
    ).format(
        s=s,
        args=args,
        name=sql.Literal(schema),
        cluster=sql.Literal(cluster),
        created=created,
        mark=sql.SQL(str(PARTITIONED_MARK)),
    )
    return sql.SQL(
        "-- A queue over p_partitions shards (lonnymq.shard.partitions): partition k on shard\n"
        "-- (home + k) mod shards, recorded in shard_partition. Returns false if it existed and\n"
        "-- p_if_not_exists. Locks: the map lock shared, the queue's route lock exclusive.\n"
        "CREATE FUNCTION {s}.queue_create_partitioned(p_name text, p_partitions integer, {rest})"
        " RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER"
        " SET search_path = pg_catalog, pg_temp AS $fn$\n{b}\n$fn$"
    ).format(s=s, rest=sql.SQL(rest), b=body)
