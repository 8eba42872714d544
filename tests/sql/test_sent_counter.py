"""Sends are counted once (migration 0015): queue_stat's sent is queue_metrics' total_sent, and
the upgrade keeps every queue's total_sent, including what sent_count counted before queue_stat
existed (0010)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from core_helpers import drop_schema, fresh_schema_name
from lonnymq import Client


@pytest.fixture
def new_schema(dsn: str) -> Iterator[str]:
    name = fresh_schema_name()
    yield name
    drop_schema(dsn, name)


def test_0015_keeps_total_sent_and_drops_sent_count(dsn: str, new_schema: str) -> None:
    s = sql.Identifier(new_schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        client = Client(conn, schema=new_schema)
        client.migrate(target=14, conn=conn)
        # Only the tables at 14 (the functions come with the full migrate): queue rows as
        # queue_create wrote them.
        ids = dict(
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.queue (name) VALUES ('old'), ('new'), ('idle') RETURNING name, id"
                ).format(s)
            ).fetchall()
        )
        # What 0014's functions left: "old" had 7 sends before 0010 (sent_count only) and 3
        # since (both counters), "new" 5 since 0010 (both), "idle" nothing.
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.sent_count (queue_id, n) VALUES (%(o)s, 7), (%(o)s, 1), (%(o)s, 2), (%(n)s, 5)"
            ).format(s),
            {"o": ids["old"], "n": ids["new"]},
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.queue_stat (queue_id, minute, sent, acked)"
                " VALUES (%(o)s, 29000000, 1, 0), (%(o)s, 29000001, 2, 1), (%(n)s, 29000001, 5, 0)"
            ).format(s),
            {"o": ids["old"], "n": ids["new"]},
        )
        client.migrate(conn=conn)
        assert conn.execute("SELECT to_regclass(%s)", (f"{new_schema}.sent_count",)).fetchone() == (None,)
        assert [client.metrics(n, conn=conn).total_sent for n in ("old", "new", "idle")] == [10, 5, 0]
        totals = {t.queue: t.sent for t in client.run(client.ops.stats_totals(), conn)}
        assert totals == {"old": 10, "new": 5, "idle": 0}
        # The per-minute counters are as they were: the moved history is in minute 0.
        window = client.ops.stats_minutes(since=29000000 * 60000, until=29000002 * 60000)
        got = [(m.queue, m.minute_at, m.sent, m.acked) for m in client.run(window, conn)]
        assert got == [
            ("new", 29000001 * 60000, 5, 0),
            ("old", 29000000 * 60000, 1, 0),
            ("old", 29000001 * 60000, 2, 1),
        ]
        client.send("old", b"x", conn=conn)
        assert client.metrics("old", conn=conn).total_sent == 11


def test_a_send_writes_one_counter_row(client: Client, dsn: str, schema: str) -> None:
    """The message and one queue_stat row: nothing else counts a send."""
    client.create_queue("q")
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(before,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}.queue_stat").format(s)).fetchall()
        client.send("q", b"x")
        client.send_batch("q", [b"a", b"b"])
        [(after,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}.queue_stat").format(s)).fetchall()
    assert after - before == 2
    assert client.metrics("q").total_sent == 3
