"""``lonnymq worker MODULE:ATTR`` and ``lonnymq cron list|add|remove|pause|resume``.

The worker command is the only place that installs signal handlers: the first SIGTERM/SIGINT
starts a graceful shutdown (stop fetching, let running handlers finish within
``--shutdown-timeout``, then cancel them and release their leases), a second one skips the wait.
The previous handlers are restored when the worker has stopped. Exit status: 0 after a clean
shutdown, 1 if the worker stopped because one of its tasks failed or the server could not be
reached (within ``--startup-timeout``, or it refused the worker), 2 on a usage error (e.g.
MODULE:ATTR that is not an App).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib
import inspect
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from .. import errors
from . import CommandError, UsageError, _util, common

_log = logging.getLogger("lonnymq.worker")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run the message handlers of an App",
        description="Run the handlers of the lonnymq.worker.App found at MODULE:ATTR (the module"
        " is imported with the current directory on sys.path). SIGTERM/SIGINT: graceful shutdown;"
        " a second signal: stop without waiting for handlers.",
    )
    common(p)
    p.add_argument("app", metavar="MODULE:ATTR", help="the App (or a function returning one), e.g. tasks:app")
    p.add_argument("-c", "--concurrency", type=int, default=8, help="handlers running at once (default 8)")
    p.add_argument("-q", "--queues", nargs="+", metavar="QUEUE", help="serve only these queues")
    p.add_argument("--batch-size", type=int, help="most messages per fetch (default: concurrency)")
    p.add_argument("--lease", type=float, help="lease seconds (default: each queue's own)")
    p.add_argument(
        "--poll-interval", type=float, default=5.0, help="fetch at least this often without NOTIFY (s)"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running handlers get to finish on shutdown (default 30)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=60.0,
        help="seconds to wait at start for a database that cannot be reached yet, e.g. restarting"
        " (default 60; 0: fail at once)",
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint binds (default 127.0.0.1: this host only; 0.0.0.0: every interface)",
    )
    p.add_argument("--no-cron", action="store_true", help="do not send periodic messages from this worker")
    p.add_argument(
        "--log-level",
        default=os.environ.get("LONNYMQ_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    p.add_argument(
        "--log-format",
        default=os.environ.get("LONNYMQ_LOG_FORMAT", "text"),
        choices=["text", "json"],
        help="json: one JSON object per line, with the traceback of failures (default text)",
    )
    p.set_defaults(func=run)

    c = sub.add_parser("cron", help="list and manage periodic messages")
    cs = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = cs.add_parser("list", help="list periodic messages with their last and next tick")
    common(ls, json=True)
    ls.set_defaults(func=cron_list)
    add = cs.add_parser("add", help="declare (or update) a periodic message")
    common(add)
    add.add_argument("name")
    add.add_argument(
        "schedule",
        help="cron expression ('*/5 * * * *'), @hourly, or '@every 30s'; cron expressions and macros run"
        " in UTC unless prefixed 'CRON_TZ=<IANA zone> ' (e.g. 'CRON_TZ=Europe/Paris 0 8 * * mon') or"
        " given --timezone",
    )
    add.add_argument(
        "--timezone",
        metavar="ZONE",
        help="IANA time zone of a cron expression or macro, e.g. Europe/Paris (default UTC;"
        " same as the CRON_TZ= prefix)",
    )
    add.add_argument("--queue", required=True)
    add.add_argument("--payload", default="null", help="JSON payload (plain text if not JSON)")
    add.add_argument("--kind")
    add.add_argument("--priority", type=int, default=0)
    add.add_argument(
        "--misfire-grace", type=float, default=60.0, help="seconds a late tick is still sent (default 60)"
    )
    add.set_defaults(func=cron_add)
    for name, fn, what in (
        ("remove", cron_remove, "delete"),
        ("pause", cron_pause, "stop sending"),
        ("resume", cron_resume, "resume sending"),
    ):
        sp = cs.add_parser(name, help=f"{what} a periodic message")
        common(sp)
        sp.add_argument("name")
        sp.set_defaults(func=fn)


def load_app(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted) and return the App it names; a function is
    called to build one."""
    from ..worker import App

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise errors.InvalidArgument(f"expected MODULE:ATTR, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise errors.InvalidArgument(f"cannot import {module_name!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise errors.InvalidArgument(f"{module_name!r} has no attribute {attr!r}") from None
    if inspect.isfunction(obj):  # a factory; classes and other callables are not called
        obj = obj()
    if not isinstance(obj, App):
        raise errors.InvalidArgument(f"{spec} is a {type(obj).__name__}, not a lonnymq.worker.App")
    return obj


def run(args: argparse.Namespace) -> int:
    import psycopg

    from ..worker import Worker

    try:
        app = load_app(args.app)
    except errors.InvalidArgument as e:
        raise UsageError(str(e)) from e
    dsn = _util.resolve(args)
    handler = logging.StreamHandler()
    if args.log_format == "json":
        from ..worker.logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler])
    worker = Worker(
        app,
        dsn,
        schema=_util.schema(args),
        queues=args.queues,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        lease=args.lease,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        startup_timeout=args.startup_timeout,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        cron=not args.no_cron,
    )
    try:
        return asyncio.run(_serve(worker))
    except errors.MetricsServerError as e:
        hint = "--metrics-port" if e.errno == errno.EADDRINUSE else "--metrics-host"
        raise CommandError(f"{e} (choose another {hint})") from e
    except psycopg.OperationalError as e:  # at start: refused, or unreachable for --startup-timeout
        reason = " ".join(str(e).split())
        if isinstance(e, errors.DatabaseUnavailable):  # the client's own: it names where already
            raise CommandError(reason) from e
        raise CommandError(f"cannot connect to {_util.where(dsn)}: {reason}") from e


async def _serve(worker: Any) -> int:
    from ..worker import WorkerError

    loop = asyncio.get_running_loop()
    received = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal received
        received += 1
        if received == 1:
            _log.info("%s: shutting down (again to skip waiting for running handlers)", sig.name)
            worker.request_stop()
        else:
            _log.warning("%s: stopping now, releasing the leases of running handlers", sig.name)
            worker.request_stop(hard=True)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await worker.run()
    except WorkerError as e:
        _log.critical("worker failed: %s", e)
        return 1
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
    return 0


# -- cron ----------------------------------------------------------------------------------------


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def cron_list(args: argparse.Namespace) -> int:
    from ..worker.ops import worker_ops

    with _util.client(args) as c:
        rows = c.run(worker_ops(c.schema).cron_list())
    out = []
    for r in rows:
        out.append(
            {
                "name": r.name,
                "schedule": r.schedule,
                "queue": r.queue,
                "kind": r.kind,
                "enabled": r.enabled,
                "source": r.source,
                "last_tick": _iso(r.last_tick_ms),
                "next_tick": _iso(r.next_tick_ms()) if r.enabled else None,
                "last_message_id": r.last_message_id,
            }
        )
    _util.emit(
        args,
        out,
        [
            "name",
            "schedule",
            "queue",
            "kind",
            "enabled",
            "source",
            "last_tick",
            "next_tick",
            "last_message_id",
        ],
        title="periodic messages",
    )
    return 0


def cron_add(args: argparse.Namespace) -> int:
    from ..worker import parse_schedule
    from ..worker.ops import worker_ops

    try:
        sched = parse_schedule(args.schedule, args.timezone)
    except errors.InvalidArgument as e:
        raise UsageError(str(e)) from e
    with _util.client(args) as c:
        op = worker_ops(c.schema).cron_upsert(
            args.name,
            sched.text,
            args.queue,
            _util.parse_payload(args.payload),
            kind=args.kind,
            priority=args.priority,
            misfire_grace=args.misfire_grace,
            source="cli",
        )
        outcome = c.run(op)
    _util.done(
        args,
        f"periodic message {args.name!r} {outcome}: {sched.text} -> {args.queue}",
        name=args.name,
        outcome=outcome,
    )
    return 0


def _cron_change(args: argparse.Namespace, what: str, op: Any) -> int:
    with _util.client(args) as c:
        found = c.run(op(c.schema))
    if not found:
        print(f"lonnymq: no periodic message named {args.name!r}", file=sys.stderr)
        return 1
    _util.done(args, f"periodic message {args.name!r} {what}", name=args.name, outcome=what)
    return 0


def cron_remove(args: argparse.Namespace) -> int:
    from ..worker.ops import worker_ops

    return _cron_change(args, "removed", lambda s: worker_ops(s).cron_delete(args.name))


def cron_pause(args: argparse.Namespace) -> int:
    from ..worker.ops import worker_ops

    return _cron_change(args, "paused", lambda s: worker_ops(s).cron_set_enabled(args.name, False))


def cron_resume(args: argparse.Namespace) -> int:
    from ..worker.ops import worker_ops

    return _cron_change(args, "resumed", lambda s: worker_ops(s).cron_set_enabled(args.name, True))
