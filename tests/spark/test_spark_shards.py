"""The Spark data source given a shard router's DSN (docs/spark.md, "Sharded setups"): reads and
writes go straight to the queue's shard, a partitioned queue's to every partition's shard (read in
parallel, the union), each row written once, to its channel's or key's partition; a write whose publish
fails on one shard leaves nothing on any (every shard publishes before any commits), and a
rerun with the same write id writes each row once (also after a failure between two shards'
COMMITs); a stream consumes every partition.

With the Spark session of the test_spark group (its JVM is started already) and a router over two
shard clusters of this module's own (tests/shard's helpers: about 4 s to start, less than a JVM
and its first job in the shard group's process)."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql.datasource import EqualTo
from pyspark.sql.functions import spark_partition_id
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from lonnymq import Client, Envelope, errors, shard
from lonnymq.client.direct import STRIDE, key_partition
from lonnymq.shard.move import _delete_rows
from lonnymq.spark._conf import Target
from lonnymq.spark._read import BatchReader, StreamReader, read_schema
from lonnymq.spark._write import Plan, StagedShards, abort_shards, commit, commit_shards, stage_shards
from spark_fixtures import spark_session  # noqa: F401 - provides the `spark` fixture

# tests/shard's cluster helpers (pytest puts that folder on the path for its own tests as well).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shard"))
from shard_helpers import start_clusters

pytestmark = [
    pytest.mark.once,
    pytest.mark.spark,
    pytest.mark.xdist_group("test_spark"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

SCHEMA = "n long, key string"


@dataclass(frozen=True)
class Router:
    dsn: str
    shard_dsns: list[str]


@pytest.fixture(scope="module")
def sharded() -> Iterator[Router]:
    """A router over two shards (``lonnymq.shard.init``), for this module."""
    with ExitStack() as stack:
        router, *shards = start_clusters(3, stack)
        shard.init(router.dsn, [c.dsn for c in shards])
        yield Router(router.dsn, [c.dsn for c in shards])


def rows(first: int, count: int, keyed: int) -> list[tuple[int, str | None]]:
    """(n, key): the first ``keyed`` with a key of their own, the rest without."""
    return [(n, f"k{n}" if n - first < keyed else None) for n in range(first, first + count)]


def on_shards(sharded: Router, queue: str) -> list[list[tuple[int, str | None, int]]]:
    """(id, key, payload n) of the queue's live messages on each shard, read on the shard."""
    out = []
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            got = conn.execute(
                "SELECT m.id, m.key, convert_from(m.payload, 'UTF8')::jsonb->>'n' FROM lonnymq.message m"
                " JOIN lonnymq.queue q ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id",
                (queue,),
            ).fetchall()
        out.append([(int(i), k, int(n)) for i, k, n in got])
    return out


def partitioned(sharded: Router, prefix: str) -> tuple[str, tuple[Target, ...]]:
    """A new queue of 2 partitions and its partitions' shards, as a writer places them."""
    q = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
    return q, Target.from_options({"dsn": sharded.dsn, "queue": q}).placed()


def test_partitioned_queue_written_and_read_on_every_shard(spark: Any, sharded: Router) -> None:
    q = f"spark_hot_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2, max_attempts=1)
    parts = shard.status(sharded.dsn).partitioned[q]
    opts = {"dsn": sharded.dsn, "queue": q}
    df = spark.createDataFrame(rows(0, 300, keyed=200), SCHEMA)
    df.write.format("lonnymq").options(**opts).mode("append").save()

    shards = on_shards(sharded, q)
    assert Counter(n for held in shards for _, _, n in held) == Counter(range(300))  # each row once
    for i, held in enumerate(shards):
        assert {m_id % STRIDE for m_id, _, _ in held} <= {i}
        for _, key, _ in held:  # a keyed row on its key's partition
            assert key is None or parts[key_partition(key, 2)] == i
        assert sum(key is None for _, key, _ in held) > 10  # unkeyed rows spread over both

    read = spark.read.format("lonnymq").options(numPartitions="4", **opts).load()
    got = read.select("id", spark_partition_id().alias("task")).collect()
    assert sorted(r.id for r in got) == sorted(m_id for held in shards for m_id, _, _ in held)
    # Two id ranges on each shard, read in parallel: each task's rows come from one shard.
    assert len({r.task for r in got}) == 4
    assert {(r.task, r.id % STRIDE) for r in got} == {(t, parts[t // 2]) for t in range(4)}

    # Dead letters are read from every partition; a key filter reads its key's partition only.
    with Client(sharded.dsn, direct=True) as c:
        dead = [m for _ in range(6) for m in c.take(q, 2)]
        assert {m.id % STRIDE for m in dead} == {0, 1}
        c.nack(dead, error="boom")
    schema = StructType.fromDDL(read_schema({}))
    reader = BatchReader({**opts, "table": "dead"}, schema, {})
    ids = [i for r in reader.partitions() for b in reader.read(r) for i in b.column("id").to_pylist()]
    assert sorted(ids) == sorted(m.id for m in dead)
    reader = BatchReader(opts, schema, {})
    assert list(reader.pushFilters([EqualTo(("key",), "k7")])) == []
    assert {r.target for r in reader.partitions()} == {key_partition("k7", 2)}

    # A stream consumes every partition, on its shard: each live message once, acked there.
    live = {m_id for held in on_shards(sharded, q) for m_id, _, _ in held}
    assert len(live) == 300 - len(dead)
    stream = spark.readStream.format("lonnymq").options(maxRowsPerBatch="100", ack="delete", **opts).load()
    name = f"m_{q}"
    query = stream.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    taken = [r.id for r in spark.sql(f"SELECT id FROM {name}").collect()]
    assert sorted(taken) == sorted(live)  # each once
    assert on_shards(sharded, q) == [[], []]  # acked on both shards
    assert len(query.recentProgress) >= 3  # at most 100 a batch


def test_commit_failing_on_one_shard_leaves_nothing_then_rerun_exactly_once(
    spark: Any, sharded: Router
) -> None:
    """Partition 1's publish fails (a key there conflicts, onConflict=error) after partition 0's
    succeeded: partition 0's is rolled back with it (before, it stayed committed), the job fails
    and its staging is gone from both shards: nothing of the job on any shard. The rerun with
    the same write id then writes each row exactly once, routed as the first run routed it."""
    q = f"spark_rerun_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
    parts = shard.status(sharded.dsn).partitioned[q]
    data = rows(0, 200, keyed=50)
    clash = next(k for _, k in data if k is not None and key_partition(k, 2) == 1)
    with Client(sharded.dsn, direct=True) as c:
        c.send(q, {"n": -1}, key=clash)
    df = spark.createDataFrame(data, SCHEMA)
    write = df.write.format("lonnymq").options(
        dsn=sharded.dsn, queue=q, writeId="nightly", onConflict="error"
    )
    with pytest.raises(Exception, match="DuplicateKey"):
        write.mode("append").save()
    held = on_shards(sharded, q)
    assert held[parts[0]] == [] and [n for _, _, n in held[parts[1]]] == [-1]  # nothing of the job
    for dsn in sharded.shard_dsns:  # abort dropped the job's staging everywhere
        with psycopg.connect(dsn) as conn:
            staged = conn.execute("SELECT count(*) FROM lonnymq.spark_stage_part").fetchone()
            sinks = conn.execute(
                "SELECT count(*) FROM lonnymq.spark_sink_commit WHERE queue = %s", (q,)
            ).fetchone()
        assert staged == (0,) and sinks == (0,)  # nor its write id

    with Client(sharded.dsn, direct=True) as c:
        assert c.cancel(q, key=clash)
    write.mode("append").save()
    held = on_shards(sharded, q)
    assert Counter(n for h in held for _, _, n in h) == Counter(range(200))
    for i, h in enumerate(held):
        assert all(key is None or parts[key_partition(key, 2)] == i for _, key, _ in h)


def test_commit_failing_at_a_later_shard_rolls_back_the_earlier(spark: Any, sharded: Router) -> None:
    """commit_shards called directly: partition 0's rows staged and valid, partition 1's
    publish fails (its staged part lost rows: LQ101). Partition 0's published messages are
    rolled back, with its write-id record."""
    q, targets = partitioned(sharded, "spark_roll")
    plan = Plan.build(StructType.fromDDL("n long"), {})
    run = str(uuid.uuid4())
    staged = stage_shards(targets, plan, run, iter([pa.record_batch({"n": list(range(40))})]))
    assert isinstance(staged, StagedShards) and {s.target for s in staged.staged} == {0, 1}
    lost = next(s for s in staged.staged if s.target == 1)
    with psycopg.connect(targets[1].dsn) as conn:
        conn.execute("DELETE FROM lonnymq.spark_stage WHERE part = %s AND seq = 0", (lost.part,))
    with pytest.raises(psycopg.Error, match="rows but 19 are left"):
        commit_shards(targets, run, [staged], "ignore", "write:w", 0, 60_000, None)
    assert on_shards(sharded, q) == [[], []]
    abort_shards(targets, run, [staged])  # as Spark's abort: the staging goes
    for t in targets:
        with psycopg.connect(t.dsn) as conn:
            sink = "SELECT count(*) FROM lonnymq.spark_sink_commit WHERE queue = %s"
            assert conn.execute(sink, (q,)).fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM lonnymq.spark_stage").fetchone() == (0,)


def test_failure_between_the_commits_then_rerun_exactly_once(spark: Any, sharded: Router) -> None:
    """The one window left: partition 1's COMMIT fails after partition 0's COMMIT (a deferred
    trigger on partition 1's shard raises at commit time). Partition 0's rows stay committed,
    partition 1's do not; the rerun with the same write id (the same rows, staged again) skips
    partition 0's shard and commits partition 1's: each row exactly once. (Keeps the coverage
    of the rerun that the DuplicateKey test had before every shard published first.)"""
    q, targets = partitioned(sharded, "spark_window")
    plan = Plan.build(StructType.fromDDL("n long, key string"), {})
    data = rows(0, 60, keyed=20)
    batch = pa.record_batch({"n": [n for n, _ in data], "key": [k for _, k in data]})
    trap = sql.SQL(
        "CREATE FUNCTION spark_window_trap() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.queue = {q} THEN RAISE EXCEPTION 'trapped at commit'; END IF; RETURN NULL; END $$;"
        " CREATE CONSTRAINT TRIGGER spark_window_trap AFTER INSERT ON lonnymq.spark_sink_commit"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION spark_window_trap()"
    ).format(q=sql.Literal(q))
    with psycopg.connect(targets[1].dsn, autocommit=True) as conn:
        conn.execute(trap)
    try:
        run = str(uuid.uuid4())
        staged = stage_shards(targets, plan, run, iter([batch]))
        with pytest.raises(psycopg.Error, match="trapped at commit"):
            commit_shards(targets, run, [staged], "ignore", "write:w", 0, 60_000, None)
        abort_shards(targets, run, [staged])
    finally:
        with psycopg.connect(targets[1].dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER spark_window_trap ON lonnymq.spark_sink_commit")
            conn.execute("DROP FUNCTION spark_window_trap()")
    parts = shard.status(sharded.dsn).partitioned[q]
    held = on_shards(sharded, q)
    assert held[parts[0]] and held[parts[1]] == []  # partition 0 committed, partition 1 not

    rerun = str(uuid.uuid4())
    staged = stage_shards(targets, plan, rerun, iter([batch]))
    first, second = commit_shards(targets, rerun, [staged], "ignore", "write:w", 0, 60_000, None)
    assert first.duplicate and not second.duplicate
    held = on_shards(sharded, q)
    assert Counter(n for h in held for _, _, n in h) == Counter(range(60))
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM lonnymq.spark_stage").fetchone() == (0,)


def test_shards_without_prepared_transactions_commit_one_after_another(
    sharded: Router, caplog: pytest.LogCaptureFixture
) -> None:
    """This module's shards have max_prepared_transactions = 0 (PostgreSQL's default): a write
    to a partitioned queue commits its shards one after another, as before the two-phase commit
    (tests/spark/test_spark_two_phase.py), prepares nothing, and says so once per write."""
    q, targets = partitioned(sharded, "spark_nopc")
    plan = Plan.build(StructType.fromDDL("n long"), {})
    run = str(uuid.uuid4())
    staged = stage_shards(targets, plan, run, iter([pa.record_batch({"n": list(range(40))})]))
    with caplog.at_level(logging.WARNING, "lonnymq.spark"):
        results = commit_shards(targets, run, [staged], "ignore", "write:w", 0, 60_000, None)
    assert sum(r.created for r in results) == 40
    [warning] = [r.message for r in caplog.records if "max_prepared_transactions = 0" in r.message]
    assert "not atomically" in warning and repr(q) in warning
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
    assert Counter(n for h in on_shards(sharded, q) for _, _, n in h) == Counter(range(40))


def test_rows_with_a_channel_go_to_the_channels_partition(spark: Any, sharded: Router) -> None:
    """A row with a channel goes where the router sends it: its channel's partition (so the
    channel's limits hold on one shard), not by its payload (before: each channel's rows were
    spread over both shards). A row with both a channel and a key is refused as the router
    refuses it (InvalidArgument) and the job leaves nothing on any shard."""
    q = f"spark_chan_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
    parts = shard.status(sharded.dsn).partitioned[q]
    names = [f"tenant-{i}" for i in range(8)]
    assert {key_partition(ch, 2) for ch in names} == {0, 1}
    data = [(n, None, names[n % 8] if n % 4 else None) for n in range(160)]
    opts = {"dsn": sharded.dsn, "queue": q}
    df = spark.createDataFrame(data, "n long, key string, channel string")
    df.write.format("lonnymq").options(**opts).mode("append").save()
    channel_of = {n: ch for n, _, ch in data}
    held = on_shards(sharded, q)
    assert Counter(n for h in held for _, _, n in h) == Counter(range(160))
    for i, h in enumerate(held):
        for _, _, n in h:
            ch = channel_of[n]
            assert ch is None or parts[key_partition(ch, 2)] == i, (n, ch, i)
    assert all(sum(channel_of[n] is None for _, _, n in h) > 0 for h in held)  # no channel: both

    bad = spark.createDataFrame(
        [(1, None, "tenant-1"), (2, "k2", "tenant-2")], "n long, key string, channel string"
    )
    with pytest.raises(Exception, match="cannot also have a key"):
        bad.write.format("lonnymq").options(**opts).mode("append").save()
    assert Counter(n for h in on_shards(sharded, q) for _, _, n in h) == Counter(range(160))
    for dsn in sharded.shard_dsns:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM lonnymq.spark_stage").fetchone() == (0,)


def test_stream_batch_fills_from_the_partition_that_has_messages(spark: Any, sharded: Router) -> None:
    """All of a queue's ready messages on one partition: a micro-batch of maxRowsPerBatch 100
    leases 100 (the empty partition's share goes to the full one), where it leased 50 (its
    share only) before; two batches take all 200, each once, acked on their shard."""
    q, _ = partitioned(sharded, "spark_skew")
    parts = shard.status(sharded.dsn).partitioned[q]
    keys = [k for k in (f"k{i}" for i in range(2000)) if key_partition(k, 2) == 0][:200]
    with Client(sharded.dsn, direct=True) as c:
        c.send_batch(q, [Envelope({"n": n}, key=k) for n, k in enumerate(keys)])
    reader = StreamReader({"dsn": sharded.dsn, "queue": q}, StructType.fromDDL(read_schema({})), {})
    offset = reader.initialOffset()
    taken: list[int] = []
    for want in (100, 100, 0):
        end = reader.latestOffset(offset, ReadMaxRows(100))
        got = [
            i
            for ch in reader.partitions(offset, end)
            for b in reader.read(ch)
            for i in b.column("id").to_pylist()
        ]
        assert len(got) == want
        taken += got
        reader.commit(end)
        offset = end
    reader.stop()
    assert len(set(taken)) == 200 and {i % STRIDE for i in taken} == {parts[0]}
    assert on_shards(sharded, q) == [[], []]  # acked


def test_plain_queue_straight_to_its_shard(spark: Any, sharded: Router) -> None:
    q = f"spark_plain_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn) as c:
        c.create_queue(q)
    opts = {"dsn": sharded.dsn, "queue": q}
    # Through the router this fails: the router has no staging tables.
    spark.createDataFrame(rows(0, 100, keyed=100), SCHEMA).write.format("lonnymq").options(**opts).mode(
        "append"
    ).save()
    counts = [len(s) for s in on_shards(sharded, q)]
    assert sorted(counts) == [0, 100]  # all on the queue's shard
    home = sharded.shard_dsns[counts.index(100)]
    schema = StructType.fromDDL(read_schema({}))
    for reader in (BatchReader(opts, schema, {}), StreamReader(opts, schema, {})):
        [target] = reader.targets if isinstance(reader, BatchReader) else [reader.target]
        assert conninfo_to_dict(target.dsn)["port"] == conninfo_to_dict(home)["port"]


def test_calls_wait_for_a_move_then_fail_queue_not_found(spark: Any, sharded: Router) -> None:
    """A stream's calls (plan, chunks, read, commit) and a write's commit on the queue's shard
    hold the shard's side of the move fence: made while a move holds it, they wait, and once the
    move took the queue away they raise QueueNotFound (unfenced, the stream's chunks and reads
    came back empty: a micro-batch read nothing, then was acked on the new shard). The move is
    simulated on the source: its fence held exclusively, the queue's rows deleted as it deletes
    them, committed."""
    q = f"spark_fence_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn, direct=True) as c:
        c.create_queue(q)
        c.send_batch(q, [{"n": n} for n in range(3)])
    opts = {"dsn": sharded.dsn, "queue": q}
    reader = StreamReader(opts, StructType.fromDDL(read_schema({})), {})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())  # batch 1 leased before the move
    [chunk] = reader.partitions(start, end)
    batch = BatchReader(opts, reader.schema, {})
    [ids] = batch.partitions()  # planned before the move
    t = reader.target
    with psycopg.connect(t.dsn) as mover, ThreadPoolExecutor(4) as pool:
        mover.execute("SELECT pg_advisory_xact_lock(hashtext('lonnymq/route'), hashtext(%s))", (q,))
        [(qid,)] = mover.execute("SELECT id FROM lonnymq.queue WHERE name = %s", (q,)).fetchall()
        _delete_rows(mover, "lonnymq", [q], [qid])
        calls = [
            pool.submit(reader.partitions, start, end),
            pool.submit(lambda: list(reader.read(chunk))),
            pool.submit(commit, t, str(uuid.uuid4()), [], "ignore"),
        ]
        time.sleep(0.3)
        assert not any(call.done() for call in calls)  # waiting at the fence
        mover.commit()
        for call in calls:
            with pytest.raises(errors.QueueNotFound):
                call.result(timeout=60)
    # A batch read's partition reads one snapshot: before the move, whole, else QueueNotFound.
    for later in (
        lambda: reader.commit(end),
        lambda: reader.latestOffset(end, ReadAllAvailable()),
        lambda: list(batch.read(ids)),
    ):
        with pytest.raises(errors.QueueNotFound):
            later()
    reader.stop()


def test_stream_and_write_rerun_after_a_move(spark: Any, sharded: Router) -> None:
    """A move takes a stream's log with the queue: restarted from its checkpoint (its offsets),
    the stream re-plans to the new shard, replays the batch it had leased there (the same
    deliveries) and acks them there. A write staged on the old shard fails at its commit
    (QueueNotFound), its abort drops the staging left there, and the rerun (a new plan) writes
    to the new shard."""
    q = f"spark_moved_{uuid.uuid4().hex[:8]}"
    with Client(sharded.dsn, direct=True) as c:
        c.create_queue(q)
        sent = c.send_batch(q, [{"n": n} for n in range(3)])
    opts = {"dsn": sharded.dsn, "queue": q}
    schema = StructType.fromDDL(read_schema({}))
    before = StreamReader(opts, schema, {})
    start = before.initialOffset()
    end = before.latestOffset(start, ReadAllAvailable())
    before.stop()
    plan = Plan.build(StructType.fromDDL("n long"), {})
    run = str(uuid.uuid4())
    staged = stage_shards(before.targets, plan, run, iter([pa.record_batch({"n": [7, 8]})]))
    moved = shard.move(sharded.dsn, q, 1 - [len(s) for s in on_shards(sharded, q)].index(3))
    assert moved.rows["spark_stream_batch"] == 1
    after = StreamReader(opts, schema, {})  # the restart: the checkpoint's offsets
    assert after.target.shard != before.target.shard
    [chunk] = after.partitions(start, end)
    got = [i for b in after.read(chunk) for i in b.column("id").to_pylist()]
    assert sorted(got) == sorted(r.id for r in sent)
    after.commit(end)
    after.stop()
    assert on_shards(sharded, q) == [[], []]

    with pytest.raises(errors.QueueNotFound):
        commit_shards(before.targets, run, [staged], "ignore", None, None, 1000, None)
    abort_shards(before.targets, run, [staged])
    with psycopg.connect(before.target.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM lonnymq.spark_stage").fetchone() == (0,)
    rerun = str(uuid.uuid4())
    staged = stage_shards(after.targets, plan, rerun, iter([pa.record_batch({"n": [7, 8]})]))
    commit_shards(after.targets, rerun, [staged], "ignore", None, None, 1000, None)
    assert sorted(n for held in on_shards(sharded, q) for _, _, n in held) == [7, 8]
