"""The pgmq facade through the router: ``shard init`` proxies the ``pgmq`` schema when the
shards have the facade, and the official ``pgmq`` Python client works on the router's DSN."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from shard_helpers import home

from lonnymq.shard import catalog

pytestmark = [pytest.mark.once, pytest.mark.slow]

_SIGNATURES = """
SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
  FROM pg_proc p
 WHERE p.pronamespace = 'pgmq'::regnamespace AND NOT starts_with(p.proname, '_')
 ORDER BY 1, 2
"""


def pgmq_client(dsn: str) -> Any:
    """The official pgmq client (``pgmq.PGMQueue``) on ``dsn`` (skips without it)."""
    pgmq = pytest.importorskip("pgmq")
    info = conninfo_to_dict(dsn)
    return pgmq.PGMQueue(
        host=str(info.get("host", "localhost")),
        port=str(info.get("port", "5432")),
        database=str(info["dbname"]),
        username=str(info.get("user", "postgres")),
        password=str(info.get("password", "")),
        pool_size=2,
        init_extension=False,
    )


def test_every_pgmq_function_has_a_proxy_with_its_signature(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(with_pgmq.shard_dsns[0]) as s, psycopg.connect(with_pgmq.dsn) as r:
        facade = s.execute(_SIGNATURES).fetchall()
        router = r.execute(_SIGNATURES).fetchall()
    assert len(facade) > 40
    assert router == facade


# pgmq 1.x's client warns on every list_queues() call that its result type changed.
@pytest.mark.filterwarnings("ignore:list_queues\\(\\) now returns:UserWarning")
def test_the_pgmq_client_on_the_router(with_pgmq) -> None:  # type: ignore[no-untyped-def]
    q = pgmq_client(with_pgmq.dsn)
    # Two queues, one on each shard.
    names: dict[int, str] = {}
    i = 0
    while len(names) < 2:
        names.setdefault(home(with_pgmq.dsn, f"pgq_{i}"), f"pgq_{i}")
        i += 1
    try:
        for name in names.values():
            q.create_queue(name)
            ids = [q.send(name, {"n": n}) for n in range(3)]
            ids += q.send_batch(name, [{"n": 3}, {"n": 4}])
            assert len(set(ids)) == 5
            m = q.read(name, vt=30)
            assert m.message == {"n": 0}
            assert q.delete(name, m.msg_id)
            m = q.read(name, vt=30)
            assert m.message == {"n": 1}
            assert q.archive(name, m.msg_id)
            popped = q.pop(name)
            assert popped.message == {"n": 2}
            assert q.metrics(name).queue_length == 2
            assert [x.message["n"] for x in q.read_batch(name, vt=30, batch_size=10)] == [3, 4]
        listed = {r.queue_name for r in q.list_queues()}
        assert set(names.values()) <= listed
        assert {m.queue_name for m in q.metrics_all()} >= set(names.values())
        # Each queue is on the shard its name hashes to, read there directly.
        for idx, name in names.items():
            with psycopg.connect(with_pgmq.shard_dsns[idx]) as conn:
                assert conn.execute("SELECT 1 FROM lonnymq.queue WHERE name = %s", (name,)).fetchone()
            with psycopg.connect(with_pgmq.shard_dsns[1 - idx]) as conn:
                assert not conn.execute("SELECT 1 FROM lonnymq.queue WHERE name = %s", (name,)).fetchone()
        for name in names.values():
            assert q.drop_queue(name)
    finally:
        q.pool.close()


def test_a_pgmq_function_without_queue_or_rule_stops_generation() -> None:
    fn = catalog.CoreFunction("mystery", "x integer", "x integer", "bigint", False, "v", False, ("x",), ())
    with pytest.raises(catalog.NoRoute, match="pgmq function mystery"):
        catalog.proxy_statements("pgmq", [fn], core="lonnymq")
