"""A run's progress: where it stands (``overview``) and how it went over time (``timeline``), for the dashboard
and the report, in bounded work at any run size.

``timeline(store, run_id, bucket_s)``: one entry per time bucket (``timeline_bucket``: from a second for a short
run to whole days) in which attempts of the run ended, oldest first:
``{"t", "attempts", "succeeded", "failed", "accepted", "published", "tokens", "cost_usd"}`` (``t``: the
bucket's start, epoch seconds; ``succeeded``: attempts that ended their task done, memo answers found at claim
time included (tasks answered from the memo as they were created have no attempt and are not in the timeline);
``failed``: attempts that did not (retries included); ``accepted``/``published``: successes at the run's
acceptance stages (its record stage when it declares none) and at its publish stages).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.service.records import RunGraph
from conveyor.service.report import find_run, run_status, stage_activity
from conveyor.store import RunRecord, SqlStore
from conveyor.store.metrics import AGE_BUCKETS

SUCCESSES = ("succeeded", "cached")
AGE_CAP = 10_000  # queued tasks counted per age bin, at most
# A timeline's bucket: the smallest of these that keeps the run's life within MAX_BUCKETS (whole days past them).
BUCKET_SIZES = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 10800.0, 21600.0, 86400.0)
MAX_BUCKETS = 120
# Buckets under a minute are counted from the run's attempts (its running totals count by the minute), so only
# for a run with at most this many: the read stays bounded.
FINE_ATTEMPTS = 50_000


def timeline(store: SqlStore, run_id: str, bucket_s: float = 60.0, tenant: str | None = None) -> list[dict[str, Any]]:
    run = find_run(store, run_id, tenant)
    accept, publish = progress_stages(run)
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


def bucket_size(span_s: float, fine: bool = True) -> float:
    """The smallest of BUCKET_SIZES (under a minute only when ``fine``) that cuts ``span_s`` into at most
    MAX_BUCKETS buckets; whole days past them."""
    for size in BUCKET_SIZES:
        if (fine or size >= 60) and span_s / size <= MAX_BUCKETS:
            return size
    return 86400.0 * -(-span_s // (86400.0 * MAX_BUCKETS))


def timeline_bucket(store: SqlStore, run_id: str, span_s: float) -> float:
    """``bucket_size`` for a run that has lived ``span_s`` seconds: under a minute only for a run with at most
    FINE_ATTEMPTS attempts."""
    attempts = sum(value for *_, value in store.run_totals(run_id, "attempts"))
    return bucket_size(span_s, fine=attempts <= FINE_ATTEMPTS)


def overview(store: SqlStore, run_id: str, tenant: str | None = None, age_cap: int = AGE_CAP) -> dict[str, Any]:
    """What a progress page shows of one run, read in bounded work at any size (no per-item outcome: that is
    ``conveyor reconcile``): ``run_status`` with, per stage, ``calls``, ``cached``, ``oldest_queued_age_s``
    and ``queue_ages`` (the pipeline's runnable tasks of that stage per age bin: ``{"le": bound in seconds or
    None for older, "tasks", "capped"}``, a bin counted up to ``age_cap``); ``accepted`` and ``published``: tasks
    done at the acceptance stages (the record stage when none is declared) and at the publish stages."""
    run = find_run(store, run_id, tenant)
    counts = store.task_counts(run.run_id)
    status = run_status(store, run, counts=counts)
    activity = stage_activity(store, run, counts)
    now = store.clock()
    for stage, entry in activity.items():
        bins = store.queue_ages(run.pipeline, stage, now, age_cap) if status["stages"][stage].get("queued") else []
        entry["queue_ages"] = [{"le": bound, "tasks": n, "capped": n >= age_cap}
                               for bound, n in zip((*AGE_BUCKETS, None), bins, strict=False)]
    status["stage_activity"] = activity
    accept, publish = progress_stages(run)
    status["accepted"] = done_at(status["stages"], accept)
    status["published"] = done_at(status["stages"], publish)
    return status


def progress_stages(run: RunRecord) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The stages whose done tasks a run's progress counts: its acceptance stages (its record stage when it
    declares none), and its publish stages."""
    graph = RunGraph.of(run)
    accept = graph.stages.accept or ((graph.record_stage,) if graph.record_stage else ())
    return accept, graph.stages.publish


def done_at(stages: Mapping[str, Mapping[str, int]], names: Sequence[str]) -> int:
    """Tasks done (succeeded) at ``names``, from ``run_status``'s per-stage counts."""
    return sum(stages.get(name, {}).get("succeeded", 0) for name in names)
