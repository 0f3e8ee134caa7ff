"""Live pages: a Server-Sent Events stream that says when a page's content changed.

The runs list and a run's page subscribe (static/dashboard.js, ``data-changes``): the stream sends ``changed``
when the page's change key moves (service/dashboard.py ``change_key``: the runs' status and running totals, a
few rows read a second, whatever the run's size), and the browser then fetches the page's ``live`` block once
(``?fragment=1``). A quiet run costs the server no page render and the browser no fetch; a busy one is
fetched at most once a second. The stream says ``end`` when a run is over (its page no longer changes), sends
a keep-alive comment while nothing happens, and ends when the session's token is revoked (the browser's
reconnection is then sent to the login form) or the browser leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from conveyor.api.context import Services, Svc
from conveyor.api.dashboard.pages import View
from conveyor.api.dashboard.render import PageRoute
from conveyor.api.operations import Name
from conveyor.service import operations as ops
from conveyor.service.tokens import still_valid

router = APIRouter(route_class=PageRoute, include_in_schema=False)
TICK_S = 1.0  # how often the change key is read: the page is at most this far behind
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.get("/changes")
async def runs_changes(request: Request, svc: Svc, view: View) -> StreamingResponse:
    """``changed`` whenever the runs list (the newest runs the viewer sees) changes."""
    await view.call(ops.change_key, None)
    return StreamingResponse(_changes(request, svc, view, None), media_type="text/event-stream", headers=HEADERS)


@router.get("/runs/{run_id}/changes")
async def run_changes(request: Request, run_id: Name, svc: Svc, view: View) -> StreamingResponse:
    """``changed`` whenever the run's page changes; ``end`` once the run is over (another tenant's run: 404)."""
    await view.call(ops.change_key, run_id)
    return StreamingResponse(_changes(request, svc, view, run_id), media_type="text/event-stream",
                             headers=HEADERS)


async def _changes(request: Request, svc: Services, view: View, run_id: str | None) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last = await view.call(ops.change_key, run_id)
    quiet_since = time.monotonic()
    while True:
        await asyncio.sleep(TICK_S)
        if await request.is_disconnected() or not await svc.call(still_valid, view.who):
            return
        key = await view.call(ops.change_key, run_id)
        if key != last:
            last, quiet_since = key, time.monotonic()
            yield "event: changed\ndata: {}\n\n"
            continue
        if run_id is not None and await view.call(ops.run_over, run_id):
            yield "event: end\ndata: {}\n\n"
            return
        if time.monotonic() - quiet_since >= svc.settings.sse_keepalive_s:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
