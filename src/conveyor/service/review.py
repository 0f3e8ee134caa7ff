"""The review queue, for the CLI and the API: list, show, approve, edit, reject, expire.

A decision needs the pipeline that made the answer (an approved record continues down it), so it is
loaded from the run's TARGET. Reading the queue changes nothing and loads no pipeline: an entry past its
deadline stays open until a worker of its pipeline (as it keeps its leases) or ``expire_deadlines``
(`conveyor review expire`) applies the outcome recorded with it. ``tenant`` (the API's tenant callers)
narrows every call to the entries of that tenant's jobs: another's is NotFound.
"""

from __future__ import annotations

import getpass
import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from conveyor.acceptance.judge import shape_problem
from conveyor.blobs import Blobs
from conveyor.errors import ConveyorError, NotFound, StateConflict, UserError
from conveyor.pipeline import Pipeline
from conveyor.runtime.target import load_target
from conveyor.runtime.transitions import ReviewTaken, Transitions
from conveyor.runtime.values import Ref, encode, load_value, store_value
from conveyor.service.report import find_run
from conveyor.service.tenancy import visible
from conveyor.store import SqlStore
from conveyor.store.reviews import ReviewEntry

DECISIONS = ("approved", "edited", "rejected")
EXPIRE_BATCH = 200


def reviewer() -> str:
    """Who decides, unless told: CONVEYOR_REVIEWER, else the login name."""
    try:
        return os.environ.get("CONVEYOR_REVIEWER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def expire_deadlines(store: SqlStore, run_id: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Apply passed deadlines (`conveyor review expire`), run by run: each entry takes the outcome recorded
    with it. A run whose pipeline cannot be loaded (its file moved, say) is reported with why, its entries
    left open, and the other runs proceed."""
    now = store.clock() if now is None else now
    if run_id is not None:
        find_run(store, run_id)
    runs = [_expire_run(store, run, due, now) for run, due in _due_by_run(store, now, run_id).items()]
    decided: Counter[str] = Counter()
    for run_report in runs:
        decided.update(run_report["decided"])
    return {"now": now, "runs": runs, "decided": dict(sorted(decided.items())),
            "not_applicable": sum(r["not_applicable"] for r in runs)}


class _Due(NamedTuple):
    pipeline: str
    stages: frozenset[str]
    entries: int


def _due_by_run(store: SqlStore, now: float, run_id: str | None) -> dict[str, _Due]:
    found: dict[str, _Due] = {}
    for run, pipeline, stage, count in store.due_review_counts(now, run_id):
        seen = found.get(run, _Due(pipeline, frozenset(), 0))
        found[run] = _Due(pipeline, seen.stages | {stage}, seen.entries + count)
    return found


def review_list(store: SqlStore, run_id: str | None = None, stage: str | None = None,
                include_decided: bool = False, limit: int = 1000, now: float | None = None,
                tenant: str | None = None, after: int | None = None, reason_class: str | None = None
                ) -> dict[str, Any]:
    """The queue by id (``after``: the entries after that id, the next page). Reads only: ``overdue`` counts
    the listed open entries past their deadline, which a worker or `conveyor review expire` decides."""
    now = store.clock() if now is None else now
    if tenant is None:
        entries = store.reviews(run_id, stage, include_decided, limit, after, reason_class)
    else:
        entries = store.tenant_reviews(tenant, run_id, stage, include_decided, limit, after, reason_class)
    return {"reviews": [_summary(e) for e in entries],
            "overdue": sum(1 for e in entries if e.open and e.deadline_at <= now)}


def review_reasons(store: SqlStore, run_id: str | None = None, stage: str | None = None,
                   tenant: str | None = None) -> list[dict[str, Any]]:
    """The open queue's entries counted by reason class (``low_confidence``, ``invalid_content``...), largest
    first: what a reviewer can take one kind at a time."""
    rows = (store.review_reasons(run_id, stage) if tenant is None
            else store.tenant_review_reasons(tenant, run_id, stage))
    return [{"reason_class": reason, "open": count} for reason, count in rows]


def decide_many(store: SqlStore, blobs: Blobs, ids: Sequence[int], decision: str, by: str | None = None,
                why: str | None = None, tenant: str | None = None) -> dict[str, Any]:
    """Approve or reject each of ``ids``; an entry decided meanwhile (by another reviewer, or twice here) or not
    the caller's is skipped with why, and the others are decided: a selection is never half refused."""
    if decision not in ("approve", "reject"):
        raise UserError(f"decision {decision!r} is not one; use approve or reject")
    if decision == "reject" and (not why or not why.strip()):
        raise UserError("a rejection needs a reason; it is recorded with each item")
    by = by or reviewer()
    decided: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for review_id in dict.fromkeys(ids):  # each once, in the order given
        try:
            done = (approve(store, blobs, [review_id], by, why, None, tenant) if decision == "approve"
                    else reject(store, [review_id], why or "", by, None, tenant))
        except (StateConflict, NotFound) as exc:
            skipped.append({"id": review_id, "why": str(exc)})
            continue
        decided += done["decided"]
    return {"decided": decided, "skipped": skipped, "by": by, "why": why}


def review_show(store: SqlStore, blobs: Blobs, review_id: int, tenant: str | None = None) -> dict[str, Any]:
    entry = _entry(store, review_id, tenant)
    return _summary(entry) | {"candidate": _candidate(entry, blobs), "edits": _json(entry.edits),
                              "attempts": store.task_attempts(entry.task_id, entry.run_id)}


def review_candidate(store: SqlStore, blobs: Blobs, review_id: int, tenant: str | None = None) -> Any:
    """One entry's answer, as ``review_show`` gives it (``candidate``), without reading its attempts."""
    return _candidate(_entry(store, review_id, tenant), blobs)


def approve(store: SqlStore, blobs: Blobs, ids: Sequence[int], by: str | None = None, why: str | None = None,
            now: float | None = None, tenant: str | None = None) -> dict[str, Any]:
    """Accept candidates as they are; their items continue down the pipeline."""
    by = by or reviewer()
    decided = []
    for review_id in ids:
        entry = _open(store, review_id, tenant)
        output = Ref(entry.candidate_kind, entry.candidate_digest, entry.candidate_size, entry.candidate_inline)
        decided.append(_decide(store, entry, "approved", by, why, output, None, now))
    return {"decided": decided, "by": by, "why": why}


def edit(store: SqlStore, blobs: Blobs, review_id: int, fields: str, by: str | None = None, why: str | None = None,
         now: float | None = None, tenant: str | None = None) -> dict[str, Any]:
    """Accept a candidate with corrected fields (a JSON object merged over it, checked against the
    stage's schema); the item continues down the pipeline with the corrected record."""
    by = by or reviewer()
    entry = _open(store, review_id, tenant)
    changes = _fields(fields)
    candidate = _candidate(entry, blobs)
    if not isinstance(candidate, dict):
        raise UserError(f"review {review_id}: the answer is not an object ({type(candidate).__name__}); approve or "
                        "reject it")
    record = _shaped(_pipeline(store, entry), entry.stage, {**candidate, **changes})
    output = store_value(*encode(record), blobs)
    edits = json.dumps(changes, sort_keys=True, ensure_ascii=False)
    return {"decided": [_decide(store, entry, "edited", by, why, output, edits, now)], "by": by, "why": why}


def reject(store: SqlStore, ids: Sequence[int], why: str, by: str | None = None,
           now: float | None = None, tenant: str | None = None) -> dict[str, Any]:
    if not why or not why.strip():
        raise UserError("a rejection needs --why \"reason\"; it is recorded with the item")
    by = by or reviewer()
    decided = [_decide(store, _open(store, review_id, tenant), "rejected", by, why, None, None, now)
               for review_id in ids]
    return {"decided": decided, "by": by, "why": why}


# --- helpers -------------------------------------------------------------------------------------------

def _decide(store: SqlStore, entry: ReviewEntry, decision: str, by: str, why: str | None, output: Ref | None,
            edits: str | None, now: float | None) -> dict[str, Any]:
    transitions = _transitions(store, entry)
    try:
        queued = transitions.decide(entry, decision, by, why, store.clock() if now is None else now, output, edits)
    except ReviewTaken:
        raise StateConflict(f"review {entry.id} was decided meanwhile; `conveyor review show {entry.id}` says how") \
            from None
    return {"id": entry.id, "run_id": entry.run_id, "item_key": entry.item_key, "stage": entry.stage,
            "decision": decision, "queued": queued}


def _transitions(store: SqlStore, entry: ReviewEntry) -> Transitions:
    return Transitions(_pipeline(store, entry), store, worker=f"review:{os.getpid()}")


def _pipeline(store: SqlStore, entry: ReviewEntry) -> Pipeline:
    try:
        return _run_pipeline(store, entry.run_id)
    except NotFound as exc:
        raise NotFound(f"review {entry.id}: {exc}") from None
    except UserError as exc:
        raise UserError(f"review {entry.id} cannot be decided: {exc}") from None


def _run_pipeline(store: SqlStore, run_id: str) -> Pipeline:
    """The pipeline a run was made with, loaded from its TARGET (NotFound, or a UserError that says why not)."""
    run = store.get_run(run_id)
    if run is None:
        raise NotFound(f"its run {run_id!r} is not in this store")
    try:
        return load_target(run.target)
    except UserError as exc:
        raise UserError(f"its pipeline ({run.target}) cannot be loaded: {exc}") from None
    except Exception as exc:  # a module that fails to import its own way (a file target's failures are wrapped)
        raise UserError(f"its pipeline ({run.target}) cannot be loaded: {type(exc).__name__}: {exc}") from None


def _expire_run(store: SqlStore, run_id: str, due: _Due, now: float) -> dict[str, Any]:
    """One run's passed deadlines applied, or why they cannot be (``reason``, one line)."""
    report: dict[str, Any] = {"run_id": run_id, "pipeline": due.pipeline, "due": due.entries, "decided": {},
                              "not_applicable": 0, "reason": None}
    try:
        pipeline = _run_pipeline(store, run_id)
        _check_stages(pipeline, due)
    except ConveyorError as exc:
        return report | {"not_applicable": due.entries, "reason": str(exc).splitlines()[0]}
    transitions = Transitions(pipeline, store, worker=f"review:{os.getpid()}")
    decided: Counter[str] = Counter()
    while True:  # in batches; one that decides fewer than it read is the last (the rest were decided meanwhile)
        done = transitions.expire_reviews(now, EXPIRE_BATCH, run_id)
        decided.update(done)
        if sum(done.values()) < EXPIRE_BATCH:
            break
    return report | {"decided": dict(sorted(decided.items()))}


def _check_stages(pipeline: Pipeline, due: _Due) -> None:
    """The loaded pipeline still has the entries' pipeline name and stages (the file may have changed since)."""
    if pipeline.name != due.pipeline:
        raise UserError(f"its pipeline file now declares {pipeline.name!r}, not {due.pipeline!r}")
    missing = sorted(due.stages - {s.name for s in pipeline})
    if missing:
        raise UserError(f"its pipeline no longer has stage {missing[0]!r}")


def _entry(store: SqlStore, review_id: int, tenant: str | None = None) -> ReviewEntry:
    entry = store.review(review_id)
    if entry is None or not visible(store, tenant, entry.run_id):
        raise NotFound(f"no review {review_id}; `conveyor review list` shows the open ones")
    return entry


def _open(store: SqlStore, review_id: int, tenant: str | None = None) -> ReviewEntry:
    entry = _entry(store, review_id, tenant)
    if not entry.open:
        raise StateConflict(f"review {review_id} was already decided ({entry.decision} by {entry.decided_by}); "
                            "nothing to do")
    return entry


def _fields(text: str) -> dict[str, Any]:
    try:
        changes = json.loads(text)
    except ValueError as exc:
        raise UserError(f"--fields is not JSON ({exc}); give an object, e.g. '{{\"title\": \"ls\"}}'") from None
    if not isinstance(changes, dict) or not changes:
        raise UserError("--fields must be a non-empty JSON object of the fields to correct, e.g. '{\"title\": \"ls\"}'")
    return changes


def _shaped(pipeline: Pipeline, stage: str, record: dict[str, Any]) -> Any:
    accept = pipeline[stage].accept
    if accept is None or accept.schema is None:
        return record
    from pydantic import ValidationError

    try:  # fields the schema does not declare (an Answer's known fields) are kept as they were
        return {**record, **accept.schema.model_validate(record).model_dump(mode="json")}
    except ValidationError as exc:
        raise UserError(f"the edited record does not fit stage {stage!r}'s schema: "
                        f"{shape_problem(exc, 'the record')}; correct --fields") from None


def _candidate(entry: ReviewEntry, blobs: Blobs) -> Any:
    ref = Ref(entry.candidate_kind, entry.candidate_digest, entry.candidate_size, entry.candidate_inline)
    value = load_value(ref, blobs)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _summary(e: ReviewEntry) -> dict[str, Any]:
    return {"id": e.id, "run_id": e.run_id, "item_key": e.item_key, "stage": e.stage, "reason_class": e.reason_class,
            "reason": e.reason, "confidence": e.confidence, "tier": e.tier, "created_at": e.created_at,
            "deadline_at": e.deadline_at, "on_deadline": e.on_deadline,
            "status": "open" if e.open else e.decision, "decided_at": e.decided_at, "decided_by": e.decided_by,
            "why": e.why}
