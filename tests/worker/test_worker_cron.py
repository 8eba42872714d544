"""Periodic messages: the SQL de-duplication (migration 0004), the worker's scheduler and the
``lonnymq cron`` commands, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lonnymq import Client, errors
from lonnymq.cli import main
from lonnymq.worker import App, Worker
from lonnymq.worker.meters import total
from lonnymq.worker.ops import worker_ops
from worker_helpers import eventually

T0 = 1_700_000_000_000  # a fixed "now" for the SQL tests (epoch ms, a whole minute)


def fire(conn: psycopg.Connection[Any], schema: str, name: str, tick: int, now: int) -> int | None:
    q = sql.SQL("SELECT {}.cron_fire(%s, %s, %s)").format(sql.Identifier(schema))
    row = conn.execute(q, (name, tick, now)).fetchone()
    return None if row is None else row[0]


def upsert(conn: psycopg.Connection[Any], schema: str, name: str, now: int, **kw: Any) -> str:
    args = {
        "p_name": name,
        "p_schedule": "@every 1s",
        "p_queue": "ticks",
        "p_payload": b'{"x":1}',
        "p_content_type": "application/json",
        "p_now": now,
        **kw,
    }
    names = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in args)
    q = sql.SQL("SELECT {}.cron_upsert({})").format(sql.Identifier(schema), names)
    row = conn.execute(q, list(args.values())).fetchone()
    assert row is not None
    return str(row[0])


def test_each_tick_is_sent_once_by_racing_schedulers(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("ticks")
    assert upsert(conn, schema, "beat", T0) == "created"
    racers = 8
    results: dict[int, list[int | None]] = {}
    ticks = [T0 + k * 1000 for k in range(1, 6)]

    def racer(barrier: threading.Barrier, tick: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            results.setdefault(tick, []).append(fire(c, schema, "beat", tick, tick + 10))

    for tick in ticks:
        barrier = threading.Barrier(racers)
        threads = [threading.Thread(target=racer, args=(barrier, tick)) for _ in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for tick in ticks:
        sent = [r for r in results[tick] if r is not None]
        assert len(sent) == 1, (tick, results[tick])
    messages = client.peek("ticks", 100)
    assert sorted(m.headers["lonnymq_cron"]["tick"] for m in messages if m.headers) == ticks
    assert all(m.payload == {"x": 1} for m in messages)


def test_fire_rules(dsn: str, schema: str, client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("ticks")
    upsert(conn, schema, "beat", T0, p_misfire_grace_ms=5000, p_headers=psycopg.types.json.Jsonb({"h": 1}))
    assert fire(conn, schema, "beat", T0, T0 + 100) is None  # not after the creation time
    assert fire(conn, schema, "beat", T0 + 2000, T0 + 1000) is None  # in the future
    assert fire(conn, schema, "beat", T0 + 1000, T0 + 7000) is None  # older than the grace
    assert fire(conn, schema, "beat", T0 + 3000, T0 + 7000) is not None
    assert fire(conn, schema, "beat", T0 + 2000, T0 + 7000) is None  # behind the last tick sent
    assert fire(conn, schema, "beat", T0 + 3000, T0 + 7000) is None  # already sent
    (m,) = client.peek("ticks")
    assert m.headers == {"h": 1, "lonnymq_cron": {"name": "beat", "tick": T0 + 3000}}
    assert fire(conn, schema, "nobody", T0 + 4000, T0 + 7000) is None

    ops = worker_ops(schema)
    assert client.run(ops.cron_set_enabled("beat", False))
    assert fire(conn, schema, "beat", T0 + 4000, T0 + 7000) is None  # paused
    assert client.run(ops.cron_set_enabled("beat", True))
    # A send that fails leaves the tick unsent, to be sent once the queue is back.
    client.drop_queue("ticks")
    with pytest.raises(psycopg.Error):
        fire(conn, schema, "beat", T0 + 5000, T0 + 7000)
    client.create_queue("ticks")
    assert fire(conn, schema, "beat", T0 + 5000, T0 + 7000) is not None


def test_redeclaring_keeps_the_last_tick(
    dsn: str, schema: str, client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("ticks")
    client.create_queue("other")
    assert upsert(conn, schema, "beat", T0) == "created"
    assert fire(conn, schema, "beat", T0 + 1000, T0 + 1000) is not None
    assert upsert(conn, schema, "beat", T0 + 5000) == "unchanged"
    assert upsert(conn, schema, "beat", T0 + 5000, p_queue="other") == "updated"
    assert fire(conn, schema, "beat", T0 + 1000, T0 + 6000) is None  # still sent once
    (row,) = client.run(worker_ops(schema).cron_list())
    assert (row.queue, row.last_tick_ms) == ("other", T0 + 1000)
    with pytest.raises(errors.QueueNotFound):
        client.run(worker_ops(schema).cron_upsert("x", "@hourly", "absent", None))
    with pytest.raises(errors.InvalidArgument):
        client.run(worker_ops(schema).cron_upsert("bad name!", "@hourly", "ticks", None))


def test_worker_sends_every_tick_once_across_a_restart(dsn: str, schema: str, client: Client) -> None:
    client.create_queue("ticks", archive=True)
    app = App()
    app.periodic("beat", "@every 1s", queue="ticks", payload={"hello": "world"}, kind="beat")
    got: list[dict[str, Any]] = []

    @app.handler("ticks")
    async def on_tick(job):  # type: ignore[no-untyped-def]
        got.append(job.headers["lonnymq_cron"])
        assert job.payload == {"hello": "world"} and job.kind == "beat"

    async def run_for(n: int) -> Worker:
        w = Worker(app, dsn, schema=schema, poll_interval=0.5)
        await w.start()
        start = len(got)
        try:
            await eventually(lambda: len(got) >= start + n)
        finally:
            await w.stop()
        return w

    w1 = asyncio.run(run_for(2))
    w2 = asyncio.run(run_for(2))  # a restart re-declares the schedule: no tick twice
    ticks = [g["tick"] for g in got]
    assert len(ticks) == len(set(ticks)), ticks
    assert all(t % 1000 == 0 for t in ticks)
    assert total(w1.m_cron) + total(w2.m_cron) >= 4
    assert total(w1.m_cron_errors) == 0


def test_cron_cli(dsn: str, schema: str, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    client.create_queue("reports")
    base = ["--dsn", dsn, "--schema", schema]
    assert (
        main(
            [
                "cron",
                "add",
                "nightly",
                "0 3 * * *",
                "--queue",
                "reports",
                "--payload",
                '{"kind": "daily"}',
                "--kind",
                "report",
                *base,
            ]
        )
        == 0
    )
    assert "created" in capsys.readouterr().out
    assert main(["cron", "list", "--json", *base]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "nightly" and row["schedule"] == "0 3 * * *" and row["source"] == "cli"
    assert row["enabled"] is True and row["next_tick"].endswith("T03:00:00+00:00")
    assert main(["cron", "pause", "nightly", *base]) == 0
    assert main(["cron", "list", "--json", *base]) == 0
    capsys.readouterr()
    assert main(["cron", "resume", "nightly", *base]) == 0
    assert main(["cron", "remove", "nightly", *base]) == 0
    assert main(["cron", "remove", "nightly", *base]) == 1
    capsys.readouterr()
    assert main(["cron", "add", "x", "61 * * * *", "--queue", "reports", *base]) == 2
    assert "Bad minute (minute 0-59" in capsys.readouterr().err
    assert client.run(worker_ops(schema).cron_list()) == []
