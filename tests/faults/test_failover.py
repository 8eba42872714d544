"""Failover to a synchronous streaming standby while producers and a worker run (issue 18,
item 3).

A primary and a standby (pg_basebackup -R, ``synchronous_standby_names = '*'``: a commit
returns once the standby has it) from Debian's PostgreSQL 15. Clients and the worker get the
multi-host conninfo ``host=127.0.0.1,127.0.0.1 port=<primary>,<standby>
target_session_attrs=read-write``: libpq connects to whichever host accepts writes. The primary
is stopped in immediate mode (a crash) and the standby promoted. Then:

* 0 lost: every send that returned (checked by id) is processed;
* 0 resurrected: no message processed again after its ack had committed (only deliveries in
  flight at the failover may run twice);
* the worker carries on against the new primary, the same Worker, without a restart.

The figures are printed (-s).
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from cluster_helpers import SETTINGS, Producer, Recorder, pgcluster, recovery_gaps, require_pg15

from lonnymq import Client
from lonnymq.worker import Worker
from worker_helpers import eventually

pytestmark = [pytest.mark.once, pytest.mark.slow, pytest.mark.timeout(240)]


def test_failover_to_a_synchronous_standby() -> None:
    require_pg15()
    with (
        pgcluster.temporary_cluster(SETTINGS, install=False) as primary,
        pgcluster.temporary_standby(primary) as standby,
    ):
        dsn = (
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user={pgcluster.SUPERUSER}"
            f" dbname={pgcluster.DATABASE} target_session_attrs=read-write connect_timeout=3"
        )
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            # Only now that the standby is there (a commit would wait for it forever before); the
            # standby's copy of the settings does not have it, so the promoted one will not wait.
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone() != ("sync",):
                assert time.monotonic() < deadline, "the standby never became synchronous"
                time.sleep(0.1)
        with Client(dsn) as c:
            c.migrate()
            c.create_queue("q", lease=5)
        rec = Recorder(seconds=0.2)
        producers = [Producer(dsn, rate=30) for _ in range(2)]

        async def main() -> tuple[float, float]:
            w = Worker(rec.app(), dsn, concurrency=4, poll_interval=1.0)
            await w.start()
            try:
                for p in producers:
                    p.start()
                await asyncio.sleep(8)  # more than Recorder.resurrected's margin before the outage
                down = time.monotonic()
                await asyncio.to_thread(primary.stop, "immediate")
                await asyncio.to_thread(standby.promote)
                up = time.monotonic()
                await asyncio.sleep(5)
                for p in producers:
                    await asyncio.to_thread(p.finish)
                assert not w._done.is_set(), "the worker stopped"
                committed = set().union(*(p.ids for p in producers))
                await eventually(lambda: committed <= rec.ids(), 60, "every committed message processed")
                with psycopg.connect(standby.dsn, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lonnymq-worker'"
                    ).fetchone()
                    assert row is not None and row[0] > 0, "the worker is not connected to the new primary"
            finally:
                await w.stop()
            await w.wait()  # raises if one of its tasks failed
            return down, up

        down, up = asyncio.run(main())
        with Client(standby.dsn) as c:
            assert c.peek("q") == [], "messages left in the queue"

    committed = set().union(*(p.ids for p in producers))
    lost = committed - rec.ids()
    after = [d for d in rec.done if d[2] > up]
    sent_at = sorted(t for p in producers for t in p.sent_at)
    print(
        f"\nfailover (primary crashed, standby promoted in {up - down:.2f}s): {len(committed)} sends committed, "
        f"{len(lost)} lost, {len(rec.resurrected(down))} resurrected, {len(rec.twice())} ran twice (in flight), "
        f"{len(after)} processed after the failover; producers' ConnectionLost "
        f"{sum(p.connection_lost for p in producers)}, other errors {sum(len(p.errors) for p in producers)}; "
        f"first send {recovery_gaps(sent_at, [(down, up)])}s after the promotion"
    )
    assert lost == set(), f"committed but never processed: {sorted(lost)[:10]}"
    assert rec.resurrected(down) == [], "an acknowledged message was processed again"
    assert len(rec.twice()) <= 8, "more messages ran twice than were in flight"
    assert after, "nothing processed after the failover"
    assert [e for p in producers for e in p.errors] == []
