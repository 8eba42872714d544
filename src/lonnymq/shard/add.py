"""Doubling a router's shard count while clients run (:func:`add`): pin the queues whose hash
moves and add the shards in one router transaction, then move each pinned queue to its new
shard with :func:`lonnymq.shard.move.move`."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .. import errors
from ..migrations import DEFAULT_SCHEMA, check_schema
from . import admin, catalog, partitions
from .move import MoveBlocked, MoveResult, move

__all__ = ["AddResult", "add"]


@dataclass(frozen=True, slots=True)
class AddResult:
    """What :func:`add` did: the shard count before and after, the queues and partitions it
    moved to the new shards (with what each move reported; a partition's has
    ``MoveResult.partition``), and those it could not move (queue, or ``"<queue> partition
    <k>"``, -> error; each stays, whole, where it was: a plain queue on its old shard, routed
    there by an override; move it later with :func:`move`, or run :func:`add` again)."""

    before: int
    after: int
    moved: list[MoveResult]
    failed: dict[str, str]


def add(
    router_dsn: str,
    new_shard_dsns: Sequence[str],
    *,
    schema: str = DEFAULT_SCHEMA,
    pgmq: bool = False,
    lock_timeout: float = 1.0,
    attempts: int = 5,
    retry_delay: float = 0.5,
) -> AddResult:
    """Double the router's shard count with ``new_shard_dsns`` (as many as it has), while
    clients keep calling through the router, then move the queues whose hash now names a new
    shard there (:func:`move`, one queue and its dead-letter links at a time).

    Migrates the new shards (they must hold no queues), then in one router transaction, holding
    the lock that ``queue_create`` waits for (asked with ``lock_timeout``, ``attempts`` times):
    pins every queue whose hash moves to the shard it is on (an override), and adds the new
    shards to the cluster (PL/Proxy's shard ``i + n`` takes the queues of shard ``i`` whose hash
    has bit ``n`` set). From then on every call finds its queue, and new queues are created
    where the new count says. Each pinned queue then moves with the guarantees of :func:`move`
    (exactly once, a short pause of that queue); then each partition of a partitioned queue
    whose place under the new count (partition k on ``(hash + k) mod shards``, as
    ``queue_create_partitioned`` places it) is a new shard moves there, one partition at a
    time (:func:`move` with ``partition=``, the same guarantees). One that cannot move is
    reported in ``AddResult.failed`` and stays where it is. Run it again with the same shards
    to retry those (it only moves)."""
    check_schema(schema)
    dsns = admin.shard_dsns(router_dsn, schema=schema)
    with admin._connect(router_dsn, "router", autocommit=True) as router:
        admin.check_movable(router, schema)
    n = len(dsns)
    fresh = list(new_shard_dsns)
    if not fresh:
        raise errors.InvalidArgument("give the new shards' DSNs")
    # The same shards again (a retry after failed moves): they are there already, only move.
    retry = 2 * len(fresh) == n and all(_same_db(d, x) for d, x in zip(dsns[n // 2 :], fresh, strict=True))
    if not retry and len(fresh) != n:
        raise errors.InvalidArgument(
            f"the router has {n} shard(s): give {n} new ones to double it (PL/Proxy needs a power of two)"
        )
    if not retry:
        for d in fresh:
            if any(_same_db(d, x) for x in dsns):
                raise errors.InvalidArgument(f"{admin.where(d)} is already a shard of this router")
        partitions, _ = admin._partitions([*dsns, *fresh])
        if len(set(partitions)) != len(partitions):
            raise errors.InvalidArgument("a shard is given twice: each shard must be its own database")
        _prepare_new_shards(fresh, schema, pgmq, n)
        _widen(router_dsn, schema, fresh, partitions[n:], n, lock_timeout, attempts, retry_delay)
        before, after = n, 2 * n
    else:  # a retry with the shards already added: only the moves
        before, after = n // 2, n
    # Every move of an add: with the archive, each lock asked for as the caller said.
    mover = functools.partial(
        move,
        router_dsn,
        schema=schema,
        archive=True,
        lock_timeout=lock_timeout,
        attempts=attempts,
        retry_delay=retry_delay,
    )
    result = _rehome(router_dsn, schema, before, after, mover)
    planned = _partition_moves(router_dsn, schema, before, after)
    wanted = {(q, k): target for q, k, target in planned}
    done: set[tuple[str, int]] = set()
    for q, k, target in planned:
        if (q, k) in done:
            continue

        # A dead-letter queue's partition takes the partitions feeding it on its shard along
        # when each of those belongs on the same new shard too (else it stays with them).
        def along(parts: Mapping[str, int], target: int = target) -> bool:
            return all(wanted.get(p) == target for p in parts.items())

        try:
            moved = mover(q, target, partition=k, feeders=along)
        except errors.QueueNotFound:
            continue  # dropped meanwhile: nothing left to move
        except errors.LonnyMQError as e:
            result.failed[f"{q} partition {k}"] = str(e)
            continue
        result.moved.append(moved)
        done.update((moved.partitions or {q: k}).items())
    for q, k in done:  # a feeder refused before its dead-letter queue's partition took it along
        result.failed.pop(f"{q} partition {k}", None)
    return result


def _homes(router: psycopg.Connection[Any], names: Iterable[str], shards: int) -> dict[str, int]:
    """The shard each queue's name hashes to among ``shards`` (PL/Proxy's rule)."""
    rows = router.execute(
        "SELECT n, hashtext(n) & %s FROM unnest(%s::text[]) AS n", (shards - 1, sorted(names))
    ).fetchall()
    return {str(n): int(h) for n, h in rows}


def _partition_moves(router_dsn: str, schema: str, before: int, after: int) -> list[tuple[str, int, int]]:
    """The partitions that move onto the new shards, as (queue, partition, target): partition k
    of a partitioned queue goes to ``(hash + k) mod after`` (its place had the queue been created
    with ``after`` shards) when that is a new shard (``>= before``) holding none of its
    partitions. A partition created with ``before`` shards and not moved by hand is on
    ``(hash + k) mod before``, the same shard modulo ``before``: so each moves to its old
    shard's new twin or stays, and no two go to the same shard."""
    with admin._connect(router_dsn, "router", autocommit=True) as router:
        parted = admin.partitioned(router, schema)
        homes = _homes(router, parted, after)
    moves: list[tuple[str, int, int]] = []
    for q in sorted(parted):
        parts = parted[q]
        for k in range(len(parts)):
            want = (int(homes[q]) + k) % after
            if want >= before and want not in parts:
                moves.append((q, k, want))
    return moves


def _same_db(a: str, b: str) -> bool:
    keys = ("host", "hostaddr", "port", "dbname")
    try:
        da, db = conninfo_to_dict(a), conninfo_to_dict(b)
    except psycopg.ProgrammingError as e:
        raise errors.InvalidArgument(f"a shard DSN does not parse: {e}") from None
    return all(str(da.get(k) or "") == str(db.get(k) or "") for k in keys)


def _prepare_new_shards(fresh: Sequence[str], schema: str, pgmq: bool, first: int) -> None:
    from ..client import Client

    s = sql.Identifier(schema)
    for i, dsn in enumerate(fresh):
        with admin._connect(dsn, f"new shard {i}", autocommit=True) as conn:
            state = admin._router_state(conn, schema)
        if state is not None and state.startswith(catalog.ROUTER_MARKER):
            raise errors.InvalidArgument(f"{admin.where(dsn)} is itself a lonnymq router")
        with Client(dsn, schema=schema, pool_size=1) as c:
            c.migrate(pgmq=pgmq)
        admin.stride_ids(dsn, schema, first + i)  # the shard's index once added
        with admin._connect(dsn, f"new shard {i}", autocommit=True) as conn:
            names = [
                r[0]
                for r in conn.execute(sql.SQL("SELECT name FROM {}.queue ORDER BY name LIMIT 5").format(s))
            ]
        if names:
            raise errors.InvalidArgument(
                f"new shard {admin.where(dsn)} already holds queues ({', '.join(names)}...): give empty databases"
            )


def _widen(
    router_dsn: str,
    schema: str,
    fresh: Sequence[str],
    new_partitions: Sequence[str],
    n: int,
    lock_timeout: float,
    attempts: int,
    retry_delay: float,
) -> None:
    """Pin the queues whose hash moves and add the new partitions, in one router transaction
    under the map lock (queue_create waits on it)."""
    s = sql.Identifier(schema)
    dsns = admin.shard_dsns(router_dsn, schema=schema)
    timeout_ms = max(1, int(lock_timeout * 1000))
    with admin._connect(router_dsn, "router") as router:
        for attempt in range(1, attempts + 1):
            try:
                with router.transaction():
                    router.execute(
                        sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{timeout_ms}ms"))
                    )
                    router.execute("SELECT pg_advisory_xact_lock(hashtext(%s || '/map'), 0)", (schema,))
                    overrides = admin.routes(router, schema)
                    # Partitioned queues are not pinned: their partitions have their own places
                    # (shard_partition); those whose place is a new shard move after (_partition_moves).
                    overrides.update(
                        dict.fromkeys(admin.partitioned(router, schema), partitions.PARTITIONED_MARK)
                    )
                    pins: list[tuple[str, int]] = []
                    for i, dsn in enumerate(dsns):
                        with admin._connect(dsn, f"shard {i}", autocommit=True) as conn:
                            names = [
                                str(r[0])
                                for r in conn.execute(sql.SQL("SELECT name FROM {}.queue").format(s))
                            ]
                        moving = router.execute(
                            "SELECT n FROM unnest(%s::text[]) AS n WHERE hashtext(n) & %s <> %s",
                            (names, 2 * n - 1, i),
                        ).fetchall()
                        pins += [(str(r[0]), i) for r in moving if str(r[0]) not in overrides]
                    with router.cursor() as cur:
                        cur.executemany(
                            sql.SQL("INSERT INTO {}.shard_route (queue, shard) VALUES (%s, %s)").format(s),
                            pins,
                        )
                    options = sql.SQL(", ").join(
                        sql.SQL("ADD {} {}").format(sql.Identifier(f"p{n + k}"), sql.Literal(p))
                        for k, p in enumerate(new_partitions)
                    )
                    router.execute(
                        sql.SQL("ALTER SERVER {} OPTIONS ({})").format(
                            sql.Identifier(catalog.cluster_name(schema)), options
                        )
                    )
                    router.execute(catalog.bump_version(schema))
                    router.execute(
                        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                            s,
                            sql.Literal(
                                f"{catalog.ROUTER_MARKER}: {2 * n} shards, cluster {catalog.cluster_name(schema)}"
                            ),
                        )
                    )
                return
            except pg_errors.LockNotAvailable as e:
                if attempt == attempts:
                    raise MoveBlocked(
                        f"adding shards gave up after {attempts} attempt(s): a queue_create call held"
                        f" the shard map longer than lock_timeout ({lock_timeout:g} s)"
                        f" ({' '.join(str(e).split())}); nothing was changed"
                    ) from e
                time.sleep(retry_delay)


def _rehome(
    router_dsn: str, schema: str, before: int, after: int, mover: Callable[..., MoveResult]
) -> AddResult:
    """Move each queue pinned away from the shard its hash names (queue by queue)."""
    moved: list[MoveResult] = []
    failed: dict[str, str] = {}
    done: set[str] = set()
    with admin._connect(router_dsn, "router", autocommit=True) as router:
        pinned = admin.routes(router, schema)
        homes = _homes(router, pinned, after)
    for q in sorted(pinned):
        # Only queues that the doubling pinned (on an old shard, hashed to its new twin).
        home = int(homes[q])
        if q in done or pinned[q] >= before or home != pinned[q] + before:
            continue
        try:
            result = mover(q, home)
        except errors.QueueNotFound:
            # Dropped since it was pinned: its override has nothing left to route.
            with admin._connect(router_dsn, "router", autocommit=True) as router:
                router.execute(
                    sql.SQL("DELETE FROM {}.shard_route WHERE queue = %s").format(sql.Identifier(schema)),
                    (q,),
                )
            continue
        except errors.LonnyMQError as e:
            failed[q] = str(e)
            continue
        moved.append(result)
        done.update(result.queues)
    return AddResult(before, after, moved, failed)
