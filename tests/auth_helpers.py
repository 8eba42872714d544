"""A throwaway PostgreSQL 15 cluster (tools/pgcluster.py) that asks every login but the
superuser's for a password (scram-sha-256), with a role ``alice``: the CLI's and the client's
tests of wrong and missing passwords (tests/cli/test_auth.py, tests/client/test_client_errors_auth.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pgcluster  # tools/ is not a package: found through sys.path above

# The superuser keeps trust (the tests set things up with it); everyone else needs a password.
HBA = """\
local all postgres trust
host all postgres 127.0.0.1/32 trust
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
"""


@contextlib.contextmanager
def scram_cluster(alice_password: str) -> Iterator[pgcluster.Cluster]:
    """The cluster, with role alice whose password is ``alice_password``; skips the test
    without Debian's PostgreSQL 15 binaries or root."""
    if not (pgcluster.BINDIR / "initdb").exists():
        pytest.skip(f"PostgreSQL {pgcluster.PG_MAJOR} binaries not found in {pgcluster.BINDIR}")
    if os.geteuid() != 0:
        pytest.skip("needs root to run PostgreSQL as the postgres OS user")
    with pgcluster.temporary_cluster({"shared_preload_libraries": "''"}, install=False) as c:
        (c.datadir / "pg_hba.conf").write_text(HBA)
        c.pg_ctl("reload")
        with psycopg.connect(c.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE alice LOGIN PASSWORD {}").format(sql.Literal(alice_password)))
        yield c
