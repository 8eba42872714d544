"""Property-based test of the queue API against a simple model (hypothesis state machine).

The machine calls the SQL functions directly with ``p_now`` = the model's clock, so time is
controlled exactly and leases expire when the test says. Rules: send (keys and the three
on_conflict modes, delays, priorities), batch send, take (lease), take_tx (commit or rollback),
ack, nack, defer, extend (with current and stale tokens alike) and moving the clock. After every
step the whole queue (each message's schedule, attempts, token, lease, key, payload, error), the
archive, the metrics, peek and next_ready_in must equal the model's.

Time semantics follow the core's documented rule: priority moves a message that is due now into
the past (served as if sent priority x step earlier); a message scheduled for later is never
delivered before its time (a negative priority still delays it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest
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
START = 1_700_000_000_000

KEYS = st.sampled_from([None, None, "a", "b", "c"])
DELAYS = st.sampled_from([0, 0, 1, 50, LEASE, 5 * LEASE])
PRIORITIES = st.sampled_from([0, 0, -1, 1, 2, -100, 100])
ADVANCE = st.sampled_from([1, 49, 50, LEASE - 1, LEASE, LEASE + 1, 3 * LEASE, 20 * LEASE])


def due_at(at: int, priority: int, step: int, now: int) -> int:
    return at + max(0, -priority * step) if at > now else at - priority * step


@dataclass(frozen=True)
class Msg:
    id: int
    dequeue_at: int
    scheduled_at: int
    priority: int
    key: str | None
    payload: bytes
    attempts: int = 0
    deliveries: int = 0
    leased: bool = False
    last_error: str | None = None
    superseded: bool = False  # a replace came while it was leased: its new version is another message


@dataclass(frozen=True)
class Delivery:
    id: int
    token: int


class QueueMachine(RuleBasedStateMachine):
    db: Sql  # set by the test
    queues = 0

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.msgs: dict[int, Msg] = {}
        self.archive: dict[int, tuple[str, int, int]] = {}  # id -> (status, attempts, deliveries)
        self.last_id = 0
        self.payloads = 0
        self.issued: list[Delivery] = []  # every delivery ever taken: current and stale tokens
        self.settled: dict[Delivery, str] = {}  # what each delivery's settle did: repeats report it

    # -- set-up ----------------------------------------------------------------------------

    @initialize(max_attempts=st.integers(1, 3), archive=st.booleans(), step=st.sampled_from([0, 100]))
    def make_queue(self, max_attempts: int, archive: bool, step: int) -> None:
        QueueMachine.queues += 1
        self.q = f"q{QueueMachine.queues}"
        self.max_attempts, self.archived, self.step = max_attempts, archive, step
        self.db.call(
            "queue_create",
            p_name=self.q,
            p_lease_ms=LEASE,
            p_max_attempts=max_attempts,
            p_archive=archive,
            p_priority_step_ms=step,
        )

    def teardown(self) -> None:
        if hasattr(self, "q"):
            self.db.call("queue_drop", p_name=self.q)

    # -- helpers ---------------------------------------------------------------------------

    def payload(self) -> bytes:
        self.payloads += 1
        return f"p{self.payloads}".encode()

    def new_id(self, got: int) -> int:
        assert got > self.last_id, "ids must grow"
        self.last_id = got
        return got

    def valid(self, d: Delivery) -> bool:
        m = self.msgs.get(d.id)
        return m is not None and m.leased and m.deliveries == d.token

    def draw(self, data: st.DataObject) -> list[Delivery]:
        """1-3 deliveries of distinct messages, mostly ones whose token is still current."""
        current = [d for d in self.issued if self.valid(d)]
        pool = current if current and data.draw(st.integers(0, 3), label="fresh") else self.issued
        ds = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3), label="deliveries")
        return list({d.id: d for d in ds}.values())

    def to_archive(self, m: Msg, status: str, plus: int = 0) -> None:
        del self.msgs[m.id]
        if status == "dead" or self.archived:
            self.archive[m.id] = (status, m.attempts + plus, m.deliveries + plus)

    def candidates(self) -> list[Msg]:
        return sorted(
            (m for m in self.msgs.values() if m.dequeue_at <= self.now), key=lambda m: (m.dequeue_at, m.id)
        )

    def pick(self, rows: list[dict[str, Any]], n: int) -> tuple[list[Msg], list[Msg]]:
        """What a take of n must do: walk the ready messages in (dequeue_at, id) order,
        dead-lettering those whose lease expired on the last attempt (they do not count against
        n), until n are delivered."""
        delivered: list[Msg] = []
        dead: list[Msg] = []
        for m in sorted(
            (m for m in self.msgs.values() if m.dequeue_at <= self.now), key=lambda m: (m.dequeue_at, m.id)
        ):
            if len(delivered) == n:
                break
            if m.superseded:
                self.gone.append(m)  # its lease expired: deleted, never delivered again
                continue
            (delivered if m.attempts < self.max_attempts else dead).append(m)
        assert [r["id"] for r in rows] == [m.id for m in delivered]
        return delivered, dead

    # -- rules -----------------------------------------------------------------------------

    @rule(
        key=KEYS,
        delay=DELAYS,
        priority=PRIORITIES,
        on_conflict=st.sampled_from(["ignore", "replace", "error"]),
    )
    def send(self, key: str | None, delay: int, priority: int, on_conflict: str) -> None:
        body = self.payload()
        live = next(
            (m for m in self.msgs.values() if key is not None and m.key == key and not m.superseded), None
        )
        args = dict(p_delays_ms=[delay], p_priorities=[priority], p_keys=[key], p_on_conflict=on_conflict)
        if live is not None and on_conflict == "error":
            with pytest.raises(psycopg.Error) as e:
                self.db.send(self.q, [body], self.now, **args)
            assert e.value.sqlstate == "LQ004"
            return
        [row] = self.db.send(self.q, [body], self.now, **args)
        at = self.now + delay
        fresh = Msg(0, due_at(at, priority, self.step, self.now), at, priority, key, body)
        if live is None:
            assert row["outcome"] == "created"
            self.msgs[row["id"]] = replace(fresh, id=self.new_id(row["id"]))
        elif on_conflict == "ignore":
            assert (row["outcome"], row["id"]) == ("ignored", live.id)
        elif live.leased and live.dequeue_at > self.now:
            # Held: the new version is a new message; the holder keeps the old one.
            assert row["outcome"] == "updated" and row["id"] != live.id
            self.msgs[live.id] = replace(live, superseded=True)
            self.msgs[row["id"]] = replace(fresh, id=self.new_id(row["id"]))
        else:
            # Updated in place; the fencing token moves on.
            assert (row["outcome"], row["id"]) == ("updated", live.id)
            self.msgs[live.id] = replace(fresh, id=live.id, deliveries=live.deliveries + 1)

    @rule(sends=st.lists(st.tuples(DELAYS, PRIORITIES), min_size=2, max_size=4))
    def send_batch(self, sends: list[tuple[int, int]]) -> None:
        bodies = [self.payload() for _ in sends]
        rows = self.db.send(
            self.q, bodies, self.now, p_delays_ms=[d for d, _ in sends], p_priorities=[p for _, p in sends]
        )
        assert [(r["ord"], r["outcome"]) for r in rows] == [(i + 1, "created") for i in range(len(sends))]
        for r, body, (delay, prio) in zip(rows, bodies, sends, strict=True):
            at = self.now + delay
            self.msgs[r["id"]] = Msg(
                self.new_id(r["id"]), due_at(at, prio, self.step, self.now), at, prio, None, body
            )

    @rule(n=st.integers(1, 4), lease=st.sampled_from([None, 1, LEASE, 4 * LEASE]))
    def take(self, n: int, lease: int | None) -> None:
        rows = self.db.take(self.q, n, self.now, p_lease_ms=lease)
        self.gone: list[Msg] = []
        delivered, dead = self.pick(rows, n)
        for m in self.gone:
            del self.msgs[m.id]
        for m in dead:
            self.to_archive(m, "dead")
        until = self.now + (lease or LEASE)
        for m, r in zip(delivered, rows, strict=True):
            m = replace(
                m, attempts=m.attempts + 1, deliveries=m.deliveries + 1, leased=True, dequeue_at=until
            )
            self.msgs[m.id] = m
            assert (r["attempt"], r["token"], r["lease_until"], bytes(r["payload"]), r["key"]) == (
                m.attempts,
                m.deliveries,
                until,
                m.payload,
                m.key,
            )
            self.issued.append(Delivery(m.id, m.deliveries))

    @rule(n=st.integers(1, 3), commit=st.booleans())
    def take_tx(self, n: int, commit: bool) -> None:
        conn = self.db.conn
        with conn.transaction(force_rollback=not commit):
            rows = self.db.call("take_tx", p_queue=self.q, p_limit=n, p_now=self.now)
        self.gone = []
        delivered, dead = self.pick(rows, n)
        for m, r in zip(delivered, rows, strict=True):
            assert (r["attempt"], r["token"], r["lease_until"], bytes(r["payload"])) == (
                m.attempts + 1,
                m.deliveries + 1,
                None,
                m.payload,
            )
        if commit:
            for m in self.gone:
                del self.msgs[m.id]
            for m in dead:
                self.to_archive(m, "dead")
            for m in delivered:
                self.to_archive(m, "acked", plus=1)

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        ds = self.draw(data)
        rows = self.db.call(
            "ack", p_queue=self.q, p_ids=[d.id for d in ds], p_tokens=[d.token for d in ds], p_now=self.now
        )
        valid = {d for d in ds if self.valid(d)}
        repeats = {d.id for d in ds if self.settled.get(d) == "acked"}  # idempotent: reported again
        assert {r[next(iter(r))] for r in rows} == {d.id for d in valid} | repeats
        for d in valid:
            self.to_archive(self.msgs[d.id], "acked")
            self.settled[d] = "acked"

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), delay=DELAYS, count=st.booleans(), error=st.sampled_from([None, "boom"]))
    def nack(self, data: st.DataObject, delay: int, count: bool, error: str | None) -> None:
        ds = self.draw(data)
        rows = self.db.call(
            "nack",
            p_queue=self.q,
            p_ids=[d.id for d in ds],
            p_tokens=[d.token for d in ds],
            p_delays_ms=[delay] * len(ds),
            p_errors=[error] * len(ds),
            p_count_attempt=count,
            p_now=self.now,
        )
        expected = {}
        for d in ds:
            if not self.valid(d):
                m = self.msgs.get(d.id)
                if self.settled.get(d) in ("dead", "retry"):  # repeats report the first outcome
                    expected[d.id] = self.settled[d]
                elif m is not None and not m.leased and m.deliveries == d.token:
                    expected[d.id] = "retry"  # given back by this delivery, still waiting
                continue
            m = self.msgs[d.id]
            if m.superseded:
                expected[m.id] = self.settled[d] = "retry"  # the old version goes; the new waits
                del self.msgs[m.id]
            elif count and m.attempts >= self.max_attempts:
                expected[m.id] = self.settled[d] = "dead"
                self.to_archive(replace(m, last_error=error or m.last_error), "dead")
            else:
                expected[m.id] = "retry"
                self.msgs[m.id] = replace(
                    m,
                    dequeue_at=due_at(self.now + delay, m.priority, self.step, self.now),
                    leased=False,
                    attempts=m.attempts - (0 if count else 1),
                    last_error=error or m.last_error,
                )
        assert {r["id"]: r["outcome"] for r in rows} == expected

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), lease=st.sampled_from([None, 1, LEASE, 10 * LEASE]))
    def extend(self, data: st.DataObject, lease: int | None) -> None:
        ds = self.draw(data)
        rows = self.db.call(
            "extend",
            p_queue=self.q,
            p_ids=[d.id for d in ds],
            p_tokens=[d.token for d in ds],
            p_lease_ms=lease,
            p_now=self.now,
        )
        until = self.now + (lease or LEASE)
        expected = {d.id: until for d in ds if self.valid(d)}
        assert {r["id"]: r["lease_until"] for r in rows} == expected
        for i in expected:
            self.msgs[i] = replace(self.msgs[i], dequeue_at=until)

    @rule(ms=ADVANCE)
    def advance(self, ms: int) -> None:
        self.now += ms

    # -- the whole state, after every step --------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "q"):
            return
        qid = self.db.queue_id(self.q)
        rows = self.db.q(
            "SELECT id, dequeue_at, scheduled_at, priority, key, payload, attempts, deliveries, leased,"
            " last_error, superseded_by IS NOT NULL AS superseded"
            " FROM {s}.message WHERE queue_id = %s ORDER BY id",
            (qid,),
        )
        actual = {r["id"]: Msg(**{**r, "payload": bytes(r["payload"])}) for r in rows}
        assert actual == self.msgs
        archived = self.db.q(
            "SELECT id, status, attempts, deliveries FROM {s}.archive WHERE queue_id = %s", (qid,)
        )
        assert {r["id"]: (r["status"], r["attempts"], r["deliveries"]) for r in archived} == self.archive

    @invariant()
    def same_views(self) -> None:
        if not hasattr(self, "q"):
            return
        now, ms = self.now, list(self.msgs.values())
        [metrics] = self.db.call("queue_metrics", p_name=self.q, p_now=now)
        assert (metrics["ready"], metrics["scheduled"], metrics["leased"], metrics["dead"]) == (
            sum(m.dequeue_at <= now for m in ms),
            sum(m.dequeue_at > now and not m.leased for m in ms),
            sum(m.dequeue_at > now and m.leased for m in ms),
            sum(s == "dead" for s, _, _ in self.archive.values()),
        )
        order = sorted(ms, key=lambda m: (m.dequeue_at, m.id))
        assert [r["id"] for r in self.db.call("peek", p_queue=self.q, p_limit=10, p_now=now)] == [
            m.id for m in order[:10]
        ]
        if order:  # the empty queue: test_next_ready_in_of_an_empty_queue_is_null
            [ready_in] = self.db.call("next_ready_in", p_queue=self.q, p_now=now)
            assert ready_in["next_ready_in"] == max(order[0].dequeue_at - now, 0)


@pytest.mark.slow
def test_queue_behaves_like_the_model(conn: psycopg.Connection, schema: str) -> None:
    QueueMachine.db = Sql(conn, schema)
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            # 60 programs of up to 40 steps (100 until 2026-11-26: 8 s more of the suite's CPU);
            # each CI run draws new ones.
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_next_ready_in_of_an_empty_queue_is_null(
    client: Client, conn: psycopg.Connection, schema: str
) -> None:
    """NULL ("nothing to wait for"), not 0 ("ready now"): receive() would otherwise poll an
    empty queue every 50 ms instead of sleeping until a NOTIFY."""
    client.create_queue("q")
    db = Sql(conn, schema)
    assert db.call("next_ready_in", p_queue="q", p_now=START) == [{"next_ready_in": None}]
    db.send("q", [b"x"], START, p_delays_ms=[10])
    assert db.call("next_ready_in", p_queue="q", p_now=START) == [{"next_ready_in": 10}]
