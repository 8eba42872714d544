"""What each dashboard page shows, read through the client: one function per page, returning
plain JSON-able dicts that the JSON API returns as they are and the templates render.

Everything is a keyset page or a capped count, so a page costs the same on a queue of five
million messages as on an empty one (tests/web/test_plans.py checks the plans).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, TypeVar

from psycopg import sql

from .. import errors
from ..client import AsyncClient
from ..client.ops import Op, Ops, check_queue
from ..models import (
    JSON,
    TEXT,
    ArchiveStatus,
    Envelope,
    MessageStatus,
    QueueCounts,
    QueueInfo,
    QueueMetrics,
)

T = TypeVar("T")


def _page(rows: Sequence[T], limit: int) -> tuple[list[T], T | None]:
    """A page from ``rows`` fetched as ``limit + 1``: its first ``limit`` rows, and the last of
    them when more follow (the next page's cursor), else None."""
    page = list(rows[:limit])
    return page, (page[-1] if len(rows) > limit else None)


#: Counts stop here on the overview (one capped index-only count per state and queue); the
#: queue page counts further.
OVERVIEW_CAP = 1_000
QUEUE_CAP = 100_000
#: The largest page of any listing the dashboard serves.
MAX_PAGE = 500
DEFAULT_PAGE = 50
#: The overview lists this many queues a page unless asked otherwise.
OVERVIEW_PAGE = 100
#: Payloads are shown up to this many bytes on a message's page, and in listings (dead letters,
#: archive) up to PREVIEW bytes each.
MAX_SHOWN = 64 * 1024
PREVIEW = 2 * 1024
HOUR_MS = 3_600_000
#: Throughput is averaged over the last five whole minutes.
RATE_MINUTES = 5


class WebOps:
    """The few statements the client has no method for, composed once per schema."""

    def __init__(self, schema: str) -> None:
        s = sql.Identifier(schema)
        # Every queue's metrics in one round trip (the same function the client's metrics() calls).
        self._metrics = sql.SQL(
            "SELECT m.* FROM unnest(%s::text[]) WITH ORDINALITY AS n(name, ord)"
            " CROSS JOIN LATERAL {s}.queue_metrics(n.name, %s::int) m ORDER BY n.ord"
        ).format(s=s)
        # One queue's settings: a probe of the name's index (queue_list() read every queue).
        self._queue = sql.SQL("SELECT * FROM {s}.queue_info(ARRAY[%s::text])").format(s=s)

    def metrics(self, names: Sequence[str], cap: int) -> Op[list[QueueMetrics]]:
        return Op(
            self._metrics,
            ([check_queue(n) for n in names], cap),
            lambda rows: [QueueMetrics(**r._asdict()) for r in rows],
            safe_to_retry=True,
        )

    def queue(self, name: str) -> Op[QueueInfo | None]:
        return Op(
            self._queue,
            (check_queue(name),),
            lambda rows: QueueInfo(**rows[0]._asdict()) if rows else None,
            safe_to_retry=True,
        )


@lru_cache(maxsize=64)
def web_ops(schema: str) -> WebOps:
    return WebOps(schema)


def now_ms() -> int:
    return int(time.time() * 1000)


# -- pages -------------------------------------------------------------------------------------


async def queue_rows(
    c: AsyncClient, *, after: str | None, limit: int, cap: int = OVERVIEW_CAP, parallel: int = 4
) -> dict[str, Any]:
    """The overview: a page of queues by name with their counts by state (capped at ``cap``),
    oldest ready age, throughput per minute and the last hour minute by minute. The counts are
    read in ``parallel`` slices at once (each on its own connection of the client's pool)."""
    queues, last = _page(await c.list_queues(limit=limit + 1, after=after), limit)
    names = [q.name for q in queues]
    metrics: list[QueueMetrics] = []
    minutes: list[QueueCounts] = []
    now = now_ms()
    if names:
        size = -(-len(names) // max(1, parallel))
        slices = [names[i : i + size] for i in range(0, len(names), size)]
        ops = web_ops(c.schema)
        try:
            parts, minutes = await asyncio.gather(
                asyncio.gather(*(c.run(ops.metrics(part, cap)) for part in slices)),
                c.run(c.ops.stats_minutes(names, since=now - HOUR_MS)),
            )
        except errors.QueueNotFound:  # one was dropped meanwhile: list again, once
            queues = [q for q in await c.list_queues(limit=limit, after=after) if q.name in names]
            names = [q.name for q in queues]
            parts = [await c.run(ops.metrics(names, cap))]
        metrics = [m for part in parts for m in part]
    by_queue: dict[str, list[QueueCounts]] = {}
    for x in minutes:
        by_queue.setdefault(x.queue, []).append(x)
    rows = []
    for q, m in zip(queues, metrics, strict=True):
        rows.append(
            {
                "name": q.name,
                "paused": q.paused,
                **counts(m),
                "rates": rates(by_queue.get(q.name, []), now),
                "minutes": [minute(x) for x in by_queue.get(q.name, [])],
            }
        )
    return {"queues": rows, "next_after": last.name if last else None, "cap": cap, "now": now}


async def queue_page(c: AsyncClient, name: str, *, cap: int = QUEUE_CAP) -> dict[str, Any]:
    """One queue: its settings, its counts (capped at ``cap``), throughput, the last hour."""
    now = now_ms()
    info, m, minutes, totals = await asyncio.gather(
        c.run(web_ops(c.schema).queue(name)),
        c.metrics(name, cap=cap),
        c.run(c.ops.stats_minutes([name], since=now - HOUR_MS)),
        c.run(c.ops.stats_totals([name])),
    )
    if info is None:
        raise errors.QueueNotFound(f"queue {name!r} does not exist")
    return {
        "paused": info.paused,
        "settings": settings(info),
        "counts": counts(m),
        "cap": cap,
        "rates": rates(minutes, now),
        "minutes": [minute(x) for x in minutes],
        "totals": {k: getattr(totals[0], k) for k in _COUNTERS} if totals else None,
        "now": now,
    }


async def message_rows(
    c: AsyncClient, queue: str, *, status: MessageStatus | None, after: int | None, limit: int
) -> dict[str, Any]:
    """A page of live messages by id, of one status or all, without payloads."""
    found = await c.run(c.ops.message_list(queue, status=status, after_id=after, limit=limit + 1))
    rows, last = _page(found, limit)
    return {
        "queue": queue,
        "status": status,
        "messages": [asdict(r) for r in rows],
        "next_after": last.id if last else None,
    }


async def message_one(
    c: AsyncClient, queue: str, *, id: int | None, key: str | None
) -> dict[str, Any] | None:
    """One live message with its payload and headers shown, or None."""
    m = await c.get(queue, id=id, key=key)
    if m is None:
        return None
    return {
        "queue": queue,
        "id": m.id,
        "status": m.status,
        "attempt": m.attempt,
        "token": m.token,
        "lease_until": m.lease_until,
        "scheduled_at": m.scheduled_at,
        "enqueued_at": m.enqueued_at,
        "priority": m.priority,
        "key": m.key,
        "channel": m.channel,
        "kind": m.kind,
        "content_type": m.content_type,
        "last_error": m.last_error,
        "state": m.state,
        "headers": m.headers,
        "payload": shown(m.body, m.content_type),
        "headers_text": pretty(m.headers),
    }


async def dead_rows(c: AsyncClient, queue: str, *, after: int | None, limit: int) -> dict[str, Any]:
    """A page of the queue's dead messages in the archive, by id, with their last error."""
    rows, last = _page(await c.dead_letters(queue, limit + 1, after_id=after or 0), limit)
    return {
        "queue": queue,
        "messages": [
            {
                "id": r.id,
                "archived_at": r.archived_at,
                "attempts": r.attempts,
                "kind": r.kind,
                "key": r.key,
                "last_error": r.last_error,
                "content_type": r.content_type,
                "payload": shown(r.body, r.content_type, PREVIEW),
                "headers_text": pretty(r.headers),
            }
            for r in rows
        ],
        "next_after": last.id if last else None,
    }


async def archive_rows(
    c: AsyncClient, queue: str, *, status: ArchiveStatus | None, after: int | None, limit: int
) -> dict[str, Any]:
    """A page of the queue's archive (acked, dead, cancelled; or one status), by id."""
    rows, last = _page(await c.archived(queue, after_id=after, limit=limit + 1, status=status), limit)
    return {
        "queue": queue,
        "status": status,
        "messages": [
            {
                "id": r.id,
                "status": r.status,
                "archived_at": r.archived_at,
                "enqueued_at": r.enqueued_at,
                "attempts": r.attempts,
                "deliveries": r.deliveries,
                "kind": r.kind,
                "key": r.key,
                "channel": r.channel,
                "last_error": r.last_error,
                "content_type": r.content_type,
                "payload": shown(r.body, r.content_type, PREVIEW),
                "headers_text": pretty(r.headers),
            }
            for r in rows
        ],
        "next_after": last.id if last else None,
    }


async def channel_rows(c: AsyncClient, queue: str, *, after: str | None, limit: int) -> dict[str, Any]:
    """A page of the queue's channels by name: limits, size, in flight, last served."""
    rows, last = _page(await c.channels(queue, limit=limit + 1, after=after), limit)
    return {
        "queue": queue,
        "channels": [asdict(r) for r in rows],
        "next_after": last.name if last else None,
    }


async def cron_rows(c: AsyncClient) -> dict[str, Any]:
    """Every periodic message schedule with its last and next run."""
    from ..worker.ops import worker_ops

    rows = await c.run(worker_ops(c.schema).cron_list())
    out = []
    for r in rows:
        out.append(
            {
                "name": r.name,
                "schedule": r.schedule,
                "queue": r.queue,
                "kind": r.kind,
                "enabled": r.enabled,
                "source": r.source,
                "last_tick_ms": r.last_tick_ms,
                "last_fired_ms": r.last_fired_ms,
                "last_message_id": r.last_message_id,
                "next_tick_ms": r.next_tick_ms() if r.enabled else None,
            }
        )
    return {"schedules": out}


async def worker_rows(c: AsyncClient) -> dict[str, Any]:
    """The running workers as their heartbeats registered them."""
    rows = await c.run(c.ops.worker_list())
    return {"workers": [asdict(w) for w in rows], "now": now_ms()}


@dataclass(frozen=True, slots=True)
class _Stored:
    body: bytes


class _AsStored:
    """A serializer writing a payload's stored bytes back unchanged, with its content type."""

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type

    def dumps(self, value: Any) -> bytes:
        assert isinstance(value, _Stored)
        return value.body

    def loads(self, body: bytes) -> Any:
        return body


class NotReschedulable(errors.LonnyMQError):
    """The message is not live, or leased (its worker holds it)."""


async def reschedule(c: AsyncClient, queue: str, id: int, at_ms: int) -> int:
    """Send live message ``id`` again to be delivered at ``at_ms``, in one transaction with its
    cancellation: same payload (byte for byte, content type kept), kind, headers, priority, key
    and channel; a new id, attempts counted from zero, its saved state dropped. Refused for a
    leased message. Returns the new id."""
    async with c.connection() as conn, conn.transaction():
        m = await c.get(queue, id=id, conn=conn)
        if m is None:
            raise NotReschedulable(f"message {id} of queue {queue!r} is not live")
        if m.status == "leased":
            raise NotReschedulable(f"message {id} is leased by a worker: wait for it to settle")
        # message_cancel locks the row; a take between get() and here would have leased it:
        # the message is then sent again all the same (at least once, never lost).
        if await c.cancel(queue, ids=[id], conn=conn) != [id]:
            raise NotReschedulable(f"message {id} of queue {queue!r} is not live")
        ops = c.ops if m.content_type is None else Ops(c.schema, _AsStored(m.content_type))
        payload: Any = m.body if m.content_type is None else _Stored(m.body)
        env = Envelope(payload, m.kind, m.headers, None, at_ms, m.priority, m.key, m.channel)
        (sent,) = await c.run(ops.send_batch(queue, [env], on_conflict="error"), conn)
        assert sent.id is not None
        return sent.id


# -- shaping -----------------------------------------------------------------------------------

_COUNTERS = ("sent", "acked", "nacked", "dead", "cancelled")


def settings(q: QueueInfo) -> dict[str, Any]:
    d = asdict(q)
    d["created_at"] = q.created_at.isoformat(timespec="seconds")
    return d


def counts(m: QueueMetrics) -> dict[str, Any]:
    return {
        "ready": m.ready,
        "scheduled": m.scheduled,
        "leased": m.leased,
        "dead": m.dead,
        "ready_at_least": m.ready_at_least,
        "scheduled_at_least": m.scheduled_at_least,
        "leased_at_least": m.leased_at_least,
        "dead_at_least": m.dead_at_least,
        "oldest_ready_age_ms": m.oldest_ready_age_ms,
        "next_scheduled_at": m.next_scheduled_at,
        "total_sent": m.total_sent,
    }


def minute(x: QueueCounts) -> dict[str, Any]:
    return {"minute_at": x.minute_at, **{k: getattr(x, k) for k in _COUNTERS}}


def rates(minutes: Sequence[QueueCounts], now: int) -> dict[str, float]:
    """Per-minute averages over the last RATE_MINUTES whole minutes; failed = nacked + dead."""
    start = (now // 60_000 - RATE_MINUTES) * 60_000
    end = (now // 60_000) * 60_000
    sums = dict.fromkeys(_COUNTERS, 0)
    for x in minutes:
        if x.minute_at is not None and start <= x.minute_at < end:
            for k in _COUNTERS:
                sums[k] += getattr(x, k)
    out = {k: round(v / RATE_MINUTES, 2) for k, v in sums.items()}
    out["failed"] = round((sums["nacked"] + sums["dead"]) / RATE_MINUTES, 2)
    return out


def pretty(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def shown(body: bytes, content_type: str | None, limit: int = MAX_SHOWN) -> dict[str, Any]:
    """A payload as the dashboard shows it: JSON indented, text as it is, other bytes as base64;
    cut at ``limit`` bytes (``truncated``)."""
    size = len(body)
    part = body[:limit]
    truncated = size > limit
    if content_type is None or content_type in (JSON, TEXT) or content_type.startswith("text/"):
        try:
            text = part.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            if content_type == JSON and not truncated:
                try:
                    return {
                        "format": "json",
                        "text": pretty(json.loads(text)),
                        "bytes": size,
                        "truncated": False,
                    }
                except ValueError:
                    pass
            if content_type is not None or text.isprintable() or "\n" in text:
                return {"format": "text", "text": text, "bytes": size, "truncated": truncated}
    return {
        "format": "base64",
        "text": base64.b64encode(part).decode("ascii"),
        "bytes": size,
        "truncated": truncated,
    }
