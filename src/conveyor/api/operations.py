"""Operations: runs (status, reconciliation), the review queue, dead letters and replays.

Each answer is the JSON its command prints with ``--json`` (``conveyor status RUN``, ``reconcile``, ``review
...``, ``dlq ...``, ``replay``), made by the same service function. An operator token (or ``--no-auth``) sees
every run; a tenant's token sees the runs of its own jobs, and another's run, review or dead letter is 404.
A decision or replay made here is recorded as by ``api:<tenant>``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.context import Svc, View
from conveyor.service import operations as ops
from conveyor.service.records import SampleOptions
from conveyor.service.replay import ReplayOptions
from conveyor.service.tokens import Caller

router = APIRouter(prefix="/v1", tags=["operations"])
# Text the store keeps: PostgreSQL refuses NUL in text, so it is refused here as a bad request.
TEXT = r"^[^\x00]*$"
Name = Annotated[str, Path(min_length=1, max_length=1000, pattern=TEXT)]
RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
Filter = Annotated[str | None, Query(min_length=1, max_length=1000, pattern=TEXT)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Every = Annotated[bool, Query(alias="all", description="decided (or replayed) entries too")]
_PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}
_JSON: dict[str, Any] = {"content": {"application/json": {"schema": {"type": "object"}}},
                         "description": "as the command line's --json"}
NOT_FOUND: dict[int | str, dict[str, Any]] = {200: _JSON, 404: _PROBLEM, 422: _PROBLEM}
DECIDED: dict[int | str, dict[str, Any]] = {200: _JSON, 404: _PROBLEM, 409: _PROBLEM, 422: _PROBLEM}


def _json(data: dict[str, Any]) -> Response:
    """The body exactly as the command line prints it with ``--json``."""
    return Response(json.dumps(data, default=str), media_type="application/json")


def by(who: Caller) -> str:
    return f"api:{who.tenant}"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Decision(_Body):
    why: str | None = Field(None, max_length=10_000, pattern=TEXT, description="why; recorded with the decision")


class Edit(Decision):
    fields: dict[str, Any] = Field(min_length=1, description="the corrected fields, merged over the answer and "
                                                             "checked against the stage's schema")


class Rejection(_Body):
    why: str = Field(min_length=1, max_length=10_000, pattern=TEXT, description="why; recorded with the item")


class DeadLetterReplay(_Body):
    reason: str | None = Field(None, min_length=1, max_length=10_000, pattern=TEXT,
                               description="why; recorded with the dead letter")


Names = list[Annotated[str, Field(min_length=1, max_length=1000, pattern=TEXT)]]


class ReplayIn(_Body):
    """What ``conveyor replay`` takes as options (``runs`` for ``--run``, and so on)."""

    reason: Literal["retry", "reprocess", "source-corrected", "manual"] = Field(description="recorded on every "
                                                                                  "task it re-opens")
    runs: Names = Field(default_factory=list, max_length=1000, description="default: every run (operators only)")
    stages: Names = Field(default_factory=list, max_length=100)
    statuses: Names = Field(default_factory=list, max_length=20, description="task statuses (default: any)")
    error_classes: Names = Field(default_factory=list, max_length=100)
    note: str | None = Field(None, max_length=10_000, pattern=TEXT, description="more about why")
    downstream: bool = Field(False, description="also make again everything after each re-opened task")
    dry_run: bool = Field(False, description="change nothing; say what would run and what it would cost")


# --- runs ------------------------------------------------------------------------------------------------

@router.get("/runs", responses={200: _JSON})
async def list_runs(view: View, limit: Annotated[int, Query(ge=1, le=200)] = 20) -> Response:
    """The newest runs, each as ``conveyor status --json`` lists it (``{"runs": [...]}``)."""
    return _json(await view.call(ops.list_runs, limit))


@router.get("/runs/{run_id}", responses=NOT_FOUND)
async def run_status(run_id: Name, view: View) -> Response:
    """One run's per-stage progress and outcomes, as ``conveyor status RUN --json``."""
    return _json(await view.call(ops.run_status, run_id))


@router.get("/runs/{run_id}/reconcile", responses=NOT_FOUND)
async def reconcile_run(run_id: Name, svc: Svc, view: View,
                        sample: Annotated[int, Query(ge=0, le=1000, description="accepted records per slice value "
                                                     "in the quality sample")] = 3,
                        slices: Annotated[list[str] | None, Query(alias="slice", description="also slice the "
                                                                  "sample by this field (dotted path); repeatable")]
                        = None,
                        seed: Annotated[str | None, Query(description="the sample's seed (default: the run id)")]
                        = None) -> Response:
    """Every expected item with its outcome, as ``conveyor reconcile RUN --json`` (same options)."""
    options = SampleOptions(sample, tuple(slices or ()), seed)
    return _json(await view.call(ops.reconcile, svc.blobs, run_id, options))


# --- the review queue ------------------------------------------------------------------------------------

@router.get("/reviews", responses={200: _JSON, 422: _PROBLEM})
async def list_reviews(view: View, run: Filter = None, stage: Filter = None, all_: Every = False,
                       limit: Limit = 1000) -> Response:
    """Entries waiting for a decision, as ``conveyor review list --json``."""
    return _json(await view.call(ops.reviews, run, stage, all_, limit))


@router.get("/reviews/{review_id}", responses=NOT_FOUND)
async def show_review(review_id: RowId, svc: Svc, view: View) -> Response:
    """One entry with its answer and attempts, as ``conveyor review show ID --json``."""
    return _json(await view.call(ops.review_show, svc.blobs, review_id))


@router.post("/reviews/{review_id}/approve", responses=DECIDED)
async def approve_review(review_id: RowId, svc: Svc, view: View, body: Decision | None = None) -> Response:
    """Accept the answer as it is; its item goes on. 409 when the entry was decided already."""
    why = body.why if body else None
    return _json(await view.call(ops.approve, svc.blobs, review_id, by(view.who), why))


@router.post("/reviews/{review_id}/edit", responses=DECIDED)
async def edit_review(review_id: RowId, body: Edit, svc: Svc, view: View) -> Response:
    """Accept the answer with corrected fields (422 when they break the stage's schema; 409 when decided)."""
    fields = json.dumps(body.fields)
    return _json(await view.call(ops.edit, svc.blobs, review_id, fields, by(view.who), body.why))


@router.post("/reviews/{review_id}/reject", responses=DECIDED)
async def reject_review(review_id: RowId, body: Rejection, view: View) -> Response:
    """Refuse the answer: its item ends rejected. 409 when the entry was decided already."""
    return _json(await view.call(ops.reject, review_id, body.why, by(view.who)))


# --- dead letters and replays ----------------------------------------------------------------------------

@router.get("/dead-letters", responses={200: _JSON, 422: _PROBLEM})
async def list_dead_letters(view: View, run: Filter = None, stage: Filter = None,
                            error_class: Filter = None, all_: Every = False, limit: Limit = 1000) -> Response:
    """Dead-lettered tasks, oldest first, as ``conveyor dlq list --json``."""
    return _json(await view.call(ops.dead_letters, run, stage, error_class, all_, limit))


@router.get("/dead-letters/{dead_letter_id}", responses=NOT_FOUND)
async def show_dead_letter(dead_letter_id: RowId, view: View) -> Response:
    """One dead letter with its full error and every attempt, as ``conveyor dlq show ID --json``."""
    return _json(await view.call(ops.dead_letter, dead_letter_id))


@router.post("/dead-letters/{dead_letter_id}/replay", responses=DECIDED)
async def replay_dead_letter(dead_letter_id: RowId, view: View, body: DeadLetterReplay | None = None) -> Response:
    """Queue the task again with a fresh attempt budget, as ``conveyor dlq replay ID --json``; 409 when it
    was replayed already."""
    reason = body.reason if body and body.reason else f"replayed through the API by {by(view.who)}"
    return _json(await view.call(ops.replay_dead_letter, dead_letter_id, reason))


@router.post("/replays", responses={200: _JSON, 404: _PROBLEM, 422: _PROBLEM})
async def replay_tasks(body: ReplayIn, svc: Svc, view: View) -> Response:
    """Re-open the tasks a selection names, as ``conveyor replay --json`` (a tenant names its own runs)."""
    options = ReplayOptions(body.reason, body.note, body.downstream, body.dry_run, by(view.who))
    return _json(await view.call(ops.replay_selection, svc.blobs, body.runs, body.stages, body.statuses,
                                 body.error_classes, options))
