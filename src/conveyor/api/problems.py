"""Errors as RFC 9457 problem details: one JSON shape for every error the API answers.

``{"type", "title", "status", "detail", "code"}`` with ``Content-Type: application/problem+json``; a request
that fails validation also carries ``errors`` (pydantic's, without the input values).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from conveyor.errors import (
    BackendUnavailable,
    Conflict,
    ConveyorError,
    Forbidden,
    NotFound,
    StateConflict,
    StoreError,
    TooLarge,
    Unauthorized,
    UserError,
)

log = logging.getLogger("conveyor.api")
TYPE_BASE = "https://conveyor.dev/problems/"
_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed",
           409: "Conflict", 413: "Content too large", 415: "Unsupported media type", 422: "Unprocessable content",
           429: "Too many requests", 500: "Internal server error", 503: "Service unavailable"}


def problem(status: int, detail: str, code: str, **extra: Any) -> JSONResponse:
    body = {"type": TYPE_BASE + code, "title": _TITLES.get(status, "Error"), "status": status, "detail": detail,
            "code": code, **extra}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def status_of(exc: ConveyorError) -> int:
    given = getattr(exc, "http_status", None)
    if isinstance(given, int):
        return given
    for kind, status in ((Forbidden, 403), (Unauthorized, 401), (NotFound, 404), (Conflict, 422), (TooLarge, 413),
                         (StateConflict, 409), (BackendUnavailable, 503), (UserError, 422), (StoreError, 503)):
        if isinstance(exc, kind):
            return status
    return 500


def of_error(request: Request, exc: ConveyorError) -> JSONResponse:
    """The problem that answers ``exc`` (logged when it is the server's fault)."""
    status = status_of(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return problem(status, " ".join(str(exc).split("\n")), exc.code)


def install(app: FastAPI) -> None:
    """Answer every error as a problem."""

    @app.exception_handler(ConveyorError)
    async def conveyor_error(request: Request, exc: ConveyorError) -> JSONResponse:
        return of_error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "request"
        return problem(422, f"{where}: {first['msg']}", "invalid_request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else _TITLES.get(exc.status_code, "error")
        return problem(exc.status_code, detail, _TITLES.get(exc.status_code, "error").lower().replace(" ", "_"))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem(500, "the server failed on this request; it is logged", "internal_error")
