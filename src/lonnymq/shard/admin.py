"""Setting up a router over shards (:func:`init`) and looking at it (:func:`status`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from .. import errors
from ..client import Client
from ..client.config import location
from ..migrations import DEFAULT_SCHEMA, check_schema
from ..migrations import pgmq as pgmq_facade
from . import catalog, partitions, pgmq_parts

#: A partitioned queue's row in shard_route (its mark, not a shard).
_MARK = partitions.PARTITIONED_MARK

#: libpq's connect_timeout of the router's connections to the shards, unless a DSN gives one.
CONNECT_TIMEOUT = 5

#: Seconds to wait for a shard when checking its health.
STATUS_CONNECT_TIMEOUT = 3


class InitBlocked(errors.LonnyMQError):
    """``shard init`` (or ``shard upgrade``) could not get the router's locks within its
    lock_timeout through every attempt; the router was left as it was."""


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One shard as :func:`status` saw it: ``healthy`` when it answered and holds the router's
    schema version; ``queues`` are those it holds; ``misplaced`` those among them that the router
    would route elsewhere (left over from a move or an init with other shards)."""

    index: int
    where: str  # user@host:port/dbname, no password
    healthy: bool
    error: str | None = None
    version: int | None = None
    queues: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RouterStatus:
    """A router: its schema version, its shards, and ``overrides``, the queues routed to a
    shard other than their hash's (moved with :func:`lonnymq.shard.move`): queue -> shard."""

    schema: str
    version: int
    shards: list[ShardStatus]
    overrides: dict[str, int] = field(default_factory=dict)
    #: The partitioned queues (one hot queue over several shards): queue -> its partitions'
    #: shards, partition k at index k.
    partitioned: dict[str, list[int]] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return all(s.healthy and not s.misplaced for s in self.shards)

    @property
    def degraded(self) -> dict[str, list[int]]:
        """The partitioned queues with a partition on an unhealthy shard: queue -> those
        shards. Their takes skip those partitions (serving the others); sends and settles that
        belong there fail with ShardUnavailable."""
        down = {s.index for s in self.shards if not s.healthy}
        return {q: [i for i in p if i in down] for q, p in self.partitioned.items() if down & set(p)}


def where(dsn: str) -> str:
    """Where a DSN points, without its password: ``user@host:port/dbname``."""
    return location(dsn)


def _partitions(shard_dsns: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Each shard's conninfo without user and password (key=value form, which PL/Proxy wants),
    and the user mapping's options: the user and password, one for every shard, so they are kept
    in the user mapping (hidden from non-superusers), not in the server's options."""
    parts = []
    creds: set[tuple[str | None, str | None]] = set()
    for dsn in shard_dsns:
        try:
            d = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise errors.InvalidArgument(f"shard DSN {dsn!r} does not parse: {e}") from None
        user = d.pop("user", None)
        password = d.pop("password", None)
        creds.add((None if user is None else str(user), None if password is None else str(password)))
        # A shard that does not answer fails its calls within seconds (a refused connection: at once).
        d.setdefault("connect_timeout", CONNECT_TIMEOUT)
        parts.append(make_conninfo(**{k: str(v) for k, v in d.items()}))
    if len(creds) > 1:
        raise errors.InvalidArgument(
            "the shard DSNs name different users or passwords: give every shard the same ones"
            " (the router's user mapping holds a single pair)"
        )
    user, password = creds.pop()
    mapping = {k: v for k, v in (("user", user), ("password", password)) if v is not None}
    return parts, mapping


def _check_count(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise errors.InvalidArgument(
            f"{n} shard(s) given: PL/Proxy hashes over a power-of-two number of shards (1, 2, 4, 8...)"
        )


def _connect(dsn: str, what: str, **kwargs: Any) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, **kwargs)
    except psycopg.OperationalError as e:
        reason = " ".join(str(e).split())
        raise errors.ShardUnavailable(
            f"cannot connect to the {what} {where(dsn)}: {reason}", shard=where(dsn)
        ) from e


def _router_state(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The comment of ``schema`` in the router database ('' if it exists without one; None if
    it does not exist)."""
    row = conn.execute(
        "SELECT coalesce(obj_description(oid, 'pg_namespace'), '') FROM pg_namespace WHERE nspname = %s",
        (schema,),
    ).fetchone()
    return None if row is None else str(row[0])


def init(
    router_dsn: str,
    shard_dsns: Sequence[str],
    *,
    schema: str = DEFAULT_SCHEMA,
    pgmq: bool = False,
    lock_timeout: float = 2.0,
    attempts: int = 5,
    retry_delay: float = 0.5,
) -> RouterStatus:
    """Make ``router_dsn``'s database a router over ``shard_dsns`` (a power-of-two count).

    Migrates each shard (:meth:`Client.migrate`), installs the ``plproxy`` extension in the
    router with the cluster (a SQL/MED server whose partitions are the shards, in the order
    given: the order is the shard map, keep it), and (re)generates the router's schema from the
    installed core of the first shard: every public function with the same signature, routed by
    ``hashtext(queue)`` or run on all shards and merged (:mod:`lonnymq.shard.catalog`). Running it
    again with the same shards refreshes the functions (after an upgrade of the shards); with
    other shards, queues whose hash moved are reported as ``misplaced`` by :func:`status`.
    Moved queues' routes, partitioned queues and the map's version (bumped) survive a re-run.

    The router is rebuilt in one transaction, while clients keep calling: it takes the shard
    map's lock (``queue_create``, ``shard add`` and ``shard move`` wait on it) and the router's
    tables, each asked for with ``lock_timeout`` seconds so that it never queues the router's
    calls behind a long transaction; it tries ``attempts`` times, ``retry_delay`` seconds apart,
    then raises :class:`InitBlocked` with the router unchanged (the shards stay migrated).
    Raises InvalidArgument (count, DSNs, a router schema that holds a lonnymq install) and
    psycopg errors of the servers."""
    check_schema(schema)
    _check_count(len(shard_dsns))
    partitions, mapping = _partitions(shard_dsns)
    if len(set(partitions)) != len(partitions):
        raise errors.InvalidArgument("a shard is given twice: each shard must be its own database")
    with _connect(router_dsn, "router", autocommit=True) as router:
        state = _router_state(router, schema)
        if state is not None and not state.startswith(catalog.ROUTER_MARKER):
            raise errors.InvalidArgument(
                f"schema {schema!r} of the router database {where(router_dsn)} exists and is not a"
                " lonnymq router (a lonnymq install or other data): give a database without it"
            )
        if not router.execute("SELECT FROM pg_available_extensions WHERE name = 'plproxy'").fetchall():
            raise errors.InvalidArgument(
                f"PL/Proxy is not installed on the router's server {where(router_dsn)}: install it"
                " there (Debian: apt-get install postgresql-15-plproxy)"
            )
    for i, dsn in enumerate(shard_dsns):
        with _connect(dsn, f"shard {i}", autocommit=True) as conn:
            state = _router_state(conn, schema)
        if state is not None and state.startswith(catalog.ROUTER_MARKER):
            raise errors.InvalidArgument(f"shard {where(dsn)} is itself a lonnymq router")
        with Client(dsn, schema=schema, pool_size=1) as c:
            c.migrate(pgmq=pgmq)
        stride_ids(dsn, schema, i)
    with psycopg.connect(shard_dsns[0], autocommit=True) as first:
        fns = catalog.functions(first.execute(catalog.CATALOG_QUERY, (schema,)).fetchall())
        types = first.execute(catalog.TYPES_QUERY, (schema,)).fetchall()
        migrations = first.execute(
            sql.SQL("SELECT version, name FROM {}.migration ORDER BY version").format(sql.Identifier(schema))
        ).fetchall()
        # The pgmq facade over this schema, when the shards have it: proxied too.
        facade = first.execute(pgmq_facade.installed_query()).fetchone()
        has_pgmq = facade is not None and facade[0] == pgmq_facade.marker(schema)
        pgmq_fns, pgmq_types = [], []
        if has_pgmq:
            pgmq_fns = catalog.functions(
                first.execute(catalog.CATALOG_QUERY, (catalog.PGMQ_SCHEMA,)).fetchall()
            )
            pgmq_types = first.execute(catalog.TYPES_QUERY, (catalog.PGMQ_SCHEMA,)).fetchall()
    statements = catalog.proxy_statements(schema, fns)  # NoRoute before anything is changed
    pgmq_statements = catalog.proxy_statements(catalog.PGMQ_SCHEMA, pgmq_fns, core=schema) if has_pgmq else []
    timeout_ms = max(1, int(lock_timeout * 1000))
    with _connect(router_dsn, "router") as router:
        for attempt in range(1, attempts + 1):
            try:
                with router.transaction():
                    router.execute(
                        sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{timeout_ms}ms"))
                    )
                    _rebuild(router, schema, partitions, mapping, migrations, types, statements, fns)
                    _pgmq_schema(router, schema, has_pgmq, pgmq_types, pgmq_statements, pgmq_fns)
                break
            except (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected) as e:
                if attempt == attempts:
                    raise InitBlocked(
                        f"rebuilding the router gave up after {attempts} attempt(s): a transaction on"
                        f" the router held its shard map or tables longer than lock_timeout"
                        f" ({lock_timeout:g} s) ({' '.join(str(e).split())}); the router is unchanged,"
                        " the shards are migrated: run it again"
                    ) from e
                time.sleep(retry_delay)
    return status(router_dsn, schema=schema)


def _rebuild(
    router: psycopg.Connection[Any],
    schema: str,
    partitions: Sequence[str],
    mapping: dict[str, str],
    migrations: Sequence[Sequence[Any]],
    types: Sequence[Sequence[Any]],
    statements: Sequence[sql.Composed],
    fns: Sequence[catalog.CoreFunction],
) -> None:
    """The router's schema and cluster made again (in the caller's transaction, under its
    lock_timeout), keeping the routes of moved queues, the partitioned queues and the map's
    version (bumped)."""
    s = sql.Identifier(schema)
    server = sql.Identifier(catalog.cluster_name(schema))
    # First the locks that keep the state read below from changing before the schema is
    # rebuilt: the map's (queue_create, shard add) and the tables moves and creates write, in
    # the order the router's calls read them (a queue's route in shard_route, then a
    # partitioned queue's partitions in shard_partition), so that a call holding one never
    # waits for the other behind this transaction (a deadlock). A router made before
    # partitioned queues were marked in shard_route read them the other way round: a call of
    # it that deadlocks with this transaction is told so at once and this one retried.
    router.execute("SELECT pg_advisory_xact_lock(hashtext(%s || '/map'), 0)", (schema,))
    for table in ("shard_route", "shard_partition", "shard_map", "migration"):
        found = router.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL", (schema, table)
        ).fetchone()
        if found and found[0]:
            router.execute(
                sql.SQL("LOCK TABLE {}.{} IN ACCESS EXCLUSIVE MODE").format(s, sql.Identifier(table))
            )
    # The routes of moved queues outlive a regeneration (those naming a shard that is gone
    # are dropped: status() then reports the queue as misplaced where it is).
    overrides = routes(router, schema)
    parted = partitioned(router, schema)
    moved = moved_ids(router, schema)
    version = map_version(router, schema)
    router.execute("CREATE EXTENSION IF NOT EXISTS plproxy")
    router.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
    router.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(server))
    options = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(f"p{i}"), sql.Literal(p)) for i, p in enumerate(partitions)
    )
    router.execute(
        sql.SQL(
            "CREATE SERVER {} FOREIGN DATA WRAPPER plproxy OPTIONS (connection_lifetime '1800', {})"
        ).format(server, options)
    )
    umap = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in mapping.items()
    )
    router.execute(
        sql.SQL("CREATE USER MAPPING FOR PUBLIC SERVER {}{}").format(
            server, sql.SQL(" OPTIONS ({})").format(umap) if mapping else sql.SQL("")
        )
    )
    router.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    router.execute(
        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
            s,
            sql.Literal(
                f"{catalog.ROUTER_MARKER}: {len(partitions)} shards, cluster {catalog.cluster_name(schema)}"
            ),
        )
    )
    # What clients and workers read besides the functions: the schema version.
    router.execute(
        sql.SQL(
            "CREATE TABLE {s}.migration (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(s=s)
    )
    with router.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {}.migration (version, name) VALUES (%s, %s)").format(s), migrations
        )
    for stmt in catalog.type_statements(schema, types):
        router.execute(stmt)
    for stmt in catalog.route_statements(schema):
        router.execute(stmt)
    kept = {q: p for q, p in parted.items() if max(p) < len(partitions)}
    # A partitioned queue's mark in shard_route (partitions.PARTITIONED_MARK), also for a router
    # made before the marks (`shard upgrade`): a plain queue's route reads shard_route only.
    marks = [(q, _MARK) for q in kept]
    with router.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {}.shard_route (queue, shard) VALUES (%s, %s)").format(s),
            [(q, i) for q, i in overrides.items() if i < len(partitions) and q not in kept] + marks,
        )
        cur.executemany(
            sql.SQL("INSERT INTO {}.shard_partition (queue, shards, moved_ids) VALUES (%s, %s, %s)").format(
                s
            ),
            [(q, p, Jsonb({str(i): k for i, k in moved.get(q, {}).items()})) for q, p in kept.items()],
        )
    # Never backwards across re-inits: direct clients compare it with what they remember.
    router.execute(sql.SQL("INSERT INTO {}.shard_map (version) VALUES (%s)").format(s), (version + 1,))
    for stmt in statements:
        router.execute(stmt)
    _grant(router, schema, fns)


def upgrade(
    router_dsn: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    lock_timeout: float = 2.0,
    attempts: int = 5,
    retry_delay: float = 0.5,
) -> RouterStatus:
    """After an upgrade of lonnymq: :func:`init` again with the router's own shards (read from
    its cluster and user mapping: a superuser's DSN, as init needs), with the pgmq facade if the
    router proxies it. Migrates the shards and rebuilds the router's functions, keeping moved
    queues' routes, partitioned queues and every message (they live on the shards)."""
    check_schema(schema)
    dsns = shard_dsns(router_dsn, schema=schema)
    with _connect(router_dsn, "router", autocommit=True) as router:
        state = _router_state(router, catalog.PGMQ_SCHEMA)
    return init(
        router_dsn,
        dsns,
        schema=schema,
        pgmq=state is not None and state.startswith(catalog.ROUTER_MARKER),
        lock_timeout=lock_timeout,
        attempts=attempts,
        retry_delay=retry_delay,
    )


def _pgmq_schema(
    conn: psycopg.Connection[Any],
    schema: str,
    has_pgmq: bool,
    types: Sequence[Sequence[Any]],
    statements: Sequence[sql.Composed],
    fns: Sequence[catalog.CoreFunction],
) -> None:
    """(Re)make the router's ``pgmq`` schema: the facade's functions proxied (when the shards
    have the facade), else none. Refuses a ``pgmq`` schema of the router that it did not make."""
    p = sql.Identifier(catalog.PGMQ_SCHEMA)
    state = _router_state(conn, catalog.PGMQ_SCHEMA)
    if state is not None and not state.startswith(catalog.ROUTER_MARKER):
        raise errors.InvalidArgument(
            "the router database has a pgmq schema of its own (the extension or another facade):"
            " drop it, or give a database without it"
        )
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(p))
    if not has_pgmq:
        return
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(p))
    conn.execute(
        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
            p, sql.Literal(f"{catalog.ROUTER_MARKER}: the pgmq facade of {schema}, proxied")
        )
    )
    for stmt in [*catalog.type_statements(catalog.PGMQ_SCHEMA, types), *statements]:
        conn.execute(stmt)
    # As the lonnymq schema's: the shards' EXECUTE grants, for the roles that exist here.
    existing = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles").fetchall()}
    conn.execute(sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM PUBLIC").format(p))
    roles: set[str] = set()
    for fn in fns:
        for role in (r for r in fn.grantees if r in existing):
            roles.add(role)
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(p, sql.Identifier(role)))
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {}.{}({}) TO {}").format(
                    p, sql.Identifier(fn.name), sql.SQL(fn.identity), sql.Identifier(role)
                )
            )
    # The routing functions PL/Proxy calls in the caller's role (partitioned queues' routes).
    for role in sorted(roles):
        for name in pgmq_parts.ROUTING_FUNCTIONS:
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {}.{} TO {}").format(
                    p, sql.Identifier(name), sql.Identifier(role)
                )
            )


def _grant(conn: psycopg.Connection[Any], schema: str, fns: Sequence[catalog.CoreFunction]) -> None:
    """The shards' EXECUTE grants, repeated on the router for the roles that exist there."""
    s = sql.Identifier(schema)
    existing = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles").fetchall()}
    roles: set[str] = set()
    conn.execute(sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM PUBLIC").format(s))
    for fn in fns:
        for role in fn.grantees:
            if role not in existing:
                continue
            roles.add(role)
            names = [fn.name] + ([f"_all_{fn.name}"] if catalog.route(fn).merge else [])
            if fn.name == "queue_create":  # who may create a queue may create a partitioned one
                conn.execute(
                    sql.SQL("GRANT EXECUTE ON FUNCTION {}.queue_create_partitioned TO {}").format(
                        s, sql.Identifier(role)
                    )
                )
            for name in names:
                conn.execute(
                    sql.SQL("GRANT EXECUTE ON FUNCTION {}.{}({}) TO {}").format(
                        s,
                        sql.Identifier(name),
                        sql.SQL(fn.identity),
                        sql.Identifier(role),
                    )
                )
    server = sql.Identifier(catalog.cluster_name(schema))
    for role in sorted(roles):
        r = sql.Identifier(role)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r))
        conn.execute(sql.SQL("GRANT SELECT ON {}.migration TO {}").format(s, r))
        # The routing functions run in the caller's role (PL/Proxy calls them as given) and read
        # the routes and which queues are partitioned (as _route_of tells them anyway).
        conn.execute(sql.SQL("GRANT SELECT ON {}.shard_route, {}.shard_partition TO {}").format(s, s, r))
        for fn_name in (
            catalog.SHARD_OF,
            catalog.SHARD_OF_NEW,
            catalog.SHARD_MAP,
            *partitions.ROUTING_FUNCTIONS,
        ):
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {}.{} TO {}").format(s, sql.Identifier(fn_name), r)
            )
        conn.execute(sql.SQL("GRANT USAGE ON FOREIGN SERVER {} TO {}").format(server, r))


def check_movable(conn: psycopg.Connection[Any], schema: str) -> None:
    """Refuse a router made before queues could move (no routing table, no fence) or before
    the shard map had a version (direct clients would not notice the move)."""
    row = conn.execute(
        "SELECT to_regprocedure(format('%%I._shard_of(text)', %s::text)) IS NOT NULL"
        "   AND to_regclass(format('%%I.shard_map', %s::text)) IS NOT NULL",
        (schema, schema),
    ).fetchone()
    if not row or not row[0]:
        raise errors.InvalidArgument(
            f"the router {schema!r} was made by an older lonnymq (without queue routes or the shard"
            " map's version): run `lonnymq shard upgrade` first"
        )


def map_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The version of the router's shard map (0 for a router made before it had one, or none)."""
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.shard_map', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.shard_map").format(sql.Identifier(schema))
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def stride_ids(dsn: str, schema: str, index: int) -> None:
    """Make shard ``index``'s message ids ``index`` modulo :data:`partitions.STRIDE` (so a
    partitioned queue's ids say which shard made them); a no-op once they are. Ids stay
    increasing: the next is above every id given so far."""
    stride = partitions.STRIDE
    with _connect(dsn, f"shard {index}", autocommit=True) as conn, conn.transaction():
        seq = sql.SQL("{}.message_id_seq").format(sql.Identifier(schema))
        row = conn.execute(
            "SELECT increment_by, coalesce(last_value, 0) FROM pg_sequences"
            " WHERE schemaname = %s AND sequencename = 'message_id_seq'",
            (schema,),
        ).fetchone()
        if row is None:
            raise errors.NotInstalled(f"shard {where(dsn)} has no {schema}.message_id_seq")
        increment, last = int(row[0]), int(row[1])
        if increment == stride and last % stride == index:
            return
        restart = (last // stride + 1) * stride + index
        conn.execute(
            sql.SQL("ALTER SEQUENCE {} INCREMENT BY {} RESTART WITH {}").format(
                seq, sql.Literal(stride), sql.Literal(restart)
            )
        )


def _queue_rows(conn: psycopg.Connection[Any], schema: str, table: str, column: str) -> list[tuple[Any, ...]]:
    """(queue, column) of each row of the router's ``table`` by queue; none if the router was
    made before it existed."""
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL", (schema, table)
    ).fetchone()
    if not exists or not exists[0]:
        return []
    return conn.execute(
        sql.SQL("SELECT queue, {} FROM {}.{} ORDER BY queue").format(
            sql.Identifier(column), sql.Identifier(schema), sql.Identifier(table)
        )
    ).fetchall()


def partitioned(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[int]]:
    """The router's partitioned queues: queue -> its partitions' shards (empty for a router made
    before partitioned queues existed)."""
    return {str(q): [int(i) for i in p] for q, p in _queue_rows(conn, schema, "shard_partition", "shards")}


def moved_ids(conn: psycopg.Connection[Any], schema: str) -> dict[str, dict[int, int]]:
    """Where the ids of partitioned queues' moved partitions are: queue -> {shard that made
    them: partition now holding them}, for the queues with a partition moved (empty for a
    router made before partitions could move)."""
    exists = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attname = 'moved_ids' AND NOT attisdropped"
        " AND attrelid = to_regclass(format('%%I.shard_partition', %s::text)))",
        (schema,),
    ).fetchone()
    if not exists or not exists[0]:
        return {}
    return {
        str(q): {int(i): int(k) for i, k in m.items()}
        for q, m in _queue_rows(conn, schema, "shard_partition", "moved_ids")
        if m
    }


def routes(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """The router's overrides: queue -> shard index, for the queues not where their hash says
    (moved). Empty for a router made before overrides existed. Not the partitioned queues'
    marks (shard -1, partitions.PARTITIONED_MARK): :func:`partitioned` lists those."""
    return {str(q): int(i) for q, i in _queue_rows(conn, schema, "shard_route", "shard") if int(i) != _MARK}


def shard_dsns(router_dsn: str, *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The shards of a router, in shard-map order (conninfo with the user mapping's user and
    password: only a superuser can read those)."""
    check_schema(schema)
    with _connect(router_dsn, "router", autocommit=True) as conn:
        state = _router_state(conn, schema)
        if state is None or not state.startswith(catalog.ROUTER_MARKER):
            raise errors.InvalidArgument(
                f"schema {schema!r} of {where(router_dsn)} is not a lonnymq router: run `lonnymq shard init`"
            )
        row = conn.execute(
            "SELECT s.srvoptions, (SELECT u.umoptions FROM pg_user_mappings u"
            "  WHERE u.srvid = s.oid AND u.usename = 'public')"
            "  FROM pg_foreign_server s WHERE s.srvname = %s",
            (catalog.cluster_name(schema),),
        ).fetchone()
    if row is None:
        raise errors.InvalidArgument(
            f"the router's cluster {catalog.cluster_name(schema)} is missing: run `lonnymq shard init`"
        )
    parts: dict[int, str] = {}
    for opt in row[0] or []:
        k, _, v = opt.partition("=")
        if k.startswith("p") and k[1:].isdigit():
            parts[int(k[1:])] = v
    extra = dict(o.partition("=")[::2] for o in row[1] or [])
    return [make_conninfo(parts[i], **extra) for i in sorted(parts)]


def status(router_dsn: str, *, schema: str = DEFAULT_SCHEMA) -> RouterStatus:
    """The router's shards, each with its health (does it answer, at the router's schema
    version?) and its queues; a shard that does not answer within a few seconds is reported
    unhealthy with the reason, not raised."""
    dsns = shard_dsns(router_dsn, schema=schema)
    s = sql.Identifier(schema)
    with _connect(router_dsn, "router", autocommit=True) as router:
        row = router.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migration").format(s)
        ).fetchone()
        version = int(row[0]) if row else 0
        overrides = routes(router, schema)
        parted = partitioned(router, schema)
        shards = []
        for i, dsn in enumerate(dsns):
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=STATUS_CONNECT_TIMEOUT) as conn:
                    v = conn.execute(
                        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migration").format(s)
                    ).fetchone()
                    names = [
                        r[0]
                        for r in conn.execute(sql.SQL("SELECT name FROM {}.queue_list(NULL, NULL)").format(s))
                    ]
            except psycopg.Error as e:
                shards.append(ShardStatus(i, where(dsn), False, " ".join(str(e).split())))
                continue
            shard_version = int(v[0]) if v else 0
            mask = len(dsns) - 1
            homes = router.execute(
                "SELECT n, hashtext(n) & %s FROM unnest(%s::text[]) AS n", (mask, names)
            ).fetchall()
            misplaced = sorted(
                n for n, home in homes if (i not in parted[n] if n in parted else overrides.get(n, home) != i)
            )
            error = (
                None
                if shard_version == version
                else f"schema version {shard_version}, router {version}: run `lonnymq shard upgrade`"
            )
            shards.append(
                ShardStatus(i, where(dsn), error is None, error, shard_version, sorted(names), misplaced)
            )
    return RouterStatus(schema, version, shards, overrides, parted)
