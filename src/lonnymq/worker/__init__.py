"""The LonnyMQ worker: run handlers for queued messages, with retries, heartbeats, periodic
messages and Prometheus metrics.

    from lonnymq.worker import App, Worker

    app = App()

    @app.handler("emails")
    def send_email(job):
        deliver(job.payload)

    asyncio.run(Worker(app, "postgresql://...").run())      # or: lonnymq worker mymodule:app

Not imported by ``import lonnymq``; import ``lonnymq.worker`` to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .app import App, Backoff, Defer, GiveUp, Handler, Job, Middleware, Periodic, Retry
from .schedule import Schedule, parse_schedule

if TYPE_CHECKING:
    from .runtime import Worker, WorkerError

__all__ = [
    "App",
    "Backoff",
    "Defer",
    "GiveUp",
    "Handler",
    "Job",
    "Middleware",
    "Periodic",
    "Retry",
    "Schedule",
    "Worker",
    "WorkerError",
    "parse_schedule",
]

# The runtime (the asyncio client, Prometheus meters, heartbeats, the loop) is imported when a
# worker is made: an app's module, or `lonnymq cron ...`, that only declares handlers and
# schedules does not pay for it. The modules the package used to import stay reachable as
# attributes, imported at first use.
_SUBMODULES = {
    "cron",
    "execute",
    "heartbeat",
    "loop",
    "meters",
    "metrics",
    "ops",
    "outage",
    "runtime",
    "settle",
    "state",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in ("Worker", "WorkerError"):
        value: Any = getattr(importlib.import_module(".runtime", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
