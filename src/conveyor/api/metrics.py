"""GET /metrics: the store's Prometheus metrics, in the text format, with no token (a scraper has none)."""

from __future__ import annotations

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from conveyor.api.context import Services
from conveyor.metrics import exposition, new_registry


def install(app: FastAPI, svc: Services) -> None:
    """Add /metrics to ``app``; each scrape runs in the thread pool with a store lent by the server's pool."""
    registry = new_registry(svc.store, [pipeline for pipeline, _ in svc.pipelines.values()])

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body = await run_in_threadpool(exposition, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
