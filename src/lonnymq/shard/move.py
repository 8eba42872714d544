"""Moving a queue, with everything it holds, from its shard to another (:func:`move`).

The router fences the queue (see :data:`lonnymq.shard.catalog.ROUTE_STATEMENTS`): the mover
holds the queue's route lock exclusively, so no call of the queue runs through the router while
it is moved, and every call after it reads the new route. Under that fence:

1. on the source, one transaction locks the queue's row, and each table's rows of the queue
   (messages, channels, dead letters and archive, settles, counters, cron schedules, Spark
   logs) are streamed by ``COPY (DELETE ... RETURNING ...)`` into the target's table (binary
   COPY): what is inserted is exactly what is deleted;
2. on the target, one transaction creates the queue (a new local id) and receives the rows with
   the same message ids, fencing tokens, attempts, leases and keys, and moves the target's id
   sequence past the moved ids; it commits;
3. the router records the route (``shard_route``) and commits;
4. the source transaction commits, and the fence is released; with the commit, a notification
   on the source (``client.direct.MOVED`` + the queue, on the schema's channel) tells the
   queues' waiters listening there to follow them to the target at once.

A partition of a partitioned queue moves the same way (``partition=K``, :func:`_move_partition`):
the fence is the queue's (the router's ``_partitions`` holds it for every partitioned call), the
copy is the partition's queue on its shard, and step 3 sets the partition's shard and records
that the ids its old shard made are now that partition's (``shard_partition.moved_ids``). A
dead-letter queue's partition takes along, in the same move, the partitions on its shard of the
partitioned queues dead-lettering into it (``feeders``). :func:`prune_moved_ids` forgets a
shard in ``moved_ids`` once no message holds an id it made.

A crash leaves one whole copy where the router sends the queue's calls: before 3 the source's
(its transaction rolls back; a target copy committed in 2 is unreachable, reported misplaced
by :func:`status`), after 3 the target's (the source's rolls back and is reported misplaced).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from .. import errors
from ..client.direct import MOVED, STRIDE
from ..migrations import DEFAULT_SCHEMA, check_schema
from . import admin, catalog

__all__ = ["MoveBlocked", "MoveError", "MoveResult", "move", "prune_moved_ids"]

#: Message ids (channel turns) skipped on the target beyond the largest moved in (see _advance).
ID_MARGIN = 1_000_000


class MoveError(errors.LonnyMQError):
    """A move that could not be made or finished; the message says what state it left."""


class MoveBlocked(MoveError):
    """A move gave up: a lock it needs (the queue's route on the router, its rows on a shard)
    stayed held by another transaction through every attempt. Nothing was moved."""


@dataclass(frozen=True, slots=True)
class MoveResult:
    """What :func:`move` did. ``queues``: the queue and the queues tied to it by dead-letter
    links, moved together; ``rows``: rows moved per table; ``pause_ms``: how long the queues'
    calls were held (from asking for the fence to releasing it) in the attempt that moved;
    ``attempts``: attempts made (the others gave up at a lock after ``lock_timeout``)."""

    queues: list[str]
    source: int
    target: int
    rows: dict[str, int]
    pause_ms: float
    attempts: int
    #: The partition moved (of the partitioned queue ``queues[0]``), None for a plain queue.
    partition: int | None = None
    #: A partition's move: each queue moved -> its partition moved (``queues[0]``'s and those of
    #: the queues that dead-letter into it on the source, moved with it); None for a plain queue.
    partitions: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class _Move:
    """One move as its attempts need it: connections, the checked plan, what moves where."""

    router_dsn: str
    router: psycopg.Connection[Any]
    src: psycopg.Connection[Any]
    dst: psycopg.Connection[Any]
    schema: str
    plan: Columns
    group: list[str]
    source: int
    target: int
    archive: bool
    timeout_ms: int
    mask: int
    partition: int | None = None
    #: A partition's move: queue -> its partition (the queue's, and its feeders' on the source).
    parts: dict[str, int] | None = None


# Tables holding a queue's rows, with the column that names the queue: its id or its name.
_BY_ID: tuple[LiteralString, ...] = (
    "message",
    "channel",
    "archive",
    "settled",
    "queue_stat",
    "send_key",
)
_BY_NAME: tuple[LiteralString, ...] = ("cron", "spark_sink_commit", "spark_stream")


def _group(conn: psycopg.Connection[Any], s: sql.Identifier, queue: str) -> list[str]:
    """``queue`` and every queue tied to it by dead-letter links (either way, transitively):
    they must stay on one shard, so they move together."""
    rows = conn.execute(
        sql.SQL(
            "WITH RECURSIVE g(id) AS ("
            "  SELECT id FROM {s}.queue WHERE name = %s"
            "  UNION"
            "  SELECT q.id FROM g JOIN {s}.queue p ON p.id = g.id"
            "    JOIN {s}.queue q ON q.dead_letter_queue_id = p.id OR q.id = p.dead_letter_queue_id)"
            " SELECT q.name FROM {s}.queue q WHERE q.id IN (SELECT id FROM g) ORDER BY q.name"
        ).format(s=s),
        (queue,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _columns(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a"
        " WHERE a.attrelid = format('%%I.%%I', %s::text, %s::text)::regclass"
        "   AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"
        " ORDER BY a.attnum",
        (schema, table),
    ).fetchall()
    return [str(r[0]) for r in rows]


#: Every table a move copies, in the order it inserts them.
_TABLES: tuple[LiteralString, ...] = (
    "queue",
    "spark_stream",
    "spark_stream_batch",
    "cron",
    "spark_sink_commit",
    *_BY_ID,
)

Columns = dict[str, list[str]]

#: Tables with a queue column that a move leaves behind on purpose: a Spark write's staged
#: parts (scratch of a job in flight; its commit, routed to the new shard, fails and Spark
#: runs the job again), and a backlog's frozen generations (generations are per shard: the
#: moved messages land in the target's current generation, and the source's next rotation
#: forgets the queue once it is gone).
_LEFT: tuple[str, ...] = ("spark_stage_part", "message_gen_frozen")

_PER_QUEUE_TABLES: LiteralString = """
SELECT DISTINCT c.relname::text FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
 WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND a.attname IN ('queue_id', 'queue') AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY 1
"""


def _plan(src: psycopg.Connection[Any], dst: psycopg.Connection[Any], schema: str) -> Columns:
    """The columns of each moved table (the target's order), read before the fence; the
    shards must agree on them."""
    unknown = [
        str(r[0])
        for r in src.execute(_PER_QUEUE_TABLES, (schema,))
        if r[0] not in _TABLES and r[0] not in _LEFT
    ]
    if unknown:
        raise MoveError(
            f"table(s) {', '.join(unknown)} of shard schema {schema!r} hold rows per queue that this"
            " version of lonnymq.shard.move does not copy: nothing was moved (upgrade lonnymq)"
        )
    plan: Columns = {}
    for table in _TABLES:
        names = _columns(dst, schema, table)
        if set(names) != set(_columns(src, schema, table)):
            raise errors.InvalidArgument(
                f"table {table} differs between the shards: run `lonnymq shard upgrade`"
            )
        plan[table] = names
    src.rollback()
    dst.rollback()
    return plan


def _version(conn: psycopg.Connection[Any], s: sql.Identifier) -> int:
    row = conn.execute(sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migration").format(s)).fetchone()
    return int(row[0]) if row else 0


def _target_index(dsns: Sequence[str], shard: int | str) -> int:
    if isinstance(shard, int) or (isinstance(shard, str) and shard.isdigit()):
        i = int(shard)
        if not 0 <= i < len(dsns):
            raise errors.InvalidArgument(
                f"no shard {i}: the router has shards 0..{len(dsns) - 1} (lonnymq shard status)"
            )
        return i
    try:
        want = conninfo_to_dict(shard)
    except psycopg.ProgrammingError:
        raise errors.InvalidArgument(f"shard {shard!r}: neither a shard index nor a DSN") from None
    keys = ("host", "hostaddr", "port", "dbname")
    for i, dsn in enumerate(dsns):
        have = conninfo_to_dict(dsn)
        if all(str(want.get(k) or "") == str(have.get(k) or "") for k in keys):
            return i
    raise errors.InvalidArgument(
        f"{admin.where(shard)} is not a shard of this router (lonnymq shard status lists them)"
    )


def move(
    router_dsn: str,
    queue: str,
    shard: int | str,
    *,
    schema: str = DEFAULT_SCHEMA,
    archive: bool = False,
    lock_timeout: float = 1.0,
    attempts: int = 5,
    retry_delay: float = 0.5,
    partition: int | None = None,
    feeders: bool | Callable[[Mapping[str, int]], bool] = True,
) -> MoveResult:
    """Move ``queue`` from its shard to ``shard`` (an index of the router's shard map or a
    shard's DSN), with its live messages (ready, scheduled, leased with their lease, attempts
    and fencing token, keyed versions), its channels, dead letters, settle memory, counters,
    cron schedules and Spark logs; its archive of acked and cancelled messages too when
    ``archive``, else that archive is dropped. Queues tied to it by dead-letter links move with
    it (they must share a shard).

    ``partition=K`` moves partition K of a partitioned queue (to a shard holding none of its
    partitions). With ``feeders`` (the default), the partitions of the partitioned queues that
    dead-letter into it on its shard (transitively) move with it, in the same move (each to the
    same target, which must hold none of theirs either); without, such a partition is refused.
    ``feeders`` may be a predicate of what would move (queue -> partition): moved when true.

    Exactly once, while producers and consumers keep calling through the router: the queue's
    calls wait for the move (the pause, typically milliseconds: ``MoveResult.pause_ms``), then
    run on the target; a message keeps its id and token, so a consumer holding a lease from the
    source acks, nacks or extends it after the move. Connections straight to the source shard
    are not fenced: use the router for the queue while it moves (a write to the queue that
    reaches the source directly during the move aborts it).

    Every lock is asked for with ``lock_timeout`` seconds (never waiting behind a long
    transaction for longer: the queue's calls wait at most that long per attempt); after
    ``attempts`` attempts, ``retry_delay`` seconds apart, raises :class:`MoveBlocked`. Raises
    QueueNotFound (no such queue on the shard the router sends it to), InvalidArgument (unknown
    shard, already there, shards at other schema versions, the queue's name taken on the
    target), ShardUnavailable, and :class:`MoveError` when it could not finish cleanly (the
    message says what to do)."""
    check_schema(schema)
    if attempts < 1 or lock_timeout <= 0:
        raise errors.InvalidArgument("attempts must be >= 1 and lock_timeout > 0")
    dsns = admin.shard_dsns(router_dsn, schema=schema)
    target = _target_index(dsns, shard)
    mask = len(dsns) - 1
    timeout_ms = max(1, int(lock_timeout * 1000))
    with admin._connect(router_dsn, "router", autocommit=True) as router:
        admin.check_movable(router, schema)
        overrides = admin.routes(router, schema)
        parted = admin.partitioned(router, schema)
        if queue in parted and partition is not None:
            owner = admin.moved_ids(router, schema).get(queue, {}).get(target, partition)
            if owner != partition:  # the target's ids are another partition's: still?
                prune_moved_ids(router_dsn, queue, schema=schema, lock_timeout=lock_timeout)
        if queue in parted:
            source = _partition_source(router, schema, queue, partition, parted[queue], target)
        elif partition is not None:
            raise errors.InvalidArgument(
                f"queue {queue!r} is not partitioned (or does not exist): move it without a partition"
            )
        else:
            row = router.execute("SELECT hashtext(%s) & %s", (queue, mask)).fetchone()
            assert row is not None
            source = overrides.get(queue, int(row[0]))
        with (
            admin._connect(dsns[source], f"shard {source}") as src,
            admin._connect(dsns[target], f"shard {target}") as dst,
        ):
            parts: dict[str, int] | None = None
            if partition is not None:
                parts = _partition_links(
                    router, src, schema, queue, partition, parted, source, target, feeders
                )
                group = list(parts)
            else:
                group = _plain_group(router, src, schema, queue, parted, overrides, source, target, mask)
            _same_version(src, dst, schema, source, target)
            plan = _plan(src, dst, schema)
            return _retrying(
                _Move(
                    router_dsn,
                    router,
                    src,
                    dst,
                    schema,
                    plan,
                    group,
                    source,
                    target,
                    archive,
                    timeout_ms,
                    mask,
                    partition,
                    parts,
                ),
                attempts,
                retry_delay,
            )


def _plain_group(
    router: psycopg.Connection[Any],
    src: psycopg.Connection[Any],
    schema: str,
    queue: str,
    parted: dict[str, list[int]],
    overrides: dict[str, int],
    source: int,
    target: int,
    mask: int,
) -> list[str]:
    """A plain queue's move, checked: the queues that move (it and its dead-letter links)."""
    group = _group(src, sql.Identifier(schema), queue)
    src.rollback()
    if not group:
        raise errors.QueueNotFound(
            f"queue {queue!r} does not exist (not on shard {source}, where the router sends its calls)"
        )
    if source == target:
        raise errors.InvalidArgument(f"queue {queue!r} is already on shard {target}")
    tied = sorted(set(group) & set(parted))
    if tied:
        raise errors.InvalidArgument(
            f"queue {queue!r} is tied by dead-letter links to partitioned queue(s)"
            f" {', '.join(tied)}, which move by partition: nothing was moved"
        )
    homes = dict(
        router.execute("SELECT n, hashtext(n) & %s FROM unnest(%s::text[]) AS n", (mask, group)).fetchall()
    )
    elsewhere = sorted(q for q in group if overrides.get(q, homes[q]) != source)
    if elsewhere:
        raise MoveError(
            f"queue(s) {', '.join(elsewhere)} on shard {source} are routed elsewhere"
            " (misplaced): lonnymq shard status"
        )
    return group


def _same_version(
    src: psycopg.Connection[Any], dst: psycopg.Connection[Any], schema: str, source: int, target: int
) -> None:
    s = sql.Identifier(schema)
    src_version, dst_version = _version(src, s), _version(dst, s)
    src.rollback()
    dst.rollback()
    if src_version != dst_version:
        raise errors.InvalidArgument(
            f"shard {source} is at schema version {src_version}, shard {target} at"
            f" {dst_version}: run `lonnymq shard upgrade` first"
        )


def _retrying(m: _Move, attempts: int, retry_delay: float) -> MoveResult:
    """:func:`_attempt` of ``m`` up to ``attempts`` times while a lock is not granted in time."""
    m.router.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{m.timeout_ms}ms")))
    blocked = ""
    for attempt in range(1, attempts + 1):
        try:
            rows, pause = _attempt(m)
        except (pg_errors.LockNotAvailable, pg_errors.SerializationFailure) as e:
            blocked = " ".join(str(e).split())
            if attempt < attempts:
                time.sleep(retry_delay)
            continue
        except pg_errors.ForeignKeyViolation as e:
            raise MoveError(
                f"a queue naming one of {', '.join(m.group)} as its dead-letter queue was created"
                " during the move: nothing was moved; run the move again"
                + (" (it moves them together)" if m.partition is None else "")
            ) from e
        return MoveResult(m.group, m.source, m.target, rows, pause, attempt, m.partition, m.parts)
    what = m.group[0] if m.partition is None else f"{m.group[0]} partition {m.partition}"
    raise MoveBlocked(
        f"moving queue {what!r} gave up after {attempts} attempt(s): a lock stayed held longer than"
        f" lock_timeout ({m.timeout_ms / 1000:g} s) ({blocked}); a long transaction holds the queue's"
        " route on the router or its rows on the shard: end it, or retry later; nothing was moved"
    )


def _partition_source(
    router: psycopg.Connection[Any],
    schema: str,
    queue: str,
    partition: int | None,
    parts: list[int],
    target: int,
) -> int:
    """The shard of partition ``partition`` of partitioned ``queue`` (partitions on ``parts``),
    checked against the router's records: it may go to ``target``."""
    if partition is None:
        raise errors.InvalidArgument(
            f"queue {queue!r} is partitioned over shards {', '.join(map(str, parts))}:"
            f" say which partition moves (--partition K, partition=K; K in 0..{len(parts) - 1})"
        )
    if not 0 <= partition < len(parts):
        raise errors.InvalidArgument(
            f"queue {queue!r} has no partition {partition}: its partitions are 0..{len(parts) - 1}"
            f" (on shards {', '.join(map(str, parts))})"
        )
    source = parts[partition]
    if source == target:
        raise errors.InvalidArgument(f"partition {partition} of queue {queue!r} is already on shard {target}")
    if target in parts:
        raise errors.InvalidArgument(
            f"shard {target} already holds partition {parts.index(target)} of queue {queue!r}: a shard"
            f" holds one partition of a queue (its partitions are on shards {', '.join(map(str, parts))});"
            " add shards first (lonnymq shard add) or move that partition away"
        )
    owner = admin.moved_ids(router, schema).get(queue, {}).get(target, partition)
    if owner != partition:
        raise errors.InvalidArgument(
            f"the message ids that shard {target} made for queue {queue!r} are now partition {owner}'s"
            f" (it moved from there) and some of its messages still hold such ids: ids would no longer"
            f" say their partition, so partition {partition} cannot go to shard {target} until they"
            " are gone (acked, or deleted from the archive)"
        )
    return source


#: Whether partition ``%s`` (queue name) on a shard still holds a message id made by shard
#: ``%s`` (id mod STRIDE): live messages, the archive (dead letters, archived acks), ack's memory
#: of recent settles and the ids remembered for repeated sends (send_key). NULL: no such queue.
_HOLDS_IDS: LiteralString = """
SELECT EXISTS (SELECT FROM {s}.message m WHERE m.queue_id = q.id AND m.id %% {stride} = r.made)
    OR EXISTS (SELECT FROM {s}.archive a WHERE a.queue_id = q.id AND a.id %% {stride} = r.made)
    OR EXISTS (SELECT FROM {s}.settled t WHERE t.queue_id = q.id AND t.id %% {stride} = r.made)
    OR EXISTS (SELECT FROM {s}.send_key k, unnest(k.ids) AS i(id)
                WHERE k.queue_id = q.id AND i.id %% {stride} = r.made)
  FROM {s}.queue q, (SELECT %s::bigint AS made) r WHERE q.name = %s
"""


def prune_moved_ids(
    router_dsn: str,
    queue: str | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    lock_timeout: float = 1.0,
) -> dict[str, list[int]]:
    """Forget where a moved partition's old ids are once none is left: for each partitioned
    queue (or only ``queue``), each shard recorded in ``moved_ids`` (its ids moved with a
    partition) whose ids no message of that partition holds any more (live, archived, in
    ack's settle memory or in a send's idempotency record). Such a shard may then take another
    partition of the queue (:func:`move` calls this when a target's ids are recorded as another
    partition's). Returns queue -> the shards forgotten.

    Holds the queue's fence shared on the router while it looks (calls of the queue go on; a
    move of one of its partitions waits, so no id can come back meanwhile: only a move brings a
    partition ids of another shard) and bumps the shard map's version when it forgets any.
    A settle of a delivery whose message is gone (cancelled, purged) made on a forgotten shard
    is then refused as not the queue's (InvalidArgument) rather than as a lost lease."""
    check_schema(schema)
    dsns = admin.shard_dsns(router_dsn, schema=schema)
    s = sql.Identifier(schema)
    holds = sql.SQL(_HOLDS_IDS).format(s=s, stride=sql.SQL(str(STRIDE)))
    pruned: dict[str, list[int]] = {}
    with admin._connect(router_dsn, "router", autocommit=True) as router:
        recorded = admin.moved_ids(router, schema)
        for q in sorted(recorded) if queue is None else [queue] if queue in recorded else []:
            with router.transaction():
                router.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(
                        sql.Literal(f"{max(1, int(lock_timeout * 1000))}ms")
                    )
                )
                router.execute(
                    "SELECT pg_advisory_xact_lock_shared(hashtext(%s || '/route'), hashtext(%s))", (schema, q)
                )
                row = router.execute(
                    sql.SQL(
                        "SELECT shards, moved_ids FROM {}.shard_partition WHERE queue = %s FOR UPDATE"
                    ).format(s),
                    (q,),
                ).fetchone()
                if row is None:
                    continue
                shards, moved = [int(i) for i in row[0]], {int(k): int(v) for k, v in row[1].items()}
                gone = []
                for made, k in sorted(moved.items()):
                    with admin._connect(dsns[shards[k]], f"shard {shards[k]}", autocommit=True) as conn:
                        left = conn.execute(holds, (made, q)).fetchone()
                    if left is not None and left[0] is False:
                        gone.append(made)
                if gone:
                    router.execute(
                        sql.SQL(
                            "UPDATE {}.shard_partition SET moved_ids = moved_ids - %s::text[] WHERE queue = %s"
                        ).format(s),
                        ([str(i) for i in gone], q),
                    )
                    router.execute(catalog.bump_version(schema))
                    pruned[q] = gone
    return pruned


def _partition_links(
    router: psycopg.Connection[Any],
    src: psycopg.Connection[Any],
    schema: str,
    queue: str,
    partition: int,
    parted: dict[str, list[int]],
    source: int,
    target: int,
    feeders: bool | Callable[[Mapping[str, int]], bool],
) -> dict[str, int]:
    """Check the partition on the source and its dead-letter links: the queues that move, each
    with its partition (``queue``'s first, then, with ``feeders``, the partitioned queues that
    dead-letter into it on the source, transitively: dead-lettering is one transaction on a
    shard, so they go together). Each must be free to go to ``target``, and ``queue``'s own
    dead-letter queue must have a partition there."""
    s = sql.Identifier(schema)
    row = src.execute(
        sql.SQL(
            "SELECT d.name, ARRAY(WITH RECURSIVE f(id) AS ("
            "  SELECT q.id UNION SELECT x.id FROM f JOIN {s}.queue x ON x.dead_letter_queue_id = f.id)"
            "  SELECT x.name FROM {s}.queue x WHERE x.id IN (SELECT f.id FROM f) AND x.id <> q.id ORDER BY x.name)"
            " FROM {s}.queue q LEFT JOIN {s}.queue d ON d.id = q.dead_letter_queue_id"
            " WHERE q.name = %s"
        ).format(s=s),
        (queue,),
    ).fetchone()
    src.rollback()
    if row is None:
        raise errors.QueueNotFound(
            f"partition {partition} of queue {queue!r} is not on shard {source}, where the router"
            " sends its calls (lonnymq shard status)"
        )
    dlq, fed = row[0], [str(f) for f in row[1]]
    if fed and not feeders:
        raise _fed(queue, fed, source)
    if dlq is not None and dlq not in fed and target not in parted.get(dlq, []):
        raise errors.InvalidArgument(
            f"the dead-letter queue {dlq!r} of queue {queue!r} has no partition on shard {target}:"
            f" partition {partition} would have nowhere to dead-letter there; nothing was moved"
        )
    parts = {queue: partition}
    moved = admin.moved_ids(router, schema) if fed else {}
    for f in fed:
        if f not in parted:
            raise errors.InvalidArgument(
                f"queue {f!r}, not partitioned, dead-letters into queue {queue!r} on shard {source}:"
                f" partition {partition} stays with it (a plain queue does not move with a"
                " partition); nothing was moved"
            )
        k = parted[f].index(source)
        owner = moved.get(f, {}).get(target, k)
        if target in parted[f] or owner != k:
            raise errors.InvalidArgument(
                f"queue {f!r} dead-letters into queue {queue!r} on shard {source}, so its partition"
                f" {k} moves with partition {partition}, but it cannot go to shard {target} ("
                + (
                    f"which holds its partition {parted[f].index(target)}"
                    if target in parted[f]
                    else f"whose ids are its partition {owner}'s"
                )
                + "); nothing was moved"
            )
        parts[f] = k
    if fed and callable(feeders) and not feeders(parts):
        raise _fed(queue, fed, source)
    return parts


def _fed(queue: str, fed: Sequence[str], source: int) -> errors.InvalidArgument:
    return errors.InvalidArgument(
        f"queue {queue!r} is the dead-letter queue of {', '.join(fed)} on shard {source}:"
        f" its partition there stays with theirs (dead-lettering is one transaction on a"
        " shard; move it with feeders to take theirs along); nothing was moved"
    )


def _lock_route(router: psycopg.Connection[Any], schema: str, group: Sequence[str]) -> list[str]:
    """Take the fence of each queue of ``group`` (session advisory locks, exclusive, in name
    order); on a timeout release those taken and re-raise."""
    held: list[str] = []
    try:
        for q in sorted(group):
            router.execute("SELECT pg_advisory_lock(hashtext(%s || '/route'), hashtext(%s))", (schema, q))
            held.append(q)
    except psycopg.Error:
        _unlock_route(router, schema, held)
        raise
    return held


def _unlock_route(router: psycopg.Connection[Any], schema: str, held: Sequence[str]) -> None:
    for q in held:
        router.execute("SELECT pg_advisory_unlock(hashtext(%s || '/route'), hashtext(%s))", (schema, q))


def _attempt(m: _Move) -> tuple[dict[str, int], float]:
    """One attempt of the move under the fence (see the module's docstring). Lock timeouts
    propagate (the caller retries) with nothing changed."""
    router_dsn, router, src, dst, schema = m.router_dsn, m.router, m.src, m.dst, m.schema
    group, source, target, timeout_ms = m.group, m.source, m.target, m.timeout_ms
    s = sql.Identifier(schema)
    t0 = time.monotonic()
    held = _lock_route(router, schema, group)
    try:
        try:
            for conn in (src, dst):
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{timeout_ms}ms")))
            # The source's side of the fence, for the clients that call the shard directly
            # (Client(direct=True), client/direct.py): their calls of the queue hold it shared;
            # after this transaction they find the queue gone and follow the map to the target.
            for q in sorted(group):
                src.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s || '/route'), hashtext(%s))", (schema, q)
                )
            rows = _copy(src, dst, schema, m.plan, group, m.archive)
            dst.commit()
        except BaseException:
            _rollback(src, dst)
            raise
        # The target holds a committed copy: now the route.
        try:
            with router.transaction():
                if m.parts is not None:
                    for q, k in m.parts.items():
                        _record_partition(router, schema, q, k, source, target)
                else:
                    router.execute(
                        sql.SQL(
                            "INSERT INTO {s}.shard_route (queue, shard) SELECT unnest(%s::text[]), %s"
                            " ON CONFLICT (queue) DO UPDATE SET shard = excluded.shard, moved_at = now()"
                        ).format(s=s),
                        (group, target),
                    )
                    # Back where its hash says: no override needed.
                    router.execute(
                        sql.SQL(
                            "DELETE FROM {s}.shard_route WHERE queue = ANY(%s) AND hashtext(queue) & %s = shard"
                        ).format(s=s),
                        (group, m.mask),
                    )
                router.execute(catalog.bump_version(schema))
        except BaseException as e:
            # Did the route change after all (a commit whose reply was lost)? Then carry on.
            # Otherwise keep the source's rows (a stale copy is only unreachable, never lost);
            # the target's copy goes only when the route certainly did not change.
            now = _route_now(router_dsn, schema, group[0], m.mask, m.partition)
            if now != target:
                _rollback(src)
                if now is not None:
                    _drop_copy(dst, schema, group, target, e)
                    raise
                raise MoveError(
                    f"recording the route of {', '.join(group)} failed ({' '.join(str(e).split())}) and"
                    f" the router cannot tell whether it changed: shards {source} and {target} both hold"
                    " a copy; lonnymq shard status shows the one the router does not use as misplaced:"
                    " drop that one on its shard"
                ) from e
        try:
            # Tell the queues' waiters listening on the source (receive(), the worker: their
            # ShardListener) that they left, when they do (NOTIFY is delivered at commit): they
            # ask the router where the queues are now and register there at once.
            for q in group:
                src.execute("SELECT pg_notify(%s, %s)", (schema, MOVED + q))
            src.commit()
        except psycopg.Error as e:
            raise MoveError(
                f"queue(s) {', '.join(group)} now run on shard {target}, but deleting them on shard"
                f" {source} may have failed ({' '.join(str(e).split())}): a copy left there is unreachable"
                " (misplaced in lonnymq shard status); drop it there with queue_drop on that shard"
            ) from e
    finally:
        with contextlib.suppress(psycopg.Error):  # a broken session has released its locks
            _unlock_route(router, schema, held)
    return rows, (time.monotonic() - t0) * 1000


def _rollback(*conns: psycopg.Connection[Any]) -> None:
    for conn in conns:
        with contextlib.suppress(psycopg.Error):  # a broken connection has rolled back
            conn.rollback()


def _record_partition(
    router: psycopg.Connection[Any], schema: str, queue: str, partition: int, source: int, target: int
) -> None:
    """In the router's transaction: partition ``partition`` of ``queue`` is now on shard
    ``target``, and the ids shard ``source`` made are its (``moved_ids``)."""
    cur = router.execute(
        sql.SQL(
            "UPDATE {}.shard_partition SET shards[%s] = %s,"
            " moved_ids = moved_ids || jsonb_build_object(%s::text, %s)"
            " WHERE queue = %s AND shards[%s] = %s"
        ).format(sql.Identifier(schema)),
        (partition + 1, target, source, partition, queue, partition + 1, source),
    )
    if cur.rowcount != 1:
        raise MoveError(
            f"partition {partition} of queue {queue!r} was dropped or moved meanwhile: nothing was moved"
        )


def _route_now(
    router_dsn: str, schema: str, queue: str, mask: int, partition: int | None = None
) -> int | None:
    """The shard the router sends ``queue`` to (its partition ``partition``'s), read on a new
    connection (None if it cannot be asked)."""
    s = sql.Identifier(schema)
    try:
        with psycopg.connect(
            router_dsn, autocommit=True, connect_timeout=admin.STATUS_CONNECT_TIMEOUT
        ) as conn:
            if partition is not None:
                row = conn.execute(
                    sql.SQL("SELECT shards[%s] FROM {}.shard_partition WHERE queue = %s").format(s),
                    (partition + 1, queue),
                ).fetchone()
                return None if row is None or row[0] is None else int(row[0])
            row = conn.execute(
                sql.SQL(
                    "SELECT coalesce((SELECT shard FROM {}.shard_route WHERE queue = %s), hashtext(%s) & %s)"
                ).format(s),
                (queue, queue, mask),
            ).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else int(row[0])


def _drop_copy(
    dst: psycopg.Connection[Any], schema: str, group: Sequence[str], target: int, cause: BaseException
) -> None:
    """Remove the copy committed on the target when the route could not be flipped."""
    try:
        with dst.transaction():
            ids = [
                r[0]
                for r in dst.execute(
                    sql.SQL("SELECT id FROM {}.queue WHERE name = ANY(%s)").format(sql.Identifier(schema)),
                    (list(group),),
                )
            ]
            _delete_rows(dst, schema, group, ids)
    except psycopg.Error as e:
        raise MoveError(
            f"the route of {', '.join(group)} could not be changed ({cause}) and the copy on shard"
            f" {target} could not be removed ({' '.join(str(e).split())}): the queue still runs on its"
            f" old shard; drop the copy on shard {target} (misplaced in lonnymq shard status)"
        ) from cause


def _delete_rows(
    conn: psycopg.Connection[Any], schema: str, names: Sequence[str], ids: Sequence[int]
) -> None:
    s = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "DELETE FROM {s}.spark_stream_batch b USING {s}.spark_stream t"
            " WHERE b.stream_id = t.stream_id AND t.queue = ANY(%s)"
        ).format(s=s),
        (list(names),),
    )
    for t in _BY_NAME:
        conn.execute(
            sql.SQL("DELETE FROM {}.{} WHERE queue = ANY(%s)").format(s, sql.Identifier(t)), (list(names),)
        )
    for t in _BY_ID:
        conn.execute(
            sql.SQL("DELETE FROM {}.{} WHERE queue_id = ANY(%s)").format(s, sql.Identifier(t)), (list(ids),)
        )
    conn.execute(
        sql.SQL("UPDATE {}.queue SET dead_letter_queue_id = NULL WHERE id = ANY(%s)").format(s), (list(ids),)
    )
    conn.execute(sql.SQL("DELETE FROM {}.queue WHERE id = ANY(%s)").format(s), (list(ids),))


def _copy(
    src: psycopg.Connection[Any],
    dst: psycopg.Connection[Any],
    schema: str,
    plan: Columns,
    group: list[str],
    archive: bool,
) -> dict[str, int]:
    """In the open transactions of both shards: lock the queues on the source, create them on
    the target, then stream each table's rows with ``COPY (DELETE ... RETURNING ...)`` from the
    source into the target's table (binary COPY; queue ids mapped, messages put in the target's
    current generation): what is inserted is exactly what is deleted. Returns rows per table."""
    s = sql.Identifier(schema)
    queues = [
        r[0]
        for r in src.execute(
            sql.SQL(
                "SELECT to_jsonb(q) FROM {}.queue q WHERE q.name = ANY(%s) ORDER BY q.id FOR UPDATE"
            ).format(s),
            (group,),
        )
    ]
    if len(queues) != len(group):
        raise MoveError(f"queue(s) of {', '.join(group)} were dropped meanwhile: nothing was moved")
    old_ids = [int(q["id"]) for q in queues]

    for q in group:  # queue_create's lock on the name: serialises with a create or drop there
        dst.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (schema, q))
    taken = [
        str(r[0])
        for r in dst.execute(sql.SQL("SELECT name FROM {}.queue WHERE name = ANY(%s)").format(s), (group,))
    ]
    if taken:
        raise errors.InvalidArgument(
            f"queue(s) {', '.join(sorted(taken))} already exist on the target shard (a copy left by an"
            " interrupted move, or another queue of that name: misplaced in lonnymq shard status):"
            " drop it there first"
        )
    # The queues: new local ids (an unlogged queue numbers downwards, as queue_create does), the
    # dead-letter links mapped to them.
    qcols = [c for c in plan["queue"] if c not in ("id", "dead_letter_queue_id")]
    new = dict(
        dst.execute(
            sql.SQL(
                "INSERT INTO {s}.queue (id, {qc}) OVERRIDING SYSTEM VALUE"
                " SELECT CASE WHEN r.unlogged THEN nextval(format('%%I.queue_unlogged_id_seq', %s::text))"
                "             ELSE nextval(pg_get_serial_sequence(format('%%I.queue', %s::text), 'id')) END,"
                "        {rc}"
                "   FROM jsonb_populate_recordset(NULL::{s}.queue, %s) r ORDER BY r.id"
                " RETURNING name, id"
            ).format(s=s, qc=_cols(qcols), rc=sql.SQL(", ").join(sql.Identifier("r", c) for c in qcols)),
            (schema, schema, Jsonb(queues)),
        ).fetchall()
    )
    new_ids = [int(new[q["name"]]) for q in queues]
    by_old = dict(zip(old_ids, new_ids, strict=True))
    for q in queues:
        dlq = q["dead_letter_queue_id"]
        if dlq is None:
            continue
        # Outside the group (a partition's): its dead-letter queue's partition on the target.
        dlq = by_old[int(dlq)] if int(dlq) in by_old else _local_dlq(src, dst, s, int(dlq))
        dst.execute(
            sql.SQL("UPDATE {}.queue SET dead_letter_queue_id = %s WHERE id = %s").format(s),
            (dlq, by_old[int(q["id"])]),
        )
    # Writers put new messages in the current generation, holding it (generations.sql).
    row = dst.execute(sql.SQL("SELECT {}._gen_write()").format(s)).fetchone()
    assert row is not None
    gen = int(row[0])

    def stream(
        table: LiteralString, rows_of: sql.Composable, params: Sequence[Any], delete: bool = True
    ) -> int:
        names = plan[table]
        exprs: list[sql.Composable] = []
        for c in names:
            if c == "queue_id":
                exprs.append(sql.SQL("(%s::integer[])[array_position(%s::integer[], queue_id)]"))
            elif table == "message" and c == "gen":
                exprs.append(sql.SQL("%s::bigint"))
            else:
                exprs.append(sql.Identifier(c))
        args: list[Any] = []
        for c in names:
            if c == "queue_id":
                args += [new_ids, old_ids]
            elif table == "message" and c == "gen":
                args.append(gen)
        query = (
            sql.SQL("DELETE FROM {s}.{t} WHERE {w} RETURNING {e}")
            if delete
            else sql.SQL("SELECT {e} FROM {s}.{t} WHERE {w} FOR UPDATE")
        ).format(s=s, t=sql.Identifier(table), w=rows_of, e=sql.SQL(", ").join(exprs))
        into = dst.cursor()
        with (
            src.cursor().copy(
                sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query),
                # In the order of the text: DELETE's WHERE comes before its RETURNING.
                [*params, *args] if delete else [*args, *params],
            ) as out,
            into.copy(
                sql.SQL("COPY {}.{} ({}) FROM STDIN (FORMAT BINARY)").format(
                    s, sql.Identifier(table), _cols(names)
                )
            ) as cp,
        ):
            for block in out:
                cp.write(block)
        return into.rowcount

    by_name = sql.SQL("queue = ANY(%s)")
    by_id = sql.SQL("queue_id = ANY(%s)")
    rows = {"queue": len(queues)}
    # A stream's batches reference it: the stream first (read, locked), its batches, then it goes.
    rows["spark_stream"] = stream("spark_stream", by_name, (group,), delete=False)
    rows["spark_stream_batch"] = stream(
        "spark_stream_batch",
        sql.SQL("stream_id IN (SELECT t.stream_id FROM {}.spark_stream t WHERE t.queue = ANY(%s))").format(s),
        (group,),
    )
    src.execute(sql.SQL("DELETE FROM {}.spark_stream WHERE queue = ANY(%s)").format(s), (group,))
    for table in ("cron", "spark_sink_commit"):
        rows[table] = stream(table, by_name, (group,))
    for table in _BY_ID:
        if table == "archive" and not archive:
            rows[table] = stream(table, sql.SQL("queue_id = ANY(%s) AND status = 'dead'"), (old_ids,))
        else:
            rows[table] = stream(table, by_id, (old_ids,))
    with src.pipeline():
        src.execute(sql.SQL("DELETE FROM {}.archive WHERE queue_id = ANY(%s)").format(s), (old_ids,))
        src.execute(
            sql.SQL("UPDATE {}.queue SET dead_letter_queue_id = NULL WHERE id = ANY(%s)").format(s),
            (old_ids,),
        )
        src.execute(sql.SQL("DELETE FROM {}.queue WHERE id = ANY(%s)").format(s), (old_ids,))
    # A write that reached the source without the router (not fenced) would be left behind.
    late = src.execute(
        sql.SQL("SELECT EXISTS (SELECT FROM {}.message WHERE queue_id = ANY(%s))").format(s), (old_ids,)
    ).fetchone()
    if late and late[0]:
        raise MoveError(
            f"a message was written to {', '.join(group)} on the source shard directly (not through the"
            " router) during the move: nothing was moved; move while its clients use the router"
        )
    _advance(dst, schema, "message", "id", new_ids)
    if rows["channel"]:
        _advance(dst, schema, "channel", "turn", new_ids)
    return rows


def _local_dlq(
    src: psycopg.Connection[Any], dst: psycopg.Connection[Any], s: sql.Identifier, dlq: int
) -> int:
    """The id on the target of the queue named as dead-letter queue ``dlq`` on the source (a
    moving partition's dead-letter queue stays: the link goes to its partition on the target),
    locked there against a drop until the move commits."""
    row = src.execute(sql.SQL("SELECT name FROM {}.queue WHERE id = %s").format(s), (dlq,)).fetchone()
    there = (
        dst.execute(
            sql.SQL("SELECT id FROM {}.queue WHERE name = %s FOR SHARE").format(s), (row[0],)
        ).fetchone()
        if row
        else None
    )
    if there is None:
        raise MoveError(
            f"the dead-letter queue {row[0] if row else dlq!r} has no partition on the target shard"
            " (dropped meanwhile?): nothing was moved"
        )
    return int(there[0])


def _cols(names: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(c) for c in names)


def _advance(
    dst: psycopg.Connection[Any], schema: str, table: LiteralString, column: LiteralString, ids: list[int]
) -> None:
    """Move the target's sequence of ``table.column`` (message ids, channel turns) past every
    value moved in, so new rows of the moved queues never take one they hold. Never backwards:
    nextval first, and only when the moved values reach past it, setval beyond them by
    ID_MARGIN (a sequence cannot be compared-and-set; the margin is more values than other
    writers could draw between the two calls), in whole increments from the nextval, so a
    strided sequence (a router's shard: ids are its index modulo STRIDE) stays strided."""
    s = sql.Identifier(schema)
    if table == "message":
        seq = sql.SQL("pg_get_serial_sequence(format('%%I.message', %s::text), 'id')::regclass")
        top = sql.SQL(
            "greatest((SELECT max(greatest(m.id, m.superseded_by)) FROM {s}.message m WHERE m.queue_id = ANY(%s)),"
            " (SELECT max(a.id) FROM {s}.archive a WHERE a.queue_id = ANY(%s)),"
            " (SELECT max(t.id) FROM {s}.settled t WHERE t.queue_id = ANY(%s)), 0)"
        ).format(s=s)
        top_params: list[Any] = [ids, ids, ids]
    else:
        seq = sql.SQL("format('%%I.channel_turn_seq', %s::text)::regclass")
        top = sql.SQL(
            "coalesce((SELECT max(c.turn) FROM {s}.channel c WHERE c.queue_id = ANY(%s)), 0)"
        ).format(s=s)
        top_params = [ids]
    # Past top + ID_MARGIN in whole increments from nextval: the sequence keeps its residue
    # modulo its increment (a router's shard i makes ids i modulo STRIDE: admin.stride_ids).
    dst.execute(
        sql.SQL(
            "SELECT CASE WHEN x.nv > x.top THEN x.nv"
            "            ELSE setval(x.seq, x.nv + ((x.top + %s - x.nv) / x.inc + 1) * x.inc) END"
            "  FROM (SELECT q.seq, nextval(q.seq) AS nv, {top} AS top,"
            "               (SELECT p.seqincrement FROM pg_catalog.pg_sequence p WHERE p.seqrelid = q.seq) AS inc"
            "          FROM (SELECT {seq} AS seq) q) x"
        ).format(top=top, seq=seq),
        [ID_MARGIN, *top_params, schema],
    )
