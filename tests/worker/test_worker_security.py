"""A worker needs no more than the lonnymq_consumer role (migrations 0002 and 0004)."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lonnymq import Client, errors
from lonnymq.worker import App, Backoff, Worker
from lonnymq.worker.meters import total
from lonnymq.worker.ops import worker_ops
from worker_helpers import eventually


@pytest.fixture
def consumer_dsn(dsn: str, schema: str, conn: psycopg.Connection) -> Iterator[str]:
    # schema: the migrations create the group roles.
    row = conn.execute(
        "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not row or not row[0]:
        pytest.skip("the test DSN's user may not create roles")
    name = f"lmq_worker_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password))
    )
    conn.execute(sql.SQL("GRANT lonnymq_consumer TO {}").format(sql.Identifier(name)))
    yield make_conninfo(dsn, user=name, password=password)
    conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_worker_runs_as_a_consumer(consumer_dsn: str, schema: str, client: Client) -> None:
    client.create_queue("jobs", max_attempts=2)
    client.create_queue("ticks")
    client.send_batch("jobs", ["ok", "bad"])
    app = App(retry=Backoff(base=0))
    handled: list[str] = []

    @app.handler("jobs")
    def work(job):  # type: ignore[no-untyped-def]
        handled.append(job.payload)
        if job.payload == "bad":
            raise RuntimeError("always")

    @app.handler("ticks")
    def tick(job):  # type: ignore[no-untyped-def]
        handled.append("tick")

    app.periodic("beat", "@every 1s", queue="ticks")

    async def main() -> Worker:
        w = Worker(app, consumer_dsn, schema=schema, metrics_port=0)
        await w.start()
        try:
            await eventually(lambda: handled.count("bad") == 2 and "tick" in handled and "ok" in handled)
            text = await w.metrics_text()
            assert 'lonnymq_queue_depth{queue="jobs"}' in text
        finally:
            await w.stop()
        return w

    w = asyncio.run(main())
    assert total(w.m_messages, outcome="dead") == 1
    assert "RuntimeError: always" in (client.dead_letters("jobs")[0].last_error or "")
    # Changing schedules is the admin's.
    with Client(consumer_dsn, schema=schema, pool_size=1) as c, pytest.raises(errors.PermissionDenied):
        c.run(worker_ops(schema).cron_delete("beat"))
