"""Who may change things, and proof that a form came from the dashboard itself.

Mutations need, unless the app is read-only (then every one is refused with 403):
- to be authorised: the token (``Authorization: Bearer <token>`` on the API; in a browser, the
  session cookie the login form sets, an HMAC of the token, never the token itself), or the
  host application's ``authorize(request)`` hook when the dashboard is mounted in it;
- CSRF protection when the credential is a cookie (double submit: the ``lonnymq_csrf``
  cookie's random value must come back in the form's ``csrf_token`` field or the
  ``X-CSRF-Token`` header; another site can make a browser send the cookie, not read it).
  A bearer token is not sent by browsers on their own, so API calls with one need no CSRF value.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request

AUTH_COOKIE = "lonnymq_auth"
CSRF_COOKIE = "lonnymq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"

#: The host application's check (sync or async): True lets the request make changes.
Authorize = Callable[[Request], bool | Awaitable[bool]]


class Guard:
    def __init__(self, *, read_only: bool, token: str | None, authorize: Authorize | None) -> None:
        self.read_only = read_only
        self.token = token or None
        self.authorize = authorize
        self._session = (
            hmac.new(self.token.encode(), b"lonnymq web session", hashlib.sha256).hexdigest()
            if self.token
            else None
        )

    @property
    def can_log_in(self) -> bool:
        return not self.read_only and self.token is not None

    def session_value(self) -> str:
        assert self._session is not None
        return self._session

    def check_token(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def bearer(self, request: Request) -> bool:
        """The request carries the token in its Authorization header."""
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and self.check_token(value.strip())

    def cookie_session(self, request: Request) -> bool:
        value = request.cookies.get(AUTH_COOKIE)
        return self._session is not None and value is not None and hmac.compare_digest(value, self._session)

    async def may_write(self, request: Request) -> bool:
        """Whether this request is authorised to make changes (CSRF aside)."""
        if self.read_only:
            return False
        if self.bearer(request) or self.cookie_session(request):
            return True
        if self.authorize is not None:
            allowed = self.authorize(request)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            return bool(allowed)
        return False


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request: Request, submitted: str | None) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE)
    return bool(cookie) and submitted is not None and hmac.compare_digest(cookie or "", submitted)
