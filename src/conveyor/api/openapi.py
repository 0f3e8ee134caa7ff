"""The OpenAPI document at /openapi.json, made to say what the app answers.

FastAPI declares validation errors as its own ``HTTPValidationError`` in ``application/json``; this app answers
every error as an RFC 9457 problem (problems.py). So, once, when the document is first asked for: every 4xx and
5xx response is declared as a ``Problem`` in ``application/problem+json``; every operation under /v1 declares
the 422 of a malformed request and, when the server wants tokens, the 401 and 403 it answers without a valid
one; an operation with a body, the 400 of one that is not JSON. An event stream is declared as that alone.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
SSE_EVENT = {  # one event of a stream; ``data`` is the event as JSON: {"id", "type", "job_id", "created_at", "data"}
    "type": "object", "description": "one Server-Sent Event: its id (for Last-Event-ID), its type, the event as JSON",
    "properties": {"id": {"type": "string"}, "event": {"type": "string"}, "data": {"type": "string"}}}
MALFORMED = {"422": "the request is malformed (the problem's `errors` say where)"}
NO_TOKEN = {"401": "no valid token (Authorization: Bearer TOKEN)",
            "403": "the token was revoked, or may not do this"}


class Problem(BaseModel):
    """An error, as every error is answered (RFC 9457 problem details)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="a URI naming the kind of problem")
    title: str = Field(description="the HTTP status, in words")
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what went wrong, and what to do about it, in one line")
    code: str = Field(description="a stable identifier of the kind of problem")
    errors: list[dict[str, Any]] | None = Field(None, description="a request that failed validation: where and why")


def document(app: FastAPI, authenticated: bool) -> dict[str, Any]:
    """FastAPI's document for ``app``, its error answers declared as problems (made once, then kept)."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        for path, item in doc.get("paths", {}).items():
            for operation in item.values():
                answered = {**MALFORMED, **(NO_TOKEN if authenticated else {})} if path.startswith("/v1/") else {}
                _declare_problems(operation, answered)
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
    return app.openapi_schema


def _declare_problems(operation: dict[str, Any], answered: dict[str, str]) -> None:
    """Declare the statuses in ``answered`` (status: why) where missing; every error's body as a Problem."""
    responses: dict[str, Any] = operation.setdefault("responses", {})
    if "requestBody" in operation:  # FastAPI answers a body it cannot parse as JSON with 400
        responses.setdefault("400", {"description": "the body could not be parsed"})
    for status, why in answered.items():
        responses.setdefault(status, {"description": why})
    for status, response in responses.items():
        content = response.get("content", {})
        if "text/event-stream" in content:  # FastAPI adds its default application/json beside it
            response["content"] = {"text/event-stream": {"schema": SSE_EVENT}}
        if status[:1] in ("4", "5"):
            response["content"] = {"application/problem+json": {"schema": PROBLEM_REF}}
            if response.get("description") in (None, "", "Validation Error", "a problem (RFC 9457)"):
                response["description"] = answered.get(status, "a problem (RFC 9457)")
