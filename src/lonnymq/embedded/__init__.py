"""A private PostgreSQL server run from the binaries of the ``pgserver`` wheel: the
``lonnymq[embedded]`` extra: the persistent development server (``lonnymq server start``,
``Client.embedded()``, :func:`dev_server`) and throwaway test servers (:func:`temporary_server`).
Nothing starts a server implicitly: :func:`resolve_dsn` only uses one that is running.

Only the PostgreSQL 16 binaries of ``pgserver`` are used (initdb, pg_ctl, postgres);
its ``PostgresServer``/``get_server`` machinery is deliberately avoided because it
registers global atexit hooks and per-process pid lists.

Guarantees of this package:

* A data directory is initialised at most once, atomically: ``initdb`` runs in a
  sibling staging directory that is renamed into place only after it succeeded, so an
  interrupted initdb never leaves a half-made cluster behind.
* All operations that change a server's state (initdb, start, stop) hold an exclusive
  ``fcntl.flock`` on ``<parent>/.<data_dir name>.lock``, so concurrent processes
  (e.g. two ``lonnymq server start``) never both initdb or start the same
  data directory; the loser finds the server running and reuses it.
* The server is durable: ``fsync`` is on and ``synchronous_commit`` keeps its default
  (on), so a committed transaction survives ``stop("immediate")`` (a simulated crash).
* It is tuned for a laptop: WAL is kept small (``max_wal_size`` 64MB, ``min_wal_size``
  32MB, ``wal_keep_size`` 0), so a bulk load does not leave hundreds of MB behind.
* Authentication is ``trust`` for the superuser ``postgres``; TCP listens on
  127.0.0.1 only.  This is a local development/test server, not a shared one.
* When run as root (PostgreSQL refuses to), the server runs as the unprivileged system
  user ``pgserver`` (created with ``useradd`` if missing, as pgserver itself does).

POSIX only (uses ``fcntl`` and unix sockets).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client.config import configured_dsn
from ..errors import EmbeddedServerError

if TYPE_CHECKING:
    from .server import EmbeddedServer

__all__ = [
    "NOTHING_CONFIGURED",
    "EmbeddedServer",
    "DEV_SERVER",
    "EmbeddedServerError",
    "default_data_dir",
    "dev_server",
    "disk_usage",
    "locate_server",
    "resolve_dsn",
    "running_dev_server_dsn",
    "temporary_server",
]

#: The source :func:`locate_server` reports for the development server.
DEV_SERVER = "the development server"
#: What a tool says when it has no server to connect to (one line).
NOTHING_CONFIGURED = (
    "no PostgreSQL configured: set LONNYMQ_DSN (or DATABASE_URL, or PGHOST/PGDATABASE...) or pass"
    " --dsn; for a local development server run `lonnymq server start`"
)


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
    from .server import EmbeddedServer

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


def dev_server(data_dir: str | os.PathLike[str] | None = None) -> EmbeddedServer:
    """The persistent development server (not started): `data_dir`, else :func:`default_data_dir`."""
    from .server import EmbeddedServer

    return EmbeddedServer(default_data_dir() if data_dir is None else data_dir)


def running_dev_server_dsn(data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The DSN of the development server if it is running, else None. Never starts it, and
    answers None quickly when the embedded extra is not installed."""
    server = dev_server(data_dir)
    if not (server.data_dir / "postmaster.pid").exists():
        return None
    try:
        return server.dsn
    except EmbeddedServerError:  # stale pid file, or pgserver's binaries are gone
        return None


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes used by the files under `path` (0 if it does not exist; unreadable files skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def locate_server(dsn: str | None = None) -> tuple[str, str]:
    """The server a command-line tool connects to, and where that choice came from.

    `dsn` if given; else ``$LONNYMQ_DSN``; else ``$DATABASE_URL``; else libpq's defaults
    (``""``) when a ``PG*`` variable is set; else the development server if it is running
    (``lonnymq server start``). A server is never started here.

    :raises EmbeddedServerError: nothing is configured and no development server is running
        (the message, :data:`NOTHING_CONFIGURED`, says what to do).
    """
    found = configured_dsn(dsn)
    if found is not None:
        return found
    running = running_dev_server_dsn()
    if running is not None:
        return running, DEV_SERVER
    raise EmbeddedServerError(NOTHING_CONFIGURED)


if not TYPE_CHECKING:
    from .. import _lazy_attributes

    # The server's module (its process and host handling) is imported when a server is used:
    # locate_server() with a configured DSN, what every `lonnymq` command calls, needs none of
    # it. The modules the package used to import stay reachable as attributes.
    __getattr__, __dir__ = _lazy_attributes(
        __name__, {"EmbeddedServer": ".server"}, {"server", "_host", "_initdb"}
    )


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN of :func:`locate_server` (configured, else the running development server)."""
    return locate_server(dsn)[0]
