"""Real tests of the embedded PostgreSQL manager: real initdb, real server, no mocks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("pgserver")

import psycopg

from lonnymq.embedded import (
    NOTHING_CONFIGURED,
    EmbeddedServer,
    EmbeddedServerError,
    default_data_dir,
    locate_server,
    resolve_dsn,
    temporary_server,
)
from lonnymq.embedded._host import file_lock
from lonnymq.errors import LonnyMQError

pytestmark = [pytest.mark.once, pytest.mark.timeout(180)]


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Not pytest's tmp_path: pytest re-tightens the mode of its base dir, while the
    # server (run as an unprivileged user under root) must be able to traverse ours.
    root = Path(tempfile.mkdtemp(prefix="lonnymq-test-"))
    servers: list[EmbeddedServer] = []
    yield root
    for data_dir in root.rglob("PG_VERSION"):
        servers.append(EmbeddedServer(data_dir.parent))
    for server in servers:
        server.stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


def _rows(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT id, body FROM t ORDER BY id").fetchall()


def test_committed_row_survives_immediate_stop() -> None:
    with temporary_server() as server:
        dsn = server.dsn
        assert dsn.startswith("postgresql://postgres@127.0.0.1:")
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text)")
            conn.execute("INSERT INTO t VALUES (1, 'durable')")
            conn.commit()
            # Uncommitted work must not survive the crash.
            conn.execute("INSERT INTO t VALUES (2, 'lost')")
            server.stop("immediate")
            conn.close()  # the server is gone: don't let __exit__ try to commit
        assert not server.is_running()
        server.start()
        assert server.is_running()
        assert server.dsn == dsn  # remembered port reused
        assert _rows(server.dsn) == [(1, "durable")]
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
            assert conn.execute("SHOW max_connections").fetchone() == ("200",)
    assert not server.data_dir.exists()


def test_is_running_transitions_and_idempotent_start(workdir: Path) -> None:
    server = EmbeddedServer(workdir / "pgdata")
    assert not server.is_running()
    with pytest.raises(EmbeddedServerError):
        _ = server.dsn  # never started
    server.stop()  # no-op: nothing there yet
    assert server.start() is server
    assert server.is_running()
    with psycopg.connect(server.dsn) as conn:
        started_at = conn.execute("SELECT pg_postmaster_start_time()").fetchone()

    server.start()  # already running: reused, not restarted
    other = EmbeddedServer(workdir / "pgdata").start()  # another handle adopts it
    assert other.dsn == server.dsn
    with psycopg.connect(other.dsn) as conn:
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == started_at

    server.restart()
    assert server.is_running()
    with psycopg.connect(server.dsn) as conn:
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() != started_at

    server.stop("smart")
    assert not server.is_running()
    assert not other.is_running()
    server.stop("fast")  # no-op when stopped
    with pytest.raises(ValueError):
        server.stop("violent")


def test_context_manager_starts_and_stops(workdir: Path) -> None:
    with EmbeddedServer(workdir / "pgdata") as server:
        assert server.is_running()
        with psycopg.connect(server.dsn_for("template1")) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("template1",)
    assert not server.is_running()


def test_bad_setting_reports_server_log(workdir: Path) -> None:
    server = EmbeddedServer(workdir / "pgdata", settings={"shared_buffers": "nonsense"})
    with pytest.raises(EmbeddedServerError) as info:
        server.start(timeout=20)
    message = str(info.value)
    assert isinstance(info.value, LonnyMQError)
    assert 'invalid value for parameter "shared_buffers": "nonsense"' in message
    assert "server.log" in message
    assert not server.is_running()
    # The cluster itself is fine: a good configuration starts it.
    EmbeddedServer(workdir / "pgdata").start()


def test_unix_socket_only_with_long_data_dir(workdir: Path) -> None:
    # Too long for a unix socket path inside the data dir: socket goes under /tmp.
    data_dir = workdir / ("x" * 60) / ("y" * 60) / "pgdata"
    with temporary_server(listen_tcp=False) as short:
        assert "host=" in short.dsn and "127.0.0.1" not in short.dsn
        assert _connect_ok(short.dsn)
    server = EmbeddedServer(data_dir, listen_tcp=False, settings={"application_name": "a b, c"})
    server.start()
    try:
        dsn = server.dsn
        assert dsn.startswith("postgresql://postgres@/postgres?host=%2Ftmp%2Flonnymq-")
        assert _connect_ok(dsn)
        with psycopg.connect(dsn) as conn:
            # Settings survive pg_ctl's /bin/sh with spaces and commas intact.
            assert conn.execute("SHOW application_name").fetchone() == ("a b, c",)
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
    finally:
        server.stop()


def _connect_ok(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1").fetchone() == (1,)


def _unconfigured(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    for name in ("LONNYMQ_DSN", "DATABASE_URL", "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    monkeypatch.setenv("LONNYMQ_DATA_DIR", str(data_dir))


def test_resolve_dsn_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # --dsn, LONNYMQ_DSN, DATABASE_URL, libpq's defaults when a PG* variable is set, and nothing
    # else: no server running in the data dir, so the chain ends in the one-line advice.
    _unconfigured(monkeypatch, tmp_path / "pgdata")
    with pytest.raises(EmbeddedServerError) as e:
        resolve_dsn()
    assert str(e.value) == NOTHING_CONFIGURED and "\n" not in NOTHING_CONFIGURED
    assert "LONNYMQ_DSN" in NOTHING_CONFIGURED and "lonnymq server start" in NOTHING_CONFIGURED
    assert not (tmp_path / "pgdata").exists()  # nothing was started
    monkeypatch.setenv("PGDATABASE", "app")
    assert locate_server() == ("", "$PGDATABASE")
    monkeypatch.setenv("DATABASE_URL", "postgresql://from-url/db")
    assert locate_server() == ("postgresql://from-url/db", "$DATABASE_URL")
    monkeypatch.setenv("LONNYMQ_DSN", "postgresql://from-env/db")
    assert resolve_dsn() == "postgresql://from-env/db"
    explicit = "postgresql://someone:secret@db.example:6543/queue?sslmode=require"
    assert resolve_dsn(explicit) == explicit


def test_client_without_dsn_uses_libpq_defaults_never_a_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lonnymq import Client

    _unconfigured(monkeypatch, tmp_path / "pgdata")
    assert Client().conninfo == ""  # libpq's defaults, like psql
    monkeypatch.setenv("DATABASE_URL", "postgresql://from-url/db")
    assert Client().conninfo == "postgresql://from-url/db"
    monkeypatch.setenv("LONNYMQ_DSN", "postgresql://from-env/db")
    assert Client().conninfo == "postgresql://from-env/db"
    assert not (tmp_path / "pgdata").exists()


def test_dev_server_commands_and_client_embedded(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # lonnymq server start|status|url|stop|remove, the CLI using the running server (and saying
    # so), Client.embedded() on it, and the laptop tuning.
    from lonnymq import Client

    data_dir = workdir / "dev" / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("LONNYMQ_DSN", "DATABASE_URL")}
    env = {k: v for k, v in env.items() if not k.startswith("PG")}
    env["LONNYMQ_DATA_DIR"] = str(data_dir)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lonnymq", *args], env=env, capture_output=True, text=True, timeout=120
        )

    stopped = cli("server", "status")
    assert stopped.returncode == 3 and "no data directory yet" in stopped.stdout
    assert cli("server", "url").returncode == 1
    started = cli("server", "start")
    assert started.returncode == 0, started.stderr
    dsn = cli("server", "url").stdout.strip()
    assert dsn.startswith("postgresql://postgres@127.0.0.1:") and dsn in started.stdout
    status = cli("server", "status", "--json")
    facts = json.loads(status.stdout)
    assert status.returncode == 0 and facts["running"] and facts["dsn"] == dsn and facts["disk_bytes"] > 0
    migrated = cli("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stderr.count("\n") == 1 and "using the development server" in migrated.stderr
    with psycopg.connect(dsn) as conn:
        settings = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name LIKE '%wal_%size'"))
    assert settings["max_wal_size"] == "64" and settings["wal_keep_size"] == "0"  # MB
    monkeypatch.setenv("LONNYMQ_DATA_DIR", str(data_dir))
    with Client.embedded() as c:
        assert c.conninfo == dsn
        assert c.create_queue("jobs")
    stop = cli("server", "stop")
    assert stop.returncode == 0 and "server remove" in stop.stdout and data_dir.exists()
    assert cli("server", "remove").returncode == 2  # no terminal to confirm on
    assert data_dir.exists()
    removed = cli("server", "remove", "--yes")
    assert removed.returncode == 0 and not data_dir.exists()


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONNYMQ_DATA_DIR", "/srv/q/pgdata")
    assert default_data_dir() == Path("/srv/q/pgdata")
    monkeypatch.delenv("LONNYMQ_DATA_DIR")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert default_data_dir() == Path.home() / ".local/share/lonnymq/pgdata"


def test_concurrent_server_start_starts_one_server(workdir: Path) -> None:
    env = dict(os.environ)
    env["LONNYMQ_DATA_DIR"] = str(workdir / "shared" / "pgdata")
    src = _src_dir()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    code = "from lonnymq.embedded import dev_server; print(dev_server().start().dsn)"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err.decode() for _, err in results]
    dsns = {out.decode().strip() for out, _ in results}
    assert len(dsns) == 1
    dsn = dsns.pop()
    assert _connect_ok(dsn)
    log = (workdir / "shared" / "pgdata" / "log" / "server.log").read_text()
    assert log.count("starting PostgreSQL") == 1  # one initdb, one start


def test_remembered_port_taken_picks_another(workdir: Path) -> None:
    server = EmbeddedServer(workdir / "pgdata").start()
    old_dsn = server.dsn
    old_port = int((server.data_dir / "lonnymq.port").read_text())
    server.stop()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", old_port))
        squatter.listen()
        server.start()
        assert server.dsn != old_dsn
        assert _connect_ok(server.dsn)
    server.stop()


def test_stale_pid_file_is_ignored(workdir: Path) -> None:
    server = EmbeddedServer(workdir / "pgdata").start()
    server.stop()
    pid_file = server.data_dir / "postmaster.pid"
    # A postmaster.pid left by a killed server whose pid now belongs to another program.
    with subprocess.Popen(["sleep", "60"]) as squatter:
        try:
            pid_file.write_text(f"{squatter.pid}\n{server.data_dir}\n0\n5432\n\n\n\n")
            server.start()
            assert _connect_ok(server.dsn)
        finally:
            squatter.kill()
    server.stop()


def test_missing_binaries_say_pip_install(workdir: Path) -> None:
    fake = workdir / "fake" / "pgserver"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    src = _src_dir()
    code = (
        "from lonnymq.embedded import EmbeddedServer, EmbeddedServerError\n"
        f"try: EmbeddedServer({str(workdir / 'pgdata')!r}).start()\n"
        "except EmbeddedServerError as e: print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), src]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "pip install 'lonnymq[embedded]'" in out.stdout


def test_no_dsn_and_no_pgserver_is_a_clear_error(workdir: Path) -> None:
    # The embedded server is an extra, never a silent fallback: without pgserver and without a
    # DSN, resolve_dsn raises a typed error saying what to do, and creates no data directory.
    env = {k: v for k, v in os.environ.items() if k not in ("LONNYMQ_DSN", "DATABASE_URL")}
    env = {k: v for k, v in env.items() if not k.startswith("PG")}
    env["LONNYMQ_DATA_DIR"] = str(workdir / "never" / "pgdata")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_src_dir(), env.get("PYTHONPATH")]))
    code = (
        "import sys\n"
        "sys.modules['pgserver'] = None  # as if not installed\n"
        "from lonnymq.embedded import resolve_dsn\n"
        "from lonnymq.errors import EmbeddedServerError\n"
        "try: resolve_dsn()\n"
        "except EmbeddedServerError as e: print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == NOTHING_CONFIGURED
    assert not (workdir / "never").exists()


def test_server_start_without_binaries_says_pip_install(workdir: Path) -> None:
    # A pgserver without its binaries on the path stands in for a missing one in the CLI process.
    fake = workdir / "fake" / "pgserver"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "LONNYMQ_DSN"}
    env["LONNYMQ_DATA_DIR"] = str(workdir / "never" / "pgdata")
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), _src_dir()])
    proc = subprocess.run(
        [sys.executable, "-m", "lonnymq", "server", "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "pip install 'lonnymq[embedded]'" in proc.stderr
    assert not (workdir / "never" / "pgdata").exists()


def _src_dir() -> str:
    """The directory holding the lonnymq package, for subprocesses' PYTHONPATH."""
    import lonnymq

    return str(Path(lonnymq.__file__).resolve().parents[1])


def _open_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    n = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            n += os.readlink(fd) == str(path)
    return n


def test_a_lock_file_deleted_by_its_holder_is_never_held_twice(workdir: Path) -> None:
    """remove() deletes the data directory's lock file: a waiter that then gets the lock of the
    deleted file must not hold it while a newcomer locks the file created after it (they held
    one each: two starts of one data directory at once)."""
    path = workdir / ".pgdata.lock"
    inside, leave = threading.Event(), threading.Event()

    def waiter() -> None:
        with file_lock(path, 120):
            inside.set()
            leave.wait(120)

    t = threading.Thread(target=waiter)
    with file_lock(path, 5):
        t.start()
        while _open_fds(path) < 2:  # the waiter has the file open (a condition, not a pause)
            assert t.is_alive()
            time.sleep(0.01)
        path.unlink()  # as remove() does, holding the lock
    try:
        assert inside.wait(120), "the waiter never got the lock"
        # The waiter holds the lock: a newcomer must wait (and here give up), whatever file
        # the waiter got it on.
        with pytest.raises(EmbeddedServerError, match="timed out"), file_lock(path, 0.3):
            pass
    finally:
        leave.set()
        t.join(120)
