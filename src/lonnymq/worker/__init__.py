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

from typing import TYPE_CHECKING

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

if not TYPE_CHECKING:
    from .. import _lazy_attributes

    # The runtime (the asyncio client, Prometheus meters, heartbeats, the loop) is imported when
    # a worker is made: an app's module, or `lonnymq cron ...`, that only declares handlers and
    # schedules does not pay for it. The modules the package used to import stay reachable as
    # attributes, imported at first use.
    __getattr__, __dir__ = _lazy_attributes(
        __name__,
        {"Worker": ".runtime", "WorkerError": ".runtime"},
        {
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
        },
    )
