"""The LonnyMQ web dashboard: every queue's counts, throughput, messages, dead letters,
channels, schedules and workers in a browser, with the actions to fix them.

    from lonnymq.web import create_app
    app = create_app("postgresql://...", read_only=True)   # any ASGI server, or mount it

Needs ``pip install 'lonnymq[web]'`` (Starlette, Jinja2, uvicorn); ``lonnymq web`` serves it.
Not imported by ``import lonnymq``. docs/dashboard.md.
"""

from .app import create_app

__all__ = ["create_app"]
