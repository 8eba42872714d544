"""The clients run each statement rendered to bytes once per statement and connection encoding
(ops.rendered): two schemas, or two client encodings, never share a rendering."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from lonnymq import Client
from lonnymq.client.ops import Statements, rendered


def test_each_schema_has_its_own_rendering(conn: psycopg.Connection[Any]) -> None:
    a, b = Statements("rend_a"), Statements("rend_b")
    assert rendered(a.take, conn).startswith(b'SELECT * FROM "rend_a".take(')
    assert rendered(b.take, conn).startswith(b'SELECT * FROM "rend_b".take(')
    assert rendered(a.take, conn) == a.take.as_bytes(conn)  # again, from the cache


def test_each_encoding_has_its_own_rendering(dsn: str) -> None:
    query = sql.SQL("SELECT {}::text").format(sql.SQL("'h\u00e9'"))
    with (
        psycopg.connect(dsn, autocommit=True) as utf8,
        psycopg.connect(dsn, autocommit=True, client_encoding="LATIN1") as latin1,
    ):
        assert rendered(query, utf8) == "SELECT 'h\u00e9'::text".encode()
        assert rendered(query, latin1) == "SELECT 'h\u00e9'::text".encode("latin-1")
        for c in (utf8, latin1, utf8):
            assert c.execute(rendered(query, c)).fetchone() == ("h\u00e9",)
        # A change of encoding in a session renders again.
        utf8.execute("SET client_encoding TO 'LATIN1'")
        assert rendered(query, utf8) == "SELECT 'h\u00e9'::text".encode("latin-1")


def test_client_on_a_latin1_connection(dsn: str, schema: str) -> None:
    """A client's calls on a connection of another client encoding: non-ASCII text round-trips."""
    with psycopg.connect(dsn, autocommit=True, client_encoding="LATIN1") as latin1:
        c = Client(latin1, schema=schema)
        c.create_queue("enc")
        c.send("enc", "h\u00e9", kind="k\u00e9")
        (m,) = c.take("enc", 1)
        assert (m.payload, m.kind) == ("h\u00e9", "k\u00e9")
        assert c.ack(m) == {m.id}
