"""Refuse before reading: who sends a request body is known before a byte of it is read, and every body is
counted against its route's limit as it streams.

A request that carries a body must come from a caller its route takes: an API token on ``/v1/`` routes, the
dashboard's session (or a token) on the others, asked of the same functions the routes' dependencies call
(``context.caller``, ``session.viewer``), from the headers alone. Only the login form takes a body from anyone.
Then the route's limit: an upload (``POST /v1/jobs``, ``POST /v1/batches``) takes ``--max-upload-bytes``, the
login form 64 KiB, every other body (JSON, the dashboard's forms) 16 MiB. A body over it is answered 413 at
once when its Content-Length says so, else as soon as the count passes it; the refusal is the route's kind of
answer (a problem on ``/v1/``, a page or the redirect to /login on the dashboard).

A pure ASGI middleware: Starlette's ``BaseHTTPMiddleware`` would buffer what it guards.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.context import caller
from conveyor.api.dashboard.render import LoginNeeded, page_error
from conveyor.api.dashboard.session import viewer
from conveyor.api.problems import of_error
from conveyor.api.settings import MAX_JSON, ApiSettings
from conveyor.errors import ConveyorError, TooLarge

API = "/v1/"
LOGIN = "/login"  # the one route that takes a body from anyone
MAX_LOGIN = 64 << 10
UPLOADS = frozenset({"/v1/jobs", "/v1/batches"})


@dataclass(frozen=True)
class Limit:
    """The most a route's body may be, and what to tell a sender who goes past it."""

    most: int
    hint: str

    def refusal(self, size: int | None = None) -> TooLarge:
        """The 413 for a body declared as ``size`` bytes, or (None) found over the limit as it streamed."""
        if size is None:
            return TooLarge(f"the request body is over {self.most:,} bytes, the most this route takes; {self.hint}")
        return TooLarge(f"the request body is {size:,} bytes; this route takes at most {self.most:,}; {self.hint}")


def limit_of(settings: ApiSettings, path: str, content_type: str) -> Limit:
    """The limit of a body sent to ``path``."""
    if path == LOGIN:
        return Limit(MAX_LOGIN, "a login form sends a token and little else")
    upload = settings.max_upload_bytes
    if path not in UPLOADS:
        return Limit(MAX_JSON, "send a large document as a multipart upload to POST /v1/jobs")
    if content_type.split(";")[0].strip().lower() != "application/json":
        return Limit(upload, "the server's --max-upload-bytes sets it")
    return Limit(min(upload, MAX_JSON), "send a large document as multipart/form-data")


async def check_sender(request: Request) -> None:
    """Unauthorized, Forbidden or LoginNeeded unless the route would take this request's caller."""
    if request.url.path == LOGIN:
        return
    if request.url.path.startswith(API):
        await caller(request)
    else:
        await viewer(request)


def has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length", "").strip()
    return int(declared) if declared.isdigit() else None


def refusal(request: Request, exc: Exception) -> Response:
    """The answer to a refused request, of its route's kind."""
    if request.url.path.startswith(API) and isinstance(exc, ConveyorError):
        return of_error(request, exc)
    return page_error(request, exc)


class BodyGuard:
    """The middleware: checks the sender, then the declared length, then counts the body as the app reads it."""

    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not has_body(scope):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        limit = limit_of(self.settings, request.url.path, request.headers.get("content-type", ""))
        try:
            await check_sender(request)
            size = declared_length(request)
            if size is not None and size > limit.most:
                raise limit.refusal(size)
        except (ConveyorError, LoginNeeded) as refused:
            await refusal(request, refused)(scope, receive, send)
            return
        await _Counted(request, limit, receive, send).run(self.app)


class _Counted:
    """One request's body, counted as the app reads it; past the limit the read fails, and whatever the app
    makes of that failure (a 400 from a parser, a 413 of its own) is answered as the limit's 413."""

    def __init__(self, request: Request, limit: Limit, receive: Receive, send: Send) -> None:
        self.request, self.limit = request, limit
        self._receive, self._send = receive, send
        self.seen = 0
        self.over: TooLarge | None = None
        self.started = False  # the answer began (the app's, or ours)
        self.replaced = False  # ours: the app's answer is dropped

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.request.scope, self.receive, self.send)
        except Exception:
            if self.over is None or (self.started and not self.replaced):
                raise
        if self.over is not None and not self.started:
            await self._refuse()

    async def receive(self) -> Message:
        if self.over is not None:
            raise self.over
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit.most:
                self.over = self.limit.refusal()
                raise self.over
        return message

    async def send(self, message: Message) -> None:
        if self.over is not None and not self.started:  # the app's answer to the failed read: ours instead
            await self._refuse()
        if self.replaced:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    async def _refuse(self) -> None:
        assert self.over is not None
        self.started = self.replaced = True
        await refusal(self.request, self.over)(self.request.scope, self._receive, self._send)
