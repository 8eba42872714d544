"""The worker runtime against a real PostgreSQL: dispatch, slots, settling, heartbeats,
retries, dead letters, deferral and the two-phase shutdown."""

from __future__ import annotations

import asyncio
import threading
from time import monotonic

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, Envelope
from lonnymq.worker import App, Backoff, Defer, GiveUp, Retry, Worker, WorkerError
from lonnymq.worker.meters import total
from lonnymq.worker.ops import WORKER_MIGRATION
from worker_helpers import eventually, until, waiters, with_worker


def test_sync_and_async_handlers_by_kind(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", [Envelope(i, kind="a" if i % 2 else None) for i in range(100)])
    app = App()
    sync_seen: list[int] = []
    async_seen: list[int] = []
    threads: set[str] = set()

    @app.handler("jobs", kind="a")
    def on_a(job):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        sync_seen.append(job.payload)

    @app.handler("jobs")
    async def on_other(job):  # type: ignore[no-untyped-def]
        async_seen.append(job.payload)

    w = with_worker(app, dsn, schema, until(lambda: len(sync_seen) + len(async_seen) == 100))
    assert sorted(sync_seen) == list(range(1, 100, 2))
    assert sorted(async_seen) == list(range(0, 100, 2))
    assert threads and all(t.startswith("lonnymq-handler") for t in threads)
    m = client.metrics("jobs")
    assert (m.ready, m.leased, m.scheduled) == (0, 0, 0)
    assert total(w.m_messages, outcome="acked") == 100
    assert total(w.m_fetched) == 100


def test_fetches_only_as_many_as_free_slots(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", list(range(20)))
    app = App()
    gate = threading.Event()
    running = 0
    peak = 0
    done: list[int] = []
    lock = threading.Lock()

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        gate.wait(180)  # longer than any wait of the test's: only the test opens it
        with lock:
            running -= 1
            done.append(job.payload)

    async def scenario(w: Worker) -> None:
        await eventually(lambda: w.in_flight == 3, what="3 handlers running")
        await asyncio.sleep(0.5)  # room for a wrong producer to over-fetch
        assert total(w.m_fetched) == 3
        assert (await asyncio.to_thread(client.metrics, "jobs")).leased == 3
        gate.set()
        await eventually(lambda: len(done) == 20)

    w = with_worker(app, dsn, schema, scenario, concurrency=3, batch_size=10)
    assert peak == 3
    assert total(w.m_fetched) == 20


def test_never_acks_a_message_whose_handler_runs(dsn: str, schema: str, client: Client) -> None:
    # A 4 s lease, heartbeats every ~1.3 s: a 2 s lease left a loaded CI machine (load 6-12)
    # 1.3 s of slack for a heartbeat to land.
    client.create_queue("jobs", lease=4)
    slow_id = client.send("jobs", "slow").id
    client.send_batch("jobs", [f"fast-{i}" for i in range(30)])
    app = App()
    gate = threading.Event()
    fast_done: list[str] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        if job.payload == "slow":
            gate.wait(180)
        else:
            fast_done.append(job.payload)

    async def scenario(w: Worker) -> None:
        await eventually(lambda: len(fast_done) == 30)
        # Every fast one is acknowledged (gone); the slow one is still there, leased, and stays
        # leased past its 4 s lease thanks to heartbeats.
        await eventually(lambda: asyncio.to_thread(lambda: [m.id for m in client.peek("jobs")] == [slow_id]))
        await asyncio.sleep(5)
        peeked = await asyncio.to_thread(client.peek, "jobs")
        assert [m.id for m in peeked] == [slow_id]
        assert peeked[0].lease_until is not None and peeked[0].token == 1
        gate.set()
        await eventually(lambda: asyncio.to_thread(lambda: client.peek("jobs") == []))

    w = with_worker(app, dsn, schema, scenario, concurrency=2, ack_interval=0.01)
    assert total(w.m_lost) == 0
    assert total(w.m_messages, outcome="acked") == 31


def test_heartbeats_keep_a_long_handler_exclusive(dsn: str, schema: str, client: Client) -> None:
    # A 4 s lease (heartbeats every ~1.3 s) and a handler running 2 leases: 1 s and 2 s leases
    # left too little slack for a busy 2-core machine running the suite in parallel processes
    # (CI: load 6-12).
    client.create_queue("jobs", lease=4)
    client.send("jobs", "long")
    app = App()
    runs: list[int] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        runs.append(job.attempt)
        await asyncio.sleep(8)

    async def main() -> tuple[Worker, Worker]:
        # Two workers polling fast: the second would take the message if its lease lapsed.
        a = Worker(app, dsn, schema=schema, poll_interval=0.1)
        b = Worker(app, dsn, schema=schema, poll_interval=0.1)
        await a.start()
        await b.start()
        try:
            await eventually(
                lambda: asyncio.to_thread(
                    lambda: client.metrics("jobs").leased == 0 and client.metrics("jobs").ready == 0 and runs
                )
            )
        finally:
            await a.stop()
            await b.stop()
        return a, b

    a, b = asyncio.run(main())
    assert runs == [1]
    assert total(a.m_lost) + total(b.m_lost) == 0
    assert total(a.m_messages, outcome="acked") + total(b.m_messages, outcome="acked") == 1


def test_lost_lease_is_detected_and_its_late_ack_changes_nothing(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", lease=1)
    client.send("jobs", "x")
    app = App()
    gate = threading.Event()
    started = threading.Event()

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        started.set()
        gate.wait(180)

    stolen = []

    def steal() -> None:
        # Expire the lease and take the message in one transaction, so a heartbeat cannot slip
        # in between: from then on the worker's token is stale.
        with psycopg.connect(dsn) as tx:
            tx.execute(sql.SQL("UPDATE {}.message SET dequeue_at = 0").format(sql.Identifier(schema)))
            stolen.extend(client.take("jobs", conn=tx))

    async def scenario(w: Worker) -> None:
        await eventually(started.is_set)
        await asyncio.to_thread(steal)
        assert len(stolen) == 1 and stolen[0].token == 2
        await eventually(lambda: total(w.m_lost) == 1, what="the heartbeat noticing the lost lease")
        gate.set()

    with_worker(app, dsn, schema, scenario, concurrency=1)
    # The worker's ack after the handler returned was fenced off: the thief still holds it.
    peeked = client.peek("jobs")
    assert [m.token for m in peeked] == [2]
    assert client.ack(stolen[0]) == {stolen[0].id}


def test_retries_with_exponential_backoff_then_succeeds(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=5)
    client.send("jobs", "x")
    app = App()
    seen: list[tuple[int, float, str | None]] = []

    @app.handler("jobs", retry=Backoff(base=0.3, factor=2, jitter=0))
    def work(job):  # type: ignore[no-untyped-def]
        seen.append((job.attempt, monotonic(), job.message.last_error))
        if job.attempt < 3:
            raise RuntimeError(f"fail {job.attempt}")

    w = with_worker(app, dsn, schema, until(lambda: len(seen) == 3))
    assert [a for a, _, _ in seen] == [1, 2, 3]
    # Delays are enforced by the database clock; allow for its millisecond rounding.
    assert seen[1][1] - seen[0][1] >= 0.3 - 0.02
    assert seen[2][1] - seen[1][1] >= 0.6 - 0.02
    assert seen[0][2] is None
    assert "RuntimeError: fail 1" in (seen[1][2] or "")
    assert "Traceback" in (seen[2][2] or "")
    assert total(w.m_messages, outcome="retried") == 2
    assert total(w.m_messages, outcome="acked") == 1
    assert client.peek("jobs") == []


def test_backoff_policy_per_queue_and_handler() -> None:
    app = App(retry=Backoff(base=1, jitter=0))
    app.configure_queue("q", retry=Backoff(base=2, factor=3, max=50, jitter=0))

    @app.handler("q", kind="own", retry=Backoff(base=5, jitter=0))
    def own(job):  # type: ignore[no-untyped-def]
        pass

    @app.handler("q")
    def default(job):  # type: ignore[no-untyped-def]
        pass

    @app.handler("other")
    def other(job):  # type: ignore[no-untyped-def]
        pass

    assert app.backoff(app.resolve("q", "own"), "q").delay(1) == 5
    assert [app.backoff(app.resolve("q", None), "q").delay(n) for n in (1, 2, 3, 4, 5)] == [2, 6, 18, 50, 50]
    assert app.backoff(app.resolve("other", None), "other").delay(3) == 4
    jittered = Backoff(base=10, jitter=0.5)
    assert jittered.delay(1, rand=lambda: 0.0) == 10
    assert jittered.delay(1, rand=lambda: 1.0) == 5
    assert Backoff(base=1, max=3600, jitter=0).delay(10_000) == 3600  # no overflow


def test_explicit_retry_delay(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x")
    app = App()
    times: list[float] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        times.append(monotonic())
        if job.attempt == 1:
            raise Retry("not yet", delay=0.5)

    with_worker(app, dsn, schema, until(lambda: len(times) == 2))
    assert times[1] - times[0] >= 0.5 - 0.02


def test_dead_letter_after_max_attempts_with_traceback(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=2)
    msg_id = client.send("jobs", {"n": 1}).id
    app = App(retry=Backoff(base=0))
    calls: list[int] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        calls.append(job.attempt)
        raise ValueError("boom")

    w = with_worker(app, dsn, schema, until(lambda: len(calls) == 2))
    dead = client.dead_letters("jobs")
    assert [d.id for d in dead] == [msg_id]
    assert dead[0].attempts == 2 and dead[0].payload == {"n": 1}
    assert "Traceback (most recent call last)" in (dead[0].last_error or "")
    assert "ValueError: boom" in (dead[0].last_error or "")
    assert total(w.m_messages, outcome="dead") == 1
    assert client.peek("jobs") == []


def test_handler_max_attempts_and_give_up(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", max_attempts=5, dead_letter_queue="dlq")
    client.send("jobs", "a", kind="strict")
    client.send("jobs", "b", kind="hopeless")
    app = App(retry=Backoff(base=0))
    calls: list[str] = []

    @app.handler("jobs", kind="strict", max_attempts=1)
    def strict(job):  # type: ignore[no-untyped-def]
        calls.append(job.payload)
        raise RuntimeError("once is enough")

    @app.handler("jobs", kind="hopeless")
    async def hopeless(job):  # type: ignore[no-untyped-def]
        calls.append(job.payload)
        raise GiveUp("cannot ever work")

    @app.handler("dlq")
    def never(job):  # type: ignore[no-untyped-def]
        raise AssertionError("not served")

    w = with_worker(app, dsn, schema, until(lambda: len(calls) == 2), queues=["jobs"])
    assert sorted(calls) == ["a", "b"]
    dead = {m.payload: m for m in client.peek("dlq")}
    assert set(dead) == {"a", "b"}
    assert "RuntimeError: once is enough" in (dead["a"].last_error or "")
    assert "GiveUp: cannot ever work" in (dead["b"].last_error or "")
    assert dead["a"].headers is not None and dead["a"].headers["lonnymq_dead_letter"]["attempts"] == 1
    assert total(w.m_messages, outcome="dead") == 2


def test_unknown_kind_fails_like_an_error(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=2)
    client.send("jobs", "x", kind="mystery")
    app = App(retry=Backoff(base=0))

    @app.handler("jobs", kind="known")
    def known(job):  # type: ignore[no-untyped-def]
        pass

    with_worker(app, dsn, schema, until(lambda: client.dead_letters("jobs") != [], what="a dead message"))
    dead = client.dead_letters("jobs")
    assert "no handler for kind 'mystery'" in (dead[0].last_error or "")


def test_async_timeout_fails_the_attempt(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", "x")
    app = App()

    @app.handler("jobs", timeout=0.2)
    async def slow(job):  # type: ignore[no-untyped-def]
        await asyncio.sleep(30)

    with_worker(app, dsn, schema, until(lambda: client.dead_letters("jobs") != []))
    assert "TimeoutError" in (client.dead_letters("jobs")[0].last_error or "")

    with pytest.raises(Exception, match="timeout needs an async handler"):
        app.register(lambda job: None, "jobs", kind="sync", timeout=1)


def test_defer_saves_a_checkpoint_without_spending_attempts(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", "x")
    app = App()
    seen: list[tuple[int, object, float]] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        seen.append((job.attempt, job.state, monotonic()))
        step = (job.state or {"step": 0})["step"]
        if step == 0:
            raise job.defer(delay=0.3, state={"step": 1})
        if step == 1:
            return Defer(state={"step": 2})  # returning works as well as raising
        if step == 2:
            raise Defer(state={"step": 3, "bad": object()})  # not JSON: fails the attempt

    w = with_worker(app, dsn, schema, until(lambda: client.dead_letters("jobs") != []))
    assert [(a, s) for a, s, _ in seen] == [(1, None), (1, {"step": 1}), (1, {"step": 2})]
    assert seen[1][2] - seen[0][2] >= 0.3 - 0.02
    dead = client.dead_letters("jobs")
    assert "state must be JSON-serialisable" in (dead[0].last_error or "")
    assert total(w.m_messages, outcome="deferred") == 2


def test_graceful_stop_finishes_in_flight_and_fetches_no_more(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", lease=5)
    client.send_batch("jobs", list(range(10)))
    app = App()
    started: list[int] = []
    finished: list[int] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        started.append(job.payload)
        await asyncio.sleep(0.5)
        finished.append(job.payload)

    async def scenario(w: Worker) -> None:
        await eventually(lambda: len(started) == 4)
        await w.stop()

    w = with_worker(app, dsn, schema, scenario, concurrency=4)
    assert sorted(finished) == sorted(started) == [0, 1, 2, 3]
    m = client.metrics("jobs")
    assert (m.ready, m.leased) == (6, 0)
    assert total(w.m_messages, outcome="acked") == 4
    assert total(w.m_messages, outcome="released") == 0


def test_hard_phase_cancels_and_releases_leases(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", lease=30)
    client.send("jobs", "async", kind="async")
    client.send("jobs", "sync", kind="sync")
    app = App()
    gate = threading.Event()
    started: list[str] = []
    cancelled: list[str] = []

    @app.handler("jobs", kind="async")
    async def a(job):  # type: ignore[no-untyped-def]
        started.append(job.payload)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(job.payload)
            raise

    @app.handler("jobs", kind="sync")
    def s(job):  # type: ignore[no-untyped-def]
        started.append(job.payload)
        gate.wait(180)  # a thread cannot be interrupted: its lease is released anyway

    async def scenario(w: Worker) -> None:
        await eventually(lambda: len(started) == 2)
        t0 = monotonic()
        await w.stop()
        assert monotonic() - t0 < 60  # not the 180 s the thread waits (room for a loaded machine)

    try:
        w = with_worker(app, dsn, schema, scenario, concurrency=2, shutdown_timeout=0.3)
    finally:
        gate.set()
    assert cancelled == ["async"]
    m = client.metrics("jobs")
    assert (m.ready, m.leased) == (2, 0)  # others can take them at once
    assert total(w.m_messages, outcome="released") == 2
    again = client.take("jobs", 2)
    assert sorted(x.attempt for x in again) == [1, 1]  # a release is not a failed attempt


def test_second_stop_request_skips_the_wait(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x")
    app = App()
    started = []

    @app.handler("jobs")
    async def a(job):  # type: ignore[no-untyped-def]
        started.append(1)
        await asyncio.sleep(600)

    async def scenario(w: Worker) -> None:
        await eventually(lambda: started)
        t0 = monotonic()
        w.request_stop()
        await asyncio.sleep(0.2)
        w.request_stop(hard=True)
        await w.stop()
        assert monotonic() - t0 < 60  # not the 300 s shutdown_timeout (room for a loaded machine)

    w = with_worker(app, dsn, schema, scenario, shutdown_timeout=300)
    assert total(w.m_messages, outcome="released") == 1
    assert client.metrics("jobs").ready == 1


def test_a_failing_side_task_stops_the_worker_loudly(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    client.create_queue("ticks")
    client.send("jobs", "x")
    app = App()
    gate = threading.Event()
    stopping_seen: list[bool] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        gate.wait(180)
        stopping_seen.append(job.stopping)

    app.periodic("tick", "@every 1s", queue="ticks")

    async def main() -> Worker:
        w = Worker(app, dsn, schema=schema, poll_interval=0.5)
        await w.start()
        await eventually(lambda: w.in_flight == 1)
        # The scheduler's next call fails with something that is not a connection error.
        await asyncio.to_thread(
            conn.execute, sql.SQL("DROP FUNCTION {}.cron_list()").format(sql.Identifier(schema))
        )
        await eventually(lambda: w._stopping.is_set(), what="the worker to begin stopping")
        gate.set()
        with pytest.raises(WorkerError, match="scheduler"):
            await w.wait()
        return w

    w = asyncio.run(main())
    assert stopping_seen == [True]  # the running handler could see the shutdown...
    assert total(w.m_messages, outcome="acked") == 1  # ...and was still finished and settled
    assert client.metrics("jobs").ready + client.metrics("jobs").leased == 0


def test_notify_wakes_an_idle_worker(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    app = App()
    got: list[float] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        got.append(monotonic())

    async def scenario(w: Worker) -> None:
        # Idle and registered as a waiter (a condition, not a sleep: a loaded machine may take
        # longer); the next poll in ~180 s.
        await eventually(lambda: asyncio.to_thread(waiters, dsn, schema, "jobs"), what="registered")
        t0 = monotonic()
        await asyncio.to_thread(client.send, "jobs", "x")
        await eventually(lambda: got)
        assert got[0] - t0 < 60

    with_worker(app, dsn, schema, scenario, poll_interval=180)


def test_delayed_message_runs_when_due_without_polling(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs")
    app = App()
    got: list[float] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        got.append(monotonic())

    async def scenario(w: Worker) -> None:
        await eventually(lambda: asyncio.to_thread(waiters, dsn, schema, "jobs"), what="registered")
        t0 = monotonic()
        await asyncio.to_thread(client.send, "jobs", "later", delay=1.0)
        await eventually(lambda: got)
        assert 1.0 - 0.05 <= got[0] - t0 < 60  # not the poll's ~180 s

    with_worker(app, dsn, schema, scenario, poll_interval=180)


def test_start_refuses_missing_queue_and_old_schema(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    app = App()

    @app.handler("absent")
    def work(job):  # type: ignore[no-untyped-def]
        pass

    from lonnymq import errors

    with pytest.raises(errors.QueueNotFound):
        asyncio.run(Worker(app, dsn, schema=schema).run())
    with pytest.raises(errors.InvalidArgument, match="no handler"):
        Worker(app, dsn, schema=schema, queues=["other"])
    conn.execute(
        sql.SQL("DELETE FROM {}.migration WHERE version >= %s").format(sql.Identifier(schema)),
        (WORKER_MIGRATION,),
    )
    with pytest.raises(errors.NotInstalled, match="lonnymq migrate"):
        asyncio.run(Worker(app, dsn, schema=schema).run())


def test_survives_losing_its_database_connections(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", lease=5)
    client.send_batch("jobs", list(range(300)))
    app = App()
    done: list[int] = []

    @app.handler("jobs")
    async def work(job):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.005)
        done.append(job.payload)

    def kill_worker_backends() -> int:
        row = conn.execute(
            # This test's database only: other tests' workers may share the server.
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            ["lonnymq-worker"],
        ).fetchone()
        return int(row[0]) if row else 0

    def worker_backends() -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            ["lonnymq-worker"],
        ).fetchone()
        return int(row[0]) if row else 0

    async def scenario(w: Worker) -> None:
        await eventually(lambda: len(done) >= 50)
        assert await asyncio.to_thread(kill_worker_backends) >= 2  # the pool's and the listener's
        await eventually(lambda: len(set(done)) == 300)
        # It reconnected: waited for, not slept on (a loaded machine may take longer).
        await eventually(lambda: asyncio.to_thread(worker_backends), what="the worker's new connections")
        assert await asyncio.to_thread(kill_worker_backends) >= 1

    w = with_worker(app, dsn, schema, scenario, poll_interval=0.5)
    assert set(done) == set(range(300))
    m = client.metrics("jobs")
    assert (m.ready, m.leased, m.scheduled) == (0, 0, 0)
    assert total(w.m_lost) == 0
