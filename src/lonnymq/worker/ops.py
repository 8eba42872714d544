"""The worker's SQL calls (migration 0004 and batched settling), as I/O-free ops run by
``AsyncClient.run`` like every core call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from psycopg import sql

from .. import errors
from ..client.ops import (
    Op,
    check_queue,
    check_text,
    encode_error,
    encode_headers,
    encode_payload,
    encode_state,
    message_pairs,
    statements,
    to_ms,
)
from ..models import Message
from .schedule import parse_schedule

#: The migration that created the tables below (0001_baseline; the functions are in sql/cron.sql
#: and sql/settle.sql, applied by the same migrate).
WORKER_MIGRATION = 1


@dataclass(frozen=True, slots=True)
class CronRow:
    name: str
    schedule: str
    queue: str
    kind: str | None
    enabled: bool
    source: str
    misfire_grace_ms: int
    last_tick_ms: int
    last_fired_ms: int | None
    last_message_id: int | None
    db_now_ms: int

    def next_tick_ms(self) -> int | None:
        """The schedule's next tick after its last one (or the database's now, if later): when it
        fires next if enabled. None if the schedule no longer parses or has no tick left."""
        try:
            return parse_schedule(self.schedule).next_after(max(self.last_tick_ms, self.db_now_ms))
        except errors.InvalidArgument:
            return None


class WorkerOps:
    def __init__(self, schema: str) -> None:
        s = sql.Identifier(schema)

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(s=s)

        self._version = q("SELECT coalesce(max(version), 0) FROM {s}.migration")
        self._now = q("SELECT {s}.now_ms()")
        self._nack = statements(schema).nack  # the client's own statement (binary arrays)
        self._give_up = statements(schema).give_up  # the client's: a direct client runs it on the shard
        self._worker_queues = q("SELECT * FROM {s}.worker_queues(%s::text[])")
        self._cron_list = q("SELECT * FROM {s}.cron_list()")
        self._cron_fire = q("SELECT {s}.cron_fire(%s::text, %s::bigint)")
        self._cron_upsert = q(
            "SELECT {s}.cron_upsert(%s::text, %s::text, %s::text, %s::bytea, %s::text, %s::text,"
            " %s::jsonb, %s::int2, %s::bigint, %s::text)"
        )
        self._cron_delete = q("SELECT {s}.cron_delete(%s::text)")
        self._cron_enable = q("SELECT {s}.cron_set_enabled(%s::text, %s::bool)")
        self._worker_beat = q(
            "SELECT {s}.worker_beat(%s::text, %s::text, %s::int, %s::text[], %s::int, %s::int, %s::bigint)"
        )
        self._worker_leave = q("SELECT {s}.worker_leave(%s::text)")

    def installed_version(self) -> Op[int]:
        return Op(self._version, (), lambda rows: int(rows[0][0]))

    def now_ms(self) -> Op[int]:
        return Op(self._now, (), lambda rows: int(rows[0][0]))

    def nack(
        self,
        queue: str,
        messages: Sequence[Message],
        delays_ms: Sequence[int],
        errors: Sequence[str | None] | None,
        states: Sequence[Any] | None,
        *,
        count_attempt: bool,
    ) -> Op[dict[int, str]]:
        """nack/defer of many deliveries, each with its own delay, error and saved state."""
        ids, tokens = message_pairs(queue, messages)
        jstates = (
            None if states is None or all(s is None for s in states) else [encode_state(s) for s in states]
        )
        params = (
            queue,
            ids,
            tokens,
            list(delays_ms),
            None if errors is None else _texts(errors),
            jstates,
            count_attempt,
        )
        return Op(self._nack, params, lambda rows: {r[0]: r[1] for r in rows})

    def give_up(self, queue: str, messages: Sequence[Message], errors: Sequence[str | None]) -> Op[set[int]]:
        ids, tokens = message_pairs(queue, messages)
        return Op(self._give_up, (queue, ids, tokens, _texts(errors)), lambda rows: {r[0] for r in rows})

    def worker_queues(self, names: Sequence[str]) -> Op[dict[str, tuple[int, int]]]:
        """{queue: (lease_ms, max_attempts)} of the queues among ``names`` that exist."""
        return Op(self._worker_queues, (list(names),), lambda rows: {r[0]: (r[1], r[2]) for r in rows})

    def cron_list(self) -> Op[list[CronRow]]:
        return Op(self._cron_list, (), lambda rows: [CronRow(*r) for r in rows])

    def cron_fire(self, name: str, tick_ms: int) -> Op[int | None]:
        return Op(self._cron_fire, (name, tick_ms), lambda rows: rows[0][0] if rows else None)

    def cron_upsert(
        self,
        name: str,
        schedule: str,
        queue: str,
        payload: Any,
        *,
        kind: str | None = None,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        misfire_grace: float = 60.0,
        source: str = "code",
    ) -> Op[str]:
        check_queue(queue)
        check_text(kind, "kind", 255)
        body, ctype = encode_payload(payload)
        grace = to_ms(misfire_grace, "misfire_grace")
        params = (name, schedule, queue, body, kind, ctype, encode_headers(headers), priority, grace, source)
        return Op(self._cron_upsert, params, lambda rows: rows[0][0])

    def cron_delete(self, name: str) -> Op[bool]:
        return Op(self._cron_delete, (name,), lambda rows: bool(rows[0][0]))

    def cron_set_enabled(self, name: str, enabled: bool) -> Op[bool]:
        return Op(self._cron_enable, (name, enabled), lambda rows: bool(rows[0][0]))

    def worker_beat(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        in_flight: int,
        ttl_ms: int,
    ) -> Op[None]:
        """Register or refresh this worker in the registry (sql/stats.sql) until now + ttl_ms."""
        params = (worker_id, host, pid, list(queues), concurrency, in_flight, ttl_ms)
        return Op(self._worker_beat, params, lambda rows: None, safe_to_retry=True)

    def worker_leave(self, worker_id: str) -> Op[bool]:
        return Op(self._worker_leave, (worker_id,), lambda rows: bool(rows[0][0]), safe_to_retry=True)


@lru_cache(maxsize=64)
def worker_ops(schema: str) -> WorkerOps:
    return WorkerOps(schema)


def _texts(errors: Sequence[str | None]) -> list[str | None]:
    """Error texts (tracebacks may hold NULs or lone surrogates) made storable, as the core does."""
    return [None if e is None else encode_error(e) for e in errors]
