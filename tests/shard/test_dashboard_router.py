"""The dashboard (lonnymq.web) on the router's DSN: the overview, a queue's page and the
listings read every shard through the router's merged calls."""

from __future__ import annotations

import pytest
from shard_helpers import home

from lonnymq import AsyncClient, Client
from lonnymq.client.direct import STRIDE

pytestmark = [pytest.mark.once, pytest.mark.slow]

web = pytest.importorskip("lonnymq.web")
testclient = pytest.importorskip("starlette.testclient")


@pytest.mark.parametrize("direct", [False, True], ids=["router", "direct"])
def test_dashboard_overview_through_the_router(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """Also on a direct client (``create_app(client=AsyncClient(router, direct=True))``): one
    queue's reads go to its shard, the overview's to the router."""
    r = sharded.dsn
    found: dict[int, str] = {}
    i = 0
    while len(found) < 2:
        found.setdefault(home(r, f"dash_{i}"), f"dash_{i}")
        i += 1
    queues = [found[0], found[1]]
    with Client(r) as c:
        for k, q in enumerate(queues):
            c.create_queue(q, if_not_exists=True, max_attempts=1)
            c.purge_queue(q)
            c.purge_dead(q)
            c.send_batch(q, [{"n": n} for n in range(3 + k)])
            c.send(q, "later", delay=3600)
            [m] = c.take(q)
            c.nack(m, error="boom")  # dead
    app = (
        web.create_app(token="t0ken", client=AsyncClient(r, direct=True))
        if direct
        else web.create_app(r, token="t0ken")
    )
    with testclient.TestClient(app) as http:
        got = http.get("/api/queues")
        assert got.status_code == 200, got.text
        rows = {q["name"]: q for q in got.json()["queues"]}
        for k, q in enumerate(queues):
            assert (rows[q]["ready"], rows[q]["scheduled"], rows[q]["dead"]) == (2 + k, 1, 1), rows[q]
            assert sum(x["sent"] for x in rows[q]["minutes"]) >= 4 + k
            one = http.get(f"/api/queues/{q}")
            assert one.status_code == 200, one.text
        page = http.get("/")
        assert page.status_code == 200 and all(q in page.text for q in queues)
        for path in ("/api/workers", "/api/cron", f"/api/queues/{queues[1]}/dead"):
            assert http.get(path).status_code == 200, path


def test_partitioned_queue_counted_once(sharded) -> None:  # type: ignore[no-untyped-def]
    """A partitioned queue's per-minute counters and totals come from each partition, summed:
    the dashboard shows it once, with every partition's sends and acks."""
    q = "dash_hot"
    with Client(sharded.dsn) as c:
        c.create_queue(q, partitions=2)
        try:
            for k in range(10):
                c.send(q, {"k": k}, key=f"key-{k}")
            on = {i % STRIDE for i in (m.id for m in c.peek(q, 10))}
            assert on == {0, 1}, "all sends on one partition"
            acked = 0
            while batch := c.take(q, 3):
                acked += len(c.ack(batch))
            assert acked == 10
            minutes = c.run(c.ops.stats_minutes([q]))
            assert len({m.minute_at for m in minutes}) == len(minutes), minutes  # a row per minute
            assert (sum(m.sent for m in minutes), sum(m.acked for m in minutes)) == (10, 10)
            [total] = c.run(c.ops.stats_totals([q]))
            assert (total.queue, total.sent, total.acked) == (q, 10, 10)
            app = web.create_app(sharded.dsn, token="t0ken")
            with testclient.TestClient(app) as http:
                got = http.get("/api/queues")
                assert got.status_code == 200, got.text
                rows = [row for row in got.json()["queues"] if row["name"] == q]
                assert len(rows) == 1
                assert sum(x["sent"] for x in rows[0]["minutes"]) == 10
                one = http.get(f"/api/queues/{q}")  # its settings once (queue_info on every shard)
                assert one.status_code == 200, one.text
                assert (one.json()["settings"]["name"], one.json()["totals"]["acked"]) == (q, 10)
        finally:
            c.drop_queue(q)
