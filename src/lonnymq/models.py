"""Plain data returned and accepted by the clients."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from .serializer import JSON as JSON
from .serializer import Serializer

Outcome = Literal["created", "updated", "ignored", "dropped"]
OnConflict = Literal["ignore", "replace", "error"]
OnFull = Literal["reject", "drop"]
#: Where a live message is: deliverable now (expired leases included), due later, or leased.
MessageStatus = Literal["ready", "scheduled", "leased"]
#: How a message left the queue into the archive.
ArchiveStatus = Literal["acked", "dead", "cancelled"]

TEXT = "text/plain; charset=utf-8"

T = TypeVar("T")


def decode_payload(body: bytes, content_type: str | None, serializer: Serializer | None = None) -> Any:
    """Bytes sent as bytes come back as bytes, text as str; a body of the serializer's content
    type is decoded by it, other JSON as plain JSON (see :mod:`lonnymq.serializer` for what
    round-trips). Other content types come back as bytes."""
    if serializer is not None and content_type == serializer.content_type:
        return serializer.loads(body)
    if content_type == JSON:
        return json.loads(body)
    if content_type == TEXT:
        return body.decode("utf-8")
    return body


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery of a message.

    ``token`` is the fencing token: ack/nack/extend succeed only while it still matches, i.e.
    while nobody else has taken the message since. ``attempt`` is 1 on the first delivery and
    counts failed attempts (nack, expired lease) against the queue's ``max_attempts``; deferrals
    do not count. Times are epoch milliseconds.
    """

    queue: str
    id: int
    token: int
    attempt: int
    lease_until: int | None
    scheduled_at: int
    enqueued_at: int
    priority: int
    key: str | None
    channel: str | None
    kind: str | None
    content_type: str | None
    headers: dict[str, Any] | None
    state: Any
    last_error: str | None
    body: bytes = field(repr=False)
    #: The serializer of the client that received it (decodes ``payload``).
    serializer: Serializer | None = field(default=None, repr=False, compare=False)
    #: The message's status when read by ``get`` (ready, scheduled or leased); else None.
    status: MessageStatus | None = None

    @property
    def payload(self) -> Any:
        """The payload decoded: bytes, str, or the serializer's value (see
        :mod:`lonnymq.serializer`)."""
        return decode_payload(self.body, self.content_type, self.serializer)


def _slot_constructor(cls: type[T]) -> Callable[..., T]:
    """A constructor of the frozen, slotted dataclass ``cls`` taking every field by position, in
    ``fields()`` order: the object ``cls(...)`` makes (frozen as ever), without its ``__init__``,
    which sets each field through ``object.__setattr__``: 2.7 us for Message's 18 fields,
    this 1.2 us (docs/benchmarks.md, "The client's own CPU per call"). For decoders of rows,
    whose values need no default."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set_{n}": getattr(cls, n).__set__ for n in names})
    body = "".join(f"    set_{n}(o, {n})\n" for n in names)
    exec(f"def make({', '.join(names)}):\n    o = new(cls)\n{body}    return o\n", scope)
    return cast("Callable[..., T]", scope["make"])


#: ``Message(...)`` with every field by position, made faster (see :func:`_slot_constructor`).
new_message: Callable[..., Message] = _slot_constructor(Message)


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a send did: ``created`` a message, ``updated`` (replaced) the live message with the
    same key, ``ignored`` the send because a live message with the key exists (its id), or
    ``dropped`` it because its channel was full and drops on full (id None)."""

    id: int | None
    outcome: Outcome


#: ``SendResult(id, outcome)``, made as :data:`new_message` makes a Message (a send's result,
#: made on every send).
new_send_result: Callable[[int | None, Outcome], SendResult] = _slot_constructor(SendResult)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message to send in a batch; see :meth:`Client.send` for the meaning of each field."""

    payload: Any
    kind: str | None = None
    headers: dict[str, Any] | None = None
    delay: float | None = None
    at: datetime | int | None = None
    priority: int = 0
    key: str | None = None
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    lease_ms: int
    max_attempts: int
    dead_letter_queue: str | None
    archive: bool
    retention_ms: int
    unlogged: bool
    max_payload_bytes: int
    priority_step_ms: int
    created_at: datetime
    #: Paused (``pause_queue``): sends are accepted, nothing is handed out.
    paused: bool = False


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """The state of a queue, read on one snapshot. Counts are exact; when the call was made
    with a ``cap``, a count stops at the cap and its ``*_at_least`` flag is then True.
    ``total_sent``: messages ever sent to the queue (sends, dead letters moved in, requeued
    dead messages). ``oldest_age_ms``/``newest_age_ms``: age of the first and last live
    message (None when empty); ``oldest_ready_age_ms``: how overdue the most overdue ready
    message is; ``next_scheduled_at``: epoch ms when the next scheduled one comes due. ``paused``: the queue hands out nothing
    (``pause_queue``); its ready messages still count as ready."""

    queue: str
    ready: int
    scheduled: int
    leased: int
    dead: int
    oldest_ready_age_ms: int | None
    next_scheduled_at: int | None
    total_sent: int = 0
    oldest_age_ms: int | None = None
    newest_age_ms: int | None = None
    ready_at_least: bool = False
    scheduled_at_least: bool = False
    leased_at_least: bool = False
    dead_at_least: bool = False
    paused: bool = False


@dataclass(frozen=True, slots=True)
class DeadMessage:
    id: int
    archived_at: int
    attempts: int
    kind: str | None
    key: str | None
    last_error: str | None
    headers: dict[str, Any] | None
    content_type: str | None
    body: bytes = field(repr=False)
    serializer: Serializer | None = field(default=None, repr=False, compare=False)

    @property
    def payload(self) -> Any:
        return decode_payload(self.body, self.content_type, self.serializer)


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A message kept in the archive: ``status`` says how it left the queue (``acked``,
    ``dead`` or ``cancelled``). Times are epoch milliseconds."""

    queue: str
    id: int
    status: ArchiveStatus
    archived_at: int
    scheduled_at: int
    enqueued_at: int
    attempts: int
    deliveries: int
    priority: int
    key: str | None
    channel: str | None
    kind: str | None
    content_type: str | None
    headers: dict[str, Any] | None
    state: Any
    last_error: str | None
    body: bytes = field(repr=False)
    serializer: Serializer | None = field(default=None, repr=False, compare=False)

    @property
    def payload(self) -> Any:
        return decode_payload(self.body, self.content_type, self.serializer)


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A channel of a queue: its policy and its state.

    ``size`` counts its messages (ready, scheduled and leased); ``leased`` its leases, which
    never exceed ``max_concurrency`` (expired leases not yet retaken included). ``explicit``:
    configured with ``set_channel`` (kept while empty) rather than created by a message with
    the queue's defaults. ``ready_at`` (epoch ms) is when it may deliver next, rate and
    concurrency limits included; None when empty. ``None`` limits are unlimited.
    """

    queue: str
    name: str
    max_concurrency: int | None
    release_interval_ms: int | None
    max_size: int | None
    on_full: OnFull
    explicit: bool
    size: int
    leased: int
    last_served_at: int | None
    ready_at: int | None


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What happened to a queue: messages ``sent`` (by sends, dead letters moved in, requeued
    dead messages), ``acked``, ``nacked`` (retried after a failure that counts an attempt;
    defer and release do not count), ``dead`` (dead-lettered or archived as dead) and
    ``cancelled``. ``minute_at``: the minute (epoch ms of its start) these are the counts of;
    None for totals since the queue was created. Exact: only committed calls are counted."""

    queue: str
    minute_at: int | None
    sent: int
    acked: int
    nacked: int
    dead: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A running worker process, as its last heartbeat registered it (epoch ms times)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    started_at: int
    heartbeat_at: int


@dataclass(frozen=True, slots=True)
class MessageSummary:
    """A live message as a listing shows it: no payload, its size (``payload_bytes``).
    ``status`` is as :meth:`~lonnymq.AsyncClient.get` reports it; ``lease_until`` (epoch ms)
    only while leased; ``attempt`` counts failed attempts, ``token`` the deliveries."""

    queue: str
    id: int
    status: MessageStatus
    attempt: int
    token: int
    lease_until: int | None
    scheduled_at: int
    enqueued_at: int
    priority: int
    key: str | None
    channel: str | None
    kind: str | None
    content_type: str | None
    last_error: str | None
    payload_bytes: int
