"""The dashboard: server-rendered pages at ``/`` over the same service functions and tokens as the API.

Pages (GET): ``/`` runs, ``/runs/{run_id}``, ``/runs/{run_id}/dead-letters``, ``/runs/{run_id}/items`` (the items
table, api/dashboard/items.py, with its actions at ``/runs/{run_id}/selection``), ``/runs/{run_id}/items/{item_key}``,
``/reviews``, ``/reviews/{review_id}``, ``/workers``; ``/changes`` and ``/runs/{run_id}/changes`` (when the runs
list and a run's page changed: live.py); ``/login`` and ``/logout``; ``/static/dashboard/`` its
stylesheet and script; ``/favicon.ico`` its icon (an SVG, served without a login, so no browser console
shows a 404). No front-end build step: Jinja templates and one small plain-JavaScript file.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from conveyor.api.dashboard import actions, items, live, pages
from conveyor.api.dashboard.session import local_secret


def install(app: FastAPI) -> None:
    """Add the dashboard's pages, forms and static files to ``app``."""
    app.state.dashboard_secret = local_secret()
    app.include_router(actions.router)
    app.include_router(live.router)
    app.include_router(items.router)
    app.include_router(pages.router)
    app.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
    app.mount("/static/dashboard", StaticFiles(directory=str(files("conveyor.api.dashboard") / "static")),
              name="dashboard-static")


def favicon() -> Response:
    """The dashboard's icon, where browsers ask for it."""
    icon = (files("conveyor.api.dashboard") / "static" / "favicon.svg").read_bytes()
    return Response(icon, media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"})
