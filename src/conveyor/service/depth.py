"""``conveyor queue-depth`` (and what an autoscaler reads): per stage, the tasks ready to run, how long the
oldest has waited, and the tasks running, from the store's documented query (store/depth.py ``QUEUE_DEPTH``)."""

from __future__ import annotations

from typing import Any

from conveyor.store import SqlStore


def queue_depth(store: SqlStore, pipeline: str | None = None, stage: str | None = None) -> dict[str, Any]:
    """``{"runnable", "running", "oldest_age_s", "stages": [{"pipeline", "stage", "runnable", "running",
    "oldest_age_s"}]}``: tasks ready to run now (retry waits not due yet left out) and tasks leased, by pipeline
    and stage (those with either), optionally only ``pipeline``'s and ``stage``'s; ``oldest_age_s`` is how long
    the oldest task ready to run has been so (0 when none is)."""
    now = store.clock()
    rows = [r for r in store.queue_depth(now)
            if (pipeline is None or r.pipeline == pipeline) and (stage is None or r.stage == stage)]
    stages: list[dict[str, Any]] = [
        {"pipeline": r.pipeline, "stage": r.stage, "runnable": r.runnable, "running": r.running,
         "oldest_age_s": 0.0 if r.oldest_at is None else round(max(0.0, now - r.oldest_at), 3)} for r in rows]
    return {"runnable": sum(s["runnable"] for s in stages), "running": sum(s["running"] for s in stages),
            "oldest_age_s": max((s["oldest_age_s"] for s in stages), default=0.0), "stages": stages}
