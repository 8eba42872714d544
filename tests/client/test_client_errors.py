"""A client that cannot reach its database, and one used after close(): typed lonnymq errors at
once or within the client's own timeout, naming where and libpq's reason. Before, opening raised
psycopg_pool's ``PoolTimeout("pool initialization incomplete after 30.0 sec")`` (a refused
login too, after the whole wait), and a call on a closed client retried for 30 s."""

from __future__ import annotations

import asyncio
import pickle
import socket

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from lonnymq import AsyncClient, Client, errors

# A refusal must not wait: the clients below would wait 600 s for a server that is down.
pytestmark = pytest.mark.timeout(60)


def closed_port() -> int:
    """A port nothing listens on (just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_open_on_a_closed_port_names_where_and_why() -> None:
    port = closed_port()
    dsn = f"postgresql://clienterrors_u:clienterrors_secret@127.0.0.1:{port}/clienterrors_db"
    with pytest.raises(errors.DatabaseUnavailable) as got:
        Client(dsn, connect_timeout=1).open()
    e = got.value
    text = str(e)
    assert f"clienterrors_u@127.0.0.1:{port}/clienterrors_db" in text and e.where in text
    assert "connection refused" in text.lower() and "clienterrors_secret" not in text
    assert "\n" not in text and not e.may_have_committed
    # What existing code catches: ConnectionLost, psycopg.OperationalError.
    assert isinstance(e, errors.ConnectionLost) and isinstance(e, psycopg.OperationalError)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is errors.DatabaseUnavailable and again.where == e.where


@pytest.mark.parametrize("lazy", [False, True], ids=["open", "first-call"])
def test_a_refused_login_fails_at_once(dsn: str, lazy: bool) -> None:
    nobody = make_conninfo(dsn, user="clienterrors_nobody")
    c = Client(nobody, connect_timeout=600)
    with pytest.raises(errors.DatabaseUnavailable) as got:
        if lazy:
            c.list_queues()
        else:
            c.open()
    assert 'role "clienterrors_nobody" does not exist' in str(got.value)
    assert str(got.value).startswith("cannot connect to PostgreSQL at clienterrors_nobody@")


def test_an_unknown_database_fails_at_once_async(dsn: str) -> None:
    missing = make_conninfo(dsn, dbname="clienterrors_missing")

    async def main() -> None:
        c = AsyncClient(missing, connect_timeout=600)
        with pytest.raises(
            errors.DatabaseUnavailable, match='database "clienterrors_missing" does not exist'
        ):
            async with c:
                pass
        # Nothing was left open, and trying again tries again (same answer).
        with pytest.raises(errors.DatabaseUnavailable):
            await c.open()
        await c.close()

    asyncio.run(main())


def test_a_call_on_a_closed_client_fails_at_once(dsn: str, schema: str) -> None:
    c = Client(dsn, schema=schema)
    c.create_queue("q")
    c.close()
    with pytest.raises(errors.ClientClosed, match="the client is closed"):
        c.send("q", {"n": 1})
    with pytest.raises(errors.ClientClosed):
        c.list_queues()
    with pytest.raises(errors.ClientClosed):
        c.open()


def test_a_call_on_a_closed_async_client_fails_at_once(dsn: str, schema: str) -> None:
    async def main() -> None:
        async with AsyncClient(dsn, schema=schema) as c:
            await c.create_queue("q")
        with pytest.raises(errors.ClientClosed):
            await c.take("q")
        with pytest.raises(errors.ClientClosed):
            async with c.connection():
                pass

    asyncio.run(main())
