"""Property-based test of the queue's invariants: random sequences of send, take, ack, nack,
defer and extend (with stale tokens, and time moved through p_now) against a small Python model
of the documented semantics. After every step the database must hold exactly what the model
holds, and metrics must count it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from core_helpers import Sql
from lonnymq import Client

LEASE = 1000
MAX_ATTEMPTS = 3
STEP = 100  # priority_step_ms


def due_at(at: int, priority: int, now: int) -> int:
    """The documented ordering value: priority moves a message due now into the past; a message
    scheduled for later is never due before ``at`` (negative priority still delays it)."""
    return at + max(0, -priority * STEP) if at > now else at - priority * STEP


@dataclass
class Msg:
    id: int
    dequeue_at: int
    priority: int
    payload: bytes
    attempts: int = 0
    deliveries: int = 0
    leased: bool = False
    last_error: str | None = None
    state: Any = None


class QueueModel(RuleBasedStateMachine):
    db: Sql
    client: Client
    names = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.queue = f"m{next(self.names)}"
        self.client.create_queue(
            self.queue, lease=LEASE / 1000, max_attempts=MAX_ATTEMPTS, priority_step=STEP / 1000
        )
        self.now = self.db.now()
        self.msgs: dict[int, Msg] = {}
        self.held: list[tuple[int, int]] = []  # (id, token) of every delivery, stale ones too
        # Settles are idempotent: a repeat by the delivery that acked / dead-lettered a message
        # reports it again (issue 11).
        self.acked: set[tuple[int, int]] = set()
        self.nacked_dead: set[tuple[int, int]] = set()
        self.dead = 0
        self.sent = 0

    @initialize()
    def start(self) -> None:
        pass

    def teardown(self) -> None:
        # One queue per example; dropping it keeps the catalog small while hypothesis shrinks.
        self.client.drop_queue(self.queue)

    def _settle_args(self, picks: list[int]) -> tuple[list[int], list[int]]:
        chosen = [self.held[i % len(self.held)] for i in picks]
        chosen = list(dict.fromkeys(chosen))
        return [c[0] for c in chosen], [c[1] for c in chosen]

    def _live(self, msg_id: int, token: int) -> Msg | None:
        m = self.msgs.get(msg_id)
        return m if m is not None and m.leased and m.deliveries == token else None

    @rule(ms=st.integers(0, 3000))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(k=st.integers(1, 4), priority=st.integers(-3, 3), delay=st.sampled_from([0, 0, 500, 2500]))
    def send(self, k: int, priority: int, delay: int) -> None:
        payloads = [f"p{self.sent + i}".encode() for i in range(k)]
        self.sent += k
        rows = self.db.send(
            self.queue, payloads, self.now, p_priorities=[priority] * k, p_delays_ms=[delay] * k
        )
        assert [r["outcome"] for r in rows] == ["created"] * k
        for r, p in zip(rows, payloads, strict=True):
            self.msgs[r["id"]] = Msg(r["id"], due_at(self.now + delay, priority, self.now), priority, p)

    @rule(n=st.integers(1, 5), lease=st.sampled_from([None, 300, 2000]))
    def take(self, n: int, lease: int | None) -> None:
        got = self.db.take(self.queue, n, self.now, p_lease_ms=lease)
        ready = sorted(
            (m for m in self.msgs.values() if m.dequeue_at <= self.now), key=lambda m: (m.dequeue_at, m.id)
        )
        expected: list[tuple[Any, ...]] = []
        for m in ready:
            if len(expected) == n:
                break
            if m.attempts >= MAX_ATTEMPTS:  # its last lease expired: dead-lettered, not counted
                del self.msgs[m.id]
                self.dead += 1
                continue
            m.dequeue_at = self.now + (lease or LEASE)
            m.attempts += 1
            m.deliveries += 1
            m.leased = True
            expected.append((m.id, m.attempts, m.deliveries, m.dequeue_at, m.payload, m.last_error, m.state))
        assert [
            (
                d["id"],
                d["attempt"],
                d["token"],
                d["lease_until"],
                bytes(d["payload"]),
                d["last_error"],
                d["state"],
            )
            for d in got
        ] == expected
        self.held += [(d["id"], d["token"]) for d in got]

    @precondition(lambda self: self.held)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
    def ack(self, picks: list[int]) -> None:
        ids, tokens = self._settle_args(picks)
        got = {
            r["ack"]
            for r in self.db.call("ack", p_queue=self.queue, p_ids=ids, p_tokens=tokens, p_now=self.now)
        }
        live = {(i, t) for i, t in zip(ids, tokens, strict=True) if self._live(i, t)}
        repeats = {i for i, t in zip(ids, tokens, strict=True) if (i, t) in self.acked}
        assert got == {i for i, _ in live} | repeats
        for i, t in live:
            del self.msgs[i]
            self.acked.add((i, t))

    @precondition(lambda self: self.held)
    @rule(
        picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
        delay=st.sampled_from([0, 400, 1500]),
        count=st.booleans(),
        state=st.one_of(st.none(), st.integers(0, 9)),
    )
    def nack(self, picks: list[int], delay: int, count: bool, state: int | None) -> None:
        ids, tokens = self._settle_args(picks)
        error = f"e{self.now}"
        rows = self.db.call(
            "nack",
            p_queue=self.queue,
            p_ids=ids,
            p_tokens=tokens,
            p_delays_ms=[delay] * len(ids),
            p_errors=[error] * len(ids),
            p_states=[{"s": state}] * len(ids) if state is not None else None,
            p_count_attempt=count,
            p_now=self.now,
        )
        expected = {}
        for i, t in zip(ids, tokens, strict=True):
            m = self._live(i, t)
            if m is None:
                given_back = self.msgs.get(i)
                if (i, t) in self.nacked_dead:
                    expected[i] = "dead"
                elif given_back is not None and not given_back.leased and given_back.deliveries == t:
                    expected[i] = "retry"  # this delivery gave it back already: a repeat
                continue
            if count and m.attempts >= MAX_ATTEMPTS:
                del self.msgs[i]
                self.dead += 1
                self.nacked_dead.add((i, t))
                expected[i] = "dead"
                continue
            m.dequeue_at = due_at(self.now + delay, m.priority, self.now)
            m.leased = False
            m.attempts -= 0 if count else 1
            m.last_error = error
            if state is not None:
                m.state = {"s": state}
            expected[i] = "retry"
        assert {r["id"]: r["outcome"] for r in rows} == expected

    @precondition(lambda self: self.held)
    @rule(
        picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4), lease=st.sampled_from([None, 50, 5000])
    )
    def extend(self, picks: list[int], lease: int | None) -> None:
        ids, tokens = self._settle_args(picks)
        rows = self.db.call(
            "extend", p_queue=self.queue, p_ids=ids, p_tokens=tokens, p_lease_ms=lease, p_now=self.now
        )
        expected = {}
        for i, t in zip(ids, tokens, strict=True):
            m = self._live(i, t)
            if m is not None:
                m.dequeue_at = self.now + (lease or LEASE)
                expected[i] = m.dequeue_at
        assert {r["id"]: r["lease_until"] for r in rows} == expected

    @invariant()
    def database_matches_model(self) -> None:
        rows = self.db.q(
            "SELECT m.id, m.dequeue_at, m.attempts, m.deliveries, m.leased, m.priority, m.payload,"
            " m.last_error, m.state FROM {s}.message m JOIN {s}.queue q ON q.id = m.queue_id"
            " WHERE q.name = %s ORDER BY m.id",
            (self.queue,),
        )
        assert [
            (
                r["id"],
                r["dequeue_at"],
                r["attempts"],
                r["deliveries"],
                r["leased"],
                r["priority"],
                bytes(r["payload"]),
                r["last_error"],
                r["state"],
            )
            for r in rows
        ] == [
            (
                m.id,
                m.dequeue_at,
                m.attempts,
                m.deliveries,
                m.leased,
                m.priority,
                m.payload,
                m.last_error,
                m.state,
            )
            for m in sorted(self.msgs.values(), key=lambda m: m.id)
        ]
        [metrics] = self.db.call("queue_metrics", p_name=self.queue, p_now=self.now)
        future = [m for m in self.msgs.values() if m.dequeue_at > self.now]
        assert (metrics["ready"], metrics["leased"], metrics["scheduled"], metrics["dead"]) == (
            len(self.msgs) - len(future),
            sum(m.leased for m in future),
            sum(not m.leased for m in future),
            self.dead,
        )


def test_queue_behaves_like_its_model(client: Client, conn: psycopg.Connection, schema: str) -> None:
    QueueModel.db = Sql(conn, schema)
    QueueModel.client = client
    run_state_machine_as_test(
        QueueModel,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
