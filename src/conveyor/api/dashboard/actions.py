"""The dashboard's forms (POST): log in and out, replay dead letters, decide review entries.

The login form needs the CSRF value paired with its own cookie (so a page of another site cannot log a browser
in as the attacker's tenant). Each action needs the session's CSRF value and calls the service function its
API endpoint calls, with the same tenant rules (another tenant's entry is 404); a decision or replay is
recorded as by ``dashboard:<tenant>``. The browser is then sent back to the page it came from (303), told
what was done through a query parameter of fixed meaning (``?replayed=N``, ``?decided=approved&id=N``).
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from conveyor.api.context import Svc, services
from conveyor.api.dashboard.pages import View
from conveyor.api.dashboard.render import PageRoute, page
from conveyor.api.dashboard.session import (
    Viewer,
    check_csrf,
    clear_session,
    csrf_for,
    login_csrf_ok,
    login_key,
    safe_next,
    set_login_key,
    set_session,
    viewer,
)
from conveyor.api.operations import Name, RowId
from conveyor.api.settings import MAX_JSON
from conveyor.errors import Unauthorized, UserError
from conveyor.service import operations as ops
from conveyor.service.dashboard import MAX_PAGE
from conveyor.service.tokens import authenticate

# A form is a handful of fields (a selection of review entries: one a page's entry) and no file; a review's
# edited fields may be large (the 16 MiB body limit).
router = APIRouter(route_class=PageRoute, include_in_schema=False,
                   form_limits={"max_files": 0, "max_fields": 16 + MAX_PAGE, "max_part_size": MAX_JSON})
TEXT = r"^[^\x00]*$"
Who = Annotated[Viewer, Depends(viewer)]
Csrf = Annotated[str | None, Form(max_length=200)]
Why = Annotated[str, Form(max_length=10_000, pattern=TEXT)]
Next = Annotated[str | None, Form(max_length=2000)]
LOGIN_REASONS = {"revoked": "That token was revoked; log in with another.",
                 "unknown": "Your session's token is no longer known; log in again."}
STALE_LOGIN = ("This login form's check failed (the form is stale, came from another site, or the browser keeps "
               "no cookies); enter your token again.")


# --- login -----------------------------------------------------------------------------------------------

@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: Annotated[str | None, Query(max_length=2000)] = None,
                     reason: Annotated[str | None, Query(max_length=20)] = None) -> Response:
    if not services(request).settings.auth:
        return RedirectResponse(safe_next(next), status_code=303)
    return _login_page(request, 200, next, LOGIN_REASONS.get(reason or ""))


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, svc: Svc, token: Annotated[str, Form(max_length=500)], next: Next = None,
                csrf: Csrf = None) -> Response:
    """Check the form's CSRF value, then the token; a good one is set as the session cookie."""
    if not login_csrf_ok(request, csrf):
        return _login_page(request, 403, next, STALE_LOGIN)
    token = token.strip()
    try:
        await svc.call(authenticate, f"Bearer {token}")
    except Unauthorized as exc:
        return _login_page(request, 401, next, str(exc))
    response = RedirectResponse(safe_next(next), status_code=303)
    set_session(request, response, token)
    return response


def _login_page(request: Request, status: int, next: str | None, message: str | None) -> Response:
    """The login form, with its CSRF value and the cookie that value is paired with."""
    key = login_key(request)
    response = page(request, "login.html", status=status, next=safe_next(next), message=message,
                    csrf=csrf_for(key.encode()))
    set_login_key(request, response, key)
    return response


@router.post("/logout")
async def logout(who: Who, csrf: Csrf = None) -> Response:
    check_csrf(who, csrf)
    response = RedirectResponse("/login", status_code=303)
    clear_session(response)
    return response


# --- dead letters ----------------------------------------------------------------------------------------

@router.post("/runs/{run_id}/dead-letters/{dead_letter_id}/replay")
async def replay_dead_letter(run_id: Name, dead_letter_id: RowId, who: Who, view: View, csrf: Csrf = None) -> Response:
    """Queue one dead letter's task again (``dlq_replay_entry``, as ``POST /v1/dead-letters/{id}/replay``)."""
    check_csrf(who, csrf)
    done = await view.call(ops.replay_dead_letter, dead_letter_id, f"replayed from the dashboard by {who.by}")
    return _back(f"/runs/{quote(run_id, safe='')}/dead-letters", replayed=done["replayed"])


@router.post("/runs/{run_id}/dead-letters/replay")
async def replay_class(run_id: Name, who: Who, view: View, csrf: Csrf = None,
                       error_class: Annotated[str | None, Form(max_length=1000, pattern=TEXT)] = None) -> Response:
    """Queue again every dead letter of the run (of ``error_class``, when given) not replayed yet."""
    check_csrf(who, csrf)
    reason = f"replayed from the dashboard by {who.by}" + (f" (error class {error_class})" if error_class else "")
    done = await view.call(ops.replay_class, run_id, error_class or None, reason)
    return _back(f"/runs/{quote(run_id, safe='')}/dead-letters", replayed=done["replayed"])


# --- the review queue ------------------------------------------------------------------------------------

@router.post("/reviews/{review_id}/approve")
async def approve(review_id: RowId, svc: Svc, who: Who, view: View, csrf: Csrf = None, why: Annotated[str | None, Form(
        max_length=10_000, pattern=TEXT)] = None, next: Next = None) -> Response:
    check_csrf(who, csrf)
    await view.call(ops.approve, svc.blobs, review_id, who.by, why or None)
    return _back(safe_next(next or "/reviews"), decided="approved", id=review_id)


@router.post("/reviews/{review_id}/edit")
async def edit(review_id: RowId, svc: Svc, who: Who, view: View,
               fields: Annotated[str, Form(min_length=1, max_length=1_000_000, pattern=TEXT)], csrf: Csrf = None,
               why: Annotated[str | None, Form(max_length=10_000, pattern=TEXT)] = None) -> Response:
    """Accept the answer with the edited fields (a JSON object merged over it, checked by the stage's schema)."""
    check_csrf(who, csrf)
    await view.call(ops.edit, svc.blobs, review_id, fields, who.by, why or None)
    return _back("/reviews", decided="edited", id=review_id)


@router.post("/reviews/{review_id}/reject")
async def reject(review_id: RowId, who: Who, view: View, why: Why, csrf: Csrf = None,
                 next: Next = None) -> Response:
    check_csrf(who, csrf)
    await view.call(ops.reject, review_id, why, who.by)
    return _back(safe_next(next or "/reviews"), decided="rejected", id=review_id)


@router.post("/reviews/decide")
async def decide_selected(svc: Svc, who: Who, view: View,
                          decision: Annotated[Literal["approve", "reject"], Form()],
                          ids: Annotated[list[int], Form(max_length=MAX_PAGE)], csrf: Csrf = None,
                          why: Annotated[str | None, Form(max_length=10_000, pattern=TEXT)] = None,
                          next: Next = None) -> Response:
    """Approve or reject the selected entries (a rejection needs its reason); an entry decided meanwhile is
    skipped and counted (``?skipped=N``), the others are decided."""
    check_csrf(who, csrf)
    if any(i < 1 for i in ids):
        raise UserError("review ids are positive whole numbers")
    done = await view.call(ops.decide_many, svc.blobs, ids, decision, who.by, why or None)
    told = "approved" if decision == "approve" else "rejected"
    return _back(safe_next(next or "/reviews"), decided=told, many=len(done["decided"]), skipped=len(done["skipped"]))


def _back(path: str, **told: object) -> RedirectResponse:
    """To ``path`` (a page of this site), telling it what was done."""
    base, _, query = path.partition("?")
    kept = [part for part in query.split("&") if part and part.split("=")[0] not in {*told, "fragment"}]
    return RedirectResponse(f"{base}?{'&'.join([*kept, urlencode(told)])}", status_code=303)
