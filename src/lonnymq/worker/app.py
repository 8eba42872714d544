"""What a worker runs: handlers registered per queue and message kind, retry policies, and
periodic messages. An :class:`App` is plain configuration; :class:`~lonnymq.worker.Worker`
executes it.
"""

from __future__ import annotations

import functools
import inspect
import random
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from ..client.ops import check_queue, check_text, encode_payload, to_ms
from ..errors import InvalidArgument
from ..models import Message
from .schedule import Schedule, parse_schedule

__all__ = ["App", "Backoff", "Defer", "GiveUp", "Handler", "Job", "Middleware", "Periodic", "Retry"]

F = TypeVar("F", bound=Callable[..., Any])

#: Called with the job before each handler call; returns the context manager the call runs in
#: (see :attr:`App.middleware`).
Middleware = Callable[["Job"], AbstractContextManager[Any] | AbstractAsyncContextManager[Any]]
M = TypeVar("M", bound=Middleware)


# -- outcomes a handler can ask for -----------------------------------------------------------


class Defer(Exception):
    """Raise (or return) from a handler to run the message again after ``delay`` seconds with
    ``state`` saved as its checkpoint (``job.state`` on the next delivery). Does not count as a
    failed attempt."""

    def __init__(self, delay: float | timedelta = 0, state: Any = None) -> None:
        super().__init__(delay, state)
        self.delay = delay
        self.state = state


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry after ``delay`` seconds (default: the
    handler's backoff). Counts as a failed attempt; the last attempt dead-letters."""

    def __init__(self, reason: str = "retry requested", delay: float | timedelta | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class GiveUp(Exception):
    """Raise from a handler to dead-letter the message now, whatever attempts it has left (for
    errors that retrying cannot fix). The exception text becomes the message's error."""


# -- retry policy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the retry after failed attempt ``n`` waits
    ``min(max, base * factor ** (n - 1))`` seconds, shortened by a random fraction of up to
    ``jitter`` so that messages failing together do not retry together."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.factor >= 1 and self.max >= 0 and 0 <= self.jitter <= 1):
            raise InvalidArgument("Backoff needs base >= 0, factor >= 1, max >= 0, 0 <= jitter <= 1")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retrying after failed attempt ``attempt`` (1-based)."""
        exp = min(max(attempt, 1) - 1, 64)
        full = min(self.max, self.base * self.factor**exp)
        return full * (1 - self.jitter * rand())


# -- what a handler receives ------------------------------------------------------------------


class Job:
    """One delivery given to a handler: the message and what the handler may ask of the worker."""

    __slots__ = ("_stopping", "message")

    def __init__(self, message: Message, stopping: threading.Event) -> None:
        self.message = message
        self._stopping = stopping

    @property
    def payload(self) -> Any:
        return self.message.payload

    @property
    def id(self) -> int:
        return self.message.id

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def kind(self) -> str | None:
        return self.message.kind

    @property
    def headers(self) -> dict[str, Any]:
        return self.message.headers or {}

    @property
    def attempt(self) -> int:
        """1 on the first delivery; failed attempts increase it, deferrals do not."""
        return self.message.attempt

    @property
    def state(self) -> Any:
        """The checkpoint saved by an earlier :class:`Defer` (None the first time)."""
        return self.message.state

    @property
    def stopping(self) -> bool:
        """True once the worker is shutting down: a long handler may checkpoint and
        ``raise job.defer(state=...)`` instead of running to the end."""
        return self._stopping.is_set()

    def defer(self, delay: float | timedelta = 0, state: Any = None) -> Defer:
        """The :class:`Defer` to raise or return to run again later with ``state``."""
        return Defer(delay, state)

    def __repr__(self) -> str:
        return f"<Job {self.queue}#{self.id} kind={self.kind!r} attempt={self.attempt}>"


# -- registrations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Handler:
    fn: Callable[[Job], Any]
    queue: str
    kind: str | None
    is_async: bool
    retry: Backoff | None = None
    max_attempts: int | None = None
    timeout: float | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclass(frozen=True)
class Periodic:
    """A periodic message: one message per tick of ``schedule`` into ``queue``."""

    name: str
    schedule: Schedule
    queue: str
    payload: Any = None
    kind: str | None = None
    headers: dict[str, Any] | None = None
    priority: int = 0
    misfire_grace: float = 60.0

    def encoded(self) -> tuple[bytes, str | None]:
        return encode_payload(self.payload)


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


@dataclass
class App:
    """Handlers and periodic messages, registered in code::

        app = App()

        @app.handler("emails")
        def send(job): ...                      # a thread of the worker's pool runs it

        @app.handler("emails", kind="digest", max_attempts=3, retry=Backoff(base=10))
        async def digest(job): ...              # the worker's event loop runs it

        app.periodic("nightly-report", "0 3 * * *", queue="reports", payload={"kind": "daily"})

    A message goes to the handler of its (queue, kind); failing that, to its queue's handler
    registered without a kind.

    ``middleware``: callables ``mw(job)`` returning a context manager that each handler call
    runs in (the first listed outermost): a span, a timer, a logging context, a database
    session. For a sync handler it is entered in the handler's thread; for an async one in the
    handler's task, where it may also be an async context manager. It sees the handler's
    exception (including :class:`Retry`, :class:`Defer` and :class:`GiveUp`) and must let it
    through (one that suppresses it makes the call a success: the message is acknowledged).
    Add more with :meth:`use`.
    """

    retry: Backoff = field(default_factory=Backoff)
    handlers: dict[tuple[str, str | None], Handler] = field(default_factory=dict)
    queue_retry: dict[str, Backoff] = field(default_factory=dict)
    schedules: dict[str, Periodic] = field(default_factory=dict)
    middleware: list[Middleware] = field(default_factory=list)

    def use(self, middleware: M) -> M:
        """Add ``middleware`` (innermost so far); usable as a decorator. See :class:`App`."""
        if not callable(middleware):
            raise InvalidArgument(f"middleware must be callable, got {middleware!r}")
        self.middleware.append(middleware)
        return middleware

    def handler(
        self,
        queue: str,
        *,
        kind: str | None = None,
        retry: Backoff | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Decorator: register ``fn(job)`` (sync or async) for ``queue`` and ``kind``.
        ``retry`` overrides the queue's backoff, ``max_attempts`` dead-letters sooner than the
        queue would (it cannot allow more attempts than the queue's own ``max_attempts``),
        ``timeout`` (async handlers only) fails an attempt that runs longer."""

        def register(fn: F) -> F:
            self.register(fn, queue, kind=kind, retry=retry, max_attempts=max_attempts, timeout=timeout)
            return fn

        return register

    def register(
        self,
        fn: Callable[[Job], Any] | Callable[[Job], Awaitable[Any]],
        queue: str,
        *,
        kind: str | None = None,
        retry: Backoff | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> Handler:
        """Register ``fn`` without the decorator; see :meth:`handler`."""
        check_queue(queue)
        check_text(kind, "kind", 255)
        if not callable(fn):
            raise InvalidArgument(f"handler must be callable, got {fn!r}")
        if (queue, kind) in self.handlers:
            raise InvalidArgument(f"a handler for queue {queue!r} kind {kind!r} is already registered")
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise InvalidArgument(f"max_attempts must be a positive integer, got {max_attempts!r}")
        is_async = _is_async(fn)
        timeout_ms = to_ms(timeout, "timeout", positive=True)
        if timeout_ms is not None and not is_async:
            raise InvalidArgument("timeout needs an async handler: a thread cannot be interrupted")
        h = Handler(
            fn, queue, kind, is_async, retry, max_attempts, None if timeout_ms is None else timeout_ms / 1000
        )
        self.handlers[(queue, kind)] = h
        return h

    def configure_queue(self, queue: str, *, retry: Backoff) -> None:
        """Set the backoff of every handler of ``queue`` that has none of its own."""
        self.queue_retry[check_queue(queue)] = retry

    def periodic(
        self,
        name: str,
        schedule: str,
        *,
        queue: str,
        payload: Any = None,
        kind: str | None = None,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        misfire_grace: float | timedelta = 60.0,
        timezone: str | None = None,
    ) -> Periodic:
        """Declare a periodic message: at every tick of ``schedule`` (cron syntax, a macro such as
        ``@hourly``, or ``@every 30s``) one message is sent to ``queue`` -- exactly one across
        all workers. Cron expressions run in ``timezone`` (an IANA name such as
        ``"Europe/Paris"``; default UTC), across daylight-saving changes like Debian cron (see
        :mod:`lonnymq.worker.schedule`). Workers store the declaration in the database when they
        start."""
        check_queue(queue)
        check_text(kind, "kind", 255)
        grace = to_ms(misfire_grace, "misfire_grace")
        if name in self.schedules:
            raise InvalidArgument(f"a periodic message named {name!r} is already declared")
        p = Periodic(
            name,
            parse_schedule(schedule, timezone),
            queue,
            payload,
            kind,
            headers,
            priority,
            (grace or 0) / 1000,
        )
        p.encoded()  # fail now, not in the worker, if the payload cannot be encoded
        self.schedules[name] = p
        return p

    def resolve(self, queue: str, kind: str | None) -> Handler | None:
        """The handler of a message of ``queue`` and ``kind``, or None."""
        return self.handlers.get((queue, kind)) or self.handlers.get((queue, None))

    def backoff(self, handler: Handler | None, queue: str) -> Backoff:
        if handler is not None and handler.retry is not None:
            return handler.retry
        return self.queue_retry.get(queue, self.retry)

    @property
    def queues(self) -> list[str]:
        """Every queue that has a handler, sorted."""
        return sorted({q for q, _ in self.handlers})
