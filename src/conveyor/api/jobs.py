"""``/v1/jobs``: submit one document, read its state, follow its events (Server-Sent Events)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from conveyor.api.context import Scoped, Services, Svc, View, base_url
from conveyor.api.settings import MAX_JSON
from conveyor.api.uploads import Stored, check_length, kept, read_form, read_small, store_stream
from conveyor.api.views import JobList, JobView
from conveyor.errors import TooLarge, UserError
from conveyor.pipeline import Pipeline
from conveyor.runtime.values import INLINE_MAX
from conveyor.service import jobs as job_service
from conveyor.service.jobs import JobRequest
from conveyor.service.tokens import still_valid
from conveyor.service.webhooks import check_webhook_url

router = APIRouter(prefix="/v1", tags=["jobs"])
FINAL_TYPES = {f"job.{o}" for o in job_service.FINAL}
MAX_EVENT_ID = 2**63 - 1  # event ids are the store's 64-bit integers: a larger cursor is refused before streaming
# ?after= of an event stream: out of range or not a number is a 422 before the stream starts.
EventCursor = Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID, description="resume after this event id")]


class JobOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pipeline: str | None = Field(None, description="the pipeline's name; may be left out when the server serves one")
    lane: Literal["interactive", "bulk"] = Field("interactive", description="interactive: claimed before bulk work")
    metadata: dict[str, Any] | None = Field(None, description="kept with the job; the item's meta for checks")
    webhook_url: str | None = Field(None, max_length=2048, description="where the job's events are POSTed, signed")
    key: str | None = Field(None, min_length=1, max_length=1000,
                            description="the document's item key (default: the job id); names its publication")


class JobIn(JobOptions):
    text: str = Field(description="the document, as text")


class JobAccepted(BaseModel):
    job_id: str
    status: str
    status_url: str
    events_url: str


_MULTIPART_SCHEMA = {
    "type": "object", "required": ["file"],
    "properties": {"file": {"type": "string", "format": "binary"}, "pipeline": {"type": "string"},
                   "lane": {"type": "string", "enum": ["interactive", "bulk"]},
                   "metadata": {"type": "string", "description": "a JSON object"},
                   "webhook_url": {"type": "string"}, "key": {"type": "string"}}}
_PROBLEM = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}


@router.post("/jobs", status_code=202, response_model=JobAccepted, responses={
    200: {"model": JobAccepted, "description": "a repeat of an earlier request with the same Idempotency-Key"},
    401: _PROBLEM, 403: _PROBLEM, 404: _PROBLEM, 413: _PROBLEM, 415: _PROBLEM, 422: _PROBLEM},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": JobIn.model_json_schema()},
        "multipart/form-data": {"schema": _MULTIPART_SCHEMA}}}})
async def submit_job(request: Request, svc: Svc, view: View,
                     idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None) -> JSONResponse:
    """Accept one document: stored, recorded with its first tasks and a ``job.accepted`` event in one
    transaction, and answered 202 at once; a repeat with the same Idempotency-Key answers 200, same job."""
    limit = svc.settings.max_upload_bytes
    check_length(request, limit)
    options, stored = await _read_job(request, svc, limit)
    pipeline, target = svc.pipeline(options.pipeline)
    _fits(pipeline, stored)
    wanted = JobRequest(pipeline.name, options.lane, options.metadata, options.webhook_url, options.key,
                        idempotency_key)
    if options.webhook_url is not None:
        await run_in_threadpool(check_webhook_url, options.webhook_url, svc.settings.webhook_policy)
    source = job_service.source_ref(stored.data, stored.digest, stored.size)
    created = await view.call(job_service.create_job, pipeline, target, source, wanted)
    return JSONResponse(accepted(request, created.job_id, created.status), status_code=202 if created.created else 200)


def accepted(request: Request, job_id: str, status: str) -> dict[str, Any]:
    base = base_url(request)
    return {"job_id": job_id, "status": status, "status_url": f"{base}/v1/jobs/{job_id}",
            "events_url": f"{base}/v1/jobs/{job_id}/events"}


async def _read_job(request: Request, svc: Services, limit: int) -> tuple[JobOptions, Stored]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        body = _validated(JobIn, await read_small(request, min(limit, MAX_JSON)))
        data = body.text.encode()
        if len(data) <= INLINE_MAX:  # the common case: no blob to write, no thread to wait for
            return body, kept(data)
        return body, await run_in_threadpool(store_stream, svc.blobs, iter([data]))
    if kind == "multipart/form-data":
        form = await run_in_threadpool(read_form, request, svc.blobs, limit)
        if form.document is None:
            raise UserError("a multipart upload needs the document in a part named 'file'")
        fields: dict[str, Any] = dict(form.fields)
        if "metadata" in fields:
            fields["metadata"] = _json_field("metadata", fields["metadata"])
        return _validated(JobOptions, json.dumps(fields).encode()), form.document
    raise _Unsupported(kind)


class _Unsupported(UserError):
    code = "unsupported_media_type"
    http_status = 415

    def __init__(self, kind: str) -> None:
        super().__init__(f"Content-Type {kind or '(none)'!r} is not taken; send application/json with \"text\", "
                         "or multipart/form-data with a 'file' part")


def _validated(model: type[JobOptions], raw: bytes) -> Any:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_input=False, include_url=False)) from None


def _json_field(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise UserError(f"form field {name!r} must be JSON (an object)") from None


def _fits(pipeline: Pipeline, stored: Stored) -> None:
    """413 for a document larger than every first stage of the pipeline accepts."""
    limits = [s.max_input_bytes for s in pipeline.roots]
    if limits and all(limit is not None for limit in limits):
        most = max(limit for limit in limits if limit is not None)
        if stored.size > most:
            raise TooLarge(f"the document is {stored.size:,} bytes; pipeline {pipeline.name!r} takes at most "
                           f"{most:,} (max_input_bytes)")


@router.get("/jobs", response_model=None, responses={200: {"model": JobList, "description": "a page of jobs"}})
async def list_jobs(view: View, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                    before: Annotated[float | None, Query(description="created_at of the last job seen")] = None,
                    ) -> dict[str, Any]:
    """The caller's jobs, newest first, a page at a time (``next_before`` gives the next page)."""
    return await view.call(job_service.list_jobs, limit, before)


@router.get("/jobs/{job_id}", response_model=None,
            responses={200: {"model": JobView, "description": "the job"}, 404: _PROBLEM})
async def get_job(job_id: str, svc: Svc, view: View) -> dict[str, Any]:
    """The job: status, per-stage state, outcome, the published record, errors with their class."""
    return await view.call(job_service.job_view, svc.blobs, job_id)


@router.get("/jobs/{job_id}/events", responses={200: {"content": {"text/event-stream": {}}}, 404: _PROBLEM})
async def job_events(request: Request, job_id: str, svc: Svc, view: View,
                     last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
                     after: EventCursor = None) -> StreamingResponse:
    """The job's events as Server-Sent Events, from the first (or after ``Last-Event-ID``), in the order they
    were committed; a keep-alive comment while nothing happens; the stream ends after the job's final event,
    or when the caller's token is revoked."""
    await view.call(job_service.get_job, job_id)
    return event_stream(request, svc, view, job_id, after, last_event_id)


def event_stream(request: Request, svc: Services, view: Scoped, job_id: str, after: int | None,
                 last_event_id: str | None) -> StreamingResponse:
    """A job's (or a batch's) events as Server-Sent Events, after ``after`` or ``Last-Event-ID``; each read
    through the caller's ``view``."""
    start = after if after is not None else _event_id(last_event_id)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_stream(request, svc, view, job_id, start), media_type="text/event-stream",
                             headers=headers)


def _event_id(header: str | None) -> int:
    if header is None or not header.strip():
        return 0
    if not re.fullmatch(r"[0-9]{1,19}", header.strip()) or int(header.strip()) > MAX_EVENT_ID:
        raise UserError(f"Last-Event-ID must be an event id (a whole number from 0 to {MAX_EVENT_ID})")
    return int(header.strip())


async def _stream(request: Request, svc: Services, view: Scoped, job_id: str, last: int) -> AsyncIterator[str]:
    settings = svc.settings
    quiet_since = time.monotonic()
    yield "retry: 2000\n\n"
    while True:
        if not await svc.call(still_valid, view.who):
            return  # its token was revoked: the client's reconnection is answered 403
        job = await view.call(job_service.get_job, job_id)
        events = await view.call(job_service.job_events, job_id, last)
        for e in events:
            last = e["id"]
            yield f"id: {e['id']}\nevent: {e['type']}\ndata: {json.dumps(_public(e))}\n\n"
        if events:
            quiet_since = time.monotonic()
            continue  # there may be more: read again at once
        if job.finished_at is not None:
            return
        if time.monotonic() - quiet_since >= settings.sse_keepalive_s:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        if await request.is_disconnected():
            return
        await asyncio.sleep(settings.sse_poll_s)


def _public(e: dict[str, Any]) -> dict[str, Any]:
    return {"id": e["id"], "type": e["type"], "job_id": e["job_id"], "created_at": e["created_at"], "data": e["data"]}
