"""Pages as HTML: the Jinja environment (autoescaped), the filters the templates use, and ``PageRoute``, which
answers a page's errors as a small error page (or a redirect to /login) instead of the API's problem JSON."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from conveyor.api.problems import status_of
from conveyor.errors import ConveyorError
from conveyor.service import money

log = logging.getLogger("conveyor.api")


class LoginNeeded(Exception):
    """The request has no (valid) session: the browser goes to /login, then back to ``next``."""

    def __init__(self, next_path: str, reason: str | None = None) -> None:
        super().__init__(reason or "log in")
        self.next_path = next_path
        self.reason = reason


def when(epoch: float | None) -> str:
    """An epoch time as UTC, to the second."""
    if epoch is None:
        return "—"
    return dt.datetime.fromtimestamp(float(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """A duration as a reader takes it in: 45 s, 12 min, 3.5 h, 2.1 d."""
    if seconds is None:
        return "—"
    s = float(seconds)
    if s < 90:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def usd(value: Any) -> str:
    if value is None:
        return "—"
    return money.usd(float(value))


def first_line(text: Any, width: int = 200) -> str:
    if not text:
        return ""
    line = str(text).splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


BADGE_WORDS = {"finished_failed": "finished with failures", "finished_waiting": "waiting for review",
               "paused_budget": "paused: budget", "paused_breaker": "paused: breaker"}


def badge(name: Any) -> str:
    """A run's badge in words: a finished run with failures or waits never reads as a plain "finished"."""
    return BADGE_WORDS.get(str(name), str(name).replace("_", " "))


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("conveyor.api.dashboard", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters.update(when=when, age=age, number=number, usd=usd, first_line=first_line, badge=badge)
    return env


ENV = _environment()
# Pages are not cached, not framed by another site (clickjacking), run only this site's script, and post
# forms only here; the charts' and bars' inline style attributes are the one inline content allowed.
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template``; with ``?fragment=1`` only its ``live`` block (what the page's script refreshes)."""
    tmpl = ENV.get_template(template)
    ctx = {"request": request, "viewer": getattr(request.state, "viewer", None), **context}
    if request.query_params.get("fragment") and "live" in tmpl.blocks:
        html = "".join(tmpl.blocks["live"](tmpl.new_context(ctx)))
    else:
        html = tmpl.render(ctx)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def svg(text: str | None) -> Markup:
    """A chart made by service/plots.py, which escapes every text it draws."""
    return Markup(text or "")


ENV.filters["svg"] = svg


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    return page(request, "error.html", status=status, status_code=status, message=message)


class PageRoute(APIRoute):
    """A dashboard route: its errors answered by ``page_error``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return page_error(request, exc)

        return guarded


def page_error(request: Request, exc: Exception) -> Response:
    """A page's answer to ``exc``: a ConveyorError is an error page with its one-line message and the API's status
    (404, 409, 422, ...), a bad parameter a 422 page, a refused form (too many fields) its status, anything
    else a 500 page (logged); ``LoginNeeded`` redirects to /login."""
    if isinstance(exc, LoginNeeded):
        return login_redirect(exc)
    if isinstance(exc, ConveyorError):
        status = status_of(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
        return error_page(request, status, " ".join(str(exc).split()))
    if isinstance(exc, RequestValidationError):
        return error_page(request, 422, _invalid(exc))
    if isinstance(exc, StarletteHTTPException) and exc.status_code < 500:
        return error_page(request, exc.status_code, str(exc.detail))
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_page(request, 500, "the server failed on this page; it is logged")


def login_redirect(need: LoginNeeded) -> RedirectResponse:
    from urllib.parse import urlencode

    query = {"next": need.next_path} | ({"reason": need.reason} if need.reason else {})
    return RedirectResponse(f"/login?{urlencode(query)}", status_code=303)


def _invalid(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
    return f"{where or 'request'}: {first.get('msg', 'invalid')}"
