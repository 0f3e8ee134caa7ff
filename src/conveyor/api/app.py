"""The app factory: ``create_app(settings)`` builds the FastAPI app; nothing is made at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from conveyor import __version__
from conveyor.api import (
    alerts,
    batches,
    dashboard,
    jobs,
    metrics,
    operations,
    problems,
    publications,
    webhooks,
    workers,
)
from conveyor.api.bodies import BodyGuard
from conveyor.api.context import Services
from conveyor.api.openapi import document
from conveyor.api.relay import Relay
from conveyor.api.settings import ApiSettings
from conveyor.runtime.alerts import AlertWatch

log = logging.getLogger("conveyor.api")


def create_app(settings: ApiSettings, background: Sequence[Any] = ()) -> FastAPI:
    """The HTTP service over the store and blob store ``settings`` name, for the pipelines it lists.

    The store is migrated and the pipelines loaded here, so a bad URL or target fails before the server
    listens. With ``settings.relay`` the app delivers webhooks from a background thread while it runs.
    ``background``: more parts (``start()``/``stop()``) started and stopped with the app, such as the worker
    processes of ``conveyor serve``.
    """
    svc = Services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parts = [*_background(settings), app.state.batch_keeper, app.state.alert_watch, *background]
        for part in parts:
            part.start()
        try:
            yield
        finally:
            for part in reversed(parts):
                part.stop()
            svc.close()

    app = FastAPI(title="conveyor", version=__version__, lifespan=lifespan,
                  description="Submit documents to conveyor pipelines; learn their results by polling, "
                              "Server-Sent Events or signed webhooks.")
    app.state.services = svc
    app.state.batch_keeper = batches.keeper(svc)  # reads accepted batches, ends finished ones
    # Evaluates the served pipelines' alerts (as workers do), so they are watched with no worker running.
    app.state.alert_watch = AlertWatch(settings.db, [pipeline for pipeline, _ in svc.pipelines.values()])
    problems.install(app)
    app.add_middleware(BodyGuard, settings=settings)  # who sends a body, and its size, before it is read
    app.openapi = lambda: document(app, settings.auth)  # type: ignore[method-assign]  # errors as problems
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(operations.router)
    app.include_router(webhooks.router)
    app.include_router(workers.router)
    app.include_router(alerts.router)
    app.include_router(publications.router)
    metrics.install(app, svc)
    dashboard.install(app)  # the pages at /, after the API's routes

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        """Whether the server is up and can reach its store."""
        await svc.call(lambda store: store.clock())
        return {"ok": True, "pipelines": sorted(svc.pipelines), "auth": settings.auth}

    return app


def _background(settings: ApiSettings) -> list[Any]:
    """What runs beside the app while it serves (the webhook relay, when asked for)."""
    return [Relay(settings)] if settings.relay else []
