"""What the worker's parts share: the deliveries held, per-queue buffers, the events that wake
and stop the tasks, and the two helpers every loop uses (an interruptible sleep, a retry on
connection errors)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..client.aio import AsyncClient
from ..client.config import libpq_timeout, resolve_conninfo
from ..models import Message
from .app import App
from .meters import WorkerMeters
from .ops import WorkerOps

log = logging.getLogger("lonnymq.worker")

T = TypeVar("T")

#: application_name of the worker's connections (pg_stat_activity shows who is who).
APPLICATION_NAME = "lonnymq-worker"

#: Errors worth retrying: the connection or server went away, or the transaction lost a race.
TRANSIENT = (psycopg.OperationalError, psycopg.errors.TransactionRollback)


@dataclass(eq=False)
class Held:
    """A delivery this worker holds a lease on, until its settle call completed."""

    message: Message
    state: str = "running"  # running -> done (settle queued) -> settling (settle in flight)
    lost: bool = False


@dataclass(eq=False)
class QueueState:
    """One served queue: its deliveries held, and their results waiting to be settled."""

    name: str
    lease_ms: int
    max_attempts: int
    hint: bool = True  # it may have ready messages: fetch before sleeping
    wake_at: float = 0.0  # monotonic time of the next fetch when there is no hint
    idle: bool = False  # the last fetch left slots free: be a registered waiter (sends notify)
    registered: bool = False  # the listener's connection is a waiter on the queue
    pending: list[str] = field(default_factory=list)  # sends that may have missed registering
    held: dict[tuple[int, int], Held] = field(default_factory=dict)
    acks: list[Held] = field(default_factory=list)
    retries: list[tuple[Held, int, str]] = field(default_factory=list)
    defers: list[tuple[Held, int, Any]] = field(default_factory=list)
    dead: list[tuple[Held, str]] = field(default_factory=list)

    def has_settles(self) -> bool:
        return bool(self.acks or self.retries or self.defers or self.dead)


def key(m: Message) -> tuple[int, int]:
    """A delivery's identity: the message and the lease token it was taken with."""
    return (m.id, m.token)


@dataclass(eq=False)
class Context:
    """The state the worker's tasks share (all on the worker's event loop, except ``stopping``)."""

    app: App
    client: AsyncClient
    ops: WorkerOps
    meters: WorkerMeters
    concurrency: int
    batch_size: int
    poll_interval: float
    ack_interval: float
    fetch_cooldown: float
    queues: dict[str, QueueState] = field(default_factory=dict)
    running: int = 0  # handlers running now
    cancelling: bool = False  # the hard shutdown phase cancels handlers
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # fetch loop: a slot or a NOTIFY
    listen_wake: asyncio.Event = field(default_factory=asyncio.Event)  # listener: a queue's idle changed
    settle_wake: asyncio.Event = field(default_factory=asyncio.Event)  # settler: results wait
    stop_fetch: asyncio.Event = field(default_factory=asyncio.Event)  # fetch loop, scheduler: stop
    stop_side: asyncio.Event = field(default_factory=asyncio.Event)  # settler, heartbeat: stop
    stopping: threading.Event = field(default_factory=threading.Event)  # Job.stopping, any thread


def own_client(conninfo: str | None, schema: str) -> AsyncClient:
    """The worker's own client: ``conninfo``, else what ``Client()`` would use
    (:func:`~lonnymq.client.config.resolve_conninfo`: ``$LONNYMQ_DSN``, ``$DATABASE_URL``, then
    libpq's defaults and ``PG*`` variables), with the worker's application_name unless it names
    one. A server is never started here."""
    if conninfo is None:
        conninfo = resolve_conninfo()
    if "application_name" not in conninfo_to_dict(conninfo):
        conninfo = make_conninfo(conninfo, application_name=APPLICATION_NAME)
    return AsyncClient(conninfo, schema=schema, pool_size=5)


async def probe(conninfo: str, seconds: float) -> None:
    """Connect once and close: raises what the connection attempt raised. ``seconds``: libpq's
    connect_timeout when the DSN has none (config.libpq_timeout)."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in conninfo_to_dict(conninfo):
        kwargs["connect_timeout"] = libpq_timeout(seconds)
    conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
    await conn.close()


async def sleep(seconds: float, until: asyncio.Event) -> None:
    """Sleep up to ``seconds``, less if ``until`` is set."""
    if seconds <= 0 or until.is_set():
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until.wait(), seconds)


async def retrying(
    what: str,
    call: Callable[[], Awaitable[T]],
    delay: float,
    until: asyncio.Event,
    report: Callable[[BaseException | None], None] | None = None,
) -> tuple[T | None, float]:
    """Run ``call``. On a connection error log it, sleep ``delay`` (less if ``until`` is set)
    and return None with the next, doubled delay; other errors propagate. ``report`` is told
    whether the database answered (the readiness probe)."""
    try:
        result = await call()
    except TRANSIENT as e:
        if report is not None:
            report(e)
        log.warning("%s: database unavailable (%s); retrying in %.1fs", what, e, delay)
        await sleep(delay, until)
        return None, min(delay * 2, 5.0)
    if report is not None:
        report(None)
    return result, 0.1
