"""Who looks at a page: the API's own tokens, sent by a browser as a cookie.

A browser cannot send ``Authorization: Bearer`` when it navigates, so /login takes the token once, checks it,
and sets it as an HttpOnly, SameSite=Strict cookie (Secure over https). Every page accepts that cookie or the
Authorization header, and checks the token on each request (a revoked token stops working at once). A POST
(replay, approve, edit, reject, logout) also needs the session's CSRF value in a hidden form field: an HMAC
of the token, which a page of another site can neither read nor make. The login form has no session yet: its
value is an HMAC of a random key the form's page sets as a cookie of its own (``conveyor_login``).
``conveyor serve --no-auth`` serves the one local user without a login; its CSRF value is keyed by a secret the
app makes at start.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request, Response

from conveyor.api.context import services
from conveyor.api.dashboard.render import LoginNeeded
from conveyor.errors import Forbidden, Unauthorized
from conveyor.service.tokens import LOCAL, Caller, authenticate

COOKIE = "conveyor_session"
LOGIN_COOKIE = "conveyor_login"  # the login form's CSRF key, before there is a session
_CSRF_CONTEXT = b"conveyor dashboard csrf v1"


@dataclass(frozen=True)
class Viewer:
    """The caller of a page, the CSRF value its forms carry, and whether it logged in with the cookie."""

    caller: Caller
    csrf: str
    cookie: bool = False

    @property
    def tenant(self) -> str | None:
        return self.caller.scope

    @property
    def by(self) -> str:
        """Who a decision or replay made from the dashboard is recorded as."""
        return f"dashboard:{self.caller.tenant}"


def csrf_for(key: bytes) -> str:
    """The CSRF value of a session keyed by ``key`` (its token; under --no-auth, the app's own secret)."""
    return hmac.new(key, _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def local_secret() -> bytes:
    """A fresh key for the CSRF values of ``--no-auth`` (made per app: a restart makes open forms stale)."""
    return secrets.token_bytes(32)


async def viewer(request: Request) -> Viewer:
    """The page's viewer (a FastAPI dependency): LoginNeeded without a valid session. Checked once per request
    (the body guard asks first, before a form is read; the route's dependency finds it in ``request.state``)."""
    known: Viewer | None = getattr(request.state, "viewer", None)
    if known is not None:
        return known
    svc = services(request)
    if not svc.settings.auth:
        found = Viewer(LOCAL, csrf_for(request.app.state.dashboard_secret))
    elif request.headers.get("authorization"):
        header = request.headers["authorization"]
        found = Viewer(await svc.call(authenticate, header), csrf_for(header.partition(" ")[2].strip().encode()))
    else:
        found = await _from_cookie(request)
    request.state.viewer = found
    return found


async def _from_cookie(request: Request) -> Viewer:
    token = request.cookies.get(COOKIE)
    here = _here(request)
    if not token:
        raise LoginNeeded(here)
    try:
        caller = await services(request).call(authenticate, f"Bearer {token}")
    except Forbidden:
        raise LoginNeeded(here, "revoked") from None
    except Unauthorized:
        raise LoginNeeded(here, "unknown") from None
    return Viewer(caller, csrf_for(token.encode()), cookie=True)


def _here(request: Request) -> str:
    """Where to come back to after logging in: this page (a form's POST comes back to the runs page)."""
    if request.method != "GET":
        return "/"
    path = request.url.path
    return f"{path}?{request.url.query}" if request.url.query else path


def check_csrf(found: Viewer, given: str | None) -> None:
    """Forbidden unless a form carries the session's CSRF value."""
    if not _same(found.csrf, given):
        raise Forbidden("this form's session check failed (it is stale, or came from another site); reload the "
                        "page and try again")


def login_key(request: Request) -> str:
    """The login form's key: the one the browser holds in its login cookie, else a new one (set with the form).
    Before a session there is no token to key the CSRF value by, so the login form pairs its hidden value with
    this cookie instead; a page of another site can neither read the cookie nor send it (SameSite=Strict)."""
    return _held_key(request) or secrets.token_urlsafe(32)


def login_csrf_ok(request: Request, given: str | None) -> bool:
    """Whether a login POST carries the CSRF value of the login cookie it comes with."""
    held = _held_key(request)
    return held is not None and _same(csrf_for(held.encode()), given)


def _held_key(request: Request) -> str | None:
    held = request.cookies.get(LOGIN_COOKIE, "")
    return held if 20 <= len(held) <= 100 else None  # one this server made (token_urlsafe(32): 43 characters)


def _same(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(str(given), expected)


def set_login_key(request: Request, response: Response, key: str) -> None:
    response.set_cookie(LOGIN_COOKIE, key, httponly=True, samesite="strict", secure=_secure(request),
                        path="/login")


def safe_next(path: str | None) -> str:
    """Where to go after login: a path on this site only (never another host), else the runs page."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    parts = urlsplit(path)
    return path if not parts.scheme and not parts.netloc else "/"


def set_session(request: Request, response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=_secure(request), path="/")
    response.delete_cookie(LOGIN_COOKIE, path="/login", httponly=True, samesite="strict")


def _secure(request: Request) -> bool:
    public = services(request).settings.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


def clear_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
