"""Direct routing: a client of a router that reads the shard map once and sends each queue's
calls straight to the shard holding the queue (``Client(router_dsn, direct=True)``), I/O-free.

The client (``client/aio.py`` and its sync twin) does the I/O; this module decides:

* which calls go straight to a shard (:data:`DIRECT`: the calls of one existing queue: send,
  take, settle, peek, get, cancel, dead letters, channels, metrics...), and which keep going
  through the router (creating and dropping queues, which the router serialises with ``shard
  add``; everything across queues: listings, metrics of all, housekeeping, workers; anything
  this module does not know, e.g. an op added later: the router is never wrong, only slower);
* the shard map: the router's ``_shard_map()`` (a version and each shard's conninfo, without user
  or password), and each queue's shard, asked once per queue from the router's ``_shard_of``
  (the same rule the router's proxies use: the queue's override if it was moved, else
  ``hashtext(queue)`` masked to the shard count) and remembered until the map's version changes;
* how the client logs into a shard: the shard's host, port and database from the map, every
  other connection parameter (user, password, passfile, sslmode...) from the client's own
  router DSN. The map holds no passwords (the router's user mapping does, readable only by
  superusers): the client's role must exist on the shards with the same password (or a
  ``.pgpass`` entry).

A direct call runs on the shard behind the shard's side of the move fence: its queue argument
is given through :data:`FENCE`, a subquery that takes a shared advisory lock of the queue (held
to the end of the call's transaction) before it hands the name to the function, so the lock is
taken before the function runs, in the same statement (no extra round trip). ``shard move``
holds that lock exclusively on the source shard while it copies the queue away, so a direct
call either runs before the copy (and is copied) or after the source has let the queue go, and
then fails with QueueNotFound: the client re-reads the map and runs the call on the new shard
(nothing was done on the old one: the failed call's transaction rolled back). A partitioned
queue's calls go the same way to each partition's shard (``shard move --partition``), and a
message id names its partition through the router's ``moved_ids`` once its partition moved.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, LiteralString, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .. import errors
from .ops import Op, Statements

__all__ = [
    "DIRECT",
    "DOWN_SKIP",
    "PARTITION_WAIT",
    "FENCE",
    "MAP_TTL",
    "MOVED",
    "STRIDE",
    "ShardMap",
    "key_partition",
    "listen_conninfo",
    "moved_queue",
    "settle_merge",
    "settle_split",
]

T = TypeVar("T")

#: The Statements whose calls go straight to the queue's shard; each takes the queue first.
DIRECT: tuple[str, ...] = (
    "send",
    "send_plain",
    "send_plain_once",
    "send_batch",
    "take",
    "peek",
    "ack",
    "nack",
    "extend",
    "give_up",
    "next_ready_in",
    "dead_list",
    "dead_requeue",
    "dead_purge",
    "channel_set",
    "channel_reset",
    "channel_list",
    "message_get",
    "message_cancel",
    "message_list",
    "archive_list",
    "queue_purge",
    "queue_pause",
    "queue_resume",
    "queue_metrics",
)

#: What a direct call passes as its queue argument instead of the bare name: the name, once the
#: shard's side of the move fence is held (the key of the router's ``_shard_of``; ``shard move``
#: takes it exclusively on the source). The scalar subquery runs before the function it is an
#: argument of; ``{name}`` is the schema's name as a literal.
FENCE: LiteralString = (
    "(SELECT l.q FROM (SELECT %s::text AS q) AS l,"
    " LATERAL pg_advisory_xact_lock_shared(hashtext({name} || '/route'), hashtext(l.q)) AS f)"
)

#: The queue argument of every statement of :data:`DIRECT`, which :data:`FENCE` replaces.
_QUEUE_ARG = "(%s::text"

#: Seconds after which the client asks the router whether the map's version changed (a call that
#: lands on a shard the queue left finds out at once, QueueNotFound; this bounds how long a copy
#: left behind by a failed move could be used).
MAP_TTL = 10.0

#: The prefix of the notification ``shard move`` sends on the source shard, on the schema's
#: channel (where waiters listen), when a queue has left it: ``MOVED + queue``. No queue name
#: starts with ``~`` (names start with a letter), so a listener that does not know it (a
#: single server's) takes it for a queue it does not wait on; a ``wait.ShardListener`` re-reads
#: the queue's shard from the router at once and registers there.
MOVED = "~moved "


def moved_queue(payload: str) -> str | None:
    """The queue a notification from ``shard move`` names (see :data:`MOVED`), else None."""
    return payload[len(MOVED) :] if payload.startswith(MOVED) else None


#: Connection parameters that say where a server is: they come from the map, the rest from the
#: client's DSN.
_LOCATION = ("host", "hostaddr", "port", "dbname", "service")

#: Attempts of one direct call when the queue turns out to have moved (a move back and forth
#: while the call runs needs more than one).
ATTEMPTS = 4


#: Seconds a client (and a router session) leaves alone a partition whose shard it could not
#: reach: its takes serve the other partitions meanwhile, then try it again.
DOWN_SKIP = 5.0

#: Longest wait for a connection to a partition's shard in a take of several partitions: one
#: that gives none sooner is skipped as down (its shard refuses or does not answer).
PARTITION_WAIT = 1.0

#: The calls of a partitioned queue that skip a partition whose shard cannot be reached,
#: failing only when every partition's does (the router's dispatchers do the same).
_SKIPS_DOWN = ("take", "next_ready_in")

#: Message ids of a router's shard i are i modulo STRIDE (``shard init`` sets each shard's id
#: sequence so): a partitioned queue's message id names the shard that holds it.
STRIDE = 1024


#: Seconds a listener (``wait.ShardListener``) waits for a shard to accept its connection, unless
#: the client's DSN sets ``connect_timeout``: a shard that does not answer is then left out.
LISTEN_CONNECT_TIMEOUT = 2


def listen_conninfo(conninfo: str) -> str:
    """``conninfo`` (a shard's, from :meth:`ShardMap.conninfo`) with a ``connect_timeout`` of
    :data:`LISTEN_CONNECT_TIMEOUT` if it sets none."""
    if conninfo_to_dict(conninfo).get("connect_timeout") is not None:
        return conninfo
    return make_conninfo(conninfo, connect_timeout=LISTEN_CONNECT_TIMEOUT)


def key_partition(key: str, n: int) -> int:
    """The partition (0..n-1) of ``key`` in a queue of ``n`` partitions: the first 4 bytes of
    the SHA-256 of its UTF-8 bytes, big-endian, modulo n (the router's KEY_PARTITION)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % n


#: The calls on message ids (their second argument) that a client of a router splits by the
#: shard the ids name: the deliveries of a partitioned queue settle on their own shards.
_SETTLES = re.compile(r"\.(ack|nack|extend|give_up|message_cancel)\(%s::text, %[sb]::bigint\[\]")
_settle_queries: dict[int, bool] = {}


def settle_split(op: Op[T]) -> list[Op[T]] | None:
    """``op`` cut into one op per shard when it settles (or cancels) message ids made by
    several shards (id mod STRIDE), each with its share of every per-message argument; else
    None. Its results merge with :func:`settle_merge`."""
    p = op.params
    if len(p) < 2 or not isinstance(p[1], list) or len(p[1]) < 2:
        return None
    ids = p[1]
    first = ids[0] % STRIDE if isinstance(ids[0], int) else None
    if first is None or all(isinstance(i, int) and i % STRIDE == first for i in ids):
        return None
    settles = _settle_queries.get(id(op.query))
    if settles is None:
        settles = _settle_queries[id(op.query)] = bool(_SETTLES.search(op.query.as_string(None)))
    if not settles:
        return None
    groups: dict[int, list[int]] = {}
    for pos, i in enumerate(ids):
        groups.setdefault(i % STRIDE, []).append(pos)
    n = len(ids)
    return [
        replace(op, params=tuple([v[k] for k in g] if isinstance(v, list) and len(v) == n else v for v in p))
        for g in groups.values()
    ]


def settle_merge(results: Sequence[T]) -> T:
    """The results of :func:`settle_split`'s ops as one: ids (sets; lists, in id order) or
    {id: ...}."""
    first: Any = results[0]
    if isinstance(first, dict):
        merged: Any = {k: v for r in results for k, v in cast(dict[Any, Any], r).items()}
    elif isinstance(first, set):
        merged = set().union(*cast(Sequence[set[Any]], results))
    else:
        merged = sorted(x for r in results for x in cast(list[Any], r))  # ids, in id order
    return cast(T, merged)


#: What a partitioned queue's call needs to pick its partition: the position of the argument
#: that holds it (key, keys, ids) in the client's statements (ops.Statements).
_KEY_ARG = {"send": 8, "send_batch": 8, "ack": 1, "nack": 1, "extend": 1, "give_up": 1}
#: The position of the idempotency key of a send and of a batch send.
_SEND_KEY_ARG = 11
#: The position of the channel of a send (the channels of a batch send): a channel's messages
#: are all on its partition (``key_partition`` of its name), which decides before the key.
_CHANNEL_ARG = 9

#: The listings of a partitioned queue that read every partition and merge the rows by id, cut
#: to the call's limit (as the router's ``by_id`` dispatchers): the position of that limit.
_MERGED = {"dead_list": 1, "archive_list": 4, "message_list": 3}


def _map_decode(rows: list[Any]) -> tuple[int, list[str]]:
    if not rows or rows[0][0] is None or not rows[0][1]:
        raise errors.InvalidArgument("the router's shard map is empty: run `lonnymq shard upgrade`")
    return int(rows[0][0]), [str(s) for s in rows[0][1]]


def _route_decode(rows: list[Any]) -> tuple[int | None, list[int] | None, dict[int, int] | None]:
    # (shard, partitions, moved_ids); a router made before partitions moved has no moved_ids.
    shard, parts, *rest = rows[0]
    moved = rest[0] if rest else None
    return (
        None if shard is None else int(shard),
        None if parts is None else [int(i) for i in parts],
        None if moved is None else {int(k): int(v) for k, v in moved.items()},
    )


class ShardMap:
    """The shard map as one client knows it: the version, the shards' conninfo (without
    credentials), and the queues' shards resolved so far."""

    def __init__(self, schema: str, st: Statements, *, ttl: float = MAP_TTL) -> None:
        s = sql.Identifier(schema)
        self.schema = schema
        self.ttl = ttl
        self.version: int | None = None
        self.shards: list[str] = []
        self.loaded_at = 0.0
        self._routes: dict[str, int] = {}  # -1: partitioned, see _parts
        self._parts: dict[str, list[int]] = {}
        # Partitioned queues' moved ids: shard that made them -> partition holding them.
        self._moved: dict[str, dict[int, int]] = {}
        self._names = {id(getattr(st, name)): name for name in DIRECT}
        self._direct = frozenset(self._names)
        self._ack_query = st.ack
        # The one-delivery statements (scalars) and the array statements they stand for.
        self._scalar = {id(st.ack_one): st.ack, id(st.take_ack_one): st.take}
        self._send_turn = itertools.count()
        self._take_turn = itertools.count()
        self._down: dict[int, float] = {}  # shard -> monotonic time until which it is skipped
        self._fence = sql.SQL(FENCE).format(name=sql.Literal(schema))
        self._fenced: dict[int, sql.Composed] = {}
        self._map_query = sql.SQL("SELECT version, shards FROM {}._shard_map()").format(s)
        self._route_query = sql.SQL("SELECT * FROM {}._route_of(%s::text)").format(s)

    # -- what goes where ---------------------------------------------------------------------

    def canonical(self, op: Op[T]) -> Op[T]:
        """``op`` with a one-delivery statement's scalars (``ack_one``, ``take_ack_one``) turned
        into the arrays of the statement it stands for, the one the routing below knows."""
        query = self._scalar.get(id(op.query))
        if query is None:
            return op
        p = op.params
        if query is self._ack_query:  # (queue, id, token, archive)
            return replace(op, query=query, params=(p[0], [p[1]], [p[2]], p[3]))
        return replace(op, query=query, params=(p[0], p[1], p[2], [p[3]], [p[4]]))  # take

    def queue_of(self, op: Op[Any]) -> str | None:
        """The queue whose shard runs ``op`` directly, or None: through the router."""
        if id(op.query) not in self._direct or not op.params:
            return None
        queue = op.params[0]
        return queue if isinstance(queue, str) else None

    def fenced(self, op: Op[T]) -> Op[T]:
        """``op`` (one of :meth:`queue_of`'s) with its queue argument behind :data:`FENCE`."""
        query = self._fenced.get(id(op.query))
        if query is None:
            query = self._fenced[id(op.query)] = fence_query(op.query, self._fence)
        return replace(op, query=query)

    def route(self, queue: str) -> int | None:
        """The queue's shard if known (None: ask the router, :meth:`route_op`)."""
        return self._routes.get(queue)

    def remember(
        self,
        queue: str,
        shard: int | None,
        partitions: Sequence[int] | None = None,
        moved: dict[int, int] | None = None,
    ) -> int:
        """Remember the router's answer (:meth:`route_op`): the queue's shard, or -1 for a
        partitioned queue (its partitions' shards and where its moved partitions' ids are:
        :meth:`plan`)."""
        if partitions:
            self._parts[queue] = list(partitions)
            self._moved[queue] = dict(moved or {})
            self._routes[queue] = -1
            return -1
        assert shard is not None
        i = shard & (len(self.shards) - 1)  # an override is an index; a hash is masked (PL/Proxy)
        self._routes[queue] = i
        return i

    def outside(self, found: tuple[int | None, list[int] | None, dict[int, int] | None]) -> bool:
        """Whether the router's answer (:meth:`locate_op`) names a partition's shard this map
        does not have (shards were added since it was read, ``shard add``): read the map again
        before :meth:`remember`."""
        parts = found[1]
        return bool(parts) and max(parts or [0]) >= len(self.shards)

    def partitions(self, queue: str) -> list[int]:
        """The shards of partitioned ``queue``'s partitions (after :meth:`remember`)."""
        return list(self._parts[queue])

    def placement(self, queue: str) -> tuple[list[int], dict[int, int]] | None:
        """A partitioned queue's partitions and moved ids as remembered (None: not known)."""
        parts = self._parts.get(queue)
        return None if parts is None else (list(parts), dict(self._moved.get(queue, {})))

    def forget(self, queue: str) -> None:
        self._routes.pop(queue, None)
        self._parts.pop(queue, None)
        self._moved.pop(queue, None)

    def plan(self, op: Op[Any], queue: str) -> list[int] | None:
        """The shards that run ``op`` of partitioned ``queue``, tried in order until one returns
        rows (take: the partitions in turn); None: through the router (a call over every
        partition, or one this client cannot place)."""
        parts = self._parts[queue]
        moved = self._moved.get(queue, {})
        n = len(parts)
        name = self._names.get(id(op.query))
        p = op.params
        if name == "next_ready_in" or name in _MERGED:  # every partition (wants_min, merged_limit)
            return list(parts)
        if name == "take":  # (the acks riding on it: settled before, see riding_acks)
            start = next(self._take_turn)
            return [parts[(start + k) % n] for k in range(n)]
        if name == "message_get":
            return self._by_ids(parts, moved, [p[1]]) if p[1] is not None else [parts[key_partition(p[2], n)]]
        if name in ("channel_set", "channel_reset"):  # where the channel's messages are
            return [parts[key_partition(p[1], n)]] if isinstance(p[1], str) else None
        if name == "send_plain":  # no key, channel or send key: the next partition in turn
            return [parts[next(self._send_turn) % n]]
        if name == "send_plain_once":  # a send key alone: its partition, where a repeat goes
            return [parts[key_partition(str(p[2]), n)]]
        if name not in _KEY_ARG:
            return None
        arg = p[_KEY_ARG[name]]
        if name in ("ack", "nack", "extend", "give_up"):
            return self._by_ids(parts, moved, arg)
        chans = p[_CHANNEL_ARG]
        if name == "send":
            items = [(arg, chans)]
        else:  # a batch's lists (None: no item has one)
            size = len(arg if arg is not None else chans or ())
            items = list(zip(arg or [None] * size, chans or [None] * size, strict=True))
        if any(k is not None and c is not None for k, c in items):
            return None  # a key and a channel: the router refuses it (its message)
        # A channel's messages on its partition, else a key's on the key's.
        deciders = [c if c is not None else k for k, c in items]
        keys = {key_partition(d, n) for d in deciders if d is not None}
        if not keys and p[_SEND_KEY_ARG] is not None:  # a repeat of the call goes where it went
            keys = {key_partition(str(p[_SEND_KEY_ARG]), n)}
        if not keys:
            return [parts[next(self._send_turn) % n]]
        return [parts[keys.pop()]] if len(keys) == 1 else None

    def merged_limit(self, op: Op[Any]) -> int | None:
        """For a listing that every partition answers (:meth:`plan`), merged by id: how many
        rows the merge keeps (the call's limit); None for any other call."""
        pos = _MERGED.get(self._names.get(id(op.query), ""))
        return None if pos is None else int(op.params[pos])

    def wants_min(self, op: Op[Any]) -> bool:
        """Whether :meth:`plan`'s shards all answer ``op`` and the answer is the least (the
        wait until a partition's next message is ready), rather than the first with rows."""
        return self._names.get(id(op.query)) == "next_ready_in"

    def skips_down(self, op: Op[Any], plan: Sequence[int]) -> bool:
        """Whether ``op``, planned over several partitions, skips those it cannot reach (a take:
        the others still serve; ``next_ready_in``: the soonest of those that answer)."""
        return len(plan) > 1 and self._names.get(id(op.query)) in _SKIPS_DOWN

    def reachable(self, plan: list[int]) -> list[int]:
        """``plan`` without the shards found down in the last :data:`DOWN_SKIP` seconds, unless
        that leaves none (then all: the error is then the shards' own)."""
        now = time.monotonic()
        up = [s for s in plan if self._down.get(s, 0.0) <= now]
        return up or plan

    def mark_down(self, shard: int) -> None:
        self._down[shard] = time.monotonic() + DOWN_SKIP

    def riding_acks(self, op: Op[T]) -> tuple[Op[set[int]], Op[T]] | None:
        """For a take that acknowledges earlier deliveries (``take(ack=...)``) of a partitioned
        queue: the ack of those (split by shard when run) and the take without them; else None."""
        p = op.params
        if self._names.get(id(op.query)) != "take" or not p[3]:
            return None
        ack = Op(self._ack_query, (p[0], p[3], p[4], None), lambda rows: {int(r[0]) for r in rows})
        return ack, replace(op, params=(*p[:3], None, None))

    @staticmethod
    def _by_ids(parts: list[int], moved: dict[int, int], ids: Sequence[int]) -> list[int] | None:
        """The shard holding ``ids``: the one that made them (id mod STRIDE), or the shard of
        the partition they moved with (the router's ``_id_at``); None unless one of ``parts``."""
        at = {parts[moved[i % STRIDE]] if i % STRIDE in moved else i % STRIDE for i in ids}
        return [at.pop()] if len(at) == 1 and next(iter(at)) in parts else None

    def stale(self) -> bool:
        return self.version is None or time.monotonic() - self.loaded_at > self.ttl

    def load(self, version: int, shards: Sequence[str]) -> bool:
        """Take a map read from the router; returns whether it changed (its routes are then
        forgotten)."""
        changed = version != self.version or list(shards) != self.shards
        if changed:
            self._routes.clear()
        self.version, self.shards = version, list(shards)
        self.loaded_at = time.monotonic()
        return changed

    # -- the router's answers ----------------------------------------------------------------

    def map_op(self) -> Op[tuple[int, list[str]]]:
        return Op(self._map_query, (), _map_decode, safe_to_retry=True)

    def route_op(self, queue: str) -> Op[tuple[int | None, list[int] | None]]:
        """The queue's shard or its partitions' shards."""
        return Op(self._route_query, (queue,), lambda rows: _route_decode(rows)[:2], safe_to_retry=True)

    def locate_op(self, queue: str) -> Op[tuple[int | None, list[int] | None, dict[int, int] | None]]:
        """:meth:`route_op` with where a partitioned queue's moved ids are (for :meth:`remember`)."""
        return Op(self._route_query, (queue,), _route_decode, safe_to_retry=True)

    # -- logging into a shard ----------------------------------------------------------------

    def conninfo(self, shard: int, client_conninfo: str) -> str:
        """Shard ``shard``'s conninfo: where it is from the map, everything else (user,
        password, TLS...) from the client's router DSN."""
        try:
            mine = conninfo_to_dict(client_conninfo)
            there = conninfo_to_dict(self.shards[shard])
        except psycopg.ProgrammingError as e:
            raise errors.InvalidArgument(f"a DSN of the shard map does not parse: {e}") from None
        there.pop("user", None)
        there.pop("password", None)
        given = {k: v for k, v in mine.items() if k not in _LOCATION}
        return make_conninfo(**{k: str(v) for k, v in {**there, **given}.items() if v is not None})

    def where(self, shard: int) -> str:
        """Where shard ``shard`` is (``host:port/dbname``), for messages."""
        try:
            d = conninfo_to_dict(self.shards[shard])
        except (psycopg.ProgrammingError, IndexError):
            return f"shard {shard}"
        host = d.get("host") or d.get("hostaddr") or "local socket"
        port = f":{d['port']}" if d.get("port") else ""
        db = f"/{d['dbname']}" if d.get("dbname") else ""
        return f"{host}{port}{db}"

    def unavailable(self, shard: int, e: Exception) -> errors.ShardUnavailable:
        at = self.where(shard)
        reason = " ".join(str(e).split())
        return errors.ShardUnavailable(f"shard {shard} ({at}) cannot be reached: {reason}", shard=at)


def fence_query(query: sql.Composed, fence: sql.Composable) -> sql.Composed:
    """``query`` with its first ``(%s::text`` argument (the queue) replaced by ``fence``."""
    parts: list[sql.Composable] = []
    done = False
    for part in query:
        if not done and isinstance(part, sql.SQL) and _QUEUE_ARG in part.as_string(None):
            before, _, after = part.as_string(None).partition(_QUEUE_ARG)
            # Our own statement text (Statements), split around the queue's placeholder.
            parts += [sql.SQL(before + "("), fence, sql.SQL(after)]
            done = True
        else:
            parts.append(part)
    if not done:
        raise AssertionError(f"no queue argument in {query!r}")
    return sql.Composed(parts)


def unsupported(conninfo: object) -> errors.InvalidArgument:
    return errors.InvalidArgument(
        f"direct=True needs the router's DSN (a conninfo string), not {type(conninfo).__name__}:"
        " the client opens its own pool to each shard"
    )
