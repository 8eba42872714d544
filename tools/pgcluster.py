"""A throwaway PostgreSQL 15 cluster from Debian's binaries, with plpgsql_check preloaded.

Used by ``tools/sqlcheck.py`` (the plpgsql_check lint and the SQL coverage run).  The cluster lives
in a temporary directory owned by the ``postgres`` OS user (PostgreSQL refuses to run as root), listens
on a free loopback port and a unix socket inside that directory, trusts every local connection, and has
a superuser ``postgres`` and a database ``test``.  Durability is off: it is thrown away at the end.

    with temporary_cluster() as cluster:
        print(cluster.dsn)   # postgresql://postgres@127.0.0.1:<port>/test

The fault tests also stop, start and restart a cluster (``Cluster.stop``/``start``/``restart``) and
give it a streaming standby (:func:`temporary_standby`, promoted with ``Cluster.promote``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
from psycopg import sql

PG_MAJOR = 15
BINDIR = Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin")
PLPGSQL_CHECK_PACKAGE = f"postgresql-{PG_MAJOR}-plpgsql-check"
PLPGSQL_CHECK_CONTROL = Path(f"/usr/share/postgresql/{PG_MAJOR}/extension/plpgsql_check.control")
SUPERUSER = "postgres"
DATABASE = "test"
OS_USER = "postgres"

# A small throwaway server: no durability, enough connections for the worker tests (the embedded
# server also allows 200), plpgsql_check preloaded so its profiler can keep profiles in shared memory.
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "shared_buffers": "128MB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_preload_libraries": "'plpgsql,plpgsql_check'",
    "log_min_messages": "warning",
    "log_statement": "none",
}


class ClusterError(RuntimeError):
    """The cluster could not be set up (missing binaries or package, initdb/pg_ctl failure)."""


def ensure_plpgsql_check() -> None:
    """Install Debian's plpgsql_check for PostgreSQL 15 if it is missing (needs root and apt-get)."""
    if not (BINDIR / "initdb").exists():
        raise ClusterError(
            f"PostgreSQL {PG_MAJOR} binaries not found in {BINDIR}: install postgresql-{PG_MAJOR}"
        )
    if PLPGSQL_CHECK_CONTROL.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ClusterError(
            f"plpgsql_check is not installed for PostgreSQL {PG_MAJOR}: run as root "
            f"`apt-get update && apt-get install -y {PLPGSQL_CHECK_PACKAGE}`"
        )
    print(f"pgcluster: installing {PLPGSQL_CHECK_PACKAGE}", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", PLPGSQL_CHECK_PACKAGE],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    if not PLPGSQL_CHECK_CONTROL.exists():
        raise ClusterError(f"{PLPGSQL_CHECK_PACKAGE} installed but {PLPGSQL_CHECK_CONTROL} is missing")


PLPROXY_PACKAGE = f"postgresql-{PG_MAJOR}-plproxy"
PLPROXY_CONTROL = Path(f"/usr/share/postgresql/{PG_MAJOR}/extension/plproxy.control")


def ensure_plproxy() -> None:
    """Install Debian's PL/Proxy for PostgreSQL 15 if it is missing (needs root and apt-get):
    the shard router's functions are written in it (lonnymq.shard, docs/sharding.md)."""
    ensure_package(PLPROXY_PACKAGE, PLPROXY_CONTROL)


def ensure_package(package: str, control: Path) -> None:
    """Install the Debian ``package`` unless ``control`` (a file it ships) exists."""
    if not (BINDIR / "initdb").exists():
        raise ClusterError(
            f"PostgreSQL {PG_MAJOR} binaries not found in {BINDIR}: install postgresql-{PG_MAJOR}"
        )
    if control.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ClusterError(
            f"{package} is not installed: run as root `apt-get update && apt-get install -y {package}`"
        )
    print(f"pgcluster: installing {package}", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", package], check=True, env=env, stdout=subprocess.DEVNULL
    )
    if not control.exists():
        raise ClusterError(f"{package} installed but {control} is missing")


def free_port() -> int:
    """A loopback TCP port that is free right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Cluster:
    directory: Path
    port: int

    @property
    def datadir(self) -> Path:
        return self.directory / "data"

    @property
    def logfile(self) -> Path:
        return self.directory / "server.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def admin_dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl -D <datadir> -w <args>`` as the server's OS user."""
        _run(
            [
                str(BINDIR / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-w",
                "-t",
                str(int(timeout)),
                *args,
            ],
            f"pg_ctl {' '.join(args)}",
        )

    def start(self) -> None:
        self.pg_ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """``mode``: smart, fast, or immediate (a crash: recovery from WAL at the next start)."""
        self.pg_ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "restart")

    def promote(self) -> None:
        """Promote a standby to a primary (it leaves recovery and accepts writes)."""
        self.pg_ctl("promote")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def _as_server_user(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: drop to the postgres OS user when we are root.
    if os.geteuid() == 0:
        return ["runuser", "-u", OS_USER, "--", *argv]
    return argv


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(_as_server_user(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{what} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def _start_on_a_free_port(cluster: Cluster, tries: int = 5) -> Cluster:
    """Start ``cluster`` (its postgresql.conf already names its port). free_port() finds a port
    free when it looks, and another process (a test's server, a JVM) may bind it before the
    server does: then the server stops with "Address already in use", and it is started again
    on another free port (a later ``port`` line in postgresql.conf wins). Returns the cluster
    with the port it runs on."""
    for attempt in range(tries):
        seen = cluster.logfile.stat().st_size if cluster.logfile.exists() else 0
        try:
            cluster.start()
            return cluster
        except ClusterError:
            with cluster.logfile.open("rb") as f:
                f.seek(seen)
                taken = b"Address already in use" in f.read()
            if not taken or attempt == tries - 1:
                raise
        cluster = replace(cluster, port=free_port())
        with (cluster.datadir / "postgresql.conf").open("a") as f:
            f.write(f"port = {cluster.port}  # the port before was taken when the server bound it\n")
    raise AssertionError("unreachable")


@contextmanager
def temporary_cluster(
    settings: Mapping[str, str] | None = None, *, install: bool = True, keep: bool = False
) -> Iterator[Cluster]:
    """Start a fresh PostgreSQL 15 cluster; stop it and delete its directory on exit.

    ``settings`` are extra postgresql.conf lines (values written as-is, so quote strings:
    ``{"plpgsql_check.profiler": "on"}``).  With ``keep`` the directory survives (for debugging).
    """
    if install:
        ensure_plpgsql_check()
    directory = Path(tempfile.mkdtemp(prefix="lonnymq-pg15-"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam(OS_USER)
        os.chown(directory, pw.pw_uid, pw.pw_gid)
    cluster = Cluster(directory=directory, port=free_port())
    started = False
    try:
        _run(
            [
                str(BINDIR / "initdb"),
                "-D",
                str(cluster.datadir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            "initdb",
        )
        conf = {
            **BASE_SETTINGS,
            "port": str(cluster.port),
            "unix_socket_directories": f"'{directory}'",
            **(settings or {}),
        }
        with (cluster.datadir / "postgresql.conf").open("a") as f:
            f.write("\n# lonnymq tools/pgcluster.py\n")
            for name, value in conf.items():
                f.write(f"{name} = {value}\n")
        cluster = _start_on_a_free_port(cluster)
        started = True
        with psycopg.connect(cluster.admin_dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        yield cluster
    except ClusterError as e:
        raise ClusterError(f"{e}\n--- server log ---\n{cluster.log_tail()}") from None
    finally:
        if started:
            subprocess.run(
                _as_server_user(
                    [str(BINDIR / "pg_ctl"), "-D", str(cluster.datadir), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
            )
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def temporary_standby(primary: Cluster, settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A streaming standby of ``primary`` (``pg_basebackup -R``: it follows the primary's WAL),
    on a port of its own; stopped and deleted on exit. Give the primary
    ``synchronous_standby_names = '*'`` (and ``synchronous_commit = on``) for synchronous
    replication: a commit then returns only once the standby has it."""
    directory = Path(tempfile.mkdtemp(prefix="lonnymq-pg15-standby-"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam(OS_USER)
        os.chown(directory, pw.pw_uid, pw.pw_gid)
    standby = Cluster(directory=directory, port=free_port())
    started = False
    try:
        _run(
            [
                str(BINDIR / "pg_basebackup"),
                "-D",
                str(standby.datadir),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                SUPERUSER,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            "pg_basebackup",
        )
        # The copied postgresql.conf names the primary's port and socket directory: later lines win.
        conf = {"port": str(standby.port), "unix_socket_directories": f"'{directory}'", **(settings or {})}
        with (standby.datadir / "postgresql.conf").open("a") as f:
            f.write("\n# lonnymq tools/pgcluster.py: standby\n")
            for name, value in conf.items():
                f.write(f"{name} = {value}\n")
        standby = _start_on_a_free_port(standby)
        started = True
        yield standby
    except ClusterError as e:
        raise ClusterError(f"{e}\n--- standby log ---\n{standby.log_tail()}") from None
    finally:
        if started:
            subprocess.run(
                _as_server_user(
                    [str(BINDIR / "pg_ctl"), "-D", str(standby.datadir), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
            )
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    """`python tools/pgcluster.py`: start a cluster, print its DSN, keep it until Ctrl-C."""
    import time

    with temporary_cluster() as cluster:
        print(cluster.dsn, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
