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

from .app import App, Backoff, Defer, GiveUp, Handler, Job, Middleware, Periodic, Retry
from .runtime import Worker, WorkerError
from .schedule import Schedule, parse_schedule

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
