"""A private PostgreSQL server run from the binaries shipped in the ``pgserver`` wheel.

Only the PostgreSQL 16 binaries of ``pgserver`` are used (initdb, pg_ctl, postgres);
its ``PostgresServer``/``get_server`` machinery is deliberately avoided because it
registers global atexit hooks and per-process pid lists.

Guarantees of this module:

* A data directory is initialised at most once, atomically: ``initdb`` runs in a
  sibling staging directory that is renamed into place only after it succeeded, so an
  interrupted initdb never leaves a half-made cluster behind.
* All operations that change a server's state (initdb, start, stop) hold an exclusive
  ``fcntl.flock`` on ``<parent>/.<data_dir name>.lock``, so concurrent processes
  (e.g. two CLIs calling :func:`resolve_dsn`) never both initdb or start the same
  data directory; the loser finds the server running and reuses it.
* The server is durable: ``fsync`` is on and ``synchronous_commit`` keeps its default
  (on), so a committed transaction survives ``stop("immediate")`` (a simulated crash).
* Authentication is ``trust`` for the superuser ``postgres``; TCP listens on
  127.0.0.1 only.  This is a local development/test server, not a shared one.
* When run as root (PostgreSQL refuses to), the server runs as the unprivileged system
  user ``pgserver`` (created with ``useradd`` if missing, as pgserver itself does).

POSIX only (uses ``fcntl`` and unix sockets).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import logging
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from lonnymq.errors import EmbeddedServerError

__all__ = [
    "EmbeddedServer",
    "EmbeddedServerError",
    "default_data_dir",
    "dsn_or_temporary",
    "resolve_dsn",
    "temporary_server",
]

_logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
# Same account pgserver uses when run as root, so both tools can share a data dir.
_SYSTEM_USER = "pgserver"
_PORT_FILE = "lonnymq.port"
_LOG_DIR = "log"
_LOG_FILE = "server.log"
_LOG_TAIL_LINES = 40
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
_STOP_MODES = frozenset({"smart", "fast", "immediate"})
_STOP_TIMEOUT = 60.0
_INITDB_TIMEOUT = 300.0
# sun_path is 108 bytes on Linux and 104 on macOS (both including the NUL byte).
_SOCKET_PATH_MAX = 103
_SOCKET_NAME_MAX = "/.s.PGSQL.65535"
_START_ATTEMPTS = 3
_MISSING_BINARIES = (
    "PostgreSQL binaries not found: the embedded server needs the 'pgserver' package "
    "(pip install pgserver), or pass an explicit DSN / set LONNYMQ_DSN"
)
# Settings for a queue workload on a small machine.  Passed with -c, so they take
# precedence over postgresql.conf and ALTER SYSTEM; override them via `settings=`.
_DEFAULT_SETTINGS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "128MB",
    # Durability is the point of a queue: state it explicitly rather than rely on defaults.
    "fsync": "on",
    # Queue tables churn (insert/delete) constantly; vacuum them more often than 1/min.
    "autovacuum_naptime": "10s",
}
_GUC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# pg_ctl pastes -D/-l paths into a /bin/sh command line inside double quotes.
_UNSAFE_PATH_CHARS = frozenset('"$`\\\n')


@dataclass(frozen=True)
class _Account:
    """The unprivileged OS account the server runs as when we are root."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class _PidInfo:
    """The parts of ``postmaster.pid`` we use (it is written incrementally at startup)."""

    pid: int
    port: int | None
    socket_dir: Path | None
    listen_addr: str
    status: str


def _bin_dir() -> Path:
    # find_spec does not import pgserver: its __init__ pulls in the server machinery.
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            bin_dir = Path(location) / "pginstall" / "bin"
            if all((bin_dir / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
                return bin_dir
    raise EmbeddedServerError(_MISSING_BINARIES)


@functools.cache
def _service_account() -> _Account | None:
    """None when not root; else the unprivileged account, created and enabled once."""
    if os.geteuid() != 0:
        return None
    bin_dir = _bin_dir()
    try:
        # Importing pgserver runs its package __init__, whose PostgresServer class body
        # asks platformdirs for a runtime dir and may warn about XDG_RUNTIME_DIR.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver.utils import ensure_folder_permissions, ensure_user_exists
    except ImportError as exc:
        raise EmbeddedServerError(f"{_MISSING_BINARIES} ({exc})") from exc
    try:
        ensure_user_exists(_SYSTEM_USER)
    except (subprocess.CalledProcessError, OSError) as exc:
        # Another process may have created the user between its check and useradd.
        try:
            pwd.getpwnam(_SYSTEM_USER)
        except KeyError:
            detail = getattr(exc, "stderr", "") or exc
            raise EmbeddedServerError(
                f"running as root, PostgreSQL needs an unprivileged user but "
                f"'useradd {_SYSTEM_USER}' failed: {detail}"
            ) from exc
    entry = pwd.getpwnam(_SYSTEM_USER)
    account = _Account(_SYSTEM_USER, entry.pw_uid, entry.pw_gid)
    # The wheel may be installed root-only (e.g. a venv under /root): let the account
    # traverse to and read/execute the binaries, libraries and share files.
    readable = stat.S_IRGRP | stat.S_IROTH
    executable = stat.S_IXGRP | stat.S_IXOTH
    _grant_traverse(bin_dir, account)
    ensure_folder_permissions(bin_dir, readable | executable)
    for sub in ("lib", "share"):
        if (bin_dir.parent / sub).is_dir():
            ensure_folder_permissions(bin_dir.parent / sub, readable)
    return account


def _grant_traverse(path: Path, account: _Account | None) -> None:
    """Let `account` reach `path` by adding only o+x to ancestors it cannot traverse.

    Narrower than pgserver's ensure_prefix_permissions, which also makes every
    ancestor (e.g. /root) world-readable.
    """
    if account is None:
        return
    for ancestor in path.parents:
        st = ancestor.stat()
        if st.st_uid == account.uid and st.st_mode & stat.S_IXUSR:
            continue
        if st.st_gid == account.gid and st.st_mode & stat.S_IXGRP:
            continue
        if st.st_mode & stat.S_IXOTH:
            continue
        ancestor.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _chown(path: Path, account: _Account | None) -> None:
    if account is not None:
        os.chown(path, account.uid, account.gid)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # postgres binds with SO_REUSEADDR too, so TIME_WAIT leftovers don't count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _read_pid_file(data_dir: Path) -> _PidInfo | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text(errors="replace").splitlines()
    except OSError:
        return None

    def line(index: int) -> str:
        return lines[index].strip() if len(lines) > index else ""

    try:
        pid = int(line(0))
    except ValueError:
        return None  # caught mid-write
    port_text = line(3)
    socket_dir = line(4)
    return _PidInfo(
        pid=pid,
        port=int(port_text) if port_text.isdigit() else None,
        socket_dir=Path(socket_dir) if socket_dir else None,
        listen_addr=line(5),
        status=line(7),
    )


def _looks_like_postgres(pid: int) -> bool:
    """False only when we can tell `pid` is gone or was reused by another program."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith("postgres")
    except OSError:
        return True  # no /proc (e.g. macOS): can't tell, assume it is


@contextlib.contextmanager
def _file_lock(path: Path, timeout: float) -> Iterator[None]:
    # A fresh open file description per call: flock then also excludes other threads
    # and other EmbeddedServer objects of this process, not only other processes.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(
                        f"timed out after {timeout:.0f}s waiting for lock {path} "
                        "(another process is initialising/starting/stopping this server)"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


class EmbeddedServer:
    """A PostgreSQL 16 server owning the data directory `data_dir`.

    Nothing happens until :meth:`start`.  The object holds no resources: several
    objects (or processes) may manage the same data directory, coordinated by a lock
    file next to it, and the server keeps running after the Python process exits
    unless :meth:`stop` is called (or the object is used as a context manager).

    Layout: the cluster lives in `data_dir`; the server log is
    ``data_dir/log/server.log``; the chosen TCP port is remembered in
    ``data_dir/lonnymq.port`` so the DSN stays the same across restarts while that
    port is free; the unix socket is in `data_dir`, or in ``/tmp/lonnymq-<hash>``
    when `data_dir` is too long for a socket path.

    :param port: fixed TCP port (also names the unix socket).  Default: the
        remembered port if free, else a free one chosen by the OS.
    :param listen_tcp: also listen on 127.0.0.1 (the :attr:`dsn` then uses TCP);
        otherwise only the unix socket is used.
    :param settings: extra server settings (``-c name=value``), applied after and
        overriding the built-in defaults (max_connections=200, shared_buffers=128MB,
        fsync=on, autovacuum_naptime=10s).  ``port`` must be given as `port`.
    """

    data_dir: Path

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        listen_tcp: bool = True,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        if _UNSAFE_PATH_CHARS & set(str(self.data_dir)):
            raise ValueError(f"data_dir must not contain any of {sorted(_UNSAFE_PATH_CHARS)!r}")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port out of range: {port}")
        merged = dict(_DEFAULT_SETTINGS)
        for name, value in (settings or {}).items():
            if not _GUC_NAME.match(name):
                raise ValueError(f"invalid setting name: {name!r}")
            if name.lower() == "port":
                raise ValueError("pass the port as EmbeddedServer(port=...), not in settings")
            merged[name] = str(value)
        self._requested_port = port
        self._listen_tcp = listen_tcp
        self._settings = merged
        self._start_timeout = 30.0
        # Connection details of the server last seen running (from postmaster.pid).
        self._port: int | None = None
        self._socket_dir: Path | None = None
        self._tcp_host: str | None = None

    def __repr__(self) -> str:
        return f"EmbeddedServer({str(self.data_dir)!r})"

    # ----------------------------------------------------------------- paths

    @property
    def _lock_path(self) -> Path:
        return self.data_dir.parent / f".{self.data_dir.name}.lock"

    @property
    def _log_path(self) -> Path:
        return self.data_dir / _LOG_DIR / _LOG_FILE

    def _socket_dir_for_start(self) -> Path:
        if len(os.fsencode(self.data_dir)) + len(_SOCKET_NAME_MAX) <= _SOCKET_PATH_MAX:
            return self.data_dir
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
        return Path("/tmp") / f"lonnymq-{digest}"

    # ------------------------------------------------------------ processes

    def _run(self, exe: str, args: list[str], *, timeout: float) -> tuple[int, str]:
        """Run a PostgreSQL binary (as the service account when root); (rc, output)."""
        account = _service_account()
        env = dict(os.environ)
        env["LC_ALL"] = "C"  # English messages, which we grep for port conflicts
        env.pop("PGDATA", None)
        # Output goes to a file, not a pipe: the daemonised postmaster could otherwise
        # keep a pipe's write end open and make us wait for an EOF that never comes.
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.run(
                    [str(_bin_dir() / exe), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    cwd="/",  # the service account may not be able to enter our cwd
                    env=env,
                    user=account.uid if account else None,
                    group=account.gid if account else None,
                    extra_groups=[] if account else None,
                )
                returncode: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                returncode = None
            out.seek(0)
            output = out.read().decode(errors="replace")
        if returncode is None:
            output += f"\n({exe} did not finish within {timeout:.0f}s)"
            returncode = 255
        return returncode, output

    def _running_info(self) -> _PidInfo | None:
        """postmaster.pid contents if a postmaster is alive for this data dir."""
        info = _read_pid_file(self.data_dir)
        if info is None:
            return None
        rc, _ = self._run("pg_ctl", ["status", "-D", str(self.data_dir)], timeout=30)
        return info if rc == 0 else None

    def _adopt(self, info: _PidInfo) -> None:
        self._port = info.port
        self._socket_dir = info.socket_dir
        addr = info.listen_addr
        if not addr:
            self._tcp_host = None
        elif addr in ("*", "0.0.0.0"):
            self._tcp_host = "127.0.0.1"
        elif addr == "::":
            self._tcp_host = "[::1]"
        elif ":" in addr:
            self._tcp_host = f"[{addr}]"
        else:
            self._tcp_host = addr

    def _wait_ready(self, deadline: float) -> _PidInfo:
        """Wait for a running postmaster (perhaps started elsewhere) to accept connections."""
        while True:
            info = self._running_info()
            if info is None:
                raise self._failure("server stopped while waiting for it to be ready", "", 0)
            if info.status == "ready" and info.port is not None:
                return info
            if time.monotonic() >= deadline:
                raise self._failure("timed out waiting for the running server to be ready", "", 0)
            time.sleep(0.1)

    # ------------------------------------------------------------------ logs

    def _log_size(self) -> int:
        try:
            return self._log_path.stat().st_size
        except OSError:
            return 0

    def _log_tail(self, offset: int) -> str:
        try:
            with self._log_path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(offset if offset < size else 0, size - 64 * 1024))
                text = fh.read().decode(errors="replace")
        except OSError:
            return "(no server log)"
        lines = text.splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(lines) if lines else "(server log is empty)"

    def _failure(self, what: str, output: str, log_offset: int) -> EmbeddedServerError:
        message = f"{what} (data_dir={self.data_dir})"
        if output.strip():
            message += f"\n--- pg_ctl/initdb output ---\n{output.strip()}"
        message += f"\n--- last lines of {self._log_path} ---\n{self._log_tail(log_offset)}"
        return EmbeddedServerError(message)

    # ------------------------------------------------------------------ init

    def _initdb(self, account: _Account | None) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedServerError(
                f"{self.data_dir} exists, is not empty and holds no PostgreSQL cluster "
                "(no PG_VERSION); refusing to initialise it"
            )
        staging = self.data_dir.parent / f".{self.data_dir.name}.initdb"
        if staging.exists():
            shutil.rmtree(staging)  # left by an interrupted run; we hold the lock
        target = staging
        existed = self.data_dir.exists()
        if existed:
            try:
                self.data_dir.rmdir()  # replaced atomically by the staging dir below
            except OSError:
                target = self.data_dir  # e.g. a mount point: initdb in place
        target.mkdir(mode=0o700, exist_ok=target == self.data_dir)
        target.chmod(0o700)
        _chown(target, account)
        _grant_traverse(target, account)
        started = time.monotonic()
        rc, output = self._run(
            "initdb",
            [
                "-D",
                str(target),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                # C locale: byte-order sorting, independent of the host's locales.
                "--no-locale",
                "--no-instructions",
            ],
            timeout=_INITDB_TIMEOUT,
        )
        if rc != 0:
            if target == staging:
                shutil.rmtree(staging, ignore_errors=True)
                if existed:
                    self.data_dir.mkdir(exist_ok=True)  # give back the caller's empty dir
            raise EmbeddedServerError(f"initdb failed for {self.data_dir} (exit {rc}):\n{output.strip()}")
        if target == staging:
            os.rename(staging, self.data_dir)
        _logger.info("initdb %s took %.2fs", self.data_dir, time.monotonic() - started)

    def _prepare_runtime_dirs(self, account: _Account | None) -> Path:
        """Create the log and socket directories; returns the socket directory."""
        log_dir = self.data_dir / _LOG_DIR
        log_dir.mkdir(mode=0o700, exist_ok=True)
        _chown(log_dir, account)
        # pg_ctl -l appends forever; keep one previous generation.
        if self._log_size() > _LOG_ROTATE_BYTES:
            os.replace(self._log_path, self._log_path.with_name(_LOG_FILE + ".1"))
        socket_dir = self._socket_dir_for_start()
        if socket_dir != self.data_dir:
            socket_dir.mkdir(mode=0o700, exist_ok=True)
            st = socket_dir.lstat()
            owner = account.uid if account else os.geteuid()
            # /tmp is shared: never use a directory someone else planted there.
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (owner, os.geteuid()):
                raise EmbeddedServerError(
                    f"socket directory {socket_dir} exists but is not a directory owned by us"
                )
            _chown(socket_dir, account)
            socket_dir.chmod(0o700)
        return socket_dir

    def _choose_port(self) -> int:
        if self._requested_port is not None:
            return self._requested_port
        try:
            remembered = int((self.data_dir / _PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            remembered = None
        if remembered is not None and (not self._listen_tcp or _port_is_free(remembered)):
            return remembered
        port = _free_port()
        (self.data_dir / _PORT_FILE).write_text(f"{port}\n")
        return port

    # ----------------------------------------------------------------- start

    def _launch(self, socket_dir: Path, timeout: float) -> None:
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = self._choose_port()
            settings = dict(self._settings)
            settings.setdefault("listen_addresses", "127.0.0.1" if self._listen_tcp else "")
            settings["port"] = str(port)
            # Double quotes keep postgres' list parser from splitting on commas/spaces.
            settings["unix_socket_directories"] = '"' + str(socket_dir).replace('"', '""') + '"'
            # pg_ctl runs postgres through /bin/sh, so each argument is shell-quoted.
            options = " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items())
            log_offset = self._log_size()
            rc, output = self._run(
                "pg_ctl",
                [
                    "start",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self._log_path),
                    "-w",
                    "-t",
                    str(max(1, math.ceil(timeout))),
                    "-o",
                    options,
                ],
                timeout=timeout + 15,
            )
            if rc == 0:
                return
            if self._running_info() is not None:
                # Still starting (e.g. long crash recovery): don't leave a server we
                # reported as failed running behind the caller's back.
                self._stop_locked("immediate")
                raise self._failure(f"server did not become ready within {timeout:.0f}s", output, log_offset)
            new_log = self._log_tail(log_offset)
            port_clash = "could not bind" in new_log or "could not create any TCP/IP" in new_log
            if port_clash and self._requested_port is None and self._listen_tcp and attempt < _START_ATTEMPTS:
                # Someone grabbed the port between our probe and postgres' bind.
                _logger.info("port %d taken while starting %s; retrying", port, self)
                (self.data_dir / _PORT_FILE).unlink(missing_ok=True)
                continue
            raise self._failure("server failed to start", output, log_offset)

    def start(self, timeout: float = 30) -> EmbeddedServer:
        """Make sure the server is running and accepting connections; returns self.

        Runs initdb first if the data directory holds no cluster yet (trust auth,
        UTF8, C locale, superuser ``postgres``).  If the server is already running
        (started by this or any other process) it is reused as is, even if it was
        started with other settings.  `timeout` bounds the wait for the server to
        accept connections; waiting for the lock (another process initialising or
        starting the same data dir) and initdb have their own, larger bounds.

        :raises EmbeddedServerError: binaries missing (``pip install pgserver``),
            initdb failed, or the server failed/timed out starting; the message then
            contains the last lines of the server log, and the server is not left
            running.
        """
        started = time.monotonic()
        _bin_dir()  # fail early and clearly when pgserver is missing
        self._start_timeout = timeout
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(self._lock_path, timeout + _INITDB_TIMEOUT):
            account = _service_account()
            info = _read_pid_file(self.data_dir)
            if info is not None and not _looks_like_postgres(info.pid):
                # Stale pid file whose pid now belongs to another program (common after
                # a container restart); postgres would refuse to start because of it.
                _logger.warning("removing stale %s/postmaster.pid", self.data_dir)
                (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
            if self._running_info() is not None:
                self._adopt(self._wait_ready(time.monotonic() + timeout))
                return self
            if not (self.data_dir / "PG_VERSION").is_file():
                self._initdb(account)
            _grant_traverse(self.data_dir, account)
            socket_dir = self._prepare_runtime_dirs(account)
            self._launch(socket_dir, timeout)
            info = _read_pid_file(self.data_dir)
            if info is None or info.port is None:
                raise self._failure("server started but postmaster.pid is unreadable", "", 0)
            self._adopt(info)
        _logger.info("started %s in %.2fs", self, time.monotonic() - started)
        return self

    # ------------------------------------------------------------------ stop

    def _stop_locked(self, mode: str) -> None:
        if self._running_info() is None:
            return
        log_offset = self._log_size()
        rc, output = self._run(
            "pg_ctl",
            ["stop", "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(int(_STOP_TIMEOUT))],
            timeout=_STOP_TIMEOUT + 15,
        )
        if rc != 0 and self._running_info() is not None:
            raise self._failure(f"pg_ctl stop -m {mode} failed", output, log_offset)
        socket_dir = self._socket_dir_for_start()
        if socket_dir != self.data_dir:
            # Don't litter /tmp; postgres already removed the socket files inside.
            with contextlib.suppress(OSError):
                socket_dir.rmdir()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server and wait until it has exited; no-op if it is not running.

        `mode` is pg_ctl's: ``"smart"`` waits for clients to disconnect, ``"fast"``
        rolls back open transactions and disconnects clients, ``"immediate"`` aborts
        without a shutdown checkpoint, like a crash (recovery runs at next start;
        committed data survives).

        :raises EmbeddedServerError: the server still runs after pg_ctl gave up (60s).
        """
        if mode not in _STOP_MODES:
            raise ValueError(f"mode must be one of {sorted(_STOP_MODES)}, not {mode!r}")
        if not (self.data_dir / "postmaster.pid").exists():
            return
        with _file_lock(self._lock_path, _STOP_TIMEOUT + _INITDB_TIMEOUT):
            self._stop_locked(mode)

    def restart(self) -> None:
        """Stop (fast) and start again, with the timeout of the last :meth:`start`."""
        self.stop("fast")
        self.start(self._start_timeout)

    def is_running(self) -> bool:
        """Whether a postmaster is alive for this data dir (postmaster.pid + pg_ctl status).

        True also while it is still starting up or shutting down.
        """
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        return self._running_info() is not None

    def _kill(self) -> None:
        """Last resort for throwaway servers: SIGQUIT (immediate shutdown), then SIGKILL."""
        info = _read_pid_file(self.data_dir)
        if info is None or not _looks_like_postgres(info.pid):
            return
        for sig, grace in ((signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(info.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                try:
                    os.kill(info.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)

    # ------------------------------------------------------------------- dsn

    @property
    def dsn(self) -> str:
        """libpq URI of the ``postgres`` database (see :meth:`dsn_for`)."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        """libpq URI for database `dbname` as superuser ``postgres`` (no password).

        TCP (``postgresql://postgres@127.0.0.1:PORT/db``) when the server listens on
        TCP and this object was made with ``listen_tcp=True``; otherwise the unix
        socket (``postgresql://postgres@/db?host=SOCKETDIR&port=PORT``).  The value
        is the one last seen running and stays valid across stop/start as long as
        the remembered port is free.

        :raises EmbeddedServerError: the server was never seen running.
        """
        if self._port is None:
            info = self._running_info() if self.data_dir.exists() else None
            if info is None or info.port is None:
                raise EmbeddedServerError(f"{self} is not running; call start() first")
            self._adopt(info)
        database = quote(dbname, safe="")
        if self._listen_tcp and self._tcp_host is not None:
            return f"postgresql://{SUPERUSER}@{self._tcp_host}:{self._port}/{database}"
        if self._socket_dir is None:
            raise EmbeddedServerError(f"{self} listens on neither TCP nor a unix socket")
        host = quote(str(self._socket_dir), safe="")
        return f"postgresql://{SUPERUSER}@/{database}?host={host}&port={self._port}"

    # ------------------------------------------------------- context manager

    def __enter__(self) -> EmbeddedServer:
        """Starts the server (no-op if running)."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stops the server (fast)."""
        self.stop("fast")


def default_data_dir() -> Path:
    """Persistent data directory used by the CLI.

    ``$LONNYMQ_DATA_DIR`` if set, else ``$XDG_DATA_HOME/lonnymq/pgdata`` (when
    XDG_DATA_HOME is an absolute path), else ``~/.local/share/lonnymq/pgdata``.
    """
    explicit = os.environ.get("LONNYMQ_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "lonnymq" / "pgdata"


@contextlib.contextmanager
def temporary_server(**kw: Any) -> Iterator[EmbeddedServer]:
    """A started throwaway server in a fresh temporary directory (for tests).

    Keyword arguments go to :class:`EmbeddedServer`.  On exit the server is stopped
    with ``immediate`` (killed if that fails) and all its files are deleted.
    """
    root = Path(tempfile.mkdtemp(prefix="lonnymq-pg-"))
    server = EmbeddedServer(root / "pgdata", **kw)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop("immediate")
        except EmbeddedServerError:
            server._kill()
        finally:
            socket_dir = server._socket_dir_for_start()
            if socket_dir != server.data_dir:
                shutil.rmtree(socket_dir, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def dsn_or_temporary(dsn: str | None) -> Iterator[str]:
    """``dsn`` if given; otherwise the DSN of a throwaway embedded server that lives for the
    ``with`` block (what benchmark scripts run on by default)."""
    if dsn:
        yield dsn
        return
    with temporary_server() as srv:
        yield srv.dsn


def resolve_dsn(dsn: str | None = None, *, env: str = "LONNYMQ_DSN") -> str:
    """The DSN to connect to.

    `dsn` if given (returned untouched); else the non-empty environment variable
    `env`; else the persistent embedded server at :func:`default_data_dir` is started
    (or reused if already running, by this or another process) and its DSN returned.
    The server is left running for later calls.
    """
    if dsn is not None:
        return dsn
    from_env = os.environ.get(env)
    if from_env:
        return from_env
    return EmbeddedServer(default_data_dir()).start().dsn
