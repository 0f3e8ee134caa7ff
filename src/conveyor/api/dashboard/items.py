"""The console's items page and the actions on its selection.

``GET /runs/{run_id}/items`` is a run's tasks as a table, filtered by the query string (``outcome``, ``stage``,
``status``, ``error_class``, ``where``, ``review``, ``prefix``, ``text``: the URL is the filter, so a page can
be linked), paged by ``?after=TASK_ID``; with only ``key``, it is the run page's "find an item" box and sends the
browser to that item's page. ``GET /runs/{run_id}/selection?action=replay|approve|reject`` is the dry run of an
action on the whole selection (count and forecast) with the form that does it; ``POST
/runs/{run_id}/selection/{action}`` does it (the session's CSRF value, the viewer's tenant, as every action),
through the service functions of `conveyor replay` and `conveyor review`, and goes back to the items page
with ``?acted=ACTION&count=N``.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from conveyor.api.context import Svc
from conveyor.api.dashboard.pages import View
from conveyor.api.dashboard.render import PageRoute, page
from conveyor.api.dashboard.session import Viewer, check_csrf, viewer
from conveyor.api.operations import Name
from conveyor.service import operations as ops
from conveyor.service.dashboard import MAX_PAGE
from conveyor.service.itemtable import ItemQuery
from conveyor.service.replay import REASONS
from conveyor.service.selection import OUTCOMES, REVIEW_STATES, STATUSES

router = APIRouter(route_class=PageRoute, include_in_schema=False,
                   form_limits={"max_files": 0, "max_fields": 16, "max_part_size": 100_000})
TEXT = r"^[^\x00]*$"
Who = Annotated[Viewer, Depends(viewer)]
Text = Annotated[str | None, Query(max_length=1000, pattern=TEXT)]
Field = Annotated[str | None, Form(max_length=1000, pattern=TEXT)]
Action = Literal["replay", "approve", "reject"]
Reason = Literal["retry", "reprocess", "manual"]


def filter_of(outcome: Text = None, stage: Text = None, status: Text = None, error_class: Text = None,
              where: Text = None, review: Text = None, prefix: Text = None, text: Text = None) -> ItemQuery:
    """The items filter a page's query string names (blank fields: no condition)."""
    return ItemQuery(outcome or None, stage or None, status or None, error_class or None, where or None,
                     review or None, prefix or None, text or None)


def form_filter(outcome: Field = None, stage: Field = None, status: Field = None, error_class: Field = None,
                where: Field = None, review: Field = None, prefix: Field = None, text: Field = None) -> ItemQuery:
    """The same filter, carried by an action's form."""
    return filter_of(outcome, stage, status, error_class, where, review, prefix, text)


Filtered = Annotated[ItemQuery, Depends(filter_of)]
FormFiltered = Annotated[ItemQuery, Depends(form_filter)]


@router.get("/runs/{run_id}/items", response_class=HTMLResponse)
async def items(request: Request, run_id: Name, view: View, query: Filtered, key: Text = None,
                after: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
                limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                acted: Annotated[Action | None, Query()] = None,
                count: Annotated[int | None, Query(ge=0)] = None) -> Response:
    """A page of the run's tasks the filter selects, each linked to its item's page."""
    if key:
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}/items/{quote(key, safe='')}", status_code=303)
    data = await view.call(ops.items_page, run_id, query, limit, after)
    return page(request, "items.html", data=data, limit=limit, acted=acted, count=count, outcomes=OUTCOMES,
                statuses=STATUSES, review_states=REVIEW_STATES, filter_query=urlencode(query.params()))


@router.get("/runs/{run_id}/selection", response_class=HTMLResponse)
async def preview(request: Request, run_id: Name, svc: Svc, view: View, query: Filtered, action: Action,
                  reason: Annotated[Reason, Query()] = "retry") -> Response:
    """What the action would do to the whole selection (a dry run: nothing is written), and its form."""
    data = await view.call(ops.bulk_preview, svc.blobs, run_id, query, action, reason)
    return page(request, "selection.html", data=data, reason=reason, reasons=REASONS,
                filter_query=urlencode(query.params()))


@router.post("/runs/{run_id}/selection/{action}")
async def act(run_id: Name, action: Action, svc: Svc, who: Who, view: View, query: FormFiltered,
              csrf: Annotated[str | None, Form(max_length=200)] = None,
              why: Annotated[str | None, Form(max_length=10_000, pattern=TEXT)] = None,
              expected: Annotated[int | None, Form(ge=0)] = None,
              reason: Annotated[Reason, Form()] = "retry") -> Response:
    """Replay, approve or reject every task the filter selects; back to the items page, told how many."""
    check_csrf(who, csrf)
    note = why or f"from the console by {who.by}"
    done = await view.call(ops.bulk_act, svc.blobs, run_id, query, action, who.by,
                           note if action == "replay" else why, expected, reason)
    told = urlencode({**query.params(), "acted": action, "count": done["count"]})
    return RedirectResponse(f"/runs/{quote(run_id, safe='')}/items?{told}", status_code=303)

