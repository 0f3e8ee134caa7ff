"""What the provider batch lane holds (`conveyor provider-batches`): its batches, its requests by state and, for
a run, the tasks waiting on them."""

from __future__ import annotations

from typing import Any

from conveyor.store import SqlStore
from conveyor.store.provider_batch import ProviderBatch


def provider_batch_report(store: SqlStore, pipeline: str | None = None, run_id: str | None = None,
                          limit: int = 20) -> dict[str, Any]:
    """``{"batches": [...newest first], "requests": {state: n}, "waiting": {stage: n}}`` (``waiting``: the tasks
    of ``run_id`` parked on requests not answered yet; empty without a run)."""
    if run_id is not None and pipeline is None:
        run = store.get_run(run_id)
        pipeline = run.pipeline if run is not None else None
    return {"pipeline": pipeline, "run_id": run_id,
            "batches": [_batch(b) for b in store.provider_batches(pipeline, limit)],
            "requests": store.batch_request_states(pipeline),
            "waiting": store.waiting_tasks(run_id) if run_id is not None else {}}


def _batch(b: ProviderBatch) -> dict[str, Any]:
    return {"id": b.id, "pipeline": b.pipeline, "provider": b.provider, "model": b.model,
            "provider_batch_id": b.provider_batch_id, "state": b.state, "status": b.status, "requests": b.requests,
            "bytes": b.bytes, "created_at": b.created_at, "submitted_at": b.submitted_at, "ended_at": b.ended_at,
            "answered": b.answered, "failed": b.failed, "retried": b.retried, "direct": b.direct, "tag": b.tag}
