"""A wrong password, on a server that asks for one (scram-sha-256): opening a client fails at
once with DatabaseUnavailable naming the user and libpq's reason, not after the client's whole
connect timeout (psycopg's pool retries a failing login until then). Runs on a throwaway
PostgreSQL 15 cluster (tools/pgcluster.py), as tests/cli/test_auth.py does."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lonnymq import AsyncClient, Client, errors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import pgcluster  # tools/ is not a package: found through sys.path above

# The clients below would wait 600 s on the old code: the timeout is the test's failure.
pytestmark = [pytest.mark.once, pytest.mark.timeout(120)]

HBA = """\
local all postgres trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
"""


@pytest.fixture(scope="module")
def alice() -> Iterator[str]:
    """A DSN of role alice with a wrong password."""
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")
    with pgcluster.temporary_cluster({"shared_preload_libraries": "''"}, install=False) as c:
        (c.datadir / "pg_hba.conf").write_text(HBA)
        c.pg_ctl("reload")
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE alice LOGIN PASSWORD {}").format(sql.Literal("right-Horse")))
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
