"""``/v1/webhooks``: how the webhooks of the caller's jobs went (each event's delivery)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from conveyor.api.context import View
from conveyor.service import webhooks as webhook_service

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
_PROBLEM = {"content": {"application/problem+json": {}}, "description": "a problem (RFC 9457)"}


class DeliveryView(BaseModel):
    event_id: int
    job_id: str
    type: str
    url: str | None
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    error: str | None
    created_at: float
    delivered_at: float | None


class Deliveries(BaseModel):
    deliveries: list[DeliveryView]


@router.get("/deliveries", response_model=Deliveries, responses={401: _PROBLEM, 403: _PROBLEM, 422: _PROBLEM})
async def deliveries(view: View,
                     state: Annotated[Literal["pending", "delivered", "failed"] | None,
                                      Query(description="only deliveries in this state")] = None,
                     limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """Each event of the caller's jobs that has a webhook, newest first: where it goes, its state (pending:
    being tried, with backoff; delivered; failed: not taken within a day), attempts and the last error."""
    return await view.call(webhook_service.list_deliveries, state, limit)
