"""Where a client connects when no conninfo is passed: the same chain as other PostgreSQL tools.

1. the conninfo given explicitly (``Client(dsn)``, ``--dsn``);
2. ``$LONNYMQ_DSN``;
3. ``$DATABASE_URL`` (the convention of Heroku, Render, Django and most PaaS);
4. libpq's own defaults: the empty conninfo ``""``, which libpq completes from ``PGHOST``,
   ``PGPORT``, ``PGDATABASE``, ``PGUSER``, ``PGSERVICE``, ``PGPASSFILE``... and finally the
   local unix socket, exactly as ``psql`` does.

The library never starts a server on its own: the embedded development server is used only
when asked for (``Client.embedded()``, ``lonnymq server start``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from .. import errors

#: Environment variables holding a DSN, in the order they are read.
DSN_VARIABLES = ("LONNYMQ_DSN", "DATABASE_URL")
#: libpq environment variables that say "connect with libpq's defaults" (see ``psql``).
LIBPQ_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")
#: Seconds to wait for a connection unless ``$LONNYMQ_CONNECT_TIMEOUT`` says otherwise.
DEFAULT_CONNECT_TIMEOUT = 5.0


def configured_dsn(
    dsn: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """``(dsn, where it came from)`` from `dsn` or the first non-empty DSN variable; ``("",
    "PG* variables")`` when only libpq variables are set; None when nothing is configured."""
    env = os.environ if environ is None else environ
    if dsn is not None:
        return dsn, "--dsn"
    for name in DSN_VARIABLES:
        value = env.get(name)
        if value:
            return value, f"${name}"
    set_vars = [name for name in LIBPQ_VARIABLES if env.get(name)]
    if set_vars:
        return "", "$" + ", $".join(set_vars)
    return None


def resolve_conninfo(dsn: str | None = None) -> str:
    """The conninfo a client uses: `dsn`, else ``$LONNYMQ_DSN``, else ``$DATABASE_URL``, else
    ``""`` (libpq's defaults and ``PG*`` variables, like ``psql``)."""
    found = configured_dsn(dsn)
    return "" if found is None else found[0]


def connect_timeout(value: float | None = None) -> float:
    """Seconds a connection attempt may take: `value`, else ``$LONNYMQ_CONNECT_TIMEOUT``, else 5.

    :raises InvalidArgument: not a positive number.
    """
    raw = str(value) if value is not None else os.environ.get("LONNYMQ_CONNECT_TIMEOUT", "")
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        raise errors.InvalidArgument(f"connect timeout must be a number of seconds, got {raw!r}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise errors.InvalidArgument(f"connect timeout must be positive, got {raw!r}")
    return seconds


def libpq_timeout(seconds: float) -> int:
    """libpq's ``connect_timeout`` is whole seconds, at least 2 (libpq raises 1 to 2)."""
    return max(2, math.ceil(seconds))


#: What a failed connection attempt says when the server answered and turned the login down (a
#: wrong or missing password, an unknown role or database, no pg_hba.conf entry): waiting would
#: not mend it, so opening a client fails at once. libpq's and the server's texts, lower case.
REFUSALS = (
    "password authentication failed",
    "authentication failed for user",
    "no password supplied",
    "no pg_hba.conf entry",
    "does not exist",  # role "x" / database "x"
    "permission denied for database",
)


def refused(e: BaseException) -> bool:
    """Whether a failed connection attempt was turned down by the server (see REFUSALS)."""
    text = str(e).lower()
    return any(s in text for s in REFUSALS)


#: What an error says when the server is down or not yet (or no longer) accepting connections:
#: a restart, a failover, a database container starting beside a worker (which waits for it at
#: start). Other errors (REFUSALS above, a DSN that does not parse) are the configuration's:
#: waiting would not mend them. libpq's and the server's texts, lower case.
UNAVAILABLE = (
    "connection refused",
    "timeout expired",
    "timed out",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "too many clients",
    "connection slots are reserved",
    "server closed the connection unexpectedly",
    "terminating connection due to administrator command",
    "connection reset",
    "broken pipe",
    "no such file or directory",  # the server's Unix socket is gone while it is down
    "could not translate host name",  # a container's name before its DNS entry exists
    "consuming input failed",
    "the connection is lost",
)


def unavailable(e: BaseException) -> bool:
    """Whether ``e`` says the database cannot be reached now (see UNAVAILABLE), as opposed to
    refusing the login for good."""
    import psycopg

    if isinstance(e, (psycopg.errors.AdminShutdown, psycopg.errors.CannotConnectNow)):
        return True
    if not isinstance(e, psycopg.OperationalError):
        return False
    text = str(e).lower()
    return any(s in text for s in UNAVAILABLE)


def location(conninfo: str) -> str:
    """Where ``conninfo`` connects, for messages: ``user@host:port/dbname`` (and its service),
    never the password; libpq's defaults for an empty one. The one place that says it: the
    client's, the CLI's, the shard router's and the Spark data source's messages."""
    import psycopg  # (here: the CLI imports this module before it needs psycopg)
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "a DSN that does not parse"
    if not parts:
        return "libpq's defaults (PG* variables)"
    host = str(parts.get("host") or parts.get("hostaddr") or "local socket")
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    db = f"/{parts['dbname']}" if parts.get("dbname") else ""
    service = f" (service {parts['service']})" if parts.get("service") else ""
    return f"{user}{host}{port}{db}{service}"
