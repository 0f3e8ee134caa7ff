"""``/v1/batches``: submit a manifest (JSONL, one document per line) as one run, read where it stands, follow
its events (Server-Sent Events)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from conveyor.api.context import Services, Svc, View, base_url
from conveyor.api.jobs import EventCursor, event_stream
from conveyor.api.uploads import Stored, body_chunks, check_length, read_form, store_stream
from conveyor.errors import UserError
from conveyor.service import batches as batch_service
from conveyor.service.batches import BatchKeeper, BatchRequest
from conveyor.service.webhooks import check_webhook_url

router = APIRouter(prefix="/v1", tags=["batches"])
MANIFEST_TYPES = ("application/x-ndjson", "application/jsonl", "application/ndjson", "application/x-jsonlines")


class BatchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str | None = Field(None, description="the pipeline's name; may be left out when the server serves one")
    lane: Literal["interactive", "bulk"] = Field("bulk", description="bulk (default): claimed after interactive work")
    webhook_url: str | None = Field(None, max_length=2048, description="where the batch's events are POSTed, signed")


class BatchAccepted(BaseModel):
    batch_id: str
    job_id: str
    run_id: str
    items: int
    status_url: str
    events_url: str


_LINE = {"type": "string", "description": 'one JSON object per line: {"key": "...", "text": "...", "meta": {...}}'}
_MULTIPART_SCHEMA = {
    "type": "object", "required": ["file"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "the manifest (JSONL)"},
                   "pipeline": {"type": "string"}, "lane": {"type": "string", "enum": ["interactive", "bulk"]},
                   "webhook_url": {"type": "string"}}}
_PROBLEM = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}


def keeper(svc: Services) -> BatchKeeper:
    """What reads accepted batches and ends finished ones, beside the app (its ``start``/``stop``)."""
    return BatchKeeper(svc.settings.db, svc.blobs, svc.pipelines)


@router.post("/batches", status_code=202, response_model=BatchAccepted, responses={
    200: {"model": BatchAccepted, "description": "a repeat of an earlier request with the same Idempotency-Key"},
    401: _PROBLEM, 403: _PROBLEM, 404: _PROBLEM, 413: _PROBLEM, 415: _PROBLEM, 422: _PROBLEM},
    openapi_extra={"requestBody": {"required": True, "content": {
        **{kind: {"schema": _LINE} for kind in MANIFEST_TYPES[:2]},
        "multipart/form-data": {"schema": _MULTIPART_SCHEMA}}}})
async def submit_batch(
    request: Request, svc: Svc, view: View,
    pipeline: Annotated[str | None, Query(description="the pipeline's name (or a form field)")] = None,
    lane: Annotated[Literal["interactive", "bulk"] | None, Query(description="default: bulk")] = None,
    webhook_url: Annotated[str | None, Query(max_length=2048)] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    """Accept a manifest: every line a document (``{"key", "text", "meta"}``), checked whole first (a bad
    line is a 422 naming it, and nothing is created), stored, recorded as a run with a ``batch.accepted``
    event, and answered 202 at once; its items are read into the run right after. A repeat with the same
    Idempotency-Key answers 200, same batch."""
    limit = svc.settings.max_upload_bytes
    check_length(request, limit)
    given = {k: v for k, v in (("pipeline", pipeline), ("lane", lane), ("webhook_url", webhook_url)) if v is not None}
    fields, stored = await _read_manifest(request, svc, limit)
    options = _options(given | fields)
    served, target = svc.pipeline(options.pipeline)
    if options.webhook_url is not None:
        await run_in_threadpool(check_webhook_url, options.webhook_url, svc.settings.webhook_policy)
    wanted = BatchRequest(served.name, options.lane, options.webhook_url, idempotency_key)
    made = await view.call(batch_service.create_batch, svc.blobs, served, target, stored.digest, wanted)
    if made.created:
        request.app.state.batch_keeper.ingest(made.batch_id, served.name)
    base = f"{base_url(request)}/v1/batches/{made.batch_id}"
    body = {"batch_id": made.batch_id, "job_id": made.batch_id, "run_id": made.batch_id, "items": made.items,
            "status_url": base, "events_url": f"{base}/events"}
    return JSONResponse(body, status_code=202 if made.created else 200)


async def _read_manifest(request: Request, svc: Services, limit: int) -> tuple[dict[str, str], Stored]:
    """(the form's fields, the manifest kept in the blob store, however small)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in MANIFEST_TYPES:
        fields: dict[str, str] = {}
        stored = await run_in_threadpool(lambda: store_stream(svc.blobs, body_chunks(request, limit)))
    elif kind == "multipart/form-data":
        form = await run_in_threadpool(read_form, request, svc.blobs, limit)
        if form.document is None:
            raise UserError("a multipart upload needs the manifest in a part named 'file'")
        fields, stored = form.fields, form.document
    else:
        raise _Unsupported(kind)
    if stored.data is not None:  # kept inline so far: a batch is read again from the blob store
        await run_in_threadpool(svc.blobs.put, stored.data)
    return fields, stored


class _Unsupported(UserError):
    code = "unsupported_media_type"
    http_status = 415

    def __init__(self, kind: str) -> None:
        super().__init__(f"Content-Type {kind or '(none)'!r} is not taken; send the manifest as application/x-ndjson "
                         "(or application/jsonl), or in a multipart/form-data part named 'file'")


def _options(given: dict[str, str]) -> BatchOptions:
    try:
        return BatchOptions.model_validate_json(json.dumps(given))
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_input=False, include_url=False)) from None


@router.get("/batches/{batch_id}", responses={404: _PROBLEM})
async def get_batch(batch_id: str, view: View) -> dict[str, Any]:
    """The batch: ``status`` (submitting, running, finished), its items by outcome, and its ``outcome`` once
    finished (completed, partial or failed)."""
    found: dict[str, Any] = await view.call(batch_service.batch_view, batch_id)
    return found


@router.get("/batches/{batch_id}/events", responses={200: {"content": {"text/event-stream": {}}}, 404: _PROBLEM})
async def batch_events(request: Request, batch_id: str, svc: Svc, view: View,
                       last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
                       after: EventCursor = None) -> StreamingResponse:
    """The batch's events (``batch.accepted``, ``batch.finished``) as Server-Sent Events, resumable with
    ``Last-Event-ID``; the stream ends after ``batch.finished``."""
    await view.call(batch_service.get_batch, batch_id)
    return event_stream(request, svc, view, batch_id, after, last_event_id)
