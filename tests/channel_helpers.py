"""Helpers of the channel tests: direct SQL calls with a controlled clock, a counter check
against the messages themselves, and a consumer process for the concurrency tests."""

from __future__ import annotations

import random
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from lonnymq import Client


class Db:
    """Calls of the plpgsql functions of one schema with ``p_now`` under the test's control."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema

    def q(self, text: str, params: Any = ()) -> list[dict[str, Any]]:
        """Run ``text`` with ``{s}`` standing for the schema; dict rows (or [])."""
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(sql.SQL(text).format(s=sql.Identifier(self.schema)), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []

    def now(self) -> int:
        return int(self.q("SELECT {s}.now_ms() AS n")[0]["n"])

    def qid(self, queue: str) -> int:
        return int(self.q("SELECT id FROM {s}.queue WHERE name = %s", (queue,))[0]["id"])

    def send(
        self,
        queue: str,
        items: list[tuple[str | None, str]],
        now: int,
        *,
        keys: list[str | None] | None = None,
        on_conflict: str = "ignore",
        delays: list[int | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Send (channel, payload) pairs; returns (ord, id, outcome) rows."""
        return self.q(
            "SELECT * FROM {s}.send_batch(%s, %s::bytea[], p_channels => %s::text[],"
            " p_keys => %s::text[], p_on_conflict => %s, p_delays_ms => %s::bigint[], p_now => %s)",
            (queue, [p.encode() for _, p in items], [c for c, _ in items], keys, on_conflict, delays, now),
        )

    def take(self, queue: str, n: int, now: int, lease_ms: int | None = None) -> list[dict[str, Any]]:
        return self.q("SELECT * FROM {s}.take(%s, %s, %s, NULL, NULL, %s)", (queue, n, lease_ms, now))

    def take_tx(self, queue: str, n: int, now: int) -> list[dict[str, Any]]:
        return self.q("SELECT * FROM {s}.take_tx(%s, %s, NULL, %s)", (queue, n, now))

    def payloads(self, queue: str, n: int, now: int, lease_ms: int | None = None) -> list[str]:
        return [bytes(d["payload"]).decode() for d in self.take(queue, n, now, lease_ms)]

    def ack(self, queue: str, deliveries: list[dict[str, Any]], now: int) -> list[int]:
        rows = self.q(
            "SELECT * FROM {s}.ack(%s, %s, %s, NULL, %s)",
            (queue, [d["id"] for d in deliveries], [d["token"] for d in deliveries], now),
        )
        return [r["ack"] for r in rows]

    def nack(
        self,
        queue: str,
        deliveries: list[dict[str, Any]],
        now: int,
        delay_ms: int = 0,
        count_attempt: bool = True,
    ) -> dict[int, str]:
        rows = self.q(
            "SELECT * FROM {s}.nack(%s, %s, %s, %s, NULL, NULL, %s, %s)",
            (
                queue,
                [d["id"] for d in deliveries],
                [d["token"] for d in deliveries],
                [delay_ms] * len(deliveries),
                count_attempt,
                now,
            ),
        )
        return {r["id"]: r["outcome"] for r in rows}

    def channel(self, queue: str, name: str) -> dict[str, Any] | None:
        rows = self.q(
            "SELECT c.* FROM {s}.channel c JOIN {s}.queue q ON q.id = c.queue_id"
            " WHERE q.name = %s AND c.name = %s",
            (queue, name),
        )
        return rows[0] if rows else None

    def check_channels(self, queue: str, *, ready_at: bool = True) -> None:
        """The counters of every channel equal what its messages say, and (unless a lease was
        extended since, which take heals lazily) ready_at equals a fresh computation."""
        qid = self.qid(queue)
        actual = {
            r["channel"]: (r["size"], r["leased"])
            for r in self.q(
                "SELECT channel, count(*) AS size, count(*) FILTER (WHERE leased) AS leased"
                " FROM {s}.message WHERE queue_id = %s AND channel IS NOT NULL GROUP BY channel",
                (qid,),
            )
        }
        rows = self.q(
            "SELECT c.*, {s}._channel_ready_at(c.queue_id, c.name, c.current_size,"
            " c.current_concurrency, c.max_concurrency, c.last_served_at,"
            " c.release_interval_ms, c.blocked_until) AS fresh"
            " FROM {s}.channel c WHERE c.queue_id = %s",
            (qid,),
        )
        kept = {
            r["name"]: (r["current_size"], r["current_concurrency"])
            for r in rows
            if (r["current_size"], r["current_concurrency"]) != (0, 0)
        }
        assert kept == actual
        for r in rows:
            assert (r["current_size"] == 0) == (r["ready_at"] is None), r
            if ready_at:
                assert r["ready_at"] == r["fresh"], r
        with self.conn.transaction():
            assert self.q("SELECT {s}.channel_recount(%s) AS n", (queue,))[0]["n"] == 0


def consumer(dsn: str, schema: str, queue: str, batch: int, barrier: Any, out: Any) -> None:
    """Take up to ``batch`` at a time, hold each message a little, ack it; until the queue has
    been empty for a while. Reports (id, channel, payload, taken_ns, acked_ns) per message."""
    done: list[tuple[int, str | None, str, int, int]] = []
    rng = random.Random()
    with Client(dsn, schema=schema, pool_size=1) as c:
        barrier.wait()
        idle_since = None
        while True:
            got = c.take(queue, batch, lease=60)
            taken = time.monotonic_ns()
            if not got:
                if idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 1.5:
                    break
                time.sleep(0.005)
                continue
            idle_since = None
            for m in got:
                time.sleep(rng.uniform(0.001, 0.006))
                done.append((m.id, m.channel, m.payload, taken, time.monotonic_ns()))
                c.ack(m)
    out.put(done)
