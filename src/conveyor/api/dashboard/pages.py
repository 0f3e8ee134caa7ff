"""The dashboard's pages (GET): runs, one run, its dead letters, the review queue, one review, one item's
journey, the workers. Each is one call of service/dashboard.py in the thread pool, rendered by a template; a
page with a ``live`` block is refreshed by static/dashboard.js through ``?fragment=1`` when its stream says it
changed (live.py), or every 2 s."""

from __future__ import annotations

import time
from typing import Annotated, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from conveyor.api.context import Scoped, Svc
from conveyor.api.dashboard.render import PageRoute, page
from conveyor.api.dashboard.session import Viewer, viewer
from conveyor.api.operations import Name, RowId
from conveyor.errors import Forbidden
from conveyor.service import dashboard
from conveyor.service import operations as ops
from conveyor.service.dashboard import RunsFilter
from conveyor.service.progress import AGE_CAP
from conveyor.service.selection import parse_time
from conveyor.service.workers import list_workers

router = APIRouter(route_class=PageRoute, include_in_schema=False)
TEXT = r"^[^\x00]*$"
Who = Annotated[Viewer, Depends(viewer)]


def page_view(svc: Svc, who: Who) -> Scoped:
    """The store as the page's viewer sees it (api/context.py's View, for a dashboard session)."""
    return Scoped(svc, who.caller)


View = Annotated[Scoped, Depends(page_view)]
Limit = Annotated[int, Query(ge=1, le=dashboard.MAX_PAGE)]
After = Annotated[int | None, Query(ge=0, le=2**63 - 1)]
Before = Annotated[float | None, Query(ge=0)]
Filter = Annotated[str | None, Query(min_length=1, max_length=1000, pattern=TEXT)]
Decided = Annotated[Literal["approved", "edited", "rejected"] | None, Query()]
Count = Annotated[int | None, Query(ge=0)]
WORKERS_SHOWN = 500


@router.get("/", response_class=HTMLResponse)
async def runs(request: Request, view: View, before: Before = None, limit: Limit = 20, pipeline: Filter = None,
               status: Filter = None, since: Filter = None, until: Filter = None) -> HTMLResponse:
    """The newest runs with their accepted and published items of expected and their failures and waits;
    ``?pipeline=``, ``?status=`` (a badge), ``?since=``/``?until=`` (dates) narrow them, ``?before=`` pages on."""
    only = runs_filter(pipeline, status, since, until)
    data = await view.call(ops.runs_page, limit, before, only)
    live = any(r["status"] != "finished" for r in data["runs"])
    shown = {k: v for k, v in (("pipeline", pipeline), ("status", status), ("since", since), ("until", until)) if v}
    return page(request, "runs.html", data=data, live=live, limit=limit, shown=shown, badges=dashboard.BADGES,
                filter_query=urlencode(shown))


def runs_filter(pipeline: str | None, status: str | None, since: str | None, until: str | None) -> RunsFilter:
    """The runs page's filter; a date alone in ``until`` means up to the end of that day (UTC)."""
    now = time.time()
    end = parse_time(until, "until", now)
    if end is not None and until is not None and len(until.strip()) == len("2026-12-01"):
        end += 86400.0
    return RunsFilter(pipeline or None, status or None, parse_time(since, "since", now), end)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run(request: Request, run_id: Name, view: View) -> HTMLResponse:
    """One run: per-stage counts, queued ages, outcomes (runs of up to 20,000 items), throughput and cost over
    time."""
    data = await view.call(ops.run_page, run_id)
    return page(request, "run.html", run=data, live=data["status"] != "finished", age_cap=AGE_CAP)


@router.get("/runs/{run_id}/dead-letters", response_class=HTMLResponse)
async def dead_letters(request: Request, run_id: Name, view: View, error_class: Filter = None,
                       after: After = None, limit: Limit = 50, replayed: Count = None) -> HTMLResponse:
    """A run's dead letters by error class, with a Replay button per entry and per class."""
    data = await view.call(ops.dead_letters_page, run_id, error_class, limit, after)
    return page(request, "dead_letters.html", data=data, limit=limit, replayed=replayed)


@router.get("/runs/{run_id}/items/{item_key:path}", response_class=HTMLResponse)
async def item(request: Request, run_id: Name, item_key: str, svc: Svc, view: View,
               offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> HTMLResponse:
    """One item's journey: its tasks stage by stage, their attempts, provenance and outputs."""
    data = await view.call(ops.item_page, svc.blobs, run_id, item_key, offset)
    return page(request, "item.html", item=data)


@router.get("/reviews", response_class=HTMLResponse)
async def reviews(request: Request, svc: Svc, view: View, run: Filter = None, stage: Filter = None,
                  reason: Filter = None, after: After = None, limit: Limit = 50, decided: Decided = None,
                  id: Count = None, many: Count = None, skipped: Count = None) -> HTMLResponse:
    """The open review queue, one line an entry (expandable), grouped by reason class, with Approve, Edit and
    Reject per entry, the same decisions on a selection, and keyboard shortcuts (static/reviews.js)."""
    data = await view.call(ops.reviews_page, svc.blobs, run, stage, limit, after, reason)
    return page(request, "reviews.html", data=data, limit=limit, decided=decided, decided_id=id, many=many,
                skipped=skipped)


@router.get("/reviews/{review_id}", response_class=HTMLResponse)
async def review(request: Request, review_id: RowId, svc: Svc, view: View) -> HTMLResponse:
    """One entry: its whole answer in a text area to edit, its attempts, and the three decisions."""
    data = await view.call(ops.review_page, svc.blobs, review_id)
    return page(request, "review.html", entry=data)


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request, svc: Svc, who: Who,
                  every: Annotated[bool, Query(alias="all")] = False) -> HTMLResponse:
    """The fleet (operators only, as ``GET /v1/workers``)."""
    if not who.caller.operator:
        raise Forbidden("the workers are an operator's view; log in with an operator token")
    data = await svc.call(list_workers, every, WORKERS_SHOWN + 1)
    rows = data["workers"]
    return page(request, "workers.html", workers=rows[:WORKERS_SHOWN], more=len(rows) > WORKERS_SHOWN, every=every,
                live=True)
