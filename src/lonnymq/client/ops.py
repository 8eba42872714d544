"""The I/O-free half of the clients: argument checking, query building and row decoding.

Every client call is ``Op`` = one SQL function call (so one atomic action) + a decoder. The sync
and async clients only execute ops, so both behave identically by construction.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import time
import uuid
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import cache, lru_cache, partial
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg.rows import RowFactory, RowMaker, no_result, tuple_row
from psycopg.types.json import Jsonb

from .. import errors
from ..models import (
    TEXT,
    ArchivedMessage,
    ArchiveStatus,
    ChannelInfo,
    DeadMessage,
    Envelope,
    Message,
    MessageStatus,
    MessageSummary,
    OnConflict,
    OnFull,
    QueueCounts,
    QueueInfo,
    QueueMetrics,
    SendResult,
    WorkerInfo,
    new_message,
    new_send_result,
)
from ..serializer import Serializer, default_serializer

T = TypeVar("T")

#: The start of the comment on a shard router's schema (lonnymq.shard): clients that see it know
#: a call runs in the shard's transaction, not theirs.
ROUTER_MARKER = "lonnymq shard router"

QUEUE_NAME_RE = re.compile(r"^[a-z][a-z0-9_.:-]{0,62}$")
#: Hard ceiling checked in Python before anything is sent; queues set their own lower limit.
MAX_PAYLOAD_BYTES = 100 * 1024 * 1024
MAX_LIMIT = 100_000
#: Largest magnitude of a time in milliseconds (delays, epoch times): far beyond any real
#: schedule, and small enough that the database's bigint arithmetic on it cannot overflow.
MAX_MS = 2**53
_KEY_MAX = 512
_KIND_MAX = 255


@lru_cache(maxsize=256)
def _row_type(*names: bytes) -> Callable[[Sequence[Any]], Any]:
    """The maker of named tuples of the columns ``names``: ``tuple.__new__`` of their class (C),
    not the class's ``_make`` (Python). A name that is no identifier (``?column?``) becomes
    ``_<position>`` (namedtuple's ``rename``): decoders read such a column by position."""
    row = namedtuple("Row", [n.decode("utf-8", "replace") for n in names], rename=True)  # type: ignore[misc]
    return partial(tuple.__new__, row)


def _columns(cursor: Any) -> tuple[bytes, ...] | None:
    """The column names of the cursor's result, None when it has no rows to fetch (names as
    the server sent them: the SQL functions' own, ASCII, so no lookup of the encoding)."""
    res = cursor.pgresult
    if res is None or res.status != _TUPLES_OK:
        return None
    return tuple(map(res.fname, range(res.nfields)))


def _named_rows(cursor: Any) -> RowMaker[Any]:
    """psycopg's ``namedtuple_row`` for the client's own statements, for half its CPU per
    result (1.5 us against 2.2 for a take's 15 columns): no lookup of the connection's encoding
    and rows made by :func:`_row_type`."""
    names = _columns(cursor)
    return no_result if names is None else _row_type(*names)


_TUPLES_OK = ExecStatus.TUPLES_OK

#: The row factory ops are executed with unless they name another (``Op.row_factory``), whatever
#: the row factory of the connection they run on (a caller's connection or pool may use
#: ``dict_row``, ``class_row``...): rows are named tuples, which decoders read by column name.
ROW_FACTORY = _named_rows

#: The row factory of ops whose decoder reads the one column of a scalar function (or of a
#: SETOF of scalars) by position (``r[0]``): plain tuples, no column names read (a named row
#: factory costs 5-6k instructions a call for one column: docs/benchmarks.md, branch clientfast).
POSITIONAL: RowFactory[Any] = tuple_row


# Not frozen: a frozen dataclass's __init__ costs 0.9 us here against 0.3 us, on every call.
# Nothing changes an op once made (direct.py derives new ones with dataclasses.replace).
@dataclass(slots=True)
class Op(Generic[T]):
    """One SQL statement and the decoder of its rows, made by ``row_factory`` (:data:`ROW_FACTORY`:
    named tuples; :data:`POSITIONAL`: tuples, for a decoder that reads one column by position).
    ``safe_to_retry``: running it twice does no harm, so a call cut off by a lost connection is
    repeated even if it may have run (see :mod:`lonnymq.client.retry`)."""

    query: sql.Composed
    params: Sequence[Any]
    decode: Callable[[list[Any]], T]
    safe_to_retry: bool = False
    #: Its promise is the caller's transaction (take_tx): refused on a shard router.
    caller_tx: bool = False
    row_factory: RowFactory[Any] = ROW_FACTORY


# -- argument checks -------------------------------------------------------------------------


#: Queue names already checked (a client calls on a few queues again and again): a set lookup
#: instead of the regular expression; emptied when full.
_checked_queues: set[str] = set()
_CHECKED_MAX = 10_000


def check_queue(name: object) -> str:
    if type(name) is str and name in _checked_queues:
        return name
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise errors.InvalidQueueName(
            f"invalid queue name {name!r}: use 1-63 of a-z 0-9 _ . : - starting with a letter"
        )
    if type(name) is str:
        if len(_checked_queues) >= _CHECKED_MAX:
            _checked_queues.clear()
        _checked_queues.add(name)
    return name


def to_ms(value: object, what: str, *, positive: bool = False) -> int | None:
    """Seconds (int/float) or a timedelta -> whole milliseconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise errors.InvalidArgument(f"{what} must be seconds or a timedelta, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds <= 0):
        bound = "positive" if positive else ">= 0"
        raise errors.InvalidArgument(f"{what} must be finite and {bound}, got {value!r}")
    if seconds * 1000 > MAX_MS:
        raise errors.InvalidArgument(f"{what} is too large, got {value!r}")
    return round(seconds * 1000)


def at_ms(value: object) -> int | None:
    """An aware datetime or epoch milliseconds -> epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise errors.InvalidArgument("at must be a timezone-aware datetime")
        return round(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_MS:
            raise errors.InvalidArgument(f"at is out of range, got {value!r}")
        return value
    raise errors.InvalidArgument(f"at must be an aware datetime or epoch ms, got {value!r}")


def check_limit(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_LIMIT:
        raise errors.InvalidArgument(f"n must be an integer between 1 and {MAX_LIMIT}, got {n!r}")
    return n


def check_text(value: object, what: str, max_len: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_len or not _storable(value):
        raise errors.InvalidArgument(
            f"{what} must be a non-empty string of at most {max_len} characters, got {value!r}"
        )
    return value


def check_channel(channel: object) -> str:
    checked = check_text(channel, "channel", _KEY_MAX)
    if checked is None:
        raise errors.InvalidArgument("channel must be a non-empty string")
    return checked


def _channel_policy(
    max_concurrency: object, release_interval: object, max_size: object, on_full: object, prefix: str
) -> tuple[int | None, int | None, int | None, str]:
    """A channel policy as the SQL functions take it: (max_concurrency, release_interval_ms,
    max_size, on_full); None limits are unlimited."""
    concurrency = _optional_positive(max_concurrency, f"{prefix}max_concurrency", 2**31 - 1)
    size = _optional_positive(max_size, f"{prefix}max_size", 2**63 - 1)
    if on_full != "reject" and on_full != "drop":
        raise errors.InvalidArgument(f"{prefix}on_full must be reject or drop, got {on_full!r}")
    interval = to_ms(release_interval, f"{prefix}release_interval")
    return concurrency, interval, size, on_full


def _optional_positive(value: object, what: str, top: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise errors.InvalidArgument(f"{what} must be a positive integer or None, got {value!r}")
    if value > top:
        raise errors.InvalidArgument(f"{what} is too large, got {value!r}")
    return value


def _check_priority(priority: object) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or not -100 <= priority <= 100:
        raise errors.InvalidArgument(f"priority must be an integer in -100..100, got {priority!r}")
    return priority


#: What PostgreSQL text and jsonb cannot store: NUL, and lone surrogates (not UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(text: str) -> bool:
    return _UNSTORABLE.search(text) is None


def _check_json(value: object, what: str) -> None:
    """Raise InvalidArgument unless ``value`` is JSON that jsonb can store (also no NUL or lone
    surrogate in any key or string: the database would refuse them with an untyped error)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise errors.InvalidArgument(f"{what} must be JSON-serialisable: {e}") from None
    stack = [value]
    while stack:  # iterative: json.dumps accepted the nesting depth, so this terminates
        v = stack.pop()
        if isinstance(v, str):
            if not _storable(v):
                raise errors.InvalidArgument(f"{what} must not contain NUL characters or lone surrogates")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def encode_error(text: str) -> str:
    """Error texts are diagnostics: keep them storable rather than refuse the nack."""
    return _UNSTORABLE.sub("\ufffd", text)


def encode_headers(headers: object) -> Jsonb | None:
    if headers is None:
        return None
    if not isinstance(headers, dict) or not all(isinstance(k, str) for k in headers):
        raise errors.InvalidArgument("headers must be a dict with string keys")
    _check_json(headers, "headers")
    return Jsonb(headers)


def encode_state(state: object) -> Jsonb | None:
    if state is None:
        return None
    _check_json(state, "state")
    return Jsonb(state)


def encode_payload(payload: object, serializer: Serializer | None = None) -> tuple[bytes, str | None]:
    """bytes are stored as they are; str as UTF-8 text; anything else by ``serializer`` (default:
    JSON, see :mod:`lonnymq.serializer`)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        body, ctype = bytes(payload), None
    elif isinstance(payload, str):
        try:
            body, ctype = payload.encode("utf-8"), TEXT
        except UnicodeEncodeError as e:
            raise errors.InvalidArgument(f"payload is not valid text: {e}") from None
    else:
        ser = serializer or default_serializer()
        try:
            body = ser.dumps(payload)
        except (TypeError, ValueError, RecursionError) as e:
            raise errors.InvalidArgument(
                f"payload is not bytes, str or serialisable by {ser!r}: {e}"
            ) from None
        if not isinstance(body, bytes):
            raise errors.InvalidArgument(f"{ser!r}.dumps() returned {type(body).__name__}, not bytes")
        ctype = ser.content_type
    if len(body) > MAX_PAYLOAD_BYTES:
        raise errors.PayloadTooLarge(
            f"payload is {len(body)} bytes; lonnymq allows at most {MAX_PAYLOAD_BYTES}"
        )
    return body, ctype


#: A PL/Proxy error on a shard router: "[PL/Proxy function ]<function>(<nargs>): [<dbname>] <text>".
_PLPROXY_ERROR = re.compile(r"^(?:PL/Proxy function )?([\w.]+)\(\d+\): \[([^\]]*)\] (.*)", re.S)
#: PL/Proxy's texts for a shard it cannot reach or lost (libpq calls, the remote's FATAL).
_PLPROXY_LOST = ("PQconnectPoll", "PQconnectStart", "PQconsumeInput", "PQsend", "PQflush", "REMOTE FATAL")
_SERVER_AT = re.compile(r'server at "([^"]*)", port (\d+)|server on socket "([^"]*)"')


def _shard_unavailable(e: psycopg.Error, state: str) -> errors.ShardUnavailable | None:
    """ShardUnavailable when ``e`` is a shard router's report of a shard it cannot reach."""
    m = _PLPROXY_ERROR.match(e.diag.message_primary or "")
    if m is None:
        return None
    function, dbname, text = m.groups()
    if not (state.startswith(("08", "57P")) or any(t in text for t in _PLPROXY_LOST)):
        return None
    at = _SERVER_AT.search(text)
    host = (f"{at[1]}:{at[2]}" if at[1] is not None else at[3]) if at else None
    shard = f"{host}/{dbname}" if host else f"database {dbname}"
    reason = " ".join(text.split())
    return errors.ShardUnavailable(
        f"shard {shard} is unavailable (the router could not run {function} there): {reason}", shard=shard
    )


def map_error(e: psycopg.Error) -> Exception:
    """The typed lonnymq exception for a database error (or the error itself)."""
    state = e.sqlstate or ""
    down = _shard_unavailable(e, state)
    if down is not None:
        return down
    cls = errors.SQLSTATE_ERRORS.get(state)
    if cls is not None:
        msg = e.diag.message_primary or str(e)
        if cls is errors.InvalidArgument and msg.startswith("invalid queue name"):
            cls = errors.InvalidQueueName
        return cls(msg)
    if state == "42501":  # insufficient_privilege
        return errors.PermissionDenied(e.diag.message_primary or str(e))
    if state in ("3F000", "42883", "42P01"):  # schema/function/table missing
        return errors.NotInstalled(f"lonnymq is not installed or out of date: {e}")
    return e


def _check_on_conflict(on_conflict: object) -> None:
    if on_conflict not in ("ignore", "replace", "error"):
        raise errors.InvalidArgument(f"on_conflict must be ignore, replace or error, got {on_conflict!r}")


def new_send_key() -> uuid.UUID:
    """A new send key (idempotency key) for one send call: a UUID version 7 (RFC 9562), 48 bits
    of the Unix time in milliseconds then 74 random bits, so that the keys of a queue arrive in
    about the order of the primary key of send_key (appended, not scattered over its pages)."""
    value = (time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant 10 (RFC 9562)
    return uuid.UUID(int=value)


def check_send_key(value: object) -> uuid.UUID:
    """An idempotency key given by the caller: a UUID or its text."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise errors.InvalidArgument(f"idempotency_key must be a UUID, got {value!r}")


# -- statements ------------------------------------------------------------------------------


class Statements:
    """The SQL of every call, composed once per schema."""

    def __init__(self, schema: str) -> None:
        s = sql.Identifier(schema)
        self.schema = schema

        def q(text: LiteralString) -> sql.Composed:
            return sql.SQL(text).format(s=s)

        self.queue_create = q(
            "SELECT {s}.queue_create(%s::text, %s::bigint, %s::int, %s::text, %s::bool,"
            " %s::bigint, %s::bool, %s::int, %s::bigint, %s::bool, %s::int, %s::bigint,"
            " %s::bigint, %s::text)"
        )
        # A shard router's (lonnymq.shard.partitions): the queue over p_partitions shards.
        self.queue_create_partitioned = q(
            "SELECT {s}.queue_create_partitioned(%s::text, %s::int, %s::bigint, %s::int, %s::text,"
            " %s::bool, %s::bigint, %s::bool, %s::int, %s::bigint, %s::bool, %s::int, %s::bigint,"
            " %s::bigint, %s::text)"
        )
        self.queue_drop = q("SELECT {s}.queue_drop(%s::text, %s::bool)")
        self.queue_purge = q("SELECT {s}.queue_purge(%s::text)")
        self.queue_pause = q("SELECT {s}.queue_pause(%s::text)")
        self.queue_resume = q("SELECT {s}.queue_resume(%s::text)")
        self.queue_list = q("SELECT * FROM {s}.queue_list(%s::int, %s::text)")
        self.queue_metrics = q("SELECT * FROM {s}.queue_metrics(%s::text, %s::int)")
        self.send_batch = q(
            "SELECT ord, id, outcome FROM {s}.send_batch(%s::text, %b::bytea[], %b::text[],"
            " %b::text[], %b::jsonb[], %b::bigint[], %b::bigint[], %b::int2[], %b::text[],"
            " %b::text[], %s::text, p_send_key => %s::uuid)"
        )
        # One message: the lean send (sql/send.sql), every argument in a fixed position so that
        # the statement is prepared once per connection.
        self.send = q(
            "SELECT id, outcome FROM {s}.send(%s::text, %b::bytea, %s::text, %s::text, %b::jsonb,"
            " %s::bigint, %s::bigint, %s::int2, %s::text, %s::text, %s::text, %s::uuid)"
        )
        # A plain message (no headers, time, delay, priority, key, channel or send key): the
        # lean plain send, a scalar in the select list (sql/send.sql, send_plain).
        self.send_plain = q("SELECT {s}.send_plain(%s::text, %b::bytea, %s::text, %s::text)")
        # The same with a send key (what a Client(dsn) with retries sends for a plain message):
        # the lean keyed send, a scalar (sql/send.sql, send_plain_once).
        self.send_plain_once = q(
            "SELECT {s}.send_plain_once(%s::text, %b::bytea, %s::uuid, %s::text, %s::text)"
        )
        self.take = q("SELECT * FROM {s}.take(%s::text, %s::int, %s::bigint, %b::bigint[], %b::int[])")
        # A drain's take(ack=previous) of one delivery: scalars, as ack_one.
        self.take_ack_one = q(
            "SELECT * FROM {s}.take(%s::text, %s::int, %s::bigint, ARRAY[%b::bigint], ARRAY[%b::int])"
        )
        self.take_tx = q("SELECT * FROM {s}.take_tx(%s::text, %s::int, %s::bool)")
        # Is this schema a shard router (lonnymq.shard)? Its comment says so.
        self.is_router = sql.SQL(
            "SELECT coalesce(bool_or(starts_with(obj_description(n.oid, 'pg_namespace'), {m})), false)"
            " FROM pg_catalog.pg_namespace n WHERE n.nspname = {name}"
        ).format(m=sql.Literal(ROUTER_MARKER), name=sql.Literal(schema))
        self.peek = q("SELECT * FROM {s}.peek(%s::text, %s::int)")
        self.ack = q("SELECT * FROM {s}.ack(%s::text, %b::bigint[], %b::int[], %s::bool)")
        # One delivery (a consumer's usual ack): scalars, which psycopg dumps for a fraction of
        # a list's cost; the server makes the arrays.
        self.ack_one = q("SELECT * FROM {s}.ack(%s::text, ARRAY[%b::bigint], ARRAY[%b::int], %s::bool)")
        self.nack = q(
            "SELECT * FROM {s}.nack(%s::text, %b::bigint[], %b::int[], %b::bigint[], %b::text[],"
            " %b::jsonb[], %s::bool)"
        )
        # The worker's dead-lettering of deliveries whose handler gave up (worker/ops.py).
        self.give_up = q("SELECT * FROM {s}.give_up(%s::text, %s::bigint[], %s::int[], %s::text[])")
        self.extend = q("SELECT * FROM {s}.extend(%s::text, %b::bigint[], %b::int[], %s::bigint)")
        self.next_ready_in = q("SELECT {s}.next_ready_in(%s::text)")
        self.dead_list = q(
            "SELECT * FROM {s}.dead_list(%s::text, %s::int, %s::bigint, %s::bigint, %s::bigint)"
        )
        self.dead_requeue = q("SELECT {s}.dead_requeue(%s::text, %b::bigint[])")
        self.dead_purge = q("SELECT {s}.dead_purge(%s::text)")
        self.maintain = q("SELECT {s}.maintain(%s::int)")
        self.channel_set = q(
            "SELECT * FROM {s}.channel_set(%s::text, %s::text, %s::int, %s::bigint, %s::bigint, %s::text)"
        )
        self.channel_reset = q("SELECT {s}.channel_reset(%s::text, %s::text)")
        self.channel_list = q("SELECT * FROM {s}.channel_list(%s::text, %s::int, %s::text)")
        self.message_get = q("SELECT * FROM {s}.message_get(%s::text, %s::bigint, %s::text)")
        self.message_cancel = q(
            "SELECT * FROM {s}.message_cancel(%s::text, %b::bigint[], %b::text[], %s::bool)"
        )
        self.archive_list = q(
            "SELECT * FROM {s}.archive_list(%s::text, %s::bigint, %s::bigint, %s::bigint, %s::int, %s::text)"
        )
        self.listen = q("LISTEN {s}")
        # The dashboard's reads (sql/stats.sql, message_list in sql/messages.sql).
        self.stats_minutes = q("SELECT * FROM {s}.stats_minutes(%s::text[], %s::bigint, %s::bigint)")
        self.stats_totals = q("SELECT * FROM {s}.stats_totals(%s::text[])")
        self.worker_list = q("SELECT * FROM {s}.worker_list()")
        self.message_list = q("SELECT * FROM {s}.message_list(%s::text, %s::text, %s::bigint, %s::int)")


@lru_cache(maxsize=64)
def statements(schema: str) -> Statements:
    return Statements(schema)


#: Statements rendered to bytes: psycopg renders a ``sql.Composed`` again on every execute: 4-6%
#: of the client's CPU per call (benchmarks/client_cpu.py; send 68.0 -> 64.8 us, take + ack 153.0
#: -> 143.6). A rendering that is ASCII without a backslash is the same on every connection
#: (every client encoding is a superset of ASCII, and only a backslash makes a literal depend on
#: standard_conforming_strings): kept by the statement's id alone, so that a call need not ask
#: the connection's encoding (the client's statements: a schema name is ASCII). Any other, by (id,
#: the connection's ``client_encoding``). Each entry keeps its statement alive, so an id in the
#: cache is never that of another object; the cache is emptied when full.
_rendered: dict[int | tuple[int, bytes | None], tuple[sql.Composable, bytes]] = {}
_RENDERED_MAX = 4096


def rendered(query: sql.Composable, conn: psycopg.BaseConnection[Any]) -> bytes:
    """``query`` as ``conn`` would render it (the bytes depend on the schema, which the statement
    holds, and may depend on the connection's encoding), rendered once per statement (and
    encoding, where it matters)."""
    hit = _rendered.get(id(query))
    if hit is None or hit[0] is not query:
        key = (id(query), conn.pgconn.parameter_status(b"client_encoding"))
        hit = _rendered.get(key)
        if hit is None or hit[0] is not query:
            text = query.as_bytes(conn)
            if len(_rendered) >= _RENDERED_MAX:
                _rendered.clear()
            hit = _rendered[id(query) if text.isascii() and b"\\" not in text else key] = (query, text)
    return hit[1]


# -- decoders --------------------------------------------------------------------------------


# Rows come from ROW_FACTORY (named tuples) whatever the connection's row factory: columns are
# read by name, except the single column of a scalar function or of a SETOF of scalars.


def _scalar(rows: list[Any]) -> Any:
    return rows[0][0] if rows else None


def _nothing(rows: list[Any]) -> None:
    return None


def _ids(rows: list[Any]) -> set[int]:
    """The first column of each row, as a set (the ids an ack settled)."""
    return {r[0] for r in rows}


def _sent(rows: list[Any]) -> SendResult:
    return new_send_result(rows[0].id, rows[0].outcome)


def _sent_plain(rows: list[Any]) -> SendResult:
    return new_send_result(rows[0][0], "created")


def _message(
    queue: str, r: Any, serializer: Serializer | None, status: MessageStatus | None = None
) -> Message:
    """One delivery row (take, peek, message_get) as a Message (every field by position, in
    the order of Message's fields: see models.new_message)."""
    return new_message(
        queue,
        r.id,
        r.token,
        r.attempt,
        r.lease_until,
        r.scheduled_at,
        r.enqueued_at,
        r.priority,
        r.key,
        r.channel,
        r.kind,
        r.content_type,
        r.headers,
        r.state,
        r.last_error,
        bytes(r.payload),
        serializer,
        status,
    )


#: The columns of a delivery (the type ``delivery``, which take, take_tx and peek return), in
#: their order.
_DELIVERY = (
    b"id",
    b"attempt",
    b"token",
    b"lease_until",
    b"scheduled_at",
    b"enqueued_at",
    b"priority",
    b"key",
    b"channel",
    b"kind",
    b"content_type",
    b"headers",
    b"state",
    b"last_error",
    b"payload",
)


def _delivery(queue: str, serializer: Serializer | None, r: Sequence[Any]) -> Message:
    """A row of the columns :data:`_DELIVERY` (compared by name first) as :func:`_message`
    makes it, read by position: no named tuple, no attribute lookups."""
    return new_message(
        queue, r[0], r[2], r[1], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
        bytes(r[14]), serializer, None,
    )  # fmt: skip


def _deliveries(queue: str, serializer: Serializer | None) -> RowFactory[Message]:
    """The row factory of take, take_tx and peek: each row straight to a Message. By position
    when the result's columns are :data:`_DELIVERY` (they are compared on every result), else
    (the SQL function's columns changed) by name, as :func:`_message` reads them."""

    def factory(cursor: Any) -> RowMaker[Message]:
        names = _columns(cursor)
        if names is None:
            return no_result
        if names == _DELIVERY:
            return partial(_delivery, queue, serializer)
        row = _row_type(*names)
        return lambda values: _message(queue, row(values), serializer)

    return factory


def _rows(rows: list[T]) -> list[T]:
    """The decoder of ops whose row factory made the results (:func:`_deliveries`)."""
    return rows


def _dead_messages(serializer: Serializer | None) -> Callable[[list[Any]], list[DeadMessage]]:
    return lambda rows: [
        DeadMessage(
            id=r.id,
            archived_at=r.archived_at,
            attempts=r.attempts,
            kind=r.kind,
            key=r.key,
            last_error=r.last_error,
            headers=r.headers,
            content_type=r.content_type,
            body=bytes(r.payload),
            serializer=serializer,
        )
        for r in rows
    ]


def _got_message(queue: str, serializer: Serializer | None) -> Callable[[list[Any]], Message | None]:
    """message_get's row (or none) as a Message with its status."""
    return lambda rows: _message(queue, rows[0], serializer, rows[0].status) if rows else None


def _archived(queue: str, serializer: Serializer | None) -> Callable[[list[Any]], list[ArchivedMessage]]:
    def decode(rows: list[Any]) -> list[ArchivedMessage]:
        return [
            _record(ArchivedMessage, r, queue=queue, body=bytes(r.payload), serializer=serializer)
            for r in rows
        ]

    return decode


def _record(cls: Callable[..., T], row: Any, **given: Any) -> T:
    """The dataclass ``cls`` from ``given`` and the columns of ``row`` named like its fields."""
    return cls(**given, **{f: getattr(row, f) for f in _field_names(cls) if f not in given})


@cache
def _field_names(dataclass_type: Any) -> tuple[str, ...]:
    return tuple(f.name for f in fields(dataclass_type))


# -- ops -------------------------------------------------------------------------------------


class Ops:
    """Builds the op of every client call for one schema."""

    def __init__(self, schema: str, serializer: Serializer | None = None) -> None:
        self.st = statements(schema)
        #: Encodes payloads other than bytes and str, and decodes the messages of its content type.
        self.serializer = serializer

    def queue_create(
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
    ) -> Op[bool]:
        check_queue(name)
        policy = _channel_policy(
            channel_max_concurrency,
            channel_release_interval,
            channel_max_size,
            channel_on_full,
            "channel_",
        )
        if dead_letter_queue is not None:
            check_queue(dead_letter_queue)
        for what, value in (("max_attempts", max_attempts), ("max_payload_bytes", max_payload_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise errors.InvalidArgument(f"{what} must be a positive integer, got {value!r}")
        if max_payload_bytes > MAX_PAYLOAD_BYTES:
            raise errors.InvalidArgument(f"max_payload_bytes must be at most {MAX_PAYLOAD_BYTES}")
        params = (
            name,
            to_ms(lease, "lease", positive=True),
            max_attempts,
            dead_letter_queue,
            bool(archive),
            to_ms(retention, "retention"),
            bool(unlogged),
            max_payload_bytes,
            to_ms(priority_step, "priority_step"),
            bool(if_not_exists),
            *policy,
        )
        if partitions is not None:
            if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
                raise errors.InvalidArgument(f"partitions must be a positive integer, got {partitions!r}")
            return Op(
                self.st.queue_create_partitioned,
                (name, partitions, *params[1:]),
                _scalar,
                row_factory=POSITIONAL,
            )
        return Op(self.st.queue_create, params, _scalar, row_factory=POSITIONAL)

    def queue_drop(self, name: str, *, if_exists: bool = False) -> Op[bool]:
        return Op(self.st.queue_drop, (check_queue(name), bool(if_exists)), _scalar, row_factory=POSITIONAL)

    def queue_purge(self, name: str) -> Op[None]:
        return Op(self.st.queue_purge, (check_queue(name),), _nothing)

    def queue_pause(self, name: str) -> Op[bool]:
        return Op(
            self.st.queue_pause, (check_queue(name),), _scalar, safe_to_retry=True, row_factory=POSITIONAL
        )

    def queue_resume(self, name: str) -> Op[bool]:
        return Op(
            self.st.queue_resume, (check_queue(name),), _scalar, safe_to_retry=True, row_factory=POSITIONAL
        )

    def queue_list(self, *, limit: int | None = None, after: str | None = None) -> Op[list[QueueInfo]]:
        if after is not None:
            check_queue(after)
        return Op(
            self.st.queue_list,
            (None if limit is None else check_limit(limit), after),
            lambda rows: [_record(QueueInfo, r) for r in rows],
            safe_to_retry=True,
        )

    def queue_metrics(self, name: str, *, cap: int | None = None) -> Op[QueueMetrics]:
        if cap is not None:
            check_limit(cap)
        return Op(
            self.st.queue_metrics,
            (check_queue(name), cap),
            lambda rows: _record(QueueMetrics, rows[0]),
            safe_to_retry=True,
        )

    def send(
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
        send_key: uuid.UUID | None = None,
    ) -> Op[SendResult]:
        """One message through the lean ``send()``, or for a plain message (nothing but a
        payload and a kind) ``send_plain()``, or ``send_plain_once()`` with a ``send_key``:
        ``send()``'s semantics for it, less of the server's work (``on_conflict`` acts on a key
        only). With ``send_key`` (see :func:`new_send_key`) a repeat of the call creates nothing
        and returns the first call's result, so the op is safe to retry."""
        check_queue(queue)
        if on_conflict != "ignore":  # (the default needs no check)
            _check_on_conflict(on_conflict)
        body, ctype = encode_payload(payload, self.serializer)
        if at is not None and delay is not None:
            raise errors.InvalidArgument("give delay or at, not both")
        if (
            headers is None
            and delay is None
            and at is None
            and type(priority) is int
            and priority == 0
            and key is None
            and channel is None
        ):
            if send_key is None:
                plain = (queue, body, ctype, check_text(kind, "kind", _KIND_MAX))
                return Op(self.st.send_plain, plain, _sent_plain, row_factory=POSITIONAL)
            once = (queue, body, send_key, ctype, check_text(kind, "kind", _KIND_MAX))
            return Op(self.st.send_plain_once, once, _sent_plain, safe_to_retry=True, row_factory=POSITIONAL)
        params = (
            queue,
            body,
            ctype,
            check_text(kind, "kind", _KIND_MAX),
            encode_headers(headers),
            at_ms(at),
            to_ms(delay, "delay"),
            _check_priority(priority),
            check_text(key, "key", _KEY_MAX),
            check_text(channel, "channel", _KEY_MAX),
            on_conflict,
            send_key,
        )
        return Op(self.st.send, params, _sent, safe_to_retry=send_key is not None)

    def send_batch(
        self,
        queue: str,
        messages: Iterable[Envelope | Any],
        *,
        on_conflict: OnConflict = "ignore",
        send_key: uuid.UUID | None = None,
    ) -> Op[list[SendResult]]:
        check_queue(queue)
        _check_on_conflict(on_conflict)
        bodies: list[bytes] = []
        ctypes: list[str | None] = []
        kinds: list[str | None] = []
        headers: list[Jsonb | None] = []
        ats: list[int | None] = []
        delays: list[int | None] = []
        prios: list[int] = []
        keys: list[str | None] = []
        channels: list[str | None] = []
        if isinstance(messages, (str, bytes, bytearray, memoryview, dict, Envelope)):
            # Iterating these would send one message per character/byte/key.
            raise errors.InvalidArgument(
                f"messages must be a list of payloads or Envelopes, got {type(messages).__name__}"
            )
        items = list(messages)
        if not any(isinstance(m, Envelope) for m in items):
            # Bare payloads (the common bulk case): nothing but the payload can be invalid and
            # every other per-message array is NULL.
            for p in items:
                body, ctype = encode_payload(p, self.serializer)
                bodies.append(body)
                ctypes.append(ctype)
            items = []
        for m in items:
            if not isinstance(m, Envelope):
                m = Envelope(m)
            body, ctype = encode_payload(m.payload, self.serializer)
            bodies.append(body)
            ctypes.append(ctype)
            kinds.append(check_text(m.kind, "kind", _KIND_MAX))
            headers.append(encode_headers(m.headers))
            if m.at is not None and m.delay is not None:
                raise errors.InvalidArgument("give delay or at, not both")
            ats.append(at_ms(m.at))
            delays.append(to_ms(m.delay, "delay"))
            prios.append(_check_priority(m.priority))
            keys.append(check_text(m.key, "key", _KEY_MAX))
            channels.append(check_text(m.channel, "channel", _KEY_MAX))

        def opt(values: list[Any]) -> list[Any] | None:
            # Whole-NULL arrays keep the wire small and let SQL take its fast path.
            return values if any(v is not None for v in values) else None

        params = (
            queue,
            bodies,
            opt(kinds),
            opt(ctypes),
            opt(headers),
            opt(ats),
            opt(delays),
            prios if any(prios) else None,
            opt(keys),
            opt(channels),
            on_conflict,
            send_key,
        )

        def decode(rows: list[Any]) -> list[SendResult]:
            return [new_send_result(r.id, r.outcome) for r in rows]

        # A batch is one call: one key covers it (all or nothing either way).
        return Op(self.st.send_batch, params, decode, safe_to_retry=send_key is not None)

    def take(
        self,
        queue: str,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        ack: Sequence[Message] = (),
    ) -> Op[list[Message]]:
        check_queue(queue)
        check_limit(n)
        lease_ms = to_ms(lease, "lease", positive=True)
        # A take that ran but whose answer was lost leaves its messages leased until the lease
        # ends, and the acks riding on it are fenced by token: repeating it is harmless.
        rows = _deliveries(queue, self.serializer)
        if not ack and isinstance(ack, (tuple, list)):  # nothing to ack (the common take)
            params: tuple[Any, ...] = (queue, n, lease_ms, None, None)
            return Op(self.st.take, params, _rows, safe_to_retry=True, row_factory=rows)
        ids, tokens = message_pairs(queue, ack)
        if len(ids) == 1:
            params = (queue, n, lease_ms, ids[0], tokens[0])
            return Op(self.st.take_ack_one, params, _rows, safe_to_retry=True, row_factory=rows)
        params = (queue, n, lease_ms, ids or None, tokens or None)
        return Op(self.st.take, params, _rows, safe_to_retry=True, row_factory=rows)

    def take_tx(self, queue: str, n: int = 1, *, archive: bool | None = None) -> Op[list[Message]]:
        check_queue(queue)
        check_limit(n)
        rows = _deliveries(queue, self.serializer)
        return Op(self.st.take_tx, (queue, n, archive), _rows, caller_tx=True, row_factory=rows)

    def is_router(self) -> Op[bool]:
        """Whether the schema is a shard router's (calls run in the shards' own transactions)."""
        return Op(
            self.st.is_router, (), lambda rows: bool(rows[0][0]), safe_to_retry=True, row_factory=POSITIONAL
        )

    def peek(self, queue: str, n: int = 10) -> Op[list[Message]]:
        check_queue(queue)
        check_limit(n)
        rows = _deliveries(queue, self.serializer)
        return Op(self.st.peek, (queue, n), _rows, safe_to_retry=True, row_factory=rows)

    def ack(self, messages: Sequence[Message], *, archive: bool | None = None) -> Op[set[int]]:
        if type(messages) is list and len(messages) == 1 and isinstance(m := messages[0], Message):
            # One delivery (a consumer's usual ack): what _one_queue and message_pairs would
            # check holds already.
            return Op(self.st.ack_one, (m.queue, m.id, m.token, archive), _ids, row_factory=POSITIONAL)
        queue = _one_queue(messages)
        ids, tokens = message_pairs(queue, messages)
        if len(ids) == 1:
            return Op(self.st.ack_one, (queue, ids[0], tokens[0], archive), _ids, row_factory=POSITIONAL)
        return Op(self.st.ack, (queue, ids, tokens, archive), _ids, row_factory=POSITIONAL)

    def nack(
        self,
        messages: Sequence[Message],
        *,
        delay: float | timedelta | Sequence[float | timedelta] = 0,
        error: str | Sequence[str | None] | None = None,
        state: Any = None,
        count_attempt: bool = True,
    ) -> Op[dict[int, str]]:
        queue = _one_queue(messages)
        ids, tokens = message_pairs(queue, messages)
        n = len(ids)
        delays = [to_ms(d, "delay") for d in _per_message(delay, n, "delay")]
        errs = [None if e is None else encode_error(str(e)) for e in _per_message(error, n, "error", str)]
        states = [encode_state(state)] * n if state is not None else None
        params = (queue, ids, tokens, delays, errs, states, count_attempt)
        return Op(self.st.nack, params, lambda rows: {r.id: r.outcome for r in rows})

    def extend(
        self, messages: Sequence[Message], *, lease: float | timedelta | None = None
    ) -> Op[dict[int, int]]:
        queue = _one_queue(messages)
        ids, tokens = message_pairs(queue, messages)
        params = (queue, ids, tokens, to_ms(lease, "lease", positive=True))
        return Op(self.st.extend, params, lambda rows: {r.id: r.lease_until for r in rows})

    def next_ready_in(self, queue: str) -> Op[int | None]:
        return Op(
            self.st.next_ready_in, (check_queue(queue),), _scalar, safe_to_retry=True, row_factory=POSITIONAL
        )

    def dead_list(
        self,
        queue: str,
        n: int = 100,
        *,
        after_id: int | None = 0,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
    ) -> Op[list[DeadMessage]]:
        check_queue(queue)
        check_limit(n)
        params = (queue, n, _check_after_id(after_id), _time(since, "since"), _time(until, "until"))
        return Op(self.st.dead_list, params, _dead_messages(self.serializer), safe_to_retry=True)

    def message_get(self, queue: str, *, id: int | None = None, key: str | None = None) -> Op[Message | None]:
        check_queue(queue)
        if (id is None) == (key is None):
            raise errors.InvalidArgument("give exactly one of id and key")
        params = (queue, None if id is None else _check_id(id, "id"), check_text(key, "key", _KEY_MAX))
        return Op(self.st.message_get, params, _got_message(queue, self.serializer), safe_to_retry=True)

    def message_cancel(
        self,
        queue: str,
        *,
        ids: Sequence[int] = (),
        keys: Sequence[str] = (),
        archive: bool = False,
    ) -> Op[list[int]]:
        check_queue(queue)
        if isinstance(ids, (int, str)) or isinstance(keys, str):
            raise errors.InvalidArgument("ids and keys must be lists")
        id_list = [_check_id(i, "ids") for i in ids]
        key_list = [check_text(k, "key", _KEY_MAX) for k in keys]
        if not isinstance(archive, bool):
            raise errors.InvalidArgument(f"archive must be a bool, got {archive!r}")
        params = (queue, id_list or None, key_list or None, archive)
        # Cancelling twice removes nothing more: safe to repeat.
        return Op(
            self.st.message_cancel,
            params,
            lambda rows: [r[0] for r in rows],
            safe_to_retry=True,
            row_factory=POSITIONAL,
        )

    def archive_list(
        self,
        queue: str,
        *,
        after_id: int | None = None,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
        limit: int = 100,
        status: ArchiveStatus | None = None,
    ) -> Op[list[ArchivedMessage]]:
        check_queue(queue)
        check_limit(limit)
        if status is not None and status not in ("acked", "dead", "cancelled"):
            raise errors.InvalidArgument(f"status must be acked, dead or cancelled, got {status!r}")
        params = (
            queue,
            _check_after_id(after_id),
            _time(since, "since"),
            _time(until, "until"),
            limit,
            status,
        )
        return Op(self.st.archive_list, params, _archived(queue, self.serializer), safe_to_retry=True)

    def dead_requeue(self, queue: str, ids: Sequence[int] | None = None) -> Op[int]:
        check_queue(queue)
        if ids is not None:
            ids = list(ids)
            if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in ids):
                raise errors.InvalidArgument("ids must be message ids (integers)")
        return Op(self.st.dead_requeue, (queue, ids), _scalar, row_factory=POSITIONAL)

    def dead_purge(self, queue: str) -> Op[int]:
        return Op(self.st.dead_purge, (check_queue(queue),), _scalar, row_factory=POSITIONAL)

    def channel_set(
        self,
        queue: str,
        channel: str,
        *,
        max_concurrency: int | None = None,
        release_interval: float | timedelta | None = None,
        max_size: int | None = None,
        on_full: OnFull = "reject",
    ) -> Op[ChannelInfo]:
        check_queue(queue)
        check_channel(channel)
        policy = _channel_policy(max_concurrency, release_interval, max_size, on_full, "")
        return Op(
            self.st.channel_set,
            (queue, channel, *policy),
            lambda rows: _record(ChannelInfo, rows[0], queue=queue),
        )

    def channel_reset(self, queue: str, channel: str) -> Op[bool]:
        return Op(
            self.st.channel_reset,
            (check_queue(queue), check_channel(channel)),
            _scalar,
            row_factory=POSITIONAL,
        )

    def channel_list(
        self, queue: str, *, limit: int = 1000, after: str | None = None
    ) -> Op[list[ChannelInfo]]:
        check_queue(queue)
        check_limit(limit)
        if after is not None:
            check_channel(after)
        return Op(
            self.st.channel_list,
            (queue, limit, after),
            lambda rows: [_record(ChannelInfo, r, queue=queue) for r in rows],
            safe_to_retry=True,
        )

    def maintain(self, limit: int = 10_000) -> Op[int]:
        return Op(self.st.maintain, (check_limit(limit),), _scalar, row_factory=POSITIONAL)

    def stats_minutes(
        self,
        queues: Sequence[str] | None = None,
        *,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
    ) -> Op[list[QueueCounts]]:
        """The counts of each minute in [since, until) (default: the last hour) that counted
        anything, by queue and minute; all queues, or those of ``queues`` that exist."""
        names = None if queues is None else [check_queue(q) for q in _names(queues)]
        params = (names, _time(since, "since"), _time(until, "until"))
        return Op(
            self.st.stats_minutes,
            params,
            lambda rows: [_record(QueueCounts, r) for r in rows],
            safe_to_retry=True,
        )

    def stats_totals(self, queues: Sequence[str] | None = None) -> Op[list[QueueCounts]]:
        """The counts since each queue was created, by queue name."""
        names = None if queues is None else [check_queue(q) for q in _names(queues)]
        return Op(
            self.st.stats_totals,
            (names,),
            lambda rows: [_record(QueueCounts, r, minute_at=None) for r in rows],
            safe_to_retry=True,
        )

    def worker_list(self) -> Op[list[WorkerInfo]]:
        """The running workers (registered by their heartbeats, not expired)."""
        return Op(
            self.st.worker_list, (), lambda rows: [_record(WorkerInfo, r) for r in rows], safe_to_retry=True
        )

    def message_list(
        self,
        queue: str,
        *,
        status: MessageStatus | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> Op[list[MessageSummary]]:
        """Live messages by id (keyset paging: pass the last id as ``after_id``), of one
        status or all, without their payloads."""
        check_queue(queue)
        check_limit(limit)
        if status is not None and status not in ("ready", "scheduled", "leased"):
            raise errors.InvalidArgument(f"status must be ready, scheduled or leased, got {status!r}")
        params = (queue, status, _check_after_id(after_id), limit)
        return Op(
            self.st.message_list,
            params,
            lambda rows: [_record(MessageSummary, r, queue=queue) for r in rows],
            safe_to_retry=True,
        )


R = TypeVar("R", set[int], dict[int, str], dict[int, int])


def settled(messages: Message | Sequence[Message], result: R) -> R:
    """A single message that was not settled means its token is stale: say so loudly."""
    if isinstance(messages, Message) and messages.id not in result:
        raise errors.LeaseLost(
            f"message {messages.id} of queue {messages.queue!r}: token {messages.token} is stale"
            " (its lease expired and it was taken again, it was updated or cancelled, or this"
            " delivery already settled it otherwise)"
        )
    return result


def _check_id(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise errors.InvalidArgument(f"{what} must be message ids (positive integers), got {value!r}")
    return value


def _names(values: object) -> list[object]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise errors.InvalidArgument("queues must be a list of names")
    return list(values)


def _check_after_id(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise errors.InvalidArgument(f"after_id must be a message id, got {value!r}")
    return value


def _time(value: object, what: str) -> int | None:
    """An aware datetime or epoch milliseconds (a bound of a time window)."""
    try:
        return at_ms(value)
    except errors.InvalidArgument as e:
        raise errors.InvalidArgument(str(e).replace("at ", f"{what} ", 1)) from None


def _one_queue(messages: Sequence[Message]) -> str:
    if isinstance(messages, Message):
        raise TypeError("pass a list of messages")  # guarded by the clients
    if not messages:
        raise errors.InvalidArgument("no messages given")
    for m in messages:
        if not isinstance(m, Message):
            raise errors.InvalidArgument(f"expected a Message, got {type(m).__name__}")
    queues = {m.queue for m in messages}
    if len(queues) != 1:
        raise errors.InvalidArgument("messages of one call must come from one queue")
    return queues.pop()


def message_pairs(queue: str, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    if isinstance(messages, Message):
        messages = [messages]
    ids, tokens = [], []
    for m in messages:
        if not isinstance(m, Message):
            raise errors.InvalidArgument(f"expected a Message, got {type(m).__name__}")
        if m.queue != queue:
            raise errors.InvalidArgument("messages of one call must come from one queue")
        ids.append(m.id)
        tokens.append(m.token)
    return ids, tokens


def _per_message(
    value: Any, n: int, what: str, scalar: type | tuple[type, ...] = (int, float, timedelta)
) -> list[Any]:
    if value is None or isinstance(value, scalar):
        return [value] * n
    try:
        values = list(value)
    except TypeError:
        raise errors.InvalidArgument(f"{what} must be one value or one per message, got {value!r}") from None
    if len(values) != n:
        raise errors.InvalidArgument(f"{what} must be one value or one per message")
    return values


def connection_quiet(conn: psycopg.BaseConnection[Any]) -> bool:
    """True when a pooled connection needs no round trip to be trusted: open, idle outside a
    transaction, and nothing to read on its socket. A server that ended the session (a restart,
    a failover, ``pg_terminate_backend``) has closed the socket or sent the reason, both of which
    read, so the pool's check falls back to an empty query for those (and for a connection that
    has notifications waiting); a healthy idle connection costs one ``select()``, not a round trip.
    """
    pg = conn.pgconn
    # A closed or broken connection's status is BAD: no need to ask conn.closed and conn.broken.
    if pg.status != ConnStatus.OK or pg.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([pg.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return False
    return not readable
