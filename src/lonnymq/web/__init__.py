"""The LonnyMQ web dashboard: every queue's counts, throughput, messages, dead letters,
channels, schedules and workers in a browser, with the actions to fix them.

    from lonnymq.web import create_app
    app = create_app("postgresql://...", read_only=True)   # any ASGI server, or mount it

Needs ``pip install 'lonnymq[web]'`` (Starlette, Jinja2, uvicorn); ``lonnymq web`` serves it.
Not imported by ``import lonnymq``. docs/dashboard.md.
"""

#: The modules of the web extra (pyproject.toml) and what they import.
_WEB_MODULES = ("starlette", "jinja2", "markupsafe", "uvicorn", "multipart", "python_multipart")

try:
    from .app import create_app
except ModuleNotFoundError as e:  # the web extra is missing: say which extra, not only the module
    if e.name is None or e.name.split(".")[0] not in _WEB_MODULES:
        raise
    from ..errors import MissingExtra

    raise MissingExtra.of(e, "web", "lonnymq.web (the dashboard)") from e

__all__ = ["create_app"]
