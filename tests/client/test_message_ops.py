"""Message-level operations (issue 11): get, cancel, archive reads with keyset paging,
idempotent settle, metrics parity (total_sent, ages, exact counts) - through the client, from
SQL, and under races between real concurrent connections. Time moves with p_now, never by
sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from core_helpers import Sql, as_message
from lonnymq import ArchivedMessage, Client, Envelope, Message, errors


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Sql:
    return Sql(conn, schema)


def _threads(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Run target(0..n-1) in n threads started together; their results (or exceptions)."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = target(i)
        except BaseException as e:  # reported to the test, which asserts on it
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


# -- get ---------------------------------------------------------------------------------------


def test_get_by_id_and_key_with_status(client: Client, db: Sql) -> None:
    client.create_queue("q")
    ready = client.send("q", {"n": 1}, key="r", kind="k", headers={"h": 1})
    later = client.send("q", "later", key="s", delay=3600)
    got = client.get("q", id=ready.id)
    assert got is not None and got.status == "ready"
    assert (got.id, got.key, got.kind, got.headers, got.payload, got.lease_until) == (
        ready.id, "r", "k", {"h": 1}, {"n": 1}, None,
    )  # fmt: skip
    assert client.get("q", key="r") == got
    s = client.get("q", key="s")
    assert s is not None and (s.id, s.status, s.payload) == (later.id, "scheduled", "later")
    [m] = client.take("q")
    leased = client.get("q", id=m.id)
    assert leased is not None and leased.status == "leased"
    assert (leased.token, leased.attempt, leased.lease_until) == (m.token, 1, m.lease_until)
    client.ack(m)
    assert client.get("q", id=m.id) is None and client.get("q", key="r") is None
    assert client.get("q", id=10**12) is None and client.get("q", key="nope") is None


def test_get_an_expired_lease_is_ready(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=5)
    t = db.now()
    [sent] = db.send("q", [b"x"], t)
    db.take("q", 1, t)
    [row] = db.q(
        "SELECT * FROM {s}.message_get('q', p_id => %s::bigint, p_now => %s::bigint)", (sent["id"], t + 4_999)
    )
    assert (row["status"], row["lease_until"], row["token"]) == ("leased", t + 5_000, 1)
    [row] = db.q(
        "SELECT * FROM {s}.message_get('q', p_id => %s::bigint, p_now => %s::bigint)", (sent["id"], t + 5_000)
    )
    assert (row["status"], row["lease_until"]) == ("ready", None)


def test_get_bad_arguments(client: Client, db: Sql) -> None:
    client.create_queue("q")
    for kw in ({}, {"id": 1, "key": "k"}):
        with pytest.raises(errors.InvalidArgument, match="exactly one of id and key"):
            client.get("q", **kw)
    with pytest.raises(errors.InvalidArgument, match="message ids"):
        client.get("q", id=0)
    with pytest.raises(errors.QueueNotFound):
        client.get("nope", id=1)
    with pytest.raises(psycopg.Error, match="exactly one of id and key") as e:
        db.q("SELECT * FROM {s}.message_get('q')")
    assert e.value.sqlstate == "LQ002"


def test_get_during_a_lease_does_not_wait_for_the_taker(client: Client, dsn: str, schema: str) -> None:
    """A consumer holds the row (take_tx in an open transaction); get answers at once from
    another connection, showing the committed state."""
    client.create_queue("q")
    sent = client.send("q", b"x", key="k")
    with psycopg.connect(dsn) as holder, Client(dsn, schema=schema, pool_size=1) as other:
        with Client(holder, schema=schema) as tx_client:
            [taken] = tx_client.take_tx("q")  # row locked until holder's transaction ends
        assert taken.id == sent.id
        results = _threads(4, lambda i: other.get("q", key="k") if i % 2 else other.get("q", id=sent.id))
        for got in results:
            assert isinstance(got, Message) and (got.id, got.status) == (sent.id, "ready")
        holder.commit()
    assert client.get("q", id=sent.id) is None


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_by_id_key_and_ids(client: Client, db: Sql) -> None:
    client.create_queue("q")
    a, _, c, d = (client.send("q", x, key=x) for x in "abcd")
    assert client.cancel("q", id=a.id) is True
    assert client.cancel("q", id=a.id) is False
    assert client.cancel("q", key="b") is True and client.cancel("q", key="b") is False
    assert client.cancel("q", ids=[d.id, c.id, a.id, 10**12]) == [c.id, d.id]
    assert client.cancel("q", ids=[]) == []
    assert db.count("q") == 0 and db.archive("q") == []
    # The keys are free again.
    assert client.send("q", "a2", key="a").outcome == "created"


def test_cancel_archives_as_cancelled(client: Client, db: Sql) -> None:
    client.create_queue("q")
    sent = client.send("q", {"v": 1}, key="k", delay=60)
    assert client.cancel("q", key="k", archive=True) is True
    [arch] = client.archived("q")
    assert isinstance(arch, ArchivedMessage)
    assert (arch.id, arch.status, arch.key, arch.payload, arch.attempts) == (
        sent.id,
        "cancelled",
        "k",
        {"v": 1},
        0,
    )
    assert client.metrics("q").scheduled == 0


def test_cancel_a_leased_message_fences_its_holder(client: Client, db: Sql) -> None:
    client.create_queue("q", archive=True)
    client.send_batch("q", [b"1", b"2", b"3"])
    m1, m2, m3 = client.take("q", 3)
    assert client.cancel("q", ids=[m1.id, m2.id, m3.id]) == [m1.id, m2.id, m3.id]
    with pytest.raises(errors.LeaseLost):
        client.ack(m1)
    with pytest.raises(errors.LeaseLost):
        client.nack(m2)
    with pytest.raises(errors.LeaseLost):
        client.extend(m3)
    assert client.ack([m1, m2, m3]) == set()
    assert client.take("q", 10) == [] and client.metrics("q").leased == 0
    assert [a["status"] for a in db.archive("q")] == []  # cancelled without archive=True


def test_cancel_keeps_channel_counters_exact(client: Client, db: Sql) -> None:
    client.create_queue("q", channel_max_concurrency=1)
    client.send_batch(
        "q", [Envelope(b"1", channel="t"), Envelope(b"2", channel="t"), Envelope(b"3", channel="u")]
    )
    [m1] = [m for m in client.take("q", 5) if m.channel == "t"]
    assert client.cancel("q", id=m1.id) is True  # leased: frees the channel's only slot
    chans = {c.name: (c.size, c.leased) for c in client.channels("q")}
    assert chans["t"] == (1, 0)
    [m2] = [m for m in client.take("q", 5) if m.channel == "t"]
    u = [m for m in client.peek("q") if m.channel == "u"]
    assert client.cancel("q", ids=[m2.id, *(m.id for m in u)]) == sorted([m2.id, *(m.id for m in u)])
    assert {c.name: (c.size, c.leased) for c in client.channels("q")} == {}


def test_cancel_bad_arguments(client: Client, db: Sql) -> None:
    client.create_queue("q")
    with pytest.raises(errors.InvalidArgument, match="exactly one of id, key and ids"):
        client.cancel("q")
    with pytest.raises(errors.InvalidArgument, match="not both"):
        client.cancel("q", id=1, ids=[2])
    with pytest.raises(errors.InvalidArgument, match="message ids"):
        client.cancel("q", ids=[-1])
    with pytest.raises(errors.InvalidArgument, match="must be lists"):
        client.cancel("q", ids=5)  # type: ignore[call-overload]  # a wrong type on purpose
    with pytest.raises(errors.InvalidArgument, match="archive must be a bool"):
        client.cancel("q", id=1, archive="yes")  # type: ignore[call-overload]  # on purpose
    with pytest.raises(errors.QueueNotFound):
        client.cancel("nope", id=1)


def test_cancel_races_take(dsn: str, schema: str, client: Client) -> None:
    """Two consumers take and ack one at a time while two cancellers cancel every message: each
    message ends exactly once, either acked by a consumer or cancelled (a consumer whose
    message was cancelled under it gets LeaseLost), and nothing comes back."""
    client.create_queue("q")
    ids = [r.id for r in client.send_batch("q", list(range(200)))]
    assert all(i is not None for i in ids)
    acked: list[list[int]] = [[], []]
    lost: list[list[int]] = [[], []]
    cancelled: list[list[int]] = [[], []]

    def work(i: int) -> None:
        with Client(dsn, schema=schema, pool_size=1) as c:
            if i < 2:
                while True:
                    got = c.take("q")
                    if not got:
                        return
                    try:
                        c.ack(got[0])
                        acked[i].append(got[0].id)
                    except errors.LeaseLost:
                        lost[i].append(got[0].id)
            else:
                mine = [x for x in ids if x is not None][i - 2 :: 2]
                for k in range(0, len(mine), 10):
                    cancelled[i - 2].extend(c.cancel("q", ids=mine[k : k + 10]))

    assert _threads(4, work) == [None] * 4
    all_acked = acked[0] + acked[1]
    all_cancelled = cancelled[0] + cancelled[1]
    assert sorted(all_acked + all_cancelled) == sorted(ids)  # each exactly once
    assert set(lost[0] + lost[1]) <= set(all_cancelled)
    assert client.take("q", 100) == [] and client.metrics("q").ready == 0


# -- archive -----------------------------------------------------------------------------------


def test_archived_pages_by_id_with_outcomes(client: Client, db: Sql) -> None:
    client.create_queue("q", archive=True, max_attempts=1)
    client.send_batch("q", [Envelope(i, key=f"k{i}") for i in range(7)])
    got = client.take("q", 7)
    client.ack(got[:3])
    client.nack(got[3:5], error="boom")  # last attempt: dead, archived
    client.release(got[5:])
    client.cancel("q", ids=[m.id for m in got[5:]], archive=True)
    page1 = client.archived("q", limit=4)
    page2 = client.archived("q", limit=4, after_id=page1[-1].id)
    assert client.archived("q", after_id=page2[-1].id) == []
    rows = page1 + page2
    assert [a.id for a in rows] == [m.id for m in got]
    assert [a.status for a in rows] == ["acked"] * 3 + ["dead"] * 2 + ["cancelled"] * 2
    assert [a.payload for a in rows] == list(range(7)) and rows[3].last_error == "boom"
    assert [a.id for a in client.archived("q", status="dead")] == [m.id for m in got[3:5]]
    assert rows[0].enqueued_at <= rows[0].archived_at and rows[0].deliveries == 1


def test_archived_and_dead_letters_by_time_window(client: Client, db: Sql) -> None:
    client.create_queue("q", max_attempts=1)
    t = db.now()
    db.send("q", [b"a", b"b", b"c"], t - 3_000)
    rows = db.take("q", 3, t - 3_000)
    for k, r in enumerate(rows):  # dead-lettered at t-3000, t-2000, t-1000
        db.call("nack", p_queue="q", p_ids=[r["id"]], p_tokens=[1], p_now=t - 3_000 + 1_000 * k)
    ids = [r["id"] for r in rows]
    assert [a.id for a in client.archived("q", since=t - 2_000)] == ids[1:]
    assert [a.id for a in client.archived("q", until=t - 2_000)] == ids[:1]
    assert [a.id for a in client.archived("q", since=t - 2_000, until=t - 1_000)] == [ids[1]]
    since = datetime.fromtimestamp((t - 2_000) / 1000, UTC)
    assert [d.id for d in client.dead_letters("q", since=since)] == ids[1:]
    assert [d.id for d in client.dead_letters("q", 1, after_id=ids[0], since=t - 3_000)] == [ids[1]]
    assert [d.id for d in client.dead_letters("q", until=t - 1_000, after_id=None)] == ids[:2]
    assert [a.id for a in client.archived("q", since=t - 2_000, after_id=ids[1], status="dead")] == ids[2:]


def test_archived_bad_arguments(client: Client, db: Sql) -> None:
    client.create_queue("q")
    with pytest.raises(errors.InvalidArgument, match="status must be"):
        client.archived("q", status="gone")  # type: ignore[arg-type]  # a wrong value on purpose
    with pytest.raises(errors.InvalidArgument, match="since must be"):
        client.archived("q", since=datetime(2024, 1, 1))
    with pytest.raises(errors.InvalidArgument):
        client.archived("q", limit=0)
    with pytest.raises(errors.InvalidArgument, match="after_id"):
        client.dead_letters("q", after_id="x")  # type: ignore[arg-type]  # on purpose
    with pytest.raises(psycopg.Error, match="status must be") as e:
        db.q("SELECT * FROM {s}.archive_list('q', p_status => 'gone')")
    assert e.value.sqlstate == "LQ002"


# -- idempotent settle -------------------------------------------------------------------------


@pytest.mark.parametrize("archive", [False, True])
def test_a_repeated_ack_succeeds_and_changes_nothing(client: Client, db: Sql, archive: bool) -> None:
    client.create_queue("q", archive=archive)
    client.send_batch("q", [b"1", b"2"])
    m1, m2 = client.take("q", 2)
    assert client.ack(m1) == {m1.id}
    assert client.ack(m1) == {m1.id}  # a retry after a lost reply
    assert client.ack([m1, m2]) == {m1.id, m2.id}
    assert client.ack([m2, m2]) == {m2.id}
    assert len(db.archive("q")) == (2 if archive else 0)


def test_a_stale_token_still_loses(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=5)
    t = db.now()
    db.send("q", [b"x"], t, p_keys=["k"])
    [first] = db.take("q", 1, t)
    [second] = db.take("q", 1, t + 5_000)  # the lease expired: delivered again
    assert db.call("ack", p_queue="q", p_ids=[second["id"]], p_tokens=[2], p_now=t + 5_001)
    assert client.ack([as_message("q", first)]) == set()  # acked by someone else: stale
    with pytest.raises(errors.LeaseLost):
        client.ack(as_message("q", first))


def test_an_update_fences_the_old_token(client: Client, db: Sql) -> None:
    client.create_queue("q", lease=5)
    t = db.now()
    db.send("q", [b"v1"], t, p_keys=["k"])
    [old] = db.take("q", 1, t)
    # The lease expired; a replace updates the message: the old token must not settle it.
    [r] = db.send("q", [b"v2"], t + 5_000, p_keys=["k"], p_on_conflict="replace")
    assert r["outcome"] == "updated"
    assert db.call("nack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 5_001) == []
    assert db.call("ack", p_queue="q", p_ids=[old["id"]], p_tokens=[old["token"]], p_now=t + 5_001) == []
    [new] = db.take("q", 1, t + 5_002)
    assert (new["payload"], new["attempt"]) == (b"v2", 1) and new["token"] > old["token"]


def test_a_repeated_nack_and_give_up_succeed(client: Client, db: Sql) -> None:
    client.create_queue("dlq")
    client.create_queue("q", max_attempts=2, dead_letter_queue="dlq")
    client.send_batch("q", [b"1", b"2", b"3"])
    m1, m2, m3 = client.take("q", 3)
    assert client.nack(m1, delay=60) == {m1.id: "retry"}
    assert client.nack(m1, delay=60) == {m1.id: "retry"}  # the repeat changes nothing
    got = client.get("q", id=m1.id)
    assert got is not None and (got.attempt, got.status) == (1, "scheduled")
    with pytest.raises(errors.LeaseLost):
        client.ack(m1)  # given back, not acked
    give_up = "SELECT * FROM {s}.give_up('q', ARRAY[%s]::bigint[], ARRAY[%s]::int[])"
    assert db.q(give_up, (m2.id, m2.token)) == [{"give_up": m2.id}]
    assert db.q(give_up, (m2.id, m2.token)) == [{"give_up": m2.id}]
    assert client.nack(m2) == {m2.id: "dead"}  # dead-lettered by this delivery (give_up)
    assert db.q(give_up, (m3.id, m3.token + 1)) == []
    assert client.metrics("dlq").ready == 1
    assert client.nack(m3) == {m3.id: "retry"}
    [m3b] = client.take("q")
    assert client.nack(m3b) == {m3.id: "dead"} == client.nack(m3b)  # its last attempt
    assert client.metrics("dlq").ready == 2


def test_four_threads_acking_one_delivery(dsn: str, schema: str, client: Client, db: Sql) -> None:
    for archive in (False, True):
        name = f"q{int(archive)}"
        client.create_queue(name, archive=archive)
        for _ in range(5):
            client.send(name, b"x")
            [m] = client.take(name)
            clients = [Client(dsn, schema=schema, pool_size=1).open() for _ in range(4)]
            try:
                results = _threads(4, lambda i, cs=clients, m=m: cs[i].ack(m))
            finally:
                for c in clients:
                    c.close()
            assert results == [{m.id}] * 4
        assert db.count(name) == 0
        assert len(db.archive(name)) == (5 if archive else 0)
        settled = db.q("SELECT count(*) AS n FROM {s}.settled")[0]["n"]
        assert settled == 5  # one memory per ack of the plain queue, none for the archived


def test_four_threads_nacking_one_delivery(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("q")
    client.send("q", b"x")
    [m] = client.take("q")
    clients = [Client(dsn, schema=schema, pool_size=1).open() for _ in range(4)]
    try:
        results = _threads(4, lambda i: clients[i].nack(m, delay=60))
    finally:
        for c in clients:
            c.close()
    assert results == [{m.id: "retry"}] * 4
    got = client.get("q", id=m.id)
    assert got is not None and (got.attempt, got.status) == (1, "scheduled")


def test_maintain_forgets_old_settles(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"x", b"y"], t)
    a, b = db.take("q", 2, t)
    db.call("ack", p_queue="q", p_ids=[a["id"]], p_tokens=[1], p_now=t - 3_600_001)
    db.call("ack", p_queue="q", p_ids=[b["id"]], p_tokens=[1], p_now=t)
    db.q("SELECT {s}.maintain(p_now => %s::bigint)", (t,))
    assert client.ack([as_message("q", a), as_message("q", b)]) == {b["id"]}


# -- metrics -----------------------------------------------------------------------------------


def test_total_sent_counts_created_messages_exactly(client: Client, dsn: str, schema: str) -> None:
    client.create_queue("dlq")
    client.create_queue(
        "q", max_attempts=1, dead_letter_queue="dlq", channel_max_size=1, channel_on_full="drop"
    )
    client.send_batch("q", [b"1", b"2"])
    client.send("q", b"k", key="k")
    client.send("q", b"k2", key="k")  # ignored
    client.send("q", b"k3", key="k", on_conflict="replace")  # updated
    client.send_batch("q", [Envelope(b"c1", channel="c"), Envelope(b"c2", channel="c")])  # one dropped
    with psycopg.connect(dsn) as tx, Client(tx, schema=schema) as c:
        c.send("q", b"rolled back")
        tx.rollback()
    assert client.metrics("q").total_sent == 4
    client.maintain()  # folds the rows: same total
    assert client.metrics("q").total_sent == 4
    m = client.take("q")[0]
    client.nack(m)  # dead: moved into dlq
    assert client.metrics("dlq").total_sent == 1
    client.purge_queue("dlq")
    m = client.take("q")[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        Sql(conn, schema).q("SELECT {s}.give_up('q', ARRAY[%s]::bigint[], ARRAY[%s]::int[])", (m.id, m.token))
    assert client.metrics("dlq").total_sent == 2
    client.create_queue("arch", max_attempts=1)
    client.send("arch", b"x")
    client.nack(client.take("arch")[0])
    assert client.requeue_dead("arch") == 1
    assert client.metrics("arch").total_sent == 2
    client.drop_queue("arch")
    client.maintain()
    assert client.metrics("q").total_sent == 4 and client.metrics("dlq").total_sent == 2


def test_concurrent_sends_and_maintain_keep_total_sent_exact(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("q")

    def work(i: int) -> None:
        with Client(dsn, schema=schema, pool_size=1) as c:
            for _ in range(30):
                if i == 3:
                    c.maintain()
                else:
                    c.send_batch("q", [b"a", b"b"])

    assert _threads(4, work) == [None] * 4
    assert client.metrics("q").total_sent == 3 * 30 * 2
    client.maintain()
    assert client.metrics("q").total_sent == 180


def test_ages_and_exact_counts(client: Client, db: Sql) -> None:
    client.create_queue("q")
    t = db.now()
    db.send("q", [b"old"], t - 5_000)
    # "later" is due in an hour, not a minute: the client's calls below read the real clock.
    db.send("q", [b"new", b"later"], t - 1_000, p_delays_ms=[0, 3_600_000])
    [m] = db.q("SELECT * FROM {s}.queue_metrics('q', p_now => %s::bigint)", (t,))
    assert (m["oldest_age_ms"], m["newest_age_ms"], m["total_sent"]) == (5_000, 1_000, 3)
    assert (m["ready"], m["scheduled"], m["leased"], m["ready_at_least"]) == (2, 1, 0, False)
    capped = client.metrics("q", cap=1)
    assert (capped.ready, capped.ready_at_least, capped.scheduled, capped.scheduled_at_least) == (
        1,
        True,
        1,
        True,
    )
    assert (capped.leased, capped.leased_at_least, capped.dead_at_least) == (0, False, False)
    client.take("q", 2)
    capped = client.metrics("q", cap=1)
    assert (capped.leased, capped.leased_at_least, capped.scheduled, capped.scheduled_at_least) == (
        1,
        True,
        1,
        True,
    )
    empty = client.metrics("q") if client.purge_queue("q") is None else None
    assert empty is not None and (empty.oldest_age_ms, empty.newest_age_ms, empty.total_sent) == (
        None,
        None,
        3,
    )
    with pytest.raises(errors.InvalidArgument):
        client.metrics("q", cap=0)
