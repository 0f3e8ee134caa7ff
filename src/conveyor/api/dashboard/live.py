"""Live pages: a Server-Sent Events stream that says when a page's content changed.

The runs list, a run's page and the workers page subscribe (static/dashboard.js, ``data-changes``): the stream
sends ``changed`` when the page's change key moves (service/dashboard.py ``change_key``: the runs' status and
running totals, a few rows read a second, whatever the run's size; service/workers.py ``workers_change_key``:
the workers shown, their state, beats and task counts), and the browser then fetches the page's ``live`` block once
(``?fragment=1``). A quiet run costs the server no page render and the browser no fetch; a busy one is
fetched at most once a second. The stream says ``end`` when a run is over (its page no longer changes), sends
a keep-alive comment while nothing happens, and ends when the session's token is revoked (the browser's
reconnection is then sent to the login form) or the browser leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from conveyor.api.context import Services, Svc
from conveyor.api.dashboard.pages import WORKERS_SHOWN, View, Who
from conveyor.api.dashboard.render import PageRoute
from conveyor.api.operations import Name
from conveyor.errors import Forbidden
from conveyor.service import operations as ops
from conveyor.service.tokens import Caller, still_valid
from conveyor.service.workers import workers_change_key

router = APIRouter(route_class=PageRoute, include_in_schema=False)
TICK_S = 1.0  # how often the change key is read: the page is at most this far behind
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.get("/changes")
async def runs_changes(request: Request, svc: Svc, view: View) -> StreamingResponse:
    """``changed`` whenever the runs list (the newest runs the viewer sees) changes."""
    await view.call(ops.change_key, None)
    return _stream(_changes(request, svc, view.who, lambda: view.call(ops.change_key, None)))


@router.get("/runs/{run_id}/changes")
async def run_changes(request: Request, run_id: Name, svc: Svc, view: View) -> StreamingResponse:
    """``changed`` whenever the run's page changes; ``end`` once the run is over (another tenant's run: 404)."""
    await view.call(ops.change_key, run_id)
    return _stream(_changes(request, svc, view.who, lambda: view.call(ops.change_key, run_id),
                            lambda: view.call(ops.run_over, run_id)))


@router.get("/workers/changes")
async def workers_changes(request: Request, svc: Svc, who: Who,
                          every: Annotated[bool, Query(alias="all")] = False) -> StreamingResponse:
    """``changed`` whenever the workers page changes (operators only, as the page)."""
    if not who.caller.operator:
        raise Forbidden("the workers are an operator's view; log in with an operator token")
    return _stream(_changes(request, svc, who.caller,
                            lambda: svc.call(workers_change_key, every, WORKERS_SHOWN + 1)))


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)


async def _changes(request: Request, svc: Services, who: Caller, key_now: Callable[[], Awaitable[str]],
                   over: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last = await key_now()
    quiet_since = time.monotonic()
    while True:
        await asyncio.sleep(TICK_S)
        if await request.is_disconnected() or not await svc.call(still_valid, who):
            return
        key = await key_now()
        if key != last:
            last, quiet_since = key, time.monotonic()
            yield "event: changed\ndata: {}\n\n"
            continue
        if over is not None and await over():
            yield "event: end\ndata: {}\n\n"
            return
        if time.monotonic() - quiet_since >= svc.settings.sse_keepalive_s:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
