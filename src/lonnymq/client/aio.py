"""The asyncio client; ``sync.py`` is generated from it by ``tools/async_to_sync.py``.

Every method is one SQL function call, i.e. one atomic queue action. Pass ``conn=`` (a
connection in a transaction of yours) to make the action part of your transaction: it then
commits or rolls back with your own writes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from time import monotonic
from typing import Any, TypeVar, cast, overload

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .. import errors
from ..migrations import (
    DEFAULT_SCHEMA,
    MIGRATE_ATTEMPTS,
    MIGRATE_LOCK_TIMEOUT,
    MIGRATE_RETRY_DELAY,
    applied_query,
    blockers_query,
    bootstrap_query,
    check_schema,
    lock_query,
    lock_timeout_query,
    recorded_query,
    upgrade,
)
from ..migrations import pgmq as pgmq_facade
from ..models import (
    ArchivedMessage,
    ArchiveStatus,
    ChannelInfo,
    DeadMessage,
    Envelope,
    Message,
    OnConflict,
    OnFull,
    QueueInfo,
    QueueMetrics,
    SendResult,
)
from ..serializer import Serializer
from . import config
from .direct import (
    ATTEMPTS,
    MAP_TTL,
    PARTITION_WAIT,
    ShardMap,
    listen_conninfo,
    settle_merge,
    settle_split,
    unsupported,
)
from .ops import (
    Op,
    Ops,
    check_send_key,
    connection_quiet,
    map_error,
    new_send_key,
    rendered,
    settled,
    to_ms,
)
from .retry import DEFAULT_RETRY, Backoff, RetryPolicy, asleep
from .wait import PENDING_WAIT, AsyncListener, ShardListener, next_wait

T = TypeVar("T")


_IDLE = psycopg.pq.TransactionStatus.IDLE
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


async def _check_connection(conn: AsyncConnection[Any]) -> None:
    """The pool's check of a connection it hands out: a round trip only when the socket says the
    server may have ended the session (:func:`~lonnymq.client.ops.connection_quiet`)."""
    if not connection_quiet(conn):
        await AsyncConnectionPool.check_connection(conn)


#: Errors after which the server has rolled a call back whole (it runs as one statement in its own
#: transaction): a deadlock, a serialization failure. Repeating such a call is always safe.
ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


class AsyncClient:
    """A LonnyMQ client on asyncio.

    ``conninfo`` is a libpq connection string/URI, an open connection (used as it is: in
    autocommit mode each call is its own transaction, otherwise calls join the connection's
    transaction and you commit), or a connection pool. With nothing given, the chain of every
    PostgreSQL tool: ``$LONNYMQ_DSN``, else ``$DATABASE_URL``, else libpq's defaults (``PGHOST``,
    ``PGDATABASE``, ``PGSERVICE``..., like ``psql``); no server is ever started implicitly (see
    :meth:`embedded`). ``connect_timeout`` (seconds; default ``$LONNYMQ_CONNECT_TIMEOUT``, else
    libpq's) bounds each connection attempt and the wait for the first connection on open.

    ``serializer`` encodes payloads other than bytes and str, and decodes the messages of its
    content type on receipt (default: JSON that also takes datetime, UUID and Decimal; see
    :mod:`lonnymq.serializer`).

    On the client's pool, ``check_connections`` checks each connection as it is handed out so one
    left dead by a PostgreSQL restart or failover is replaced, not used: an empty query (one round
    trip) when its socket has something to read (a server that ended the session has closed it or
    sent why), else nothing more than that look at the socket; ``retry`` (a :class:`~lonnymq.client.retry.RetryPolicy`, None: never) says how
    calls cut off by a lost connection are repeated: those that never reached the server, and
    those safe to run twice (take, receive, peek, metrics, listings); any other call so cut off
    raises :class:`~lonnymq.errors.ConnectionLost` (``may_have_committed``).

    ``direct=True`` (``conninfo``: a shard router's DSN, docs/sharding.md): the calls of one
    queue go straight to the shard that holds it, with no hop through the router; the client
    reads the shard map from the router once, keeps a pool per shard (of ``pool_size``), and
    follows a queue that moves. It logs into the shards with its DSN's user and password.

    ``idempotent_sends`` (default True) makes sends safe to repeat too: each send or send_batch
    call that the client may repeat (on its own pool, with a retry policy) carries a new
    idempotency key, recorded with its messages, so a repeat of a call that had committed
    creates nothing and returns the first call's ids and outcomes (docs/messages.md). Without it
    a send cut off after it was sent raises ConnectionLost(may_have_committed=True).
    """

    def __init__(
        self,
        conninfo: str | AsyncConnection[Any] | AsyncConnectionPool[Any] | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = 4,
        serializer: Serializer | None = None,
        connect_timeout: float | None = None,
        check_connections: bool = True,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        direct: bool = False,
        idempotent_sends: bool = True,
    ) -> None:
        self.schema = check_schema(schema)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise errors.InvalidArgument(f"retry must be a RetryPolicy or None, got {retry!r}")
        self.retry = retry
        self.idempotent_sends = bool(idempotent_sends)
        self._open_timeout = 30.0
        self.ops = Ops(schema, serializer)
        self._conn: AsyncConnection[Any] | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._owns_pool = False
        self._opened = False
        self._closed = False
        self._listeners: list[AsyncListener | ShardListener] = []  # idle, for the next receive()
        self._router: bool | None = None  # a shard router's schema? (asked once, when it matters)
        self._map: ShardMap | None = ShardMap(schema, self.ops.st) if direct else None
        self._listen_map: ShardMap | None = None  # a router client's map, read only to listen
        self._shard_pools: dict[tuple[int, str], AsyncConnectionPool[Any]] = {}
        self._pool_args: tuple[int, dict[str, Any], bool] = (pool_size, {}, check_connections)
        self.conninfo: str | None = None
        if direct and (conninfo is not None and not isinstance(conninfo, str)):
            raise unsupported(conninfo)
        if isinstance(conninfo, AsyncConnection):
            self._conn = conninfo
        elif isinstance(conninfo, AsyncConnectionPool):
            self._pool = conninfo
            # receive() connects with it; a pool's conninfo may also be a callable (psycopg_pool 3.3).
            self.conninfo = conninfo.conninfo if isinstance(conninfo.conninfo, str) else None
        else:
            if conninfo is None:
                conninfo = config.resolve_conninfo()
            self.conninfo = conninfo
            kwargs: dict[str, Any] = {"autocommit": True}
            if connect_timeout is not None or os.environ.get("LONNYMQ_CONNECT_TIMEOUT"):
                self._open_timeout = config.connect_timeout(connect_timeout)
                kwargs["connect_timeout"] = config.libpq_timeout(self._open_timeout)
            self._pool_args = (pool_size, kwargs, check_connections)
            self._pool = self._new_pool(conninfo, 1)  # grown once open (_first_connection)
            self._owns_pool = True

    @classmethod
    def embedded(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = 4,
    ) -> AsyncClient:
        """A client of the local development server (the one ``lonnymq server start`` runs, in
        ``data_dir``, default ``$LONNYMQ_DATA_DIR`` or ``~/.local/share/lonnymq/pgdata``),
        started if it is not running. The server keeps running after the client is closed
        (``lonnymq server stop`` stops it). Blocks while the server starts (seconds, longer the
        first time). Needs ``pip install 'lonnymq[embedded]'``; raises EmbeddedServerError."""
        from ..embedded import dev_server

        return cls(dev_server(data_dir).start().dsn, schema=schema, pool_size=pool_size)

    async def open(self) -> AsyncClient:
        """Open the client's own pool (done on first use if not called): wait up to
        ``connect_timeout`` (default 30 s) for its first connection.

        :raises DatabaseUnavailable: no connection in that time, or at once when the server
            turns the login down (password, role, database); names where and libpq's reason.
            Nothing stays open: a later call or ``open()`` tries again.
        :raises ClientClosed: the client was closed.
        """
        if self._closed:
            raise self._closed_error()
        if self._owns_pool and not self._opened and self._pool is not None:
            await self._first_connection(self._open_timeout)
        self._opened = True
        return self

    async def _first_connection(self, timeout: float) -> None:
        """Open the client's pool and wait up to ``timeout`` seconds for its first connection.
        Each time the pool's attempts fail anew, one plain connection attempt learns libpq's
        reason (the pool only logs it): a refusal by the server ends the wait at once. On failure
        the pool is closed and replaced by a new one, not opened, and DatabaseUnavailable raised."""
        pool = self._pool
        assert pool is not None and self.conninfo is not None
        deadline = monotonic() + timeout
        await pool.open(wait=False)
        failures = 0
        reason: str | None = None
        step = 0.05  # the pool's first attempt takes a few ms: check on it soon, then less often
        while True:
            left = deadline - monotonic()
            try:
                # getconn(), not pool.wait(): a wait that times out closes the pool.
                c = await pool.getconn(max(min(step, left), 0.001))
            except PoolTimeout:
                pass
            else:
                await pool.putconn(c)
                # Made with room for one connection, so that waiting above did not start a
                # second (a waiter grows a pool that has room): now its full size.
                await pool.resize(1, self._pool_args[0])
                return
            step = min(step * 2, 1.0)
            failed = pool.get_stats().get("connections_errors", 0)
            if failed > failures:  # the pool's attempts failed again: ask libpq why
                failures = failed
                try:
                    probe = await AsyncConnection.connect(self.conninfo, **self._probe_args(left))
                except psycopg.OperationalError as e:
                    reason = " ".join(str(e).split())
                    if config.refused(e):
                        break
                else:  # the server answers now: room for a new connection, made at once
                    await probe.close()  # (the pool's next attempt may be seconds away)
                    await pool.resize(1, self._pool_args[0])
            if deadline - monotonic() <= 0:
                reason = f"{reason or 'timed out'}; gave up after {timeout:g}s without a connection"
                break
        await pool.close()
        if self._pool is pool:
            self._pool = self._new_pool(self.conninfo, 1)
        where = config.location(self.conninfo)
        raise errors.DatabaseUnavailable(f"cannot connect to PostgreSQL at {where}: {reason}", where=where)

    def _probe_args(self, seconds: float) -> dict[str, Any]:
        """The pool's connection arguments, with libpq's connect_timeout bounded by ``seconds``
        unless the client or the conninfo sets one."""
        kwargs = dict(self._pool_args[1])
        if "connect_timeout" not in kwargs and "connect_timeout" not in (self.conninfo or ""):
            kwargs["connect_timeout"] = config.libpq_timeout(seconds)
        return kwargs

    def _closed_error(self, e: PoolClosed | None = None) -> errors.ClientClosed:
        if self._closed or e is None:
            return errors.ClientClosed("the client is closed (close() was called): make a new client")
        return errors.ClientClosed(f"the connection pool given to the client is not open: {e}")

    async def close(self) -> None:
        """Close listener connections and the pool the client created (not ones passed in).
        Later calls on a client that made its pool raise ClientClosed at once."""
        self._closed = self._owns_pool
        while self._listeners:
            await self._listeners.pop().close()
        while self._shard_pools:
            await self._shard_pools.popitem()[1].close()
        if self._owns_pool and self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(
        self, conn: AsyncConnection[Any] | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """The connection a call runs on: ``conn`` if given, else the client's own."""
        if conn is not None:
            yield conn
        elif self._conn is not None:
            yield self._conn
        else:
            if not self._opened or self._closed:
                await self.open()
            assert self._pool is not None
            async with self._pool.connection() as c:
                yield c

    async def run(self, op: Op[T], conn: AsyncConnection[Any] | None = None, *, retry: bool = True) -> T:
        """Execute one op, mapping database errors to :mod:`lonnymq.errors`. On the client's
        pool a call cut off by a lost connection is repeated under the client's retry policy
        when that is safe (``retry=False``: not this call), else raises ConnectionLost."""
        p = op.params
        # (settle_split's first test inline: most calls pass no list of ids second, and need not
        # call it.)
        if (
            len(p) > 1
            and isinstance(p[1], list)
            and (parts := settle_split(op)) is not None
            and (self._map is not None or await self.is_router(conn=conn))
        ):
            # Deliveries of several shards (a partitioned queue's): a call on each.
            return settle_merge([await self.run(part, conn, retry=retry) for part in parts])
        if conn is None and self._map is not None:
            op = self._map.canonical(op)
            if (queue := self._map.queue_of(op)) is not None:
                return await self._run_direct(op, queue, retry)
        if conn is not None or self._pool is None:
            # The caller's connection, else the client's own (self.connection(), without its
            # context manager: nothing to open or give back).
            c = conn if conn is not None else self._conn
            assert c is not None
            # A call in the caller's transaction (open, or begun by the call itself) is refused
            # on a router; once the schema is known not to be a router's, no need to look. The
            # status from pgconn, not c.info: that makes a ConnectionInfo and an enum a call.
            if self._router is not False and (
                op.caller_tx or not c.autocommit or c.pgconn.transaction_status != _IDLE
            ):
                await self._refuse_on_router(c)
            return await self._execute(c, op)
        pool = self._pool
        if op.caller_tx and self._router is not False:
            async with self.connection() as c:
                await self._refuse_on_router(c)
        return await self._run_pooled(pool, op, retry)

    async def _run_pooled(
        self, pool: AsyncConnectionPool[Any], op: Op[T], retry: bool, wait: float | None = None
    ) -> T:
        """``op`` on a connection of ``pool`` (the client's, or a shard's of a direct client)
        under the retry policy (see :meth:`run`); without retries, waiting at most ``wait``
        seconds for a connection (None: the pool's timeout)."""
        # The policy's state is made only once an attempt fails (the deadline still counts from
        # now): most calls never need it.
        policy = self.retry if retry else None
        started = monotonic()
        backoff: Backoff | None = None
        ran = False  # an attempt reached the server: it may have committed
        if pool is self._pool and not self._opened:  # (a shard's pool is opened when made)
            if policy is not None and self._owns_pool:
                # The first connection within the retry deadline (DatabaseUnavailable, a
                # ConnectionLost, if none: nothing was sent).
                await self._first_connection(min(policy.deadline, self._open_timeout))
                self._opened = True
            else:
                await self.open()
        while True:
            sent = False
            undone: float | None = None  # the wait before repeating a call the server rolled back
            try:
                if policy is None:
                    timeout = wait
                else:
                    timeout = policy.deadline if backoff is None else backoff.remaining()
                c = await pool.getconn(timeout)
            except PoolClosed as e:
                raise self._closed_error(e) from None
            except psycopg.OperationalError as e:  # no connection (PoolTimeout): nothing was sent
                lost = e
            else:
                before, ran = ran, True
                try:
                    sent = True
                    return await self._execute(c, op)
                except ROLLED_BACK:
                    # A deadlock or a serialization failure: the call is one statement in its own
                    # transaction, which the server rolled back whole, so repeating it is safe
                    # (a send without a key too) and it did not commit.
                    if backoff is None and policy is not None:
                        backoff = policy.start(started)
                    undone = None if backoff is None else backoff.next_delay()
                    if undone is None or c.broken or c.closed:
                        raise
                    ran = before
                except psycopg.OperationalError as e:
                    if not (c.broken or c.closed):
                        raise
                    lost = e
                finally:
                    await pool.putconn(c)
            if undone is not None:
                await asleep(undone)
                continue
            if backoff is None and policy is not None:
                backoff = policy.start(started)
            if backoff is None and not sent:
                raise lost  # retries off, nothing sent: the pool's own error
            unsafe = sent and not op.safe_to_retry
            delay = None if backoff is None or unsafe else backoff.next_delay()
            if delay is None:
                raise self._lost(lost, ran, op.safe_to_retry, None if unsafe else backoff) from lost
            await asleep(delay)

    async def is_router(self, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Whether the database is a shard router (``lonnymq shard init``): every call then runs
        and commits in the shard's own transaction, never in the caller's. Asked once, then
        remembered."""
        if self._router is None:
            async with self.connection(conn) as c:
                self._router = await self._execute(c, self.ops.is_router())
        return self._router

    async def _refuse_on_router(self, c: AsyncConnection[Any]) -> None:
        """Raise RouterTransaction if the schema is a shard router's: the call's promise is the
        caller's transaction, which a router cannot keep (the shard commits on its own)."""
        if self._router is None:
            self._router = await self._execute(c, self.ops.is_router())
        if self._router:
            raise errors.RouterTransaction(
                f"schema {self.schema!r} of this database is a shard router: a call through it runs"
                " and commits in the shard's own transaction, never in yours, so take_tx and calls"
                " inside your transaction are refused; to make queue actions atomic with your data,"
                " keep that data on the queue's shard and connect to the shard (docs/sharding.md)"
            )

    # -- direct routing (client/direct.py) --------------------------------------------------

    async def _run_direct(self, op: Op[T], queue: str, retry: bool) -> T:
        """``op`` on the shard of ``queue``; if the queue is not there (it moved), once more on
        the shard the re-read map names."""
        m = self._map
        assert m is not None
        fenced = m.fenced(op)
        for attempt in range(1, ATTEMPTS + 1):
            if m.stale():
                m.load(*await self._run_pooled(self._router_pool(), m.map_op(), True))
            shard = m.route(queue)
            if shard is None:
                shard = m.remember(queue, *await self._locate(queue))
            if shard < 0:
                return await self._run_partitioned(op, queue, retry, fenced)
            pool = await self._shard_pool(shard)
            try:
                return await self._run_pooled(pool, fenced, retry)
            except errors.QueueNotFound:
                m.forget(queue)
                m.load(*await self._run_pooled(self._router_pool(), m.map_op(), True))
                again = await self._locate(queue)
                if attempt == ATTEMPTS or m.remember(queue, *again) == shard:
                    raise
            except psycopg.OperationalError as e:
                if isinstance(e, errors.ConnectionLost) and e.may_have_committed:
                    raise
                raise m.unavailable(shard, e) from e
        raise AssertionError("unreachable")

    async def _run_partitioned(
        self, op: Op[T], queue: str, retry: bool, fenced: Op[T], attempt: int = 1
    ) -> T:
        """``op`` of a partitioned queue (``fenced``: behind the move fence): on the shard its
        key or ids name, or (take) on each partition in turn until one hands out messages;
        through the router when it spans partitions (direct.ShardMap.plan). A partition not
        found where the map said (it moved): the map read again and the call made again."""
        m = self._map
        assert m is not None
        if (riding := m.riding_acks(op)) is not None:  # the acks first, on their shards
            await self.run(riding[0], retry=retry)
            op = riding[1]
            fenced = m.fenced(op)
        plan = m.plan(op, queue)
        if plan is None:
            return await self._run_pooled(self._router_pool(), op, retry)
        skips = m.skips_down(op, plan)
        if skips:  # a partition whose shard is down is skipped: the others still serve
            plan = m.reachable(plan)
        result: Any = None
        answered = False
        down: tuple[int, psycopg.OperationalError] | None = None
        limit = m.merged_limit(op)
        rows: list[Any] = []  # a listing's rows from every partition (merged by id below)
        for shard in plan:
            pool = await self._shard_pool(shard)
            try:
                got = await self._run_pooled(
                    pool, fenced, retry and not skips, PARTITION_WAIT if skips else None
                )
            except errors.QueueNotFound:
                was = m.placement(queue)
                m.forget(queue)  # moved, dropped (or made again): ask the router
                if attempt < ATTEMPTS:
                    m.load(*await self._run_pooled(self._router_pool(), m.map_op(), True))
                    found = await self._locate(queue)
                    if m.remember(queue, *found) < 0 and m.placement(queue) != was:
                        return await self._run_partitioned(op, queue, retry, fenced, attempt + 1)
                raise
            except psycopg.OperationalError as e:
                if skips and not isinstance(e, ROLLED_BACK):  # (a deadlock is no shard down)
                    m.mark_down(shard)
                    down = (shard, e)
                    continue
                if isinstance(e, errors.ConnectionLost) and e.may_have_committed:
                    raise
                raise m.unavailable(shard, e) from e
            if limit is not None:
                rows += cast(list[Any], got)
            elif not m.wants_min(op):
                result = got
                if got:
                    return got
            elif got is not None and (result is None or got < result):
                result = got  # the soonest
            answered = True
        if not answered and down is not None:
            raise m.unavailable(*down) from down[1]
        if limit is not None:  # ids are unique across shards: keyset paging holds over the merge
            return cast(T, sorted(rows, key=lambda r: r.id)[:limit])
        return cast(T, result)

    async def _locate(
        self, queue: str, wait: float | None = None
    ) -> tuple[int | None, list[int] | None, dict[int, int] | None]:
        """The router's answer where ``queue`` is (``ShardMap.locate_op``), with the shard map
        read again first when the answer names a shard the map does not have (added since)."""
        m = self._map if self._map is not None else self._listen_map
        assert m is not None
        retry = wait is None
        found = await self._run_pooled(self._router_pool(), m.locate_op(queue), retry, wait)
        if m.outside(found):
            m.load(*await self._run_pooled(self._router_pool(), m.map_op(), retry, wait))
            found = await self._run_pooled(self._router_pool(), m.locate_op(queue), retry, wait)
        return found

    def _router_pool(self) -> AsyncConnectionPool[Any]:
        assert self._pool is not None
        return self._pool

    def _new_pool(self, conninfo: str, max_size: int | None = None) -> AsyncConnectionPool[Any]:
        """A pool (not open yet) of this client's size (or ``max_size``) and connection
        arguments, checking its connections when handed out if the client does
        (``check_connections``)."""
        size, kwargs, check = self._pool_args
        return AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=size if max_size is None else max_size,
            kwargs=kwargs,
            open=False,
            check=_check_connection if check else None,
        )

    async def _shard_pool(self, shard: int) -> AsyncConnectionPool[Any]:
        m = self._map
        assert m is not None and self.conninfo is not None
        key = (shard, m.shards[shard])
        pool = self._shard_pools.get(key)
        if pool is None:
            if self._closed:
                raise self._closed_error()
            pool = self._new_pool(m.conninfo(shard, self.conninfo))
            await pool.open(wait=False)
            self._shard_pools[key] = pool
        return pool

    async def _execute(self, c: AsyncConnection[Any], op: Op[T]) -> T:
        try:
            # Rows made by the op's row factory, whatever the connection's (dict_row, class_row...);
            # given to the cursor when made (not set after execute: a second row maker a call).
            cur = c.cursor(binary=True, row_factory=op.row_factory)
            await cur.execute(rendered(op.query, c), op.params)
            # Rows only if the statement made some (rownumber's test; not description, which
            # builds a Column object per column on every call: ~50 us for a 15-column take).
            res = cur.pgresult
            rows = await cur.fetchall() if res is not None and res.status == _TUPLES_OK else []
        except psycopg.Error as e:
            mapped = map_error(e)
            if mapped is e:
                raise
            raise mapped from e
        return op.decode(rows)

    @staticmethod
    def _lost(
        e: psycopg.OperationalError, ran: bool, safe: bool, exhausted: Backoff | None
    ) -> errors.ConnectionLost:
        what = f"connection to PostgreSQL lost ({str(e).strip() or type(e).__name__})"
        if exhausted is not None:
            what += f"; gave up after {exhausted.attempts} attempt(s) in {exhausted.policy.deadline:g}s"
        if ran and not safe:
            what += (
                "; the call may have committed: check before repeating it (a send: an"
                " idempotency key makes it safe to repeat, see Client(idempotent_sends=True))"
            )
        return errors.ConnectionLost(
            what,
            may_have_committed=ran,
        )

    # -- schema ----------------------------------------------------------------------------

    async def migrate(
        self,
        *,
        target: int | None = None,
        pgmq: bool = False,
        lock_timeout: float = MIGRATE_LOCK_TIMEOUT,
        attempts: int = MIGRATE_ATTEMPTS,
        retry_delay: float = MIGRATE_RETRY_DELAY,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[int]:
        """Apply the versioned migrations this package ships that the schema lacks (to
        ``target``), then, at the latest version, every function file (``lonnymq/sql/``) whose
        text changed, all in one transaction. Safe to run concurrently and repeatedly; returns
        the versions applied by this call. ``pgmq=True`` also (re)installs the pgmq facade, a
        ``pgmq`` schema with pgmq's SQL API over this schema's queues (docs/pgmq.md), in the same
        transaction; it refuses (psycopg error, SQLSTATE 55000) when the pgmq extension or
        another ``pgmq`` schema exists.

        Safe while the queues are in use: every lock is waited for at most ``lock_timeout``
        seconds (a migration that alters a table needs its strongest lock, and while it waited
        behind a long transaction holding that table, every send and take would queue behind
        it); then the transaction is rolled back and tried again, ``retry_delay`` seconds later,
        up to ``attempts`` times in all, after which :class:`~lonnymq.errors.MigrationBlocked`
        names the transactions holding the schema's tables. Concurrent migrators still wait for
        one another (their advisory lock is taken first, without the timeout)."""
        if attempts < 1 or not lock_timeout > 0 or retry_delay < 0:
            raise errors.InvalidArgument("attempts must be >= 1, lock_timeout > 0 and retry_delay >= 0")
        attempt = 1
        while True:
            try:
                return await self._migrate_once(target, pgmq, lock_timeout, conn)
            except psycopg.errors.LockNotAvailable as e:
                if attempt >= attempts:
                    raise errors.MigrationBlocked(
                        f"migrate of schema {self.schema!r} gave up after {attempts} attempt(s):"
                        f" a lock stayed held longer than lock_timeout ({lock_timeout:g} s)"
                        f"{await self._lock_holders(lock_timeout, conn)}; nothing was changed:"
                        " end the transaction holding it and migrate again"
                    ) from e
            attempt += 1
            await asleep(retry_delay)

    async def _migrate_once(
        self, target: int | None, pgmq: bool, lock_timeout: float, conn: AsyncConnection[Any] | None
    ) -> list[int]:
        s = self.schema
        async with self.connection(conn) as c, c.transaction():
            await c.execute(lock_query(s))
            cur = c.cursor(row_factory=dict_row)
            await cur.execute("SELECT current_setting('lock_timeout') AS was")
            was = await cur.fetchone()
            await c.execute(lock_timeout_query(lock_timeout))
            await c.execute(bootstrap_query(s))
            await cur.execute(applied_query(s))
            applied = {r["version"] for r in await cur.fetchall()}
            await cur.execute(recorded_query(s))
            recorded = {r["name"]: r["checksum"] for r in await cur.fetchall()}
            versions, steps = upgrade(s, applied, recorded, target)
            for step in steps:
                await c.execute(step.query)
            if pgmq:
                await cur.execute(pgmq_facade.installed_query())
                installed = await cur.fetchone()
                if versions or installed is None or installed["obj_description"] != pgmq_facade.marker(s):
                    await c.execute(pgmq_facade.install_query(s))
            # A caller's transaction goes on with its own setting.
            await c.execute("SELECT set_config('lock_timeout', %s, true)", (was["was"] if was else "0",))
        return versions

    async def _lock_holders(self, lock_timeout: float, conn: AsyncConnection[Any] | None) -> str:
        """': pid 12 (idle in transaction for 40 s: SELECT ...), ...', the sessions holding the
        schema's tables for longer than ``lock_timeout``, or '' (none found, or no permission)."""
        try:
            async with self.connection(conn) as c, c.transaction():
                cur = await c.execute(blockers_query(self.schema), (f"{lock_timeout} seconds",))
                rows = await cur.fetchall()
        except psycopg.Error:
            return ""
        return (
            ": " + ", ".join(f"pid {p} ({st} for {secs} s: {q})" for p, st, secs, q in rows) if rows else ""
        )

    async def uninstall_pgmq(self, *, conn: AsyncConnection[Any] | None = None) -> None:
        """Drop the pgmq facade (the ``pgmq`` schema) if installed over this schema. LonnyMQ's
        schema, queues and messages are untouched. Refuses (SQLSTATE 55000) to drop a ``pgmq``
        schema that is not this facade."""
        async with self.connection(conn) as c, c.transaction():
            await c.execute(pgmq_facade.uninstall_query(self.schema))

    install = migrate

    # -- queues ----------------------------------------------------------------------------

    async def create_queue(
        self,
        name: str,
        *,
        lease: float | timedelta = 30,
        max_attempts: int = 5,
        dead_letter_queue: str | None = None,
        archive: bool = False,
        retention: float | timedelta = 7 * 24 * 3600,
        unlogged: bool = False,
        max_payload_bytes: int = 1024 * 1024,
        priority_step: float | timedelta = 1,
        if_not_exists: bool = False,
        channel_max_concurrency: int | None = None,
        channel_release_interval: float | timedelta | None = None,
        channel_max_size: int | None = None,
        channel_on_full: OnFull = "reject",
        partitions: int | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Create a queue. ``lease``: default visibility timeout (seconds). ``max_attempts``:
        failed deliveries before dead-lettering. ``dead_letter_queue``: queue that receives dead
        messages (else they go to the archive with status ``dead``). ``archive``: acks keep the
        message in the archive for ``retention`` seconds. ``unlogged``: faster, but the queue is
        emptied by a PostgreSQL crash. ``priority_step``: seconds one priority level is worth.
        ``channel_*``: the policy of each channel a message creates (see :meth:`set_channel`).
        ``partitions`` (a shard router only, docs/sharding.md): one hot queue over that many
        shards, a partition on each; keyed sends go to their key's partition, takes visit the
        partitions in turn. Returns False if it existed and ``if_not_exists``; raises
        QueueExists otherwise."""
        if partitions is not None and not await self.is_router(conn=conn):
            raise errors.InvalidArgument("partitions= needs a shard router (lonnymq shard init)")
        op = self.ops.queue_create(
            name,
            lease=lease,
            max_attempts=max_attempts,
            dead_letter_queue=dead_letter_queue,
            archive=archive,
            retention=retention,
            unlogged=unlogged,
            max_payload_bytes=max_payload_bytes,
            priority_step=priority_step,
            if_not_exists=if_not_exists,
            channel_max_concurrency=channel_max_concurrency,
            channel_release_interval=channel_release_interval,
            channel_max_size=channel_max_size,
            channel_on_full=channel_on_full,
            partitions=partitions,
        )
        return await self.run(op, conn)

    async def drop_queue(
        self, name: str, *, if_exists: bool = False, conn: AsyncConnection[Any] | None = None
    ) -> bool:
        """Drop a queue with its messages and archive."""
        return await self.run(self.ops.queue_drop(name, if_exists=if_exists), conn)

    async def purge_queue(self, name: str, *, conn: AsyncConnection[Any] | None = None) -> None:
        """Delete every message of the queue at once (the archive is kept)."""
        await self.run(self.ops.queue_purge(name), conn)

    async def pause_queue(self, name: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Pause the queue: sends are still accepted, but take, take_tx and receive hand out
        nothing (workers idle) until :meth:`resume_queue`. Messages already leased keep their
        lease and can be acked, nacked and extended. A take already running when the pause
        commits may still deliver. Returns False if it was paused already."""
        return await self.run(self.ops.queue_pause(name), conn)

    async def resume_queue(self, name: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Resume a paused queue: its ready messages are handed out again in the usual order,
        and consumers waiting on it (receive, workers) are woken. Returns False if it was not
        paused."""
        return await self.run(self.ops.queue_resume(name), conn)

    async def list_queues(
        self, *, limit: int | None = None, after: str | None = None, conn: AsyncConnection[Any] | None = None
    ) -> list[QueueInfo]:
        """The queues with their settings, by name: all of them, or ``limit`` at a time after the
        name ``after`` (keyset paging: pass the last name of a page to get the next)."""
        return await self.run(self.ops.queue_list(limit=limit, after=after), conn)

    async def metrics(
        self, queue: str, *, cap: int | None = None, conn: AsyncConnection[Any] | None = None
    ) -> QueueMetrics:
        """Exact counts of ready, scheduled, leased and dead messages, total sent, ages of the
        oldest and newest live message, all on one snapshot. ``cap``: stop each count at this
        many rows (cheap on huge queues); a count that reached it has its ``*_at_least`` flag
        set."""
        return await self.run(self.ops.queue_metrics(queue, cap=cap), conn)

    # -- channels --------------------------------------------------------------------------

    async def set_channel(
        self,
        queue: str,
        channel: str,
        *,
        max_concurrency: int | None = None,
        release_interval: float | timedelta | None = None,
        max_size: int | None = None,
        on_full: OnFull = "reject",
        conn: AsyncConnection[Any] | None = None,
    ) -> ChannelInfo:
        """Configure ``channel`` of ``queue`` (created if needed, kept while empty); this
        policy replaces the queue's channel defaults. ``max_concurrency``: at most this many of
        its messages leased at once, across all consumers (1: strict FIFO, a retried message
        keeps its place). ``release_interval`` (seconds): at least this long between two
        deliveries. ``max_size``: at most this many messages; a send beyond it raises
        ChannelFull (``on_full="reject"``, nothing of the batch is written) or is reported
        ``dropped`` (``on_full="drop"``). None is unlimited. Applies from the next delivery or
        send; messages already leased or queued stay. Returns the channel."""
        op = self.ops.channel_set(
            queue,
            channel,
            max_concurrency=max_concurrency,
            release_interval=release_interval,
            max_size=max_size,
            on_full=on_full,
        )
        return await self.run(op, conn)

    async def reset_channel(
        self, queue: str, channel: str, *, conn: AsyncConnection[Any] | None = None
    ) -> bool:
        """Give a configured channel back the queue's defaults (it goes once empty). Returns
        False if it was not configured."""
        return await self.run(self.ops.channel_reset(queue, channel), conn)

    async def channels(
        self,
        queue: str,
        *,
        limit: int = 1000,
        after: str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[ChannelInfo]:
        """The channels of ``queue`` by name (``limit`` of them after ``after``): each
        configured one and each holding messages, with its policy, size and leases."""
        return await self.run(self.ops.channel_list(queue, limit=limit, after=after), conn)

    # -- send ------------------------------------------------------------------------------

    async def send(
        self,
        queue: str,
        payload: Any,
        *,
        kind: str | None = None,
        headers: dict[str, Any] | None = None,
        delay: float | timedelta | None = None,
        at: datetime | int | None = None,
        priority: int = 0,
        key: str | None = None,
        channel: str | None = None,
        on_conflict: OnConflict = "ignore",
        idempotency_key: uuid.UUID | str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> SendResult:
        """Enqueue one message. ``payload``: bytes (stored as is), str, or a JSON value.
        ``delay`` (seconds) or ``at`` (aware datetime or epoch ms): not deliverable before then.
        ``priority`` in -100..100: delivered as if sent ``priority * priority_step`` earlier.
        ``key``: at most one live message per key and queue; ``on_conflict`` says what a second
        send does: ``ignore`` it, ``replace`` the live message unless it is leased, or ``error``
        (DuplicateKey). ``channel``: a tenant or group key; take serves channels round robin,
        each within its limits (see :meth:`set_channel`); a full channel raises ChannelFull or
        drops the message (outcome ``dropped``). Commits with ``conn``'s transaction when
        ``conn`` is given. ``idempotency_key`` (a UUID): a send with a key the queue has seen
        within ``lonnymq.send_key_retention`` (1 hour) creates nothing and returns the first
        send's result; without one, the client makes one for each call it may repeat
        (``idempotent_sends``), so its retries never create a second message."""
        op = self.ops.send(
            queue,
            payload,
            kind=kind,
            headers=headers,
            delay=delay,
            at=at,
            priority=priority,
            key=key,
            channel=channel,
            on_conflict=on_conflict,
            send_key=self._send_key(idempotency_key, conn),
        )
        return await self.run(op, conn)

    async def send_batch(
        self,
        queue: str,
        messages: Iterable[Envelope | Any],
        *,
        on_conflict: OnConflict = "ignore",
        idempotency_key: uuid.UUID | str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[SendResult]:
        """Enqueue many messages in one round trip and one transaction, in order (FIFO).
        Items are :class:`Envelope` or bare payloads. All or nothing: one bad item writes none.
        ``idempotency_key``: one for the whole call, as for :meth:`send`."""
        op = self.ops.send_batch(
            queue, messages, on_conflict=on_conflict, send_key=self._send_key(idempotency_key, conn)
        )
        return await self.run(op, conn)

    def _send_key(self, given: uuid.UUID | str | None, conn: AsyncConnection[Any] | None) -> uuid.UUID | None:
        """The idempotency key of a send call: the caller's, else a new one when the client may
        repeat the call (its own pool and a retry policy; never in a caller's transaction), else
        none (a key is a write: not paid where no retry can happen)."""
        if given is not None:
            return check_send_key(given)
        if self.idempotent_sends and conn is None and self._conn is None and self.retry is not None:
            return new_send_key()
        return None

    # -- take ------------------------------------------------------------------------------

    async def take(
        self,
        queue: str,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        ack: Sequence[Message] = (),
        conn: AsyncConnection[Any] | None = None,
    ) -> list[Message]:
        """Lease up to ``n`` ready messages for ``lease`` seconds (queue default), oldest
        ``dequeue_at`` first, FIFO among equals; never waits for messages others hold. Returns
        [] if none is ready. ``ack``: earlier deliveries to acknowledge in the same round trip."""
        return await self.run(self.ops.take(queue, n, lease=lease, ack=ack), conn)

    async def take_tx(
        self, queue: str, n: int = 1, *, archive: bool | None = None, conn: AsyncConnection[Any] | None = None
    ) -> list[Message]:
        """Take up to ``n`` ready messages inside ``conn``'s transaction: they are gone when it
        commits and back, untouched, if it rolls back (exactly-once with your own writes).
        Refused on a shard router (RouterTransaction): it cannot join your transaction."""
        return await self.run(self.ops.take_tx(queue, n, archive=archive), conn)

    async def receive(
        self,
        queue: str,
        n: int = 1,
        *,
        timeout: float | None = None,
        lease: float | timedelta | None = None,
        poll: float = 5.0,
    ) -> list[Message]:
        """Like :meth:`take`, but wait up to ``timeout`` seconds (forever if None) for messages:
        woken by NOTIFY on send (while it waits it is registered as a waiter on the queue, so
        sends notify), and by the clock when the next scheduled message comes due; ``poll``
        bounds each wait as a fallback. Returns [] on timeout."""
        op = self.ops.take(queue, n, lease=lease)
        limit = to_ms(timeout, "timeout")
        to_ms(poll, "poll", positive=True)
        deadline = None if limit is None else monotonic() + limit / 1000
        listener: AsyncListener | ShardListener | None = None
        registered = False
        pending: list[str] = []  # sends that may have missed the registration, still running
        try:
            while True:
                messages = await self.run(op)
                if messages:
                    return messages
                if deadline is not None and deadline <= monotonic():
                    return []
                wait = poll
                try:
                    if listener is None:
                        listener = await self.listener()
                    if not registered:
                        # Register, then look once more: every later send notifies, and one
                        # that missed the registration has usually committed by now.
                        pending = await listener.register(self.schema, queue)
                        registered = True
                        continue
                    if pending:
                        # Some had not: look again once they have (checked every PENDING_WAIT).
                        pending = await listener.pending(self.schema, pending)
                        if not pending:
                            continue
                    due_ms = await self.run(self.ops.next_ready_in(queue))
                    wait = next_wait(poll, due_ms, deadline)
                    await listener.wait(min(wait, PENDING_WAIT) if pending else wait)
                except psycopg.OperationalError:
                    if self.retry is None:
                        raise
                    # The LISTEN connection is gone (a restart, a failover): look again at once
                    # (run() rides out the outage), and listen on a new connection next time.
                    if listener is None:
                        await asleep(max(next_wait(wait, None, deadline), 0))
                    else:
                        await listener.close()
                        listener = None
                        registered = False
        except BaseException:
            # The listener may be broken or mid-wait (cancelled): never hand it out again.
            if listener is not None:
                await listener.close()
            raise
        finally:
            if listener is not None and not listener.closed:
                try:
                    if registered:
                        await listener.unregister(self.schema, queue)
                except psycopg.Error:
                    await listener.close()
                else:
                    self._listeners.append(listener)

    async def listener(self) -> AsyncListener | ShardListener:
        """A listener to wait for this client's queues' messages on (``receive()`` and the
        worker use it; close it when done): one LISTEN connection on a single server; on a shard
        router (``direct`` or not) a :class:`~lonnymq.client.wait.ShardListener`, which listens
        on the shards holding the queues it waits on, where their sends notify. Raises
        InvalidArgument for a client made from a connection (a listener needs a conninfo)."""
        if self._listeners:
            return self._listeners.pop()
        if self.conninfo is None:
            raise errors.InvalidArgument("receive() needs a client made from a conninfo or a pool")
        if self._map is not None or await self.is_router():
            return ShardListener(self, self.ops.st.listen)
        return await AsyncListener.connect(self.conninfo, self.ops.st.listen)

    async def _listen_shards(self, queue: str, *, fresh: bool = False) -> dict[int, str]:
        """The shards of a router holding ``queue`` (one, or its partitions'): index -> conninfo,
        from the shard map (the direct client's own; else one read just for listening); none
        when the router predates the map (``lonnymq shard upgrade``): then waits poll. Asks the
        router without retries, waiting at most PARTITION_WAIT for a connection."""
        m = self._map
        if m is None:
            m = self._listen_map = self._listen_map or ShardMap(self.schema, self.ops.st)
        assert self.conninfo is not None
        router = self._router_pool()
        try:
            if fresh:
                m.forget(queue)
            if fresh or m.stale():
                m.load(*await self._run_pooled(router, m.map_op(), False, PARTITION_WAIT))
            shard = m.route(queue)
            if shard is None:
                shard = m.remember(queue, *await self._locate(queue, PARTITION_WAIT))
        except errors.NotInstalled:
            if self._map is not None:
                raise
            return {}
        shards = m.partitions(queue) if shard < 0 else [shard]
        return {i: listen_conninfo(m.conninfo(i, self.conninfo)) for i in shards}

    def _listen_recheck(self) -> float:
        """When (monotonic) the shard map :meth:`_listen_shards` reads is to be read again."""
        m = self._map if self._map is not None else self._listen_map
        if m is None or m.version is None:
            return monotonic() + MAP_TTL
        return m.loaded_at + m.ttl

    async def peek(
        self, queue: str, n: int = 10, *, conn: AsyncConnection[Any] | None = None
    ) -> list[Message]:
        """The next ``n`` messages in delivery order (ready or not), without leasing them."""
        return await self.run(self.ops.peek(queue, n), conn)

    # -- settle ----------------------------------------------------------------------------

    async def ack(
        self,
        messages: Message | Sequence[Message],
        *,
        archive: bool | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> set[int]:
        """Acknowledge deliveries: delete them (or archive them, per queue or ``archive``).
        Returns the ids acknowledged; a delivery whose token is stale is left untouched. For a
        single message, a stale token raises LeaseLost. Idempotent: acking a delivery that this
        same delivery already acked (a retry after a lost reply, within an hour) succeeds and
        changes nothing."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        return settled(messages, await self.run(self.ops.ack(batch, archive=archive), conn))

    async def nack(
        self,
        messages: Message | Sequence[Message],
        *,
        delay: float | timedelta | Sequence[float | timedelta] = 0,
        error: str | Sequence[str | None] | None = None,
        state: Any = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> dict[int, str]:
        """Report failed deliveries: each is retried after ``delay`` seconds, or dead-lettered
        if it was its last attempt. Returns {id: "retry" | "dead"}; stale tokens are left out
        (for a single message: LeaseLost). A repeat by the delivery that already gave the
        message back reports the same outcome and changes nothing."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        op = self.ops.nack(batch, delay=delay, error=error, state=state)
        return settled(messages, await self.run(op, conn))

    async def defer(
        self,
        messages: Message | Sequence[Message],
        *,
        delay: float | timedelta | Sequence[float | timedelta] = 0,
        state: Any = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> dict[int, str]:
        """Give deliveries back to run again after ``delay`` seconds, keeping ``state`` (a JSON
        checkpoint the next delivery sees). Does not count as a failed attempt."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        op = self.ops.nack(batch, delay=delay, state=state, count_attempt=False)
        return settled(messages, await self.run(op, conn))

    async def release(
        self, messages: Message | Sequence[Message], *, conn: AsyncConnection[Any] | None = None
    ) -> dict[int, str]:
        """Give deliveries back for immediate redelivery (e.g. on shutdown), uncounted."""
        return await self.defer(messages, conn=conn)

    async def extend(
        self,
        messages: Message | Sequence[Message],
        *,
        lease: float | timedelta | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> dict[int, int]:
        """Heartbeat: push the leases to now + ``lease`` seconds (queue default). Returns
        {id: lease_until}; stale tokens are left out (for a single message: LeaseLost)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        return settled(messages, await self.run(self.ops.extend(batch, lease=lease), conn))

    # -- dead letters and housekeeping -----------------------------------------------------

    async def dead_letters(
        self,
        queue: str,
        n: int = 100,
        *,
        after_id: int | None = 0,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[DeadMessage]:
        """Up to ``n`` dead messages of ``queue`` kept in the archive, by id: those after
        ``after_id`` (pass the last id of a page to get the next), dead-lettered in
        [``since``, ``until``) when given (aware datetimes or epoch ms)."""
        op = self.ops.dead_list(queue, n, after_id=after_id, since=since, until=until)
        return await self.run(op, conn)

    # -- one message -----------------------------------------------------------------------

    async def get(
        self,
        queue: str,
        *,
        id: int | None = None,
        key: str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> Message | None:
        """The live message of ``queue`` with this ``id`` or ``key`` (give one), without taking
        it; its ``status`` is ``ready``, ``scheduled`` or ``leased``. None when no live message
        matches (settled, cancelled, dead-lettered or unknown). The result is a snapshot, not a
        delivery: do not settle it."""
        return await self.run(self.ops.message_get(queue, id=id, key=key), conn)

    @overload
    async def cancel(
        self,
        queue: str,
        *,
        id: int | None = None,
        key: str | None = None,
        archive: bool = False,
        conn: AsyncConnection[Any] | None = None,
    ) -> bool: ...

    @overload
    async def cancel(
        self,
        queue: str,
        *,
        ids: Sequence[int],
        archive: bool = False,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[int]: ...

    async def cancel(
        self,
        queue: str,
        *,
        id: int | None = None,
        key: str | None = None,
        ids: Sequence[int] | None = None,
        archive: bool = False,
        conn: AsyncConnection[Any] | None = None,
    ) -> bool | list[int]:
        """Remove live messages (ready, scheduled or leased) without holding their lease:
        one by ``id`` or ``key`` (returns whether it was live), or many by ``ids`` (returns the
        ids removed, in id order). ``archive``: keep them in the archive as ``cancelled``. A
        leased message is removed from under its holder, whose later ack/nack/extend raises
        LeaseLost; it never comes back."""
        if ids is not None:
            if id is not None or key is not None:
                raise errors.InvalidArgument("give ids, or one id or key, not both")
            return await self.run(self.ops.message_cancel(queue, ids=ids, archive=archive), conn)
        if (id is None) == (key is None):
            raise errors.InvalidArgument("give exactly one of id, key and ids")
        op = self.ops.message_cancel(
            queue, ids=() if id is None else [id], keys=() if key is None else [key], archive=archive
        )
        removed = await self.run(op, conn)
        return bool(removed)

    async def archived(
        self,
        queue: str,
        *,
        after_id: int | None = None,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
        limit: int = 100,
        status: ArchiveStatus | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[ArchivedMessage]:
        """Up to ``limit`` archived messages of ``queue`` (acked with archiving on, dead,
        cancelled with ``archive=True``; or only ``status``), by id: those after ``after_id``
        (pass the last id of a page to get the next), archived in [``since``, ``until``) when
        given (aware datetimes or epoch ms). Acked ones are kept for the queue's retention."""
        op = self.ops.archive_list(
            queue, after_id=after_id, since=since, until=until, limit=limit, status=status
        )
        return await self.run(op, conn)

    async def requeue_dead(
        self, queue: str, ids: Sequence[int] | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> int:
        """Put dead messages (all or ``ids``) back as new ready messages; returns how many."""
        return await self.run(self.ops.dead_requeue(queue, ids), conn)

    async def purge_dead(self, queue: str, *, conn: AsyncConnection[Any] | None = None) -> int:
        return await self.run(self.ops.dead_purge(queue), conn)

    async def maintain(self, *, limit: int = 10_000, conn: AsyncConnection[Any] | None = None) -> int:
        """Delete archived acks older than their queue's retention (at most ``limit``)."""
        return await self.run(self.ops.maintain(limit), conn)
