"""The host side of the embedded server: pgserver's binaries, the unprivileged OS account used
when running as root, ports, ``postmaster.pid``, the lock file, the server log and running a
PostgreSQL program. Functions of one data directory's files; no server state."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import pwd
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import EmbeddedServerError

SUPERUSER = "postgres"
# Same account pgserver uses when run as root, so both tools can share a data dir.
_SYSTEM_USER = "pgserver"
LOG_TAIL_LINES = 40
MISSING_BINARIES = (
    "the embedded PostgreSQL is not installed (it comes from the 'pgserver' package): "
    "set LONNYMQ_DSN or pass --dsn to use your own server, or pip install 'lonnymq[embedded]'"
)


@dataclass(frozen=True)
class Account:
    """The unprivileged OS account the server runs as when we are root."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class PidInfo:
    """The parts of ``postmaster.pid`` we use (it is written incrementally at startup)."""

    pid: int
    port: int | None
    socket_dir: Path | None
    listen_addr: str
    status: str


def pg_bin_dir() -> Path:
    """The directory of pgserver's PostgreSQL programs; raises when pgserver is not installed."""
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
    raise EmbeddedServerError(MISSING_BINARIES)


def service_account() -> Account | None:
    """None when not root; else the unprivileged account, created if missing.

    Looked up on every call, not once per process: should the account be deleted and created
    again meanwhile (with another uid), a server started later runs as the one that exists.
    """
    if os.geteuid() != 0:
        return None
    bin_dir = pg_bin_dir()
    try:
        # Importing pgserver runs its package __init__, whose PostgresServer class body
        # asks platformdirs for a runtime dir and may warn about XDG_RUNTIME_DIR.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver.utils import ensure_user_exists
    except ImportError as exc:
        raise EmbeddedServerError(f"{MISSING_BINARIES} ({exc})") from exc
    try:
        # One useradd at a time on this host: test processes starting together all find the
        # account missing, and useradd run concurrently has been seen to end with the account
        # created twice, the second replacing the first's uid under a server being started.
        with file_lock(Path(tempfile.gettempdir()) / "lonnymq-useradd.lock", 60):
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
    account = Account(_SYSTEM_USER, entry.pw_uid, entry.pw_gid)
    _enable(bin_dir, account)
    return account


@functools.cache
def _enable(bin_dir: Path, account: Account) -> None:
    """Once per account: let it reach and read the binaries, libraries and share files (the wheel
    may be installed root-only, e.g. in a venv under /root)."""
    from pgserver.utils import ensure_folder_permissions

    readable = stat.S_IRGRP | stat.S_IROTH
    executable = stat.S_IXGRP | stat.S_IXOTH
    grant_traverse(bin_dir, account)
    ensure_folder_permissions(bin_dir, readable | executable)
    for sub in ("lib", "share"):
        if (bin_dir.parent / sub).is_dir():
            ensure_folder_permissions(bin_dir.parent / sub, readable)


def grant_traverse(path: Path, account: Account | None) -> None:
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


def chown(path: Path, account: Account | None) -> None:
    if account is not None:
        os.chown(path, account.uid, account.gid)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # postgres binds with SO_REUSEADDR too, so TIME_WAIT leftovers don't count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def read_pid_file(data_dir: Path) -> PidInfo | None:
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
    return PidInfo(
        pid=pid,
        port=int(port_text) if port_text.isdigit() else None,
        socket_dir=Path(socket_dir) if socket_dir else None,
        listen_addr=line(5),
        status=line(7),
    )


def looks_like_postgres(pid: int) -> bool:
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
def file_lock(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block. The holder may
    delete ``path`` before leaving (EmbeddedServer.remove): a waiter that then gets the lock
    of the deleted file lets it go and locks the file at ``path`` again, so two holders never
    hold the locks of two different files at once."""
    deadline = time.monotonic() + timeout
    while True:
        # A fresh open file description per call: flock then also excludes other threads
        # and other EmbeddedServer objects of this process, not only other processes.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
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
            if _same_file(fd, path):
                yield
                return
        finally:
            os.close(fd)  # releases the lock


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one deleted, or replaced, since)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def tcp_host(listen_addr: str) -> str | None:
    """The host to connect to for postmaster.pid's listen address (None: no TCP)."""
    if not listen_addr:
        return None
    if listen_addr in ("*", "0.0.0.0"):
        return "127.0.0.1"
    if listen_addr == "::":
        return "[::1]"
    if ":" in listen_addr:
        return f"[{listen_addr}]"
    return listen_addr


def run_binary(exe: str, args: list[str], *, timeout: float) -> tuple[int, str]:
    """Run a PostgreSQL binary (as the service account when root); (rc, output)."""
    account = service_account()
    env = dict(os.environ)
    env["LC_ALL"] = "C"  # English messages, which we grep for port conflicts
    env.pop("PGDATA", None)
    # Output goes to a file, not a pipe: the daemonised postmaster could otherwise
    # keep a pipe's write end open and make us wait for an EOF that never comes.
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.run(
                [str(pg_bin_dir() / exe), *args],
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


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_tail(path: Path, offset: int) -> str:
    """The last lines of the log written since `offset` (or of the whole log if it shrank)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset if offset < size else 0, size - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return "(no server log)"
    lines = text.splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines) if lines else "(server log is empty)"


def kill_postmaster(data_dir: Path) -> None:
    """Last resort for throwaway servers: SIGQUIT (immediate shutdown), then SIGKILL."""
    info = read_pid_file(data_dir)
    if info is None or not looks_like_postgres(info.pid):
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
