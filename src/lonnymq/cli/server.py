"""``lonnymq server start|stop|status|url|remove``: the local development server.

A PostgreSQL 16 from the ``lonnymq[embedded]`` extra, in ``$LONNYMQ_DATA_DIR`` (default
``~/.local/share/lonnymq/pgdata``), listening on 127.0.0.1 only, trust authentication. It runs
until ``lonnymq server stop``; nothing starts it implicitly. While it runs, ``lonnymq`` commands
use it when no server is configured (``--dsn``, ``LONNYMQ_DSN``, ``DATABASE_URL``, ``PG*``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..embedded import EmbeddedServer, dev_server, disk_usage, running_dev_server_dsn
from . import CommandError, _util, common


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "server",
        help="start/stop the local development PostgreSQL (needs lonnymq[embedded])",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    ss = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, func, what in (
        ("start", start, "start the development server (initialised on first start)"),
        ("stop", stop, "stop it (its data is kept)"),
        ("status", status, "say whether it runs, where, and how much disk it uses (exit 3: stopped)"),
        ("url", url, "print its DSN, e.g. export LONNYMQ_DSN=$(lonnymq server url)"),
        ("remove", remove, "stop it and delete its data directory"),
    ):
        sp = ss.add_parser(name, help=what)
        common(sp)
        sp.add_argument(
            "--data-dir",
            type=Path,
            help="its data directory (default: $LONNYMQ_DATA_DIR, else ~/.local/share/lonnymq/pgdata)",
        )
        if name == "start":
            sp.add_argument("--port", type=int, help="TCP port (default: the last one if free, else any)")
        if name == "remove":
            sp.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        sp.set_defaults(func=func)


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _server(args: argparse.Namespace) -> EmbeddedServer:
    if getattr(args, "port", None) is not None:
        return EmbeddedServer(dev_server(args.data_dir).data_dir, port=args.port)
    return dev_server(args.data_dir)


def _facts(server: EmbeddedServer) -> dict[str, object]:
    dsn = running_dev_server_dsn(server.data_dir)
    used = disk_usage(server.data_dir)
    return {
        "running": dsn is not None,
        "dsn": dsn,
        "data_dir": str(server.data_dir),
        "disk_bytes": used,
        "disk": human_size(used),
        "log": str(server.data_dir / "log" / "server.log"),
    }


def start(args: argparse.Namespace) -> int:
    server = _server(args).start()
    facts = _facts(server)
    if args.json:
        _util.print_json(facts)
        return 0
    print(f"development server running: {server.dsn}")
    print(f"  data: {facts['data_dir']} ({facts['disk']})")
    print("  lonnymq commands use it when no server is configured; for your programs:")
    print("  export LONNYMQ_DSN=$(lonnymq server url)   or   Client.embedded()")
    print("  stop it: lonnymq server stop   delete it: lonnymq server remove")
    return 0


def stop(args: argparse.Namespace) -> int:
    server = _server(args)
    was_running = running_dev_server_dsn(server.data_dir) is not None
    server.stop("fast")
    facts = _facts(server)
    text = "development server stopped" if was_running else "development server was not running"
    if server.data_dir.exists():
        text += (
            f"; its data is kept in {facts['data_dir']} ({facts['disk']}): lonnymq server remove deletes it"
        )
    _util.done(args, text, **facts)
    return 0


def status(args: argparse.Namespace) -> int:
    facts = _facts(_server(args))
    if args.json:
        _util.print_json(facts)
    elif facts["running"]:
        print(f"running: {facts['dsn']}")
        print(f"  data: {facts['data_dir']} ({facts['disk']}), log: {facts['log']}")
    else:
        exists = Path(str(facts["data_dir"])).exists()
        print(
            f"stopped; data: {facts['data_dir']} ({facts['disk']})"
            if exists
            else f"stopped; no data directory yet ({facts['data_dir']}): lonnymq server start"
        )
    return 0 if facts["running"] else 3


def url(args: argparse.Namespace) -> int:
    dsn = running_dev_server_dsn(_server(args).data_dir)
    if dsn is None:
        raise CommandError("the development server is not running: lonnymq server start")
    _util.done(args, dsn, dsn=dsn)
    return 0


def remove(args: argparse.Namespace) -> int:
    server = _server(args)
    if not server.data_dir.exists():
        _util.done(args, f"nothing to remove: {server.data_dir} does not exist", removed_bytes=0)
        return 0
    used = disk_usage(server.data_dir)
    if not _util.confirm(
        args, f"stop the development server and delete {server.data_dir} ({human_size(used)})?"
    ):
        print("nothing deleted")
        return 1
    server.remove()
    _util.done(args, f"deleted {server.data_dir} ({human_size(used)})", removed_bytes=used)
    return 0
