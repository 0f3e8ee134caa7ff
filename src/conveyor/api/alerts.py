"""The alerts: ``GET /v1/alerts``, as ``conveyor alerts --json``, for operators only.

Alerts watch whole pipelines, across tenants, so a tenant's token is answered 403.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from conveyor.api.context import Svc, Who
from conveyor.errors import Forbidden
from conveyor.service.alerts import list_alerts

router = APIRouter(prefix="/v1", tags=["operations"])
_PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}


@router.get("/alerts", responses={403: _PROBLEM, 422: _PROBLEM})
async def alerts(svc: Svc, who: Who,
                 pipeline: Annotated[str | None, Query(description="only this pipeline's alerts")] = None
                 ) -> dict[str, Any]:
    """Each declared alert: ``firing`` or ``ok``, its latest value and threshold, since when, how many times it
    fired; as ``conveyor alerts --json``."""
    if not who.operator:
        raise Forbidden("the alerts are an operator's view; use an operator token")
    data: dict[str, Any] = await svc.call(list_alerts, pipeline)
    return data
