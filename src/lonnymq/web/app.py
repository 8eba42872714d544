"""The dashboard as an ASGI application (Starlette): server-rendered pages and a JSON API over
the same data (queries.py), with the mutations guarded by security.py."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import quote, unquote

import jinja2
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import errors
from ..client import AsyncClient
from ..client.config import resolve_conninfo
from ..client.ops import check_queue
from ..migrations import DEFAULT_SCHEMA
from ..models import ArchiveStatus, MessageStatus
from . import queries
from .charts import chart
from .security import (
    AUTH_COOKIE,
    CSRF_COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    Authorize,
    Guard,
    csrf_ok,
    new_csrf,
)

FLASH_COOKIE = "lonnymq_flash"
#: The largest request body a mutation reads (a form or JSON object of a few hundred ids).
MAX_BODY = 256 * 1024
#: On every response of the dashboard: only its own scripts and styles, never in a frame.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none';"
    " form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
#: Seconds between the overview's refreshes.
REFRESH_SECONDS = 5


class Params:
    """A mutation's arguments, from a form or a JSON object alike."""

    def __init__(self, values: dict[str, list[str]]) -> None:
        self.values = values

    def get(self, name: str) -> str | None:
        v = self.values.get(name)
        return v[0] if v else None

    def getlist(self, name: str) -> list[str]:
        return self.values.get(name, [])


Action = Callable[[Request, AsyncClient, Params], Awaitable[tuple[str, dict[str, Any], str]]]


def create_app(
    dsn: str | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    read_only: bool = False,
    token: str | None = None,
    authorize: Authorize | None = None,
    base_path: str = "/",
    client: AsyncClient | None = None,
    pool_size: int = 4,
    refresh_seconds: float = REFRESH_SECONDS,
    overview_cap: int = queries.OVERVIEW_CAP,
    queue_cap: int = queries.QUEUE_CAP,
) -> Starlette:
    """The dashboard's ASGI app for the LonnyMQ schema ``schema`` of ``dsn`` (default: like every
    client, ``$LONNYMQ_DSN``, ``$DATABASE_URL``, libpq's ``PG*``), or of an existing ``client``.

    ``read_only``: no page shows a button that changes anything, and every mutation is refused
    (403). Otherwise a change needs the ``token`` (default ``$LONNYMQ_WEB_TOKEN``; the API takes
    it as ``Authorization: Bearer``, browsers log in once) or, when the dashboard is mounted in
    another application, that application's ``authorize(request)`` returning True; with
    neither, every mutation is refused. ``base_path``: serve under this prefix (not needed
    when mounted: the mount's own prefix is used). The connection pool (``pool_size``) is
    opened on the first request and closed with the app's lifespan. ``refresh_seconds``: how
    often the live pages (overview, queue, workers) refresh themselves. ``overview_cap`` and
    ``queue_cap``: the counts by state stop there on the overview and on a queue's page (shown
    as "1,000+"): each page then reads a bounded number of index entries however big the
    queue."""
    for what, cap in (("overview_cap", overview_cap), ("queue_cap", queue_cap)):
        if not 1 <= cap <= 100_000:
            raise errors.InvalidArgument(f"{what} must be between 1 and 100000, got {cap!r}")
    if token is None:
        token = os.environ.get("LONNYMQ_WEB_TOKEN") or None
    guard = Guard(read_only=read_only, token=token, authorize=authorize)
    dash = _Dashboard(dsn, schema, client, pool_size, guard)
    dash.refresh = refresh_seconds
    dash.overview_cap, dash.queue_cap = overview_cap, queue_cap
    routes = dash.routes()
    base = "/" + base_path.strip("/")
    if base != "/":
        routes = [Mount(base, routes=routes), Route("/", _redirect_to(base + "/"))]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await dash.close()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(_SecurityHeaders)],
        exception_handlers={
            HTTPException: dash.http_error,
            errors.LonnyMQError: dash.lonnymq_error,
            psycopg.Error: dash.database_error,
            Exception: dash.internal_error,
        },
    )
    app.state.lonnymq_dashboard = dash
    return app


def reader_conninfo(dsn: str | None = None) -> str:
    """The conninfo of the dashboard's own connections: ``dsn`` (default: like every client)
    with sequential scans (and JIT) off for its sessions. Its reads are index ranges and capped counts;
    left to itself the planner may still pick a sequential scan that stops after a LIMIT's
    worth of rows (e.g. a capped count on a queue holding most of the table), which is fast
    only while those rows happen to come first in the table: on a big table it reads millions
    of rows. Tables without a usable index (the small ones) are still scanned."""
    params = conninfo_to_dict(resolve_conninfo(dsn))
    options = str(params.get("options") or "")
    # jit off too: the penalty enable_seqscan=off puts on the plans of tiny tables (a sequence,
    # the queue table) would push their cost over jit_above_cost, and compiling costs ms.
    params["options"] = (options + " -c enable_seqscan=off -c jit=off").strip()
    return make_conninfo("", **params)


class _SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP response the dashboard sends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _redirect_to(target: str) -> Callable[[Request], Awaitable[Response]]:
    async def go(request: Request) -> Response:
        return RedirectResponse(_root(request) + target, status_code=307)

    return go


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("lonnymq.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["ms_time"] = _ms_time
    env.filters["age"] = _age
    env.filters["urlq"] = lambda s: quote(str(s), safe="")
    env.globals["chart"] = chart
    return Jinja2Templates(env=env)


def _ms_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = max(0, int(ms) // 1000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _is_api(request: Request) -> bool:
    return request.url.path.removeprefix(_root(request)).startswith(("/api/", "/healthz"))


# -- argument parsing: anything malformed is a 400 --------------------------------------------


def _bad(detail: str) -> HTTPException:
    return HTTPException(400, detail)


def _int(text: str | None, what: str, lo: int, hi: int) -> int | None:
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise _bad(f"{what} must be an integer, got {text[:40]!r}") from None
    if not lo <= value <= hi:
        raise _bad(f"{what} must be between {lo} and {hi}, got {value}")
    return value


def _limit(request: Request, default: int = queries.DEFAULT_PAGE) -> int:
    v = _int(request.query_params.get("limit"), "limit", 1, queries.MAX_PAGE)
    return default if v is None else v


def _after_id(request: Request) -> int | None:
    return _int(request.query_params.get("after"), "after", 0, 2**63 - 1)


def _message_id(text: str) -> int:
    v = _int(text, "message id", 1, 2**63 - 1)
    if v is None:
        raise _bad("a message id is required")
    return v


def _queue(request: Request) -> str:
    name = request.path_params["queue"]
    try:
        return check_queue(name)
    except errors.InvalidQueueName as e:
        raise HTTPException(404, f"no queue {name[:80]!r}: {e}") from None


def _status(text: str | None, allowed: Sequence[str]) -> str | None:
    if text is None or text in ("", "all"):
        return None
    if text not in allowed:
        raise _bad(f"status must be one of {', '.join(allowed)}, got {text[:40]!r}")
    return text


def _confirmed(params: Params, expected: str) -> None:
    if params.get("confirm") != expected:
        raise _bad(f"type the name {expected!r} in the confirm field to do this")


def _when(params: Params) -> int:
    """Epoch ms from ``at`` (ISO 8601, UTC unless it says otherwise; or epoch ms) or ``delay``
    (seconds from now)."""
    at, delay = params.get("at"), params.get("delay")
    if at:
        if at.isdigit():
            ms = int(at)
        else:
            try:
                when = datetime.fromisoformat(at.strip().replace("Z", "+00:00"))
            except ValueError:
                raise _bad(f"at must be an ISO 8601 time or epoch ms, got {at[:40]!r}") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            ms = round(when.timestamp() * 1000)
        if not 0 <= ms <= 2**53:
            raise _bad("at is out of range")
        return ms
    seconds = _seconds(delay, "delay")
    if seconds is None:
        raise _bad("give at (a time) or delay (seconds from now)")
    return queries.now_ms() + round(seconds * 1000)


def _seconds(text: str | None, what: str) -> float | None:
    if text is None or text.strip() == "":
        return None
    try:
        v = float(text)
    except ValueError:
        raise _bad(f"{what} must be a number of seconds, got {text[:40]!r}") from None
    if not 0 <= v <= 10**9:
        raise _bad(f"{what} must be between 0 and 1e9 seconds")
    return v


class _Dashboard:
    def __init__(
        self, dsn: str | None, schema: str, client: AsyncClient | None, pool_size: int, guard: Guard
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.guard = guard
        self._client = client
        self._owns_client = client is None
        self._lock = asyncio.Lock()
        self.templates = _templates()
        self.refresh: float = REFRESH_SECONDS
        self.overview_cap = queries.OVERVIEW_CAP
        self.queue_cap = queries.QUEUE_CAP

    async def client(self) -> AsyncClient:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._client = AsyncClient(
                        reader_conninfo(self.dsn), schema=self.schema, pool_size=self.pool_size
                    )
        return self._client

    async def close(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.close()
            self._client = None

    # -- routes ----------------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        page, api, act = self._page, self._api, self._action
        r: list[BaseRoute] = [
            Route("/", page(self.overview_page)),
            Route("/queues/{queue}", page(self.queue_page)),
            Route("/queues/{queue}/messages", page(self.messages_page)),
            Route("/queues/{queue}/messages/{id}", page(self.message_page)),
            Route("/queues/{queue}/dead", page(self.dead_page)),
            Route("/queues/{queue}/archive", page(self.archive_page)),
            Route("/queues/{queue}/channels", page(self.channels_page)),
            Route("/cron", page(self.cron_page)),
            Route("/workers", page(self.workers_page)),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/healthz", self.healthz),
            Route("/api/queues", api(self.api_queues)),
            Route("/api/queues/{queue}", api(self.api_queue)),
            Route("/api/queues/{queue}/messages", api(self.api_messages)),
            Route("/api/queues/{queue}/messages/{id}", api(self.api_message)),
            Route("/api/queues/{queue}/dead", api(self.api_dead)),
            Route("/api/queues/{queue}/archive", api(self.api_archive)),
            Route("/api/queues/{queue}/channels", api(self.api_channels)),
            Route("/api/cron", api(self.api_cron)),
            Route("/api/workers", api(self.api_workers)),
            Mount("/static", StaticFiles(packages=[("lonnymq.web", "static")]), name="static"),
        ]
        actions: list[tuple[str, Action]] = [
            ("/queues/{queue}/purge", self.purge_queue),
            ("/queues/{queue}/pause", self.pause_queue),
            ("/queues/{queue}/resume", self.resume_queue),
            ("/queues/{queue}/messages/{id}/cancel", self.cancel_message),
            ("/queues/{queue}/messages/{id}/reschedule", self.reschedule_message),
            ("/queues/{queue}/dead/requeue", self.requeue_dead),
            ("/queues/{queue}/dead/purge", self.purge_dead),
            ("/queues/{queue}/channels", self.edit_channel),
            ("/cron/{name}/enable", self.cron_enable),
            ("/cron/{name}/disable", self.cron_disable),
        ]
        for path, action in actions:
            r.append(Route(path, act(action), methods=["POST"]))
            r.append(Route("/api" + path, act(action), methods=["POST"]))
        return r

    def _page(
        self, handler: Callable[[Request, AsyncClient], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await handler(request, await self.client())

        return endpoint

    def _api(
        self, handler: Callable[[Request, AsyncClient], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return JSONResponse(await handler(request, await self.client()))

        return endpoint

    def _action(self, action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            api = _is_api(request)
            if self.guard.read_only:
                raise HTTPException(403, "the dashboard is read-only: changes are refused")
            params = await _params(request)
            if self.guard.bearer(request):
                pass  # a bearer token is never sent by a browser on its own: no CSRF risk
            else:
                if not await self.guard.may_write(request):
                    raise HTTPException(
                        403,
                        "changes need the dashboard's token (Authorization: Bearer <token>, or log in)"
                        if self.guard.token
                        else "changes are disabled: start the dashboard with a token (LONNYMQ_WEB_TOKEN)",
                    )
                submitted = request.headers.get(CSRF_HEADER) or params.get(CSRF_FIELD)
                if not csrf_ok(request, submitted):
                    raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
            done, data, back = await action(request, await self.client(), params)
            if api:
                return JSONResponse({"ok": True, "done": done, **data})
            response = RedirectResponse(self._next(request, params, back), status_code=303)
            response.set_cookie(
                FLASH_COOKIE, quote(done), max_age=60, path=_cookie_path(request), samesite="strict"
            )
            return response

        return endpoint

    @staticmethod
    def _next(request: Request, params: Params, default: str) -> str:
        root = _root(request)
        nxt = params.get("next")
        # Only a path of this dashboard: never an open redirect.
        if nxt and nxt.startswith("/") and not nxt.startswith("//") and "\\" not in nxt:
            return root + nxt
        return root + default

    # -- rendering -------------------------------------------------------------------------

    async def render(
        self, request: Request, template: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        csrf = request.cookies.get(CSRF_COOKIE)
        fresh = not csrf
        if fresh:
            csrf = new_csrf()
        flash = request.cookies.get(FLASH_COOKIE)
        may_write = await self.guard.may_write(request)
        ctx = {
            "base": _root(request),
            "path": request.url.path.removeprefix(_root(request)),
            "read_only": self.guard.read_only,
            "can_write": may_write,
            "can_log_in": self.guard.can_log_in and not self.guard.cookie_session(request),
            "logged_in": self.guard.cookie_session(request),
            "csrf": csrf,
            "flash": unquote(flash) if flash else None,
            "refresh": None,
            # The query string a "next page" link keeps (filters, page size), "after" aside.
            "keep": "".join(
                f"&{quote(k)}={quote(v)}" for k, v in request.query_params.multi_items() if k != "after"
            ),
            **context,
        }
        response = self.templates.TemplateResponse(request, template, ctx, status_code=status_code)
        path = _cookie_path(request)
        if fresh:
            response.set_cookie(CSRF_COOKIE, cast(str, csrf), path=path, httponly=True, samesite="strict")
        if flash:
            response.delete_cookie(FLASH_COOKIE, path=path)
        response.headers["cache-control"] = "no-store"
        return response

    # -- error pages -----------------------------------------------------------------------

    async def _error(self, request: Request, status: int, detail: str) -> Response:
        accept = request.headers.get("accept", "")
        if _is_api(request) or ("application/json" in accept and "text/html" not in accept):
            return JSONResponse({"error": detail, "status": status}, status_code=status)
        try:
            return await self.render(request, "error.html", {"status": status, "detail": detail}, status)
        except Exception:  # the page itself failed: plain text, still no traceback
            return Response(f"{status}: {detail}", status_code=status, media_type="text/plain")

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return await self._error(request, exc.status_code, exc.detail)

    async def lonnymq_error(self, request: Request, exc: Exception) -> Response:
        status = 400
        if isinstance(exc, errors.QueueNotFound):
            status = 404
        elif isinstance(exc, errors.PermissionDenied):
            status = 403
        elif isinstance(
            exc,
            (
                errors.QueueInUse,
                errors.DuplicateKey,
                errors.ChannelFull,
                errors.LeaseLost,
                queries.NotReschedulable,
            ),
        ):
            status = 409
        elif isinstance(exc, (errors.NotInstalled, errors.ConnectionLost, errors.ShardUnavailable)):
            status = 503
        return await self._error(request, status, " ".join(str(exc).split()))

    async def database_error(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, psycopg.OperationalError):
            return await self._error(request, 503, "the database cannot be reached")
        return await self._error(request, 500, f"database error ({type(exc).__name__})")

    async def internal_error(self, request: Request, exc: Exception) -> Response:
        return await self._error(request, 500, "internal error (details in the server log)")

    # -- pages -----------------------------------------------------------------------------

    async def overview_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_queues(request, c)
        return await self.render(request, "overview.html", {**data, "refresh": self.refresh})

    async def queue_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_queue(request, c)
        return await self.render(request, "queue.html", {**data, "refresh": self.refresh})

    async def messages_page(self, request: Request, c: AsyncClient) -> Response:
        queue = _queue(request)
        qp = request.query_params
        notice = None
        if qp.get("id") or qp.get("key"):
            mid = _message_id(qp["id"]) if qp.get("id") else None
            key = None if mid is not None else qp.get("key")
            found = await c.get(queue, id=mid, key=key)
            if found is not None:
                return RedirectResponse(
                    f"{_root(request)}/queues/{queue}/messages/{found.id}",
                    status_code=303,
                )
            notice = f"no live message with {'id ' + str(mid) if mid is not None else 'key ' + repr(key)}"
        data = await self.api_messages(request, c)
        return await self.render(
            request, "messages.html", {**data, "notice": notice, "search_key": qp.get("key") or ""}
        )

    async def message_page(self, request: Request, c: AsyncClient) -> Response:
        queue = _queue(request)
        m = await queries.message_one(c, queue, id=_message_id(request.path_params["id"]), key=None)
        if m is None:
            raise HTTPException(404, f"no live message {request.path_params['id']} in queue {queue!r}")
        return await self.render(request, "message.html", {"queue": queue, "m": m})

    async def dead_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_dead(request, c)
        return await self.render(request, "dead.html", data)

    async def archive_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_archive(request, c)
        return await self.render(request, "archive.html", data)

    async def channels_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_channels(request, c)
        return await self.render(request, "channels.html", data)

    async def cron_page(self, request: Request, c: AsyncClient) -> Response:
        return await self.render(request, "cron.html", await self.api_cron(request, c))

    async def workers_page(self, request: Request, c: AsyncClient) -> Response:
        data = await self.api_workers(request, c)
        return await self.render(request, "workers.html", {**data, "refresh": self.refresh})

    async def login_page(self, request: Request) -> Response:
        if not self.guard.can_log_in:
            raise HTTPException(
                404, "there is nothing to log in to: the dashboard has no token or is read-only"
            )
        return await self.render(request, "login.html", {"error": None})

    async def login(self, request: Request) -> Response:
        if not self.guard.can_log_in:
            raise HTTPException(
                404, "there is nothing to log in to: the dashboard has no token or is read-only"
            )
        params = await _params(request)
        if not csrf_ok(request, params.get(CSRF_FIELD)):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
        if not self.guard.check_token(params.get("token") or ""):
            return await self.render(request, "login.html", {"error": "wrong token"}, status_code=403)
        response = RedirectResponse(_root(request) + "/", status_code=303)
        response.set_cookie(
            AUTH_COOKIE,
            self.guard.session_value(),
            path=_cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        params = await _params(request)
        if not csrf_ok(request, params.get(CSRF_FIELD)):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
        response = RedirectResponse(_root(request) + "/", status_code=303)
        response.delete_cookie(AUTH_COOKIE, path=_cookie_path(request))
        return response

    async def healthz(self, request: Request) -> Response:
        c = await self.client()
        await c.list_queues(limit=1)
        return JSONResponse({"status": "ok"})

    # -- API (each page's data) --------------------------------------------------------------

    async def api_queues(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        if after is not None:
            after = after[:80]
        return await queries.queue_rows(
            c,
            after=after,
            limit=_limit(request, queries.OVERVIEW_PAGE),
            cap=self.overview_cap,
            parallel=self.pool_size,
        )

    async def api_queue(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        return {"queue": _queue(request), **await queries.queue_page(c, _queue(request), cap=self.queue_cap)}

    async def api_messages(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        queue = _queue(request)
        qp = request.query_params
        if qp.get("key"):
            m = await queries.message_one(c, queue, id=None, key=qp["key"][:512])
            return {"queue": queue, "messages": [] if m is None else [m], "next_after": None}
        status = _status(qp.get("status"), ("ready", "scheduled", "leased"))
        return await queries.message_rows(
            c,
            queue,
            status=cast(MessageStatus | None, status),
            after=_after_id(request),
            limit=_limit(request),
        )

    async def api_message(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        queue = _queue(request)
        m = await queries.message_one(c, queue, id=_message_id(request.path_params["id"]), key=None)
        if m is None:
            raise HTTPException(404, f"no live message {request.path_params['id']} in queue {queue!r}")
        return m

    async def api_dead(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        return await queries.dead_rows(c, _queue(request), after=_after_id(request), limit=_limit(request))

    async def api_archive(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        status = _status(request.query_params.get("status"), ("acked", "dead", "cancelled"))
        return await queries.archive_rows(
            c,
            _queue(request),
            status=cast(ArchiveStatus | None, status),
            after=_after_id(request),
            limit=_limit(request),
        )

    async def api_channels(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        return await queries.channel_rows(
            c, _queue(request), after=None if after is None else after[:512], limit=_limit(request)
        )

    async def api_cron(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        return await queries.cron_rows(c)

    async def api_workers(self, request: Request, c: AsyncClient) -> dict[str, Any]:
        return await queries.worker_rows(c)

    # -- mutations: (what was done, data for the API, the page to go back to) ----------------

    async def purge_queue(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        _confirmed(p, queue)
        await c.purge_queue(queue)
        return f"purged queue {queue}", {}, f"/queues/{queue}"

    async def pause_queue(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        return await self._set_paused(request, c, True)

    async def resume_queue(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        return await self._set_paused(request, c, False)

    @staticmethod
    async def _set_paused(request: Request, c: AsyncClient, paused: bool) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        if paused:
            changed = await c.pause_queue(queue)
            done = f"paused queue {queue}" if changed else f"queue {queue} was paused already"
        else:
            changed = await c.resume_queue(queue)
            done = f"resumed queue {queue}" if changed else f"queue {queue} was not paused"
        return done, {"paused": paused, "changed": changed}, f"/queues/{queue}"

    async def cancel_message(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        mid = _message_id(request.path_params["id"])
        removed = await c.cancel(queue, id=mid)
        done = f"cancelled message {mid}" if removed else f"message {mid} was no longer live"
        return done, {"cancelled": removed}, f"/queues/{queue}/messages"

    async def reschedule_message(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        mid = _message_id(request.path_params["id"])
        at = _when(p)
        new_id = await queries.reschedule(c, queue, mid, at)
        return (
            f"message {mid} rescheduled for {_ms_time(at)} as message {new_id}",
            {"id": new_id, "at": at},
            f"/queues/{queue}/messages/{new_id}",
        )

    async def requeue_dead(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        ids: list[int] | None
        if p.get("one"):
            ids = [_message_id(p.get("one") or "")]
        elif p.get("all") in ("1", "true", "True"):
            ids = None
        else:
            raw = p.getlist("ids")
            if not raw:
                raise _bad("select messages to requeue (ids), or requeue all")
            if len(raw) > queries.MAX_PAGE:
                raise _bad(f"at most {queries.MAX_PAGE} ids at a time")
            ids = [_message_id(i) for i in raw]
        n = await c.requeue_dead(queue, ids)
        return f"requeued {n} dead message(s)", {"requeued": n}, f"/queues/{queue}/dead"

    async def purge_dead(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        _confirmed(p, queue)
        n = await c.purge_dead(queue)
        return f"deleted {n} dead message(s)", {"purged": n}, f"/queues/{queue}/dead"

    async def edit_channel(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        queue = _queue(request)
        channel = p.get("channel")
        if not channel:
            raise _bad("a channel name is required")
        back = f"/queues/{queue}/channels"
        if p.get("reset"):
            reset = await c.reset_channel(queue, channel)
            return f"channel {channel} back to the queue's defaults", {"reset": reset}, back
        on_full = p.get("on_full") or "reject"
        if on_full not in ("reject", "drop"):
            raise _bad("on_full must be reject or drop")
        info = await c.set_channel(
            queue,
            channel,
            max_concurrency=_int(p.get("max_concurrency"), "max_concurrency", 1, 2**31 - 1),
            release_interval=_seconds(p.get("release_interval"), "release_interval"),
            max_size=_int(p.get("max_size"), "max_size", 1, 2**63 - 1),
            on_full=cast(Any, on_full),
        )
        return f"channel {channel} updated", {"channel": _jsonable(info)}, back

    async def cron_enable(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        return await self._cron_set(request, c, True)

    async def cron_disable(
        self, request: Request, c: AsyncClient, p: Params
    ) -> tuple[str, dict[str, Any], str]:
        return await self._cron_set(request, c, False)

    async def _cron_set(
        self, request: Request, c: AsyncClient, enabled: bool
    ) -> tuple[str, dict[str, Any], str]:
        from ..worker.ops import worker_ops

        name = request.path_params["name"]
        if not await c.run(worker_ops(c.schema).cron_set_enabled(name, enabled)):
            raise HTTPException(404, f"no schedule {name[:200]!r}")
        return f"schedule {name} {'enabled' if enabled else 'disabled'}", {"enabled": enabled}, "/cron"


def _root(request: Request) -> str:
    """The path the dashboard is served under ("" at the root; a mount's or base_path's prefix)."""
    return str(request.scope.get("root_path", ""))


def _cookie_path(request: Request) -> str:
    return _root(request) or "/"


def _jsonable(obj: Any) -> Any:
    from dataclasses import asdict

    return asdict(obj)


async def _params(request: Request) -> Params:
    ctype = request.headers.get("content-type", "")
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
        raise HTTPException(413, f"the request body is larger than {MAX_BODY} bytes")
    if ctype.startswith("application/json"):
        raw = bytearray()
        async for chunk in request.stream():  # bounded even without a content-length
            raw += chunk
            if len(raw) > MAX_BODY:
                raise HTTPException(413, f"the request body is larger than {MAX_BODY} bytes")
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise _bad("the body is not valid JSON") from None
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object")
        values: dict[str, list[str]] = {}
        for k, v in body.items():
            items = v if isinstance(v, list) else [v]
            values[str(k)] = [json.dumps(x) if isinstance(x, (dict, list)) else _text(x) for x in items]
        return Params(values)
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form(max_files=0, max_fields=queries.MAX_PAGE + 20)
        out: dict[str, list[str]] = {}
        for k, v in form.multi_items():
            if isinstance(v, str):
                out.setdefault(k, []).append(v)
        return Params(out)
    return Params({})


def _text(x: Any) -> str:
    if x is None:
        return ""
    if x is True:
        return "true"
    if x is False:
        return "false"
    return str(x)
