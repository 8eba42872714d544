"""Option parsing and database access shared by the Spark reader and writers.

Spark hands options over as a case-insensitive mapping of strings; everything here turns them
into small, picklable values once, on the driver, so executors never re-parse or re-resolve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .. import errors
from ..client.config import location
from ..client.direct import FENCE, ShardMap, fence_query
from ..client.ops import Op, Ops, check_queue, map_error
from ..migrations import DEFAULT_SCHEMA, check_schema

APPLICATION_NAME = "lonnymq-spark"
#: Spark confs read by :func:`lonnymq.spark.register` (``spark.lonnymq.password`` matches Spark's
#: default ``spark.redaction.regex``, so the UI and logs show it redacted).
CONF_DSN = "spark.lonnymq.dsn"
CONF_PASSWORD = "spark.lonnymq.password"

T = TypeVar("T")


class ConnectFailed(errors.LonnyMQError, ConnectionError):
    """The data source could not connect to PostgreSQL. The message names the server, never
    the password."""


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of a DSN, for messages: never the password or other secrets."""
    return location(dsn)


def scrub(text: str, dsn: str) -> str:
    """``text`` with the DSN and its password replaced (psycopg quotes a bad conninfo string
    back in its error)."""
    secrets = [dsn]
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        password = None
    if password and len(str(password)) >= 3:
        secrets.append(str(password))
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option's value; Spark's option maps are case-insensitive, plain dicts may not be."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return default


def int_option(
    options: Mapping[str, str], name: str, default: int | None, *, low: int = 1, high: int = 2**31 - 1
) -> int | None:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(f"option {name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise errors.InvalidArgument(f"option {name} must be between {low} and {high}, got {value}")
    return value


def float_option(options: Mapping[str, str], name: str, default: float) -> float:
    raw = option(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise errors.InvalidArgument(f"option {name} must be a number, got {raw!r}") from None
    if not value > 0:
        raise errors.InvalidArgument(f"option {name} must be positive, got {raw!r}")
    return value


def choice_option(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = option(options, name, default)
    assert raw is not None
    value = raw.lower()
    if value not in choices:
        raise errors.InvalidArgument(f"option {name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def run(conn: psycopg.Connection[Any], op: Op[T]) -> T:
    """``op`` on ``conn``, with lonnymq's typed errors."""
    try:
        return op.decode(conn.execute(op.query, op.params).fetchall())
    except psycopg.Error as e:
        mapped = map_error(e)
        if mapped is e:
            raise
        raise mapped from e


@dataclass(frozen=True)
class Target:
    """Where to connect: the server, lonnymq's schema and the queue. The DSN is kept out of
    ``repr`` (plans, logs and tracebacks print objects, never the password). ``shard``: where
    a shard of a router is (``host:port/dbname``), for one of :meth:`placed`'s."""

    dsn: str = field(repr=False)
    schema: str
    queue: str
    shard: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str], conf: Mapping[str, str] | None = None) -> Target:
        """Resolve the server once, on the driver: option ``dsn``, else the environment variable
        named by option ``dsnEnv``, else the ``spark.lonnymq.dsn`` conf captured by ``register``
        (``conf``), else ``$LONNYMQ_DSN``. A ``spark.lonnymq.password`` conf fills in a DSN
        without a password."""
        conf = conf or {}
        dsn = option(options, "dsn")
        env = option(options, "dsnEnv")
        if not dsn and env:
            dsn = os.environ.get(env)
            if not dsn:
                raise errors.InvalidArgument(
                    f"lonnymq: option dsnEnv names ${env}, which is not set where the query is planned"
                    " (the driver; with Spark Connect, the Connect server)"
                )
        dsn = dsn or conf.get(CONF_DSN) or os.environ.get("LONNYMQ_DSN")
        if not dsn:
            raise errors.InvalidArgument(
                'lonnymq: give the server with .option("dsn", ...), .option("dsnEnv", "VAR"), the Spark conf'
                f" {CONF_DSN} (then lonnymq.spark.register(spark)) or $LONNYMQ_DSN"
            )
        password = conf.get(CONF_PASSWORD)
        if password:
            try:
                if not conninfo_to_dict(dsn).get("password"):
                    dsn = make_conninfo(dsn, password=password)
            except psycopg.Error:
                raise errors.InvalidArgument(
                    f"lonnymq: the DSN is not a valid connection string: {describe_dsn(dsn)}"
                ) from None
        queue = option(options, "queue")
        if queue is None:
            raise errors.InvalidArgument('lonnymq: give the queue with .option("queue", "...")')
        schema = option(options, "schema", DEFAULT_SCHEMA)
        assert schema is not None
        return cls(dsn, check_schema(schema), check_queue(queue))

    def placed(self) -> tuple[Target, ...]:
        """Where the queue's rows are: this server, or, if it is a shard router
        (docs/sharding.md), the queue's shard, or each partition's shard of a partitioned
        queue, in partition order. A shard is reached as a direct client reaches it
        (:meth:`ShardMap.conninfo`): its host, port and database from the router's shard map,
        everything else (user, password, TLS...) from this DSN."""
        ops = Ops(self.schema)
        with self.connect(autocommit=True) as conn:
            if not run(conn, ops.is_router()):
                return (self,)
            shards = ShardMap(self.schema, ops.st)
            shards.load(*run(conn, shards.map_op()))
            home, partitions = run(conn, shards.route_op(self.queue))
        return tuple(
            replace(self, dsn=shards.conninfo(i, self.dsn), shard=shards.where(i))
            for i in partitions or [shards.remember(self.queue, home)]
        )

    def open(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A new connection; a failure raises :class:`ConnectFailed` naming the server only."""
        try:
            return psycopg.connect(self.dsn, autocommit=autocommit, application_name=APPLICATION_NAME)
        except psycopg.Error as e:
            raise ConnectFailed(
                f"lonnymq: cannot connect to {describe_dsn(self.dsn)}: {scrub(str(e), self.dsn)}"
            ) from None

    @contextmanager
    def connect(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one task or driver call; closed (rolled back if unfinished) on exit."""
        with self.open(autocommit=autocommit) as conn:
            yield conn

    def query(self, function: str, args: LiteralString) -> sql.Composed:
        """``SELECT * FROM <schema>.<function>(<args>)``; ``args`` are placeholders with casts."""
        return sql.SQL("SELECT * FROM {}.{}(" + args + ")").format(
            sql.Identifier(self.schema), sql.Identifier(function)
        )

    def call(
        self, conn: psycopg.Connection[Any], function: str, args: LiteralString, params: tuple[Any, ...]
    ) -> list[Any]:
        """Run :meth:`query` with lonnymq's typed errors."""
        return run(conn, Op(self.query(function, args), params, list))

    def hold(self, conn: psycopg.Connection[Any]) -> None:
        """On a shard of a router (:attr:`shard`), put the rest of ``conn``'s transaction (READ
        COMMITTED) behind the shard's side of the move fence, as a direct client's calls are
        (``client/direct.py``): take the queue's fence shared (``FENCE``: it waits for a ``shard
        move`` of the queue that holds it, and keeps the next from starting until the
        transaction ends), then check, in a snapshot taken once it is held, that the queue is
        still here. So the calls after it either act on the queue before a move (and their
        effects move with it) or raise QueueNotFound: never act on, or read nothing from, a
        queue that moved away. Nothing on a single server."""
        if self.shard is None:
            return
        fence = sql.SQL(FENCE).format(name=sql.Literal(self.schema))
        fenced = fence_query(self.query("spark_queue_check", "%s::text"), fence)
        run(conn, Op(fenced, (self.queue,), list))
        # The fenced check's snapshot may predate the move it waited for; the next one's cannot.
        self.check(conn)

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """On a shard of a router, QueueNotFound unless the queue is on it in ``conn``'s
        snapshot (a REPEATABLE READ read's: the first statement of its transaction). Nothing on
        a single server."""
        if self.shard is not None:
            self.call(conn, "spark_queue_check", "%s::text", (self.queue,))
