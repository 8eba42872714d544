"""The embedded server itself: :class:`EmbeddedServer`, one PostgreSQL 16 cluster in a data
directory, initialised, started, stopped and connected to."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import shlex
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from ..errors import EmbeddedServerError
from ._host import (
    SUPERUSER,
    Account,
    PidInfo,
    chown,
    file_lock,
    free_port,
    grant_traverse,
    kill_postmaster,
    log_size,
    log_tail,
    looks_like_postgres,
    pg_bin_dir,
    port_is_free,
    read_pid_file,
    run_binary,
    service_account,
    tcp_host,
)
from ._initdb import INITDB_TIMEOUT, initdb

_logger = logging.getLogger(__name__)

_PORT_FILE = "lonnymq.port"
_LOG_DIR = "log"
_LOG_FILE = "server.log"
_LOG_ROTATE_BYTES = 10 * 1024 * 1024
_STOP_MODES = frozenset({"smart", "fast", "immediate"})
_STOP_TIMEOUT = 60.0
# sun_path is 108 bytes on Linux and 104 on macOS (both including the NUL byte).
_SOCKET_PATH_MAX = 103
_SOCKET_NAME_MAX = "/.s.PGSQL.65535"
_START_ATTEMPTS = 3
# precedence over postgresql.conf and ALTER SYSTEM; override them via `settings=`.
_DEFAULT_SETTINGS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "128MB",
    # Durability is the point of a queue: state it explicitly rather than rely on defaults.
    "fsync": "on",
    # Queue tables churn (insert/delete) constantly; vacuum them more often than 1/min.
    "autovacuum_naptime": "10s",
    # A laptop's disk, not a server's: checkpoint early so WAL stays small (the defaults,
    # 1GB/80MB, let one bulk load leave hundreds of MB of WAL behind), keep none for replicas.
    "max_wal_size": "64MB",
    "min_wal_size": "32MB",
    "wal_keep_size": "0",
    "checkpoint_timeout": "5min",
}
_GUC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# pg_ctl pastes -D/-l paths into a /bin/sh command line inside double quotes.
_UNSAFE_PATH_CHARS = frozenset('"$`\\\n')


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
        fsync=on, autovacuum_naptime=10s, max_wal_size=64MB, min_wal_size=32MB,
        wal_keep_size=0, checkpoint_timeout=5min).  ``port`` must be given as `port`.
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

    def _running_info(self) -> PidInfo | None:
        """postmaster.pid contents if a postmaster is alive for this data dir."""
        info = read_pid_file(self.data_dir)
        if info is None:
            return None
        rc, _ = run_binary("pg_ctl", ["status", "-D", str(self.data_dir)], timeout=30)
        return info if rc == 0 else None

    def _adopt(self, info: PidInfo) -> None:
        self._port = info.port
        self._socket_dir = info.socket_dir
        self._tcp_host = tcp_host(info.listen_addr)

    def _wait_ready(self, deadline: float) -> PidInfo:
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

    def _failure(self, what: str, output: str, log_offset: int) -> EmbeddedServerError:
        message = f"{what} (data_dir={self.data_dir})"
        if output.strip():
            message += f"\n--- pg_ctl/initdb output ---\n{output.strip()}"
        message += f"\n--- last lines of {self._log_path} ---\n{log_tail(self._log_path, log_offset)}"
        return EmbeddedServerError(message)

    # ------------------------------------------------------------------ init

    def _prepare_runtime_dirs(self, account: Account | None) -> Path:
        """Create the log and socket directories; returns the socket directory."""
        log_dir = self.data_dir / _LOG_DIR
        log_dir.mkdir(mode=0o700, exist_ok=True)
        chown(log_dir, account)
        # pg_ctl -l appends forever; keep one previous generation.
        if log_size(self._log_path) > _LOG_ROTATE_BYTES:
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
            chown(socket_dir, account)
            socket_dir.chmod(0o700)
        return socket_dir

    def _choose_port(self) -> int:
        if self._requested_port is not None:
            return self._requested_port
        try:
            remembered = int((self.data_dir / _PORT_FILE).read_text().strip())
        except (OSError, ValueError):
            remembered = None
        if remembered is not None and (not self._listen_tcp or port_is_free(remembered)):
            return remembered
        port = free_port()
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
            log_offset = log_size(self._log_path)
            rc, output = run_binary(
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
            new_log = log_tail(self._log_path, log_offset)
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

        :raises EmbeddedServerError: binaries missing (``pip install 'lonnymq[embedded]'``),
            initdb failed, or the server failed/timed out starting; the message then
            contains the last lines of the server log, and the server is not left
            running.
        """
        started = time.monotonic()
        pg_bin_dir()  # fail early and clearly when pgserver is missing
        self._start_timeout = timeout
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self._lock_path, timeout + INITDB_TIMEOUT):
            account = service_account()
            info = read_pid_file(self.data_dir)
            if info is not None and not looks_like_postgres(info.pid):
                # Stale pid file whose pid now belongs to another program (common after
                # a container restart); postgres would refuse to start because of it.
                _logger.warning("removing stale %s/postmaster.pid", self.data_dir)
                (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
            if self._running_info() is not None:
                self._adopt(self._wait_ready(time.monotonic() + timeout))
                return self
            if not (self.data_dir / "PG_VERSION").is_file():
                initdb(self.data_dir, account)
            grant_traverse(self.data_dir, account)
            socket_dir = self._prepare_runtime_dirs(account)
            self._launch(socket_dir, timeout)
            info = read_pid_file(self.data_dir)
            if info is None or info.port is None:
                raise self._failure("server started but postmaster.pid is unreadable", "", 0)
            self._adopt(info)
        _logger.info("started %s in %.2fs", self, time.monotonic() - started)
        return self

    # ------------------------------------------------------------------ stop

    def _stop_locked(self, mode: str) -> None:
        if self._running_info() is None:
            return
        log_offset = log_size(self._log_path)
        rc, output = run_binary(
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
        with file_lock(self._lock_path, _STOP_TIMEOUT + INITDB_TIMEOUT):
            self._stop_locked(mode)

    def remove(self) -> None:
        """Stop the server (fast) and delete its data directory, with everything in it."""
        with file_lock(self._lock_path, _STOP_TIMEOUT + INITDB_TIMEOUT):
            if (self.data_dir / "postmaster.pid").exists():
                self._stop_locked("fast")
            shutil.rmtree(self.data_dir, ignore_errors=True)
            shutil.rmtree(self.data_dir.parent / f".{self.data_dir.name}.initdb", ignore_errors=True)
            if self.data_dir.exists():
                raise EmbeddedServerError(f"could not delete {self.data_dir}")
            # Deleted while held: a waiter that gets the lock of the deleted file sees it gone
            # and locks a new one (file_lock). Deleted after release, a waiter could already
            # hold it while a later start locked the new file: two starts of one directory.
            self._lock_path.unlink(missing_ok=True)
        self._port = None

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
        kill_postmaster(self.data_dir)

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
