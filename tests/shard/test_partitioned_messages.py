"""The live messages of a partitioned queue (``message_list``, the dashboard's browse), through
the router and with direct clients (which read each partition's shard themselves): every
partition's messages merged by id, paged by ``after_id`` as a single queue's listing is, with
its status filter; pages read while messages come and go list no message twice and miss none
that stayed live throughout."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from psycopg import sql
from test_partition_move import four_shards
from test_partitioned_dead import _keys_over

from lonnymq import AsyncClient, Client, errors, shard
from lonnymq.client.direct import STRIDE

pytestmark = [pytest.mark.once, pytest.mark.slow]

MODES = [pytest.param(False, id="router"), pytest.param(True, id="direct")]


def _partitioned(c: Client, router: str, q: str) -> list[int]:
    """``q`` made with 2 partitions through ``c``: its partitions' shards."""
    c.create_queue(q, partitions=2)
    return shard.status(router).partitioned[q]


def _pages(c: Client, q: str, status: str | None, limit: int) -> list[list[int]]:
    """Every page of ``q``'s listing (``status``), each page's ids."""
    pages: list[list[int]] = []
    after = None
    while page := c.run(c.ops.message_list(q, status=status, after_id=after, limit=limit)):  # type: ignore[arg-type]
        assert all(m.queue == q for m in page)
        pages.append([m.id for m in page])
        after = page[-1].id
    return pages


@pytest.mark.parametrize("direct", MODES)
def test_the_messages_of_every_partition_are_listed_merged_by_id(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    q = f"hot_list_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        parts = _partitioned(c, sharded.dsn, q)
        keys = _keys_over(parts, 30, f"{q}_")
        ready = {c.send(q, k, key=k).id: k for k in keys}
        later = {c.send(q, k, key=k, delay=3600).id: k for k in _keys_over(parts, 8, f"{q}_later_")}
        leased = {m.id for _ in range(4) for m in c.take(q, 3)}
        assert len(leased) == 12 and {i % STRIDE for i in leased} == set(parts)
        everything = sorted([*ready, *later])
        assert {i % STRIDE for i in everything} == set(parts)

        # Pages of 7 by after_id: each message of both partitions once, in id order.
        pages = _pages(c, q, None, 7)
        seen = [i for p in pages for i in p]
        assert seen == everything and len(pages) == -(-len(everything) // 7)
        assert [len(p) for p in pages[:-1]] == [7] * (len(pages) - 1)
        # The same rows as each shard's own listing of its partition, merged by id.
        on_shards = []
        for dsn in sharded.shard_dsns:
            with Client(dsn) as sc:
                on_shards += sc.run(sc.ops.message_list(q, limit=1000))
        listed = c.run(c.ops.message_list(q, limit=1000))
        assert listed == sorted(on_shards, key=lambda m: m.id)
        # The status filter applies on every partition.
        by_status = {s: [i for p in _pages(c, q, s, 5) for i in p] for s in ("ready", "scheduled", "leased")}
        assert by_status["leased"] == sorted(leased)
        assert by_status["ready"] == sorted(set(ready) - leased)
        assert by_status["scheduled"] == sorted(later)
        assert {m.id: m.key for m in listed} == {**ready, **later}
        # A bad status or limit: refused as on one queue.
        with pytest.raises(errors.InvalidArgument, match="status must be"):
            c.run(c.ops.message_list(q, status="dead"))  # type: ignore[arg-type]
        with (
            psycopg.connect(sharded.dsn, autocommit=True) as conn,
            pytest.raises(psycopg.Error, match="state must be") as bad,
        ):
            conn.execute("SELECT * FROM lonnymq.message_list(%s, 'dead')", (q,))
        assert bad.value.sqlstate == "LQ002"
        with pytest.raises(errors.QueueNotFound):
            c.run(c.ops.message_list(f"{q}_none"))

    async def async_page() -> list[int]:
        async with AsyncClient(sharded.dsn, direct=direct) as ac:
            return [m.id for m in await ac.run(ac.ops.message_list(q, after_id=everything[3], limit=5))]

    assert asyncio.run(async_page()) == everything[4:9]
    if not direct:
        return
    # A direct client reads every partition's shard itself: not through the router.
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP FUNCTION lonnymq.{}").format(sql.Identifier("message_list")))
    try:
        with Client(sharded.dsn) as plain, pytest.raises(errors.NotInstalled):
            plain.run(plain.ops.message_list(q))
        with Client(sharded.dsn, direct=True) as c:
            assert [i for p in _pages(c, q, None, 7) for i in p] == everything
    finally:
        shard.init(sharded.dsn, sharded.shard_dsns)  # regenerates the proxies


@pytest.mark.parametrize("direct", MODES)
def test_pages_read_while_messages_come_and_go_repeat_none_and_miss_none(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """A producer sends and a consumer takes and acks ready messages while the listing pages
    through: no id is listed twice, ids ascend over the pages, and every scheduled message
    (live throughout: no one takes it) is listed once, on both partitions."""
    q = f"hot_list_churn_{int(direct)}"
    with Client(sharded.dsn, direct=direct) as c:
        parts = _partitioned(c, sharded.dsn, q)
        stay = sorted(c.send(q, k, key=k, delay=3600).id for k in _keys_over(parts, 60, f"{q}_"))
        assert {i % STRIDE for i in stay} == set(parts)
        for i in range(40):
            c.send(q, {"warm": i})
    done = threading.Event()
    failures: list[BaseException] = []
    churn = {"sent": 0, "acked": 0}

    def produce() -> None:
        try:
            with Client(sharded.dsn, direct=direct) as pc:
                while not done.is_set():
                    pc.send(q, {"n": churn["sent"]})
                    churn["sent"] += 1
        except BaseException as e:  # reported below
            failures.append(e)

    def consume() -> None:
        try:
            with Client(sharded.dsn, direct=direct) as cc:
                while not done.is_set():
                    got = cc.take(q, 5)
                    if got:
                        churn["acked"] += len(cc.ack(got))
        except BaseException as e:  # reported below
            failures.append(e)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        with Client(sharded.dsn, direct=direct) as c:
            listings = [(s, _pages(c, q, s, 4)) for s in (None, "scheduled", None)]
    finally:
        done.set()
        for t in threads:
            t.join(30)
    assert not failures, failures
    assert churn["sent"] > 0 and churn["acked"] > 0
    for status, pages in listings:
        ids = [i for p in pages for i in p]
        assert len(ids) == len(set(ids)), f"listed twice ({status})"
        assert ids == sorted(ids), f"not in id order ({status})"
        assert all(i in ids for i in stay), f"a message live throughout was missed ({status})"
        if status == "scheduled":
            assert ids == stay


@pytest.mark.parametrize("direct", MODES)
def test_the_dashboard_pages_a_partitioned_queues_messages(sharded, direct: bool) -> None:  # type: ignore[no-untyped-def]
    """The dashboard's messages of a partitioned queue (``/api/queues/<q>/messages``, paged by
    ``after``; the HTML page): every partition's, each once, in id order."""
    web = pytest.importorskip("lonnymq.web")
    testclient = pytest.importorskip("starlette.testclient")
    q = f"hot_list_dash_{int(direct)}"
    with Client(sharded.dsn) as c:
        parts = _partitioned(c, sharded.dsn, q)
        sent = sorted(c.send(q, k, key=k).id for k in _keys_over(parts, 10, f"{q}_"))
    assert {i % STRIDE for i in sent} == set(parts)
    app = (
        web.create_app(token="t0ken", client=AsyncClient(sharded.dsn, direct=True))
        if direct
        else web.create_app(sharded.dsn, token="t0ken")
    )
    with testclient.TestClient(app) as http:
        seen: list[int] = []
        after: int | None = None
        while True:
            got = http.get(
                f"/api/queues/{q}/messages", params={"limit": 4, **({"after": after} if after else {})}
            )
            assert got.status_code == 200, got.text
            seen += [m["id"] for m in got.json()["messages"]]
            after = got.json()["next_after"]
            if after is None:
                break
        assert seen == sent
        assert (
            http.get(f"/api/queues/{q}/messages", params={"status": "ready"}).json()["messages"][0]["id"]
            == sent[0]
        )
        page = http.get(f"/queues/{q}/messages")
        assert page.status_code == 200 and str(sent[0]) in page.text


def test_paging_goes_on_across_a_partitions_move(sharded) -> None:  # type: ignore[no-untyped-def]
    """Pages read before and after partition 0 moves (through the router and with a direct
    client whose map still names the old shard): each message once, in id order (a moved
    message keeps its id)."""
    router, _ = four_shards(sharded, "plist")  # 4 shards: partition 0 has somewhere to go
    q = "plist_moving"
    with Client(router) as c:
        parts = _partitioned(c, router, q)
        sent = sorted(c.send(q, k, key=k, delay=3600).id for k in _keys_over(parts, 24, f"{q}_"))
    assert {i % STRIDE for i in sent} == set(parts)
    target = next(i for i in range(4) if i not in parts)
    with Client(router) as via_router, Client(router, direct=True) as direct:
        listed: dict[str, list[int]] = {"router": [], "direct": []}
        after: dict[str, int | None] = {"router": None, "direct": None}

        def page(name: str, c: Client) -> None:
            got = c.run(c.ops.message_list(q, after_id=after[name], limit=5))
            listed[name] += [m.id for m in got]
            after[name] = got[-1].id if got else after[name]

        for _ in range(2):
            page("router", via_router)
            page("direct", direct)
        shard.move(router, q, target, partition=0)
        for _ in range(5):
            page("router", via_router)
            page("direct", direct)
    assert listed["router"] == listed["direct"] == sent
