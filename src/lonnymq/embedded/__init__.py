"""A private PostgreSQL server run from the binaries of the ``pgserver`` wheel: the
``lonnymq[embedded]`` extra. Used when no DSN is configured (the CLI's persistent development
server, :func:`resolve_dsn`) and for throwaway test servers (:func:`temporary_server`).

Only the PostgreSQL 16 binaries of ``pgserver`` are used (initdb, pg_ctl, postgres);
its ``PostgresServer``/``get_server`` machinery is deliberately avoided because it
registers global atexit hooks and per-process pid lists.

Guarantees of this package:

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
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import EmbeddedServerError
from .server import EmbeddedServer

__all__ = [
    "EmbeddedServer",
    "EmbeddedServerError",
    "default_data_dir",
    "resolve_dsn",
    "temporary_server",
]


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


def resolve_dsn(dsn: str | None = None, *, env: str = "LONNYMQ_DSN") -> str:
    """The DSN to connect to.

    `dsn` if given (returned untouched); else the non-empty environment variable
    `env`; else the persistent embedded server at :func:`default_data_dir` is started
    (or reused if already running, by this or another process) and its DSN returned.
    The server is left running for later calls.

    :raises EmbeddedServerError: no DSN is configured and the embedded server is not
        installed (``pip install 'lonnymq[embedded]'``), or it failed to start.
    """
    if dsn is not None:
        return dsn
    from_env = os.environ.get(env)
    if from_env:
        return from_env
    return EmbeddedServer(default_data_dir()).start().dsn
