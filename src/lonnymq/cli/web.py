"""``lonnymq web``: serve the web dashboard (needs ``pip install 'lonnymq[web]'``).

Every queue's counts, throughput, messages, dead letters, channels, schedules and workers in a
browser, with the actions to fix them. Changes need a token: ``$LONNYMQ_WEB_TOKEN``, else one
is made up and printed at start; ``--read-only`` shows no action at all. docs/dashboard.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys

from . import CommandError, UsageError, _util, common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "web",
        help="serve the web dashboard (needs lonnymq[web])",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    common(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default: 8080)")
    p.add_argument("--read-only", action="store_true", help="show everything, change nothing")
    p.add_argument("--base-path", default="/", help="serve under this path, e.g. /lonnymq (default: /)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be between 0 and 65535")
    if not args.base_path.startswith("/"):
        raise UsageError("--base-path must start with /")
    try:
        import uvicorn

        from ..web import create_app
    except ImportError as e:
        raise CommandError(
            f"the dashboard needs the web extra ({e.name} is missing): pip install 'lonnymq[web]'"
        ) from None
    dsn = _util.resolve(args)
    _util.connect_to(dsn, args).close()  # fail now, in one line, if the server cannot be reached
    _check_listen(args.host, args.port)
    token = os.environ.get("LONNYMQ_WEB_TOKEN") or None
    base = "/" + args.base_path.strip("/")
    url = f"http://{args.host}:{args.port}{'' if base == '/' else base}/"
    if args.read_only:
        print(f"lonnymq web: read-only dashboard at {url}", file=sys.stderr)
    else:
        if token is None:
            token = secrets.token_urlsafe(18)
            print(f"lonnymq web: no LONNYMQ_WEB_TOKEN set; this run's token: {token}", file=sys.stderr)
        print(f"lonnymq web: dashboard at {url} (log in at {url}login to make changes)", file=sys.stderr)
    app = create_app(dsn, schema=_util.schema(args), read_only=args.read_only, token=token, base_path=base)
    uvicorn.run(app, host=args.host, port=args.port, log_level="debug" if args.debug else "warning")
    return 0


def _check_listen(host: str, port: int) -> None:
    """Fail in one line, before announcing the dashboard, if ``host:port`` cannot be listened on
    (a port in use, a host name that does not resolve): uvicorn would print its own error after
    our URL and exit with status 3."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise CommandError(
            f"cannot listen on {host}:{port}: {(e.strerror or str(e)).lower()} (--host)"
        ) from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            reason = (e.strerror or str(e)).lower()
            raise CommandError(f"cannot listen on {host}:{port}: {reason} (choose another --port)") from None
