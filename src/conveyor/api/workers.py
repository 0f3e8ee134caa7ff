"""The fleet: ``GET /v1/workers``, as ``conveyor workers --json``, for operators only.

The workers serve every tenant at once, so a tenant's token is answered 403: what a fleet is doing is not
one tenant's to see.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from conveyor.api.context import Svc, Who
from conveyor.errors import Forbidden
from conveyor.service.workers import list_workers

router = APIRouter(prefix="/v1", tags=["operations"])
_PROBLEM: dict[str, Any] = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}


@router.get("/workers", responses={403: _PROBLEM, 422: _PROBLEM})
async def workers(svc: Svc, who: Who,
                  every: Annotated[bool, Query(alias="all", description="stopped and long-lost workers too")]
                  = False) -> dict[str, Any]:
    """Workers of this store: live, lost lately (and, with ``all``, stopped), as ``conveyor workers --json``."""
    if not who.operator:
        raise Forbidden("the workers are an operator's view; use an operator token")
    data: dict[str, Any] = await svc.call(list_workers, every)
    return data
