"""The exceptions lonnymq raises.

Everything derives from :class:`LonnyMQError`. Errors raised by the SQL functions carry a
SQLSTATE of class ``LQ`` and are mapped to the same classes, so a bad call gets the same typed
exception whether it was caught in Python or in the database.
"""

from __future__ import annotations

import psycopg


class LonnyMQError(Exception):
    """Base class of every lonnymq error."""


class InvalidArgument(LonnyMQError, ValueError):
    """An argument is out of range or of the wrong type; nothing was written."""


class InvalidQueueName(InvalidArgument):
    """A queue name does not match ``^[a-z][a-z0-9_.:-]{0,62}$``."""


class PayloadTooLarge(InvalidArgument):
    """A payload is larger than the queue's ``max_payload_bytes``; nothing was written."""


class QueueNotFound(LonnyMQError, LookupError):
    """The queue does not exist."""


class QueueExists(LonnyMQError):
    """A queue with that name already exists."""


class QueueInUse(LonnyMQError):
    """The queue cannot be dropped: another queue dead-letters into it."""


class DuplicateKey(LonnyMQError):
    """A live message with the same de-duplication key exists (``on_conflict="error"``)."""


class ChannelFull(LonnyMQError):
    """A message was sent to a channel already holding its ``max_size`` messages, and the
    channel's ``on_full`` policy is ``reject``: nothing of the batch was written."""


class LeaseLost(LonnyMQError):
    """The delivery's token is stale: its lease expired and the message was taken again, or it
    was already settled. Nothing was changed."""


class ConnectionLost(LonnyMQError, psycopg.OperationalError):
    """The connection to PostgreSQL was lost during a call, and the client did not repeat the
    call: it may have run (``may_have_committed``: the statement had reached the server; for a
    send, the message may exist, so check, or send with a ``key``, before sending it again), or the
    retry deadline passed. A subclass of ``psycopg.OperationalError``, which code written against
    plain psycopg already catches."""

    def __init__(self, message: str, *, may_have_committed: bool) -> None:
        super().__init__(message)
        self.may_have_committed = may_have_committed

    def __reduce__(self) -> tuple[object, ...]:
        return (_connection_lost, (str(self), self.may_have_committed))


def _connection_lost(message: str, may_have_committed: bool) -> ConnectionLost:
    return ConnectionLost(message, may_have_committed=may_have_committed)


class DatabaseUnavailable(ConnectionLost):
    """The client could not connect to PostgreSQL: opening it (``open()``, ``with Client(...)``,
    or its first call) got no connection within its timeout, or the server refused the login
    (a wrong password, an unknown role or database: at once, without waiting). The message
    names where (``user@host:port/dbname``, never the password, also in ``where``) and libpq's
    last reason (``Connection refused``, ``password authentication failed``...). No call ran
    (``may_have_committed`` is False); a later call or ``open()`` tries again. A
    ConnectionLost, so a ``psycopg.OperationalError`` too."""

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message, may_have_committed=False)
        self.where = where

    def __reduce__(self) -> tuple[object, ...]:
        return (_database_unavailable, (str(self), self.where))


def _database_unavailable(message: str, where: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(message, where=where)


class ClientClosed(LonnyMQError, psycopg.OperationalError):
    """A call on a client after its ``close()`` (or on a connection pool, given to the client,
    that its owner closed): it fails at once; make a new client."""


class MissingExtra(LonnyMQError, ModuleNotFoundError):
    """An optional part of lonnymq was used without its extra installed; the message names the
    ``pip install 'lonnymq[EXTRA]'`` to run (``name``: the module that is missing)."""

    @classmethod
    def of(cls, e: ModuleNotFoundError, extra: str, what: str) -> MissingExtra:
        return cls(
            f"{what} needs the {extra} extra ({e.name} is missing): pip install 'lonnymq[{extra}]'",
            name=e.name,
        )


class MetricsServerError(LonnyMQError, OSError):
    """The worker's metrics endpoint could not listen where asked (the port is in use, the
    host is not an address of this machine); the message names the host and port."""


class PermissionDenied(LonnyMQError, PermissionError):
    """The database role may not do this (see the lonnymq_producer/consumer/admin roles)."""


class NotInstalled(LonnyMQError):
    """The lonnymq schema is missing or older than this package; run ``lonnymq migrate``."""


class MigrationError(LonnyMQError):
    """The installed schema is newer than this package or a migration failed."""


class MigrationBlocked(MigrationError):
    """Migrate gave up: a lock it needs stayed held (by a long transaction, named in the message)
    for longer than its lock_timeout at every attempt. Nothing was changed; run it again once
    that transaction has ended."""


class EmbeddedServerError(LonnyMQError):
    """The embedded PostgreSQL server could not be started or stopped."""


class RouterTransaction(LonnyMQError):
    """The database is a shard router (``lonnymq shard init``): a call through it runs in the
    shard's own transaction, committed before the call returns, never in the caller's. So the
    calls whose promise is the caller's transaction are refused rather than made non-atomic:
    ``take_tx``, and any call given a ``conn`` with a transaction open (not autocommit). To
    enqueue or take atomically with business data, keep those tables on the queue's shard and
    connect to that shard directly (docs/sharding.md)."""


class ShardUnavailable(LonnyMQError):
    """A shard (or the router) of a sharded setup cannot be reached; ``shard`` says which
    (``user@host:port/dbname``, or the router's error text naming it). Queues on other shards
    keep working."""

    def __init__(self, message: str, *, shard: str) -> None:
        super().__init__(message)
        self.shard = shard

    def __reduce__(self) -> tuple[object, ...]:
        return (_shard_unavailable, (str(self), self.shard))


def _shard_unavailable(message: str, shard: str) -> ShardUnavailable:
    return ShardUnavailable(message, shard=shard)


#: SQLSTATE raised by the SQL functions -> exception class.
SQLSTATE_ERRORS: dict[str, type[LonnyMQError]] = {
    "LQ001": QueueNotFound,
    "LQ002": InvalidArgument,
    "LQ003": PayloadTooLarge,
    "LQ004": DuplicateKey,
    "LQ005": QueueExists,
    "LQ006": QueueInUse,
    "LQ007": ChannelFull,
}
