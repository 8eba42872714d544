"""A worker started against a closed port waits for the database (client.config.UNAVAILABLE), logging
each try, whether it makes its own client from a DSN or is given one. A given client used to
raise psycopg_pool's ``PoolTimeout("pool initialization incomplete ...")``, a text the worker
does not know as "unavailable", so the worker gave up after the client's connect timeout; the
client now raises DatabaseUnavailable with libpq's reason ("Connection refused")."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from lonnymq import AsyncClient
from lonnymq.worker import App, Job, Worker
from worker_helpers import eventually

pytestmark = pytest.mark.timeout(120)


def app() -> App:
    a = App()

    @a.handler("q")
    async def noop(job: Job) -> None:
        pass

    return a


@pytest.mark.parametrize("given", [True, False], ids=["given-client", "own-client"])
def test_a_worker_waits_for_a_closed_port(caplog: pytest.LogCaptureFixture, given: bool) -> None:
    caplog.set_level(logging.INFO, logger="lonnymq.worker")
    with socket.socket() as s:  # a port nothing listens on (freed below)
        s.bind(("127.0.0.1", 0))
        dsn = f"postgresql://clienterrors_u@127.0.0.1:{s.getsockname()[1]}/clienterrors_db"

    def tries() -> int:
        return sum("starting: database unavailable" in r.getMessage() for r in caplog.records)

    async def main() -> None:
        client = AsyncClient(dsn, connect_timeout=1) if given else dsn
        w = Worker(app(), client, startup_timeout=600)
        run = asyncio.ensure_future(w.run())
        await eventually(lambda: tries() >= 2 or run.done(), 90, "two tries")
        assert not run.done(), run.exception()
        await w.stop()
        await asyncio.wait_for(run, 60)  # nothing had started, nothing failed

    asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "starting: database unavailable" in r.getMessage()]
    assert "connection refused" in lines[0].lower(), lines[0]
    assert any("stopped before it started" in r.getMessage() for r in caplog.records)
