"""A wrong password, on a server that asks for one (scram-sha-256): opening a client fails at
once with DatabaseUnavailable naming the user and libpq's reason, not after the client's whole
connect timeout (psycopg's pool retries a failing login until then). Runs on a throwaway
PostgreSQL 15 cluster (tools/pgcluster.py), as tests/cli/test_auth.py does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from psycopg.conninfo import make_conninfo

from auth_helpers import scram_cluster
from lonnymq import AsyncClient, Client, errors

# The clients below would wait 600 s on the old code: the timeout is the test's failure.
pytestmark = [pytest.mark.once, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def alice() -> Iterator[str]:
    """A DSN of role alice with a wrong password."""
    with scram_cluster("right-Horse") as c:
        yield make_conninfo(c.dsn, user="alice", password="wrong-Staple")


def test_a_wrong_password_fails_at_once(alice: str) -> None:
    with pytest.raises(errors.DatabaseUnavailable) as got:
        Client(alice, connect_timeout=600).open()
    text = str(got.value)
    assert 'password authentication failed for user "alice"' in text
    assert text.startswith("cannot connect to PostgreSQL at alice@127.0.0.1:") and "wrong-Staple" not in text


def test_a_wrong_password_fails_at_once_async_first_call(alice: str) -> None:
    async def main() -> None:
        c = AsyncClient(alice, connect_timeout=600)
        with pytest.raises(errors.DatabaseUnavailable, match="password authentication failed"):
            await c.list_queues()
        await c.close()

    asyncio.run(main())
