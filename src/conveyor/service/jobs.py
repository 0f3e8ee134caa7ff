"""Jobs: one document submitted through the API, as a run of one item, and what its client may learn of it.

A job is created in one transaction: its Idempotency-Key (when given), its run, its item and first tasks (or
the memo's answers), its ``job.accepted`` event, and its end when the memo answered everything. Its events
come from the transitions that change its tasks (runtime/transitions/events.py). The command line and the
HTTP API call these functions; neither runs SQL.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import Conflict, UserError
from conveyor.pipeline import Pipeline
from conveyor.pipeline import params as params_rule
from conveyor.runtime.lanes import LANE_RANKS
from conveyor.runtime.target import absolute_target
from conveyor.runtime.transitions import Transitions
from conveyor.runtime.transitions.events import event, outcome_stages, settle
from conveyor.runtime.values import INLINE_MAX, Ref
from conveyor.service.inputs import MAX_KEY_CHARS, key_problem
from conveyor.service.records import read_records
from conveyor.service.show import shown_output
from conveyor.service.submit import run_params, stages_json
from conveyor.service.tenancy import TenantView, client_key
from conveyor.service.tokens import webhook_secret
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef
from conveyor.store.jobs import EventRow, JobRow, JobTask

IDEMPOTENCY_TTL_S = 24 * 3600  # how long an Idempotency-Key names its job
MAX_TASKS_SHOWN = 200  # a job's tasks listed by job_view (a fan-out may make many)
FINAL = ("published", "completed", "failed", "dead_lettered", "rejected")


@dataclass(frozen=True)
class JobRequest:
    """What a client asks for besides its document. ``key``: the document's item key (default: the job id),
    which names its publication too, so a later job with the same key publishes a new version of it."""

    pipeline: str
    lane: str = "interactive"
    metadata: Mapping[str, Any] | None = None
    webhook_url: str | None = None
    key: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class JobCreated:
    job_id: str
    created: bool  # False: an earlier request with the same Idempotency-Key made this job
    status: str = "queued"
    extra: dict[str, Any] = field(default_factory=dict)


def new_job_id(now: float) -> str:
    return time.strftime("j%Y%m%d-%H%M%S-", time.gmtime(now)) + secrets.token_hex(8)


def request_hash(kind: str, request: JobRequest, digest: str) -> str:
    """What identifies a request for its Idempotency-Key: the same key with another hash is a conflict."""
    body = {"kind": kind, "pipeline": request.pipeline, "lane": request.lane, "metadata": request.metadata,
            "webhook_url": request.webhook_url, "key": request.key, "document": digest}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def check_request(request: JobRequest) -> None:
    """A one-line UserError for options no job can have."""
    if request.lane not in LANE_RANKS:
        raise UserError(f"lane {request.lane!r} is not a lane; use {' or '.join(LANE_RANKS)}")
    if request.key is not None:
        problem = key_problem(request.key) if request.key else "an empty key"
        if problem is not None:
            raise UserError(f"key: {problem}")
    if request.idempotency_key is not None and not 0 < len(request.idempotency_key) <= 255:
        raise UserError("Idempotency-Key must have 1 to 255 characters")


def source_ref(data: bytes | None, digest: str, size: int) -> Ref:
    """A document's source: inline when small (``data`` given), else the blob ``digest``."""
    if data is not None and size <= INLINE_MAX:
        return Ref("bytes", digest, size, data)
    return Ref("bytes", digest, size, None)


def earlier_job(view: TenantView, request: JobRequest, fingerprint: str, now: float) -> str | None:
    """The job an earlier request of the caller's tenant with this Idempotency-Key made (same body), None when
    the key is free; Conflict when the key names a request with another body."""
    if request.idempotency_key is None:
        return None
    held = view.store.idempotency_key(view.tenant, request.idempotency_key, now - IDEMPOTENCY_TTL_S)
    if held is None:
        return None
    if held[0] != fingerprint:
        raise Conflict(f"Idempotency-Key {request.idempotency_key!r} was used for another request (job {held[1]}); "
                       "use a new key for a new request")
    return held[1]


class _KeyTaken(Exception):
    """Another request took the Idempotency-Key while this one was being written."""


def create_job(view: TenantView, pipeline: Pipeline, target: str, source: Ref, request: JobRequest,
               now: float | None = None) -> JobCreated:
    """Record a job of the caller's tenant for one document whose bytes are stored already (``source``) and
    queue its first tasks. Its item is the tenant's own (``view.item_key``): its key and publication.

    With an Idempotency-Key, a repeat of the same request returns the job the first one made
    (``created`` False), and a request with another body is a Conflict, however many arrive at once.
    """
    check_request(request)
    store, tenant = view.store, view.tenant
    now = store.clock() if now is None else now
    fingerprint = request_hash("job", request, source.digest)
    earlier = earlier_job(view, request, fingerprint, now)
    if earlier is not None:
        return JobCreated(earlier, False)
    if request.webhook_url is not None:
        webhook_secret(store, tenant)  # a tenant made without a token (--no-auth's) gets its signing secret now
    job_id = new_job_id(now)
    key = view.item_key(request.key or job_id)
    transitions = transitions_for(store, pipeline)
    values = run_params(pipeline)  # the server's: a request sets none
    try:
        with store.transaction():
            if not take_key(view, request.idempotency_key, fingerprint, job_id, now):
                raise _KeyTaken
            run = RunRecord(job_id, pipeline.name, absolute_target(target), f"api:{tenant}", "submitted", 1,
                            pipeline.has_publish, stages_json(pipeline, values), now, now, None, request.lane,
                            budget_usd=pipeline.budget_usd, params=params_rule.encode(values) if values else None)
            store.create_run(run)
            job = JobRow(job_id, tenant, "job", key, pipeline.name, request.lane, request.webhook_url,
                         _json(request.metadata), fingerprint, request.idempotency_key, now)
            store.insert_job(job)
            transitions.expander.set_lane(job_id, request.lane)
            transitions.expander.without_base(job_id)
            transitions.expander.set_params(job_id, values)
            metas = {key: dict(request.metadata)} if request.metadata else None
            cached, queued = transitions.admit(job_id, [(key, source)], now, metas=metas)
            store.insert_events([event(job, "job.accepted", now, pipeline=pipeline.name, item_key=key,
                                       lane=request.lane)])
            if cached:  # the memo answered some tasks already: they are done, and the job may be too
                answered = [t for t in store.job_tasks(job_id, MAX_TASKS_SHOWN) if t.status == "succeeded"]
                own = view.own_memo(job, [t.task_key for t in answered])
                store.insert_events([event(job, "job.stage_done", now, stage=t.stage, item_key=t.item_key,
                                           cached=t.task_key in own) for t in answered])
            ended = settle(store, [job], outcome_stages(pipeline), now) if not queued else []
            store.notify()
    except _KeyTaken:
        earlier = earlier_job(view, request, fingerprint, now)
        if earlier is None:  # taken and expired in between: vanishingly rare; the client may retry
            raise Conflict("Idempotency-Key was being used by another request; retry") from None
        return JobCreated(earlier, False)
    return JobCreated(job_id, True, ended[0].type.removeprefix("job.") if ended else "queued")


def take_key(view: TenantView, key: str | None, fingerprint: str, job_id: str, now: float) -> bool:
    """Take the tenant's Idempotency-Key ``key`` (if any) for ``job_id`` in the caller's transaction, an expired
    holder forgotten first; False when another request holds it (a concurrent one that took it first is waited
    for)."""
    if key is None:
        return True
    view.store.forget_idempotency_keys(view.tenant, key, now - IDEMPOTENCY_TTL_S)
    return view.store.claim_idempotency_key(view.tenant, key, fingerprint, job_id, now)


_TRANSITIONS: weakref.WeakKeyDictionary[SqlStore, dict[str, Transitions]] = weakref.WeakKeyDictionary()
_TRANSITIONS_LOCK = threading.Lock()


def transitions_for(store: SqlStore, pipeline: Pipeline) -> Transitions:
    """One Transitions per store and pipeline (its memo plans are built once, not per request)."""
    with _TRANSITIONS_LOCK:
        per_store = _TRANSITIONS.setdefault(store, {})
        found = per_store.get(pipeline.name)
        if found is None or found.pipeline is not pipeline:
            found = per_store[pipeline.name] = Transitions(pipeline, store, "api")
        return found


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


# --- reading a job: through the caller's TenantView only ------------------------------------------------------

def get_job(view: TenantView, job_id: str) -> JobRow:
    """The job, if the caller may see it; NotFound otherwise, the same either way."""
    return view.job(job_id)


def job_view(view: TenantView, blobs: Blobs, job_id: str) -> dict[str, Any]:
    """Everything a client may learn of a job: status, its tasks, errors, reviews, and its record. Keys are
    shown as the tenant chose them; ``cached`` tells of a memo hit on the tenant's own earlier work only."""
    job = view.job(job_id)
    tasks = view.tasks(job, MAX_TASKS_SHOWN + 1)
    shown = tasks[:MAX_TASKS_SHOWN]
    own = view.own_memo(job, [t.task_key for t in shown if t.cached])

    def key(stored: str) -> str:
        return client_key(job.tenant, stored)

    answer: dict[str, Any] = {
        "job_id": job.job_id, "kind": job.kind, "pipeline": job.pipeline, "lane": job.lane,
        "key": key(job.item_key) if job.item_key is not None else None,
        "status": job_status(job, tasks), "outcome": job.outcome, "created_at": job.created_at,
        "finished_at": job.finished_at, "metadata": json.loads(job.metadata) if job.metadata else None,
        "webhook_url": job.webhook_url,
        "stages": [{"stage": t.stage, "item_key": key(t.item_key), "status": t.status, "attempts": t.attempts,
                    "cached": t.task_key in own, "error_class": t.error_class} for t in shown],
        "errors": [{"stage": t.stage, "item_key": key(t.item_key), "error_class": t.error_class,
                    "error": (t.last_error or "").splitlines()[0] if t.last_error else None}
                   for t in shown if t.error_class is not None and t.status != "succeeded"],
        "tasks_truncated": len(tasks) > MAX_TASKS_SHOWN,
        "reviews": [{"review_id": r.id, "stage": r.stage, "item_key": key(r.item_key), "reason_class": r.reason_class,
                     "reason": r.reason} for r in view.reviews(job, MAX_TASKS_SHOWN)],
    }
    answer["record"], answer["output"] = _record(view, blobs, job, shown)
    return answer


def job_status(job: JobRow, tasks: list[JobTask]) -> str:
    """queued (nothing started), running, awaiting_review, or the job's end."""
    if job.outcome is not None:
        return job.outcome
    if any(t.status == "awaiting_review" for t in tasks):
        return "awaiting_review"
    if any(t.status == "running" or t.attempts or t.status in ("succeeded", "failed") for t in tasks):
        return "running"
    return "queued"


def _record(view: TenantView, blobs: Blobs, job: JobRow, tasks: list[JobTask]) -> tuple[Any, Any]:
    """(the live published record of the job's own document, the output of its last successful stage on it)."""
    live = view.live_record(job)
    record = {"collection": live.collection, "version": live.version,
              "fields": json.loads(live.fields) if live.fields else None} if live else None
    own = [t for t in tasks if t.item_key == job.item_key and t.status == "succeeded" and t.output_digest
           and t.output_kind]
    if not own:
        return record, None
    last = own[-1]
    assert last.output_kind is not None and last.output_digest is not None
    values = read_records(view.store, blobs, {"out": RecordRef(last.task_key, last.output_kind, last.output_digest)},
                          strict=False)
    return record, shown_output(last.output_kind, values["out"]) if "out" in values else None


def job_events(view: TenantView, job_id: str, after: int = 0, limit: int = 500) -> list[dict[str, Any]]:
    """The job's events after event id ``after``, oldest first."""
    return [event_view(e) for e in view.events(job_id, after, limit)]


def event_view(e: EventRow) -> dict[str, Any]:
    return {"id": e.id, "type": e.type, "job_id": e.job_id, "created_at": e.created_at, "data": json.loads(e.data),
            "delivery": e.delivery, "delivery_attempts": e.delivery_attempts, "delivery_error": e.delivery_error}


def list_jobs(view: TenantView, limit: int = 50, before: float | None = None) -> dict[str, Any]:
    jobs = view.jobs(limit, before)
    return {"jobs": [{"job_id": j.job_id, "kind": j.kind, "pipeline": j.pipeline,
                      "key": client_key(j.tenant, j.item_key) if j.item_key is not None else None,
                      "lane": j.lane, "created_at": j.created_at, "finished_at": j.finished_at,
                      "outcome": j.outcome} for j in jobs],
            "next_before": jobs[-1].created_at if len(jobs) == limit else None}


def is_final(status: str) -> bool:
    return status in FINAL


__all__ = ["FINAL", "IDEMPOTENCY_TTL_S", "MAX_KEY_CHARS", "JobCreated", "JobRequest", "create_job", "event_view",
           "get_job", "is_final", "job_events", "job_view", "list_jobs", "source_ref"]
