"""A run's progress over time, for the dashboard's and the report's plots.

``timeline(store, run_id)``: one entry per time bucket in which attempts of the run ended, oldest first:
``{"t", "attempts", "succeeded", "failed", "accepted", "published", "tokens", "cost_usd"}`` (``t``: the
bucket's start, epoch seconds; ``succeeded``: attempts that ended their task done, memo answers included;
``failed``: attempts that did not (retries included); ``accepted``/``published``: successes at the run's
acceptance stages (its record stage when it declares none) and at its publish stages).
"""

from __future__ import annotations

from typing import Any

from conveyor.service.records import RunGraph
from conveyor.service.report import find_run
from conveyor.store import SqlStore

SUCCESSES = ("succeeded", "cached")


def timeline(store: SqlStore, run_id: str, bucket_s: float = 60.0, tenant: str | None = None) -> list[dict[str, Any]]:
    run = find_run(store, run_id, tenant)
    graph = RunGraph.of(run)
    accept = set(graph.stages.accept) or ({graph.record_stage} if graph.record_stage else set())
    publish = set(graph.stages.publish)
    buckets: dict[float, dict[str, Any]] = {}
    for row in store.timeline_rows(run.run_id, bucket_s):
        entry = buckets.setdefault(row.bucket, {"t": row.bucket, "attempts": 0, "succeeded": 0, "failed": 0,
                                                "accepted": 0, "published": 0, "tokens": 0, "cost_usd": 0.0})
        entry["attempts"] += row.attempts
        entry["tokens"] += row.tokens
        entry["cost_usd"] += row.cost
        if row.outcome in SUCCESSES:
            entry["succeeded"] += row.attempts
            entry["accepted"] += row.attempts if row.stage in accept else 0
            entry["published"] += row.attempts if row.stage in publish else 0
        elif row.outcome:
            entry["failed"] += row.attempts
    return [buckets[t] for t in sorted(buckets)]
