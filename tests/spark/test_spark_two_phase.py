"""A Spark write to a partitioned queue over shards that allow prepared transactions
(``max_prepared_transactions > 0``) commits by two-phase commit (docs/spark.md, "Sharded
setups"): atomic across the shards, and whatever a crash leaves prepared is resolved by the next
run of the same write id or sink batch before it does anything else.

Faults are injected at the steps of the commit (``_write._fault``): a crash is an exception the
commit does not catch (its connections close as a dead driver's would: the server rolls back what
is open and keeps what is prepared), a lost connection a ``pg_terminate_backend`` of the
writer's session on the shard from another session. With the Spark session of the test_spark
group for the one job run through Spark, and a router over two shard clusters of this module's
own, started with ``max_prepared_transactions = 10``."""

from __future__ import annotations

import logging
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql
from pyspark.sql.types import LongType, StringType, StructField, StructType

import lonnymq.spark
from lonnymq import Client, shard
from lonnymq.spark import _write
from lonnymq.spark._conf import Target
from lonnymq.spark._write import GID_PREFIX, Plan, commit_shards, stage_shards
from spark_fixtures import spark_session  # noqa: F401 - provides the `spark` fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shard"))
from shard_helpers import SETTINGS, start_clusters
from test_spark_shards import SCHEMA, Router, on_shards, partitioned, rows
from test_spark_shards import pytestmark as pytestmark  # once, spark, the test_spark group


class Crash(BaseException):
    """The driver dying at a step of the commit: nothing in the commit catches it."""


@pytest.fixture(scope="module")
def prepared_ok() -> Iterator[Router]:
    """A router over two shards that allow prepared transactions."""
    with ExitStack() as stack:
        [router] = start_clusters(1, stack)
        shards = start_clusters(2, stack, {**SETTINGS, "max_prepared_transactions": "10"})
        shard.init(router.dsn, [c.dsn for c in shards])
        yield Router(router.dsn, [c.dsn for c in shards])


def in_doubt(sharded: Router) -> list[str]:
    """The gids of the writer's transactions still prepared, on every shard."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            got = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (GID_PREFIX,)
            ).fetchall()
        out += [g for (g,) in got]
    return out


def counted(sharded: Router, queue: str) -> list[Counter[int]]:
    """Each shard's live messages of ``queue``, counted by payload n."""
    return [Counter(n for _, _, n in held) for held in on_shards(sharded, queue)]


def setup(sharded: Router, prefix: str) -> tuple[str, tuple[Target, ...], Plan, pa.RecordBatch]:
    q, targets = partitioned(sharded, prefix)
    assert targets[0].dsn != targets[1].dsn  # one partition on each shard
    data = rows(0, 60, keyed=20)
    batch = pa.record_batch({"n": [n for n, _ in data], "key": [k for _, k in data]})
    return (
        q,
        targets,
        Plan.build(StructType([StructField("n", LongType()), StructField("key", StringType())]), {}),
        batch,
    )


def write(targets: tuple[Target, ...], plan: Plan, batch: pa.RecordBatch, sink: str, batch_id: int) -> Any:
    run = str(uuid.uuid4())
    staged = stage_shards(targets, plan, run, iter([batch]), sink)
    return commit_shards(targets, run, [staged], "ignore", sink, batch_id, 60_000, None)


def test_crash_after_the_first_commit_prepared_rerun_commits_the_rest(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies right after partition 0's COMMIT PREPARED (the write's decision):
    partition 0's rows are visible, partition 1's prepared and invisible. The rerun with the
    same write id finds partition 1's prepared transaction, commits it (partition 0's did)
    before anything else, then skips both shards (the write id is recorded on both): each of
    the 60 rows exactly once, nothing left prepared."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_decided")
    parts = shard.status(prepared_ok.dsn).partitioned[q]

    def crash(step: str, k: int) -> None:
        if (step, k) == ("committed", 0):
            raise Crash

    monkeypatch.setattr(_write, "_fault", crash)
    with pytest.raises(Crash):
        write(targets, plan, batch, "write:w", 0)
    monkeypatch.setattr(_write, "_fault", None)
    held = counted(prepared_ok, q)
    assert held[parts[0]] and not held[parts[1]]
    [gid] = in_doubt(prepared_ok)
    assert gid.startswith(f"{GID_PREFIX}{q}/") and gid.split("/")[-2] == "1"

    first, second = write(targets, plan, batch, "write:w", 0)
    assert first.duplicate and second.duplicate  # partition 1's committed by the recovery
    assert sum(counted(prepared_ok, q), Counter()) == Counter(range(60))
    assert in_doubt(prepared_ok) == []


def test_resolve_in_doubt_finishes_a_write_without_a_write_id(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write without a write id is never rerun as the same write: what its crash (after
    partition 0's COMMIT PREPARED) left prepared is finished by lonnymq.spark.resolve_in_doubt
    given the router's DSN, which commits partition 1's as partition 0's was; a younger
    prepared transaction than min_age is left alone."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_resolve")

    def crash(step: str, k: int) -> None:
        if (step, k) == ("committed", 0):
            raise Crash

    monkeypatch.setattr(_write, "_fault", crash)
    run = str(uuid.uuid4())
    staged = stage_shards(targets, plan, run, iter([batch]))
    with pytest.raises(Crash):
        commit_shards(targets, run, [staged], "ignore", None, None, 60_000, None)
    [gid] = in_doubt(prepared_ok)
    assert lonnymq.spark.resolve_in_doubt(prepared_ok.dsn, min_age=3600) == []
    [done] = lonnymq.spark.resolve_in_doubt(prepared_ok.dsn, min_age=0)
    assert done.gids == [gid] and done.committed
    assert sum(counted(prepared_ok, q), Counter()) == Counter(range(60))
    assert in_doubt(prepared_ok) == []


@pytest.mark.parametrize(("sink", "batch_id"), [("write:nightly", 0), ("query:q1", 4)])
def test_crash_before_the_decision_rerun_rolls_back_then_writes_once(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch, sink: str, batch_id: int
) -> None:
    """The driver dies once every shard has prepared, before partition 0's COMMIT PREPARED: no
    row is visible on any shard, and staging is free for the rerun's tasks. The rerun of the write id (or the replay of the stream's sink
    batch) rolls both back first, then publishes: each of the 60 rows exactly once (0 lost, 0
    duplicated), nothing left prepared."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_undecided")

    def crash(step: str, k: int) -> None:
        if step == "prepared":
            raise Crash

    monkeypatch.setattr(_write, "_fault", crash)
    with pytest.raises(Crash):
        write(targets, plan, batch, sink, batch_id)
    monkeypatch.setattr(_write, "_fault", None)
    assert counted(prepared_ok, q) == [Counter(), Counter()]
    assert len(in_doubt(prepared_ok)) == 2
    for dsn in prepared_ok.shard_dsns:  # the prepared publishes deleted staging, not truncated it
        with psycopg.connect(dsn) as conn:  # (a truncate's lock would stop the rerun's staging)
            conn.execute("SET lock_timeout = '5s'")
            conn.execute("LOCK TABLE lonnymq.spark_stage IN ROW EXCLUSIVE MODE")

    results = write(targets, plan, batch, sink, batch_id)
    assert not any(r.duplicate for r in results)
    assert sum(counted(prepared_ok, q), Counter()) == Counter(range(60))
    assert in_doubt(prepared_ok) == []


def test_connection_lost_between_the_commits_is_committed_again(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 1's shard session is terminated (pg_terminate_backend from another session)
    right after partition 0's COMMIT PREPARED: its COMMIT PREPARED fails, and the writer
    commits it again over a new connection. The write completes in the same run: every row
    once, nothing prepared, no error."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_lost")

    def kill(step: str, k: int) -> None:
        if (step, k) == ("committed", 0):
            with psycopg.connect(targets[1].dsn, autocommit=True) as conn:
                [(n,)] = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = 'lonnymq-spark' AND pid <> pg_backend_pid()"
                ).fetchall()
            assert n == 1

    monkeypatch.setattr(_write, "_fault", kill)
    with caplog.at_level(logging.WARNING, "lonnymq.spark"):
        results = write(targets, plan, batch, "write:w", 0)
    assert not any(r.duplicate for r in results)
    assert any("COMMIT PREPARED" in r.message for r in caplog.records)
    assert sum(counted(prepared_ok, q), Counter()) == Counter(range(60))
    assert in_doubt(prepared_ok) == []


def test_connection_lost_before_the_last_prepare_rolls_back_everywhere(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1's shard session is terminated after partition 0's PREPARE, before its own:
    the commit fails, partition 0's prepared transaction is rolled back (no decision was made),
    and nothing of the write is on either shard or left prepared."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_halfway")
    steps: list[tuple[str, int]] = []

    def kill(step: str, k: int) -> None:
        steps.append((step, k))
        if (step, k) == ("prepare", 1):
            assert len(in_doubt(prepared_ok)) == 1  # partition 0's
            with psycopg.connect(targets[1].dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = 'lonnymq-spark' AND pid <> pg_backend_pid()"
                )

    monkeypatch.setattr(_write, "_fault", kill)
    with pytest.raises(psycopg.OperationalError):
        write(targets, plan, batch, "write:w", 0)
    assert steps == [("prepare", 0), ("prepare", 1)]
    assert counted(prepared_ok, q) == [Counter(), Counter()]
    assert in_doubt(prepared_ok) == []


def test_waiting_consumers_are_woken_after_the_commit(
    prepared_ok: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer waits on each shard (LISTEN, then registered with wait_begin): a publish would
    notify it, and a transaction that notified cannot be prepared ("cannot PREPARE a transaction
    that has executed LISTEN, UNLISTEN, or NOTIFY"). The prepared publish defers its wake-up and
    the writer notifies each shard once its COMMIT PREPARED is done: the write commits by
    two-phase commit and both consumers get their notification."""
    q, targets, plan, batch = setup(prepared_ok, "tpc_wake")
    steps: list[tuple[str, int]] = []
    monkeypatch.setattr(_write, "_fault", lambda step, k: steps.append((step, k)))
    with ExitStack() as stack:
        waiting = [stack.enter_context(psycopg.connect(t.dsn, autocommit=True)) for t in targets]
        for conn in waiting:
            conn.execute("LISTEN lonnymq")
            conn.execute("SELECT lonnymq.wait_begin(%s)", (q,))
        results = write(targets, plan, batch, "write:w", 0)
        assert steps == [("prepare", 0), ("prepare", 1), ("prepared", 2), ("committed", 0), ("committed", 1)]
        for conn in waiting:
            [note] = conn.notifies(timeout=30, stop_after=1)
            assert (note.channel, note.payload) == ("lonnymq", q)
    assert sum(r.created for r in results) == 60
    assert in_doubt(prepared_ok) == []


def test_spark_job_failing_at_prepare_leaves_nothing_then_rerun_once(spark: Any, prepared_ok: Router) -> None:
    """End to end through Spark: partition 1's PREPARE fails (a deferred trigger on its shard
    raises when the transaction is prepared, after both shards published), so partition 0's
    publish is rolled back too: nothing of the job on either shard, nothing prepared (without
    the two-phase commit, partition 0's rows were committed before partition 1's COMMIT
    failed). The rerun with the same write id writes every row once."""
    q = f"tpc_spark_{uuid.uuid4().hex[:8]}"
    with Client(prepared_ok.dsn) as c:
        c.create_queue(q, partitions=2)
    parts = shard.status(prepared_ok.dsn).partitioned[q]
    trap = sql.SQL(
        "CREATE FUNCTION tpc_trap() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.queue = {q} THEN RAISE EXCEPTION 'trapped at prepare'; END IF; RETURN NULL; END $$;"
        " CREATE CONSTRAINT TRIGGER tpc_trap AFTER INSERT ON lonnymq.spark_sink_commit"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tpc_trap()"
    ).format(q=sql.Literal(q))
    trapped = prepared_ok.shard_dsns[parts[1]]
    df = spark.createDataFrame(rows(0, 200, keyed=50), SCHEMA)
    job = df.write.format("lonnymq").options(dsn=prepared_ok.dsn, queue=q, writeId="nightly").mode("append")
    with psycopg.connect(trapped, autocommit=True) as conn:
        conn.execute(trap)
    try:
        with pytest.raises(Exception, match="trapped at prepare"):
            job.save()
    finally:
        with psycopg.connect(trapped, autocommit=True) as conn:
            conn.execute("DROP TRIGGER tpc_trap ON lonnymq.spark_sink_commit")
            conn.execute("DROP FUNCTION tpc_trap()")
    assert counted(prepared_ok, q) == [Counter(), Counter()]
    assert in_doubt(prepared_ok) == []

    job.save()
    held = counted(prepared_ok, q)
    assert sum(held, Counter()) == Counter(range(200)) and all(held)
    assert in_doubt(prepared_ok) == []
