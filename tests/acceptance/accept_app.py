"""The apps the acceptance tests run with the real ``lonnymq worker`` command.

Configured by environment: ACCEPT_DSN, ACCEPT_SCHEMA, ACCEPT_SLEEP (seconds per message). The
``work`` handler records each message in ``<schema>.results`` when it starts and when it has
finished, each in its own committed transaction, so the tests can tell from the database what
was processed (finished) and by which process.
"""

from __future__ import annotations

import os
import threading
import time

from psycopg import sql
from psycopg_pool import ConnectionPool

from lonnymq.worker import App

DSN = os.environ["ACCEPT_DSN"]
SCHEMA = os.environ["ACCEPT_SCHEMA"]
SLEEP = float(os.environ.get("ACCEPT_SLEEP", "0.01"))
INSERT = sql.SQL("INSERT INTO {}.results (n, msg_id, pid, phase) VALUES (%s, %s, %s, %s)").format(
    sql.Identifier(SCHEMA)
)

_pool: ConnectionPool | None = None
_lock = threading.Lock()


def _record(n: int, msg_id: int, phase: str) -> None:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ConnectionPool(DSN, min_size=1, max_size=8, kwargs={"autocommit": True})
    with _pool.connection() as conn:
        conn.execute(INSERT, (n, msg_id, os.getpid(), phase))


app = App()


@app.handler("work")
def work(job):  # type: ignore[no-untyped-def]
    _record(job.payload, job.id, "start")
    time.sleep(SLEEP)
    _record(job.payload, job.id, "done")


cron_app = App()
cron_app.periodic("beat", "@every 1s", queue="ticks", payload="tick")


@cron_app.handler("ticks")
async def tick(job):  # type: ignore[no-untyped-def]
    pass
