"""The alerts' states (``conveyor alerts``, ``GET /v1/alerts``): each declared alert of each pipeline, firing
or ok, with its latest value, its threshold and since when it is in its state (runtime/alerts.py keeps them)."""

from __future__ import annotations

from typing import Any

from conveyor.runtime.alerts import ALERTS_TENANT
from conveyor.service.tokens import webhook_secret
from conveyor.store import SqlStore
from conveyor.store.alerts import AlertRow


def list_alerts(store: SqlStore, pipeline: str | None = None) -> dict[str, Any]:
    """``{"alerts": [{"pipeline", "alert", "state", "value", "threshold", "since", "evaluated_at", "firings"}]}``,
    by pipeline and alert; ``state`` is ``firing`` or ``ok``. An alert is listed once a process evaluated it."""
    return {"alerts": [alert_view(row) for row in store.alert_rows(pipeline)]}


def alert_view(row: AlertRow) -> dict[str, Any]:
    return {"pipeline": row.pipeline, "alert": row.alert, "state": row.state, "value": _number(row.value),
            "threshold": _number(row.threshold), "since": row.since, "evaluated_at": row.evaluated_at,
            "firings": row.firings}


def alerts_secret(store: SqlStore) -> str:
    """The Standard Webhooks secret that signs alert webhooks (made at first need), for receivers to verify."""
    return webhook_secret(store, ALERTS_TENANT)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
