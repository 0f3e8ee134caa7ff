"""What the metrics endpoint reports, read from the store in bounded work (store/metrics.py).

``snapshot`` reads everything a scrape needs; the ``conveyor.metrics`` package turns it into Prometheus
families. The quota's limits are the pipelines' declared ones, CONVEYOR_LIMITS over them (as a worker sees them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

from conveyor.pipeline import Pipeline, RateLimit, find_limit
from conveyor.runtime.quota import window_seconds
from conveyor.service.forecast import limits_of
from conveyor.store import SqlStore
from conveyor.store.alerts import AlertRow
from conveyor.store.metrics import AGE_BUCKETS, LABEL_SEP, MetricIncrement, StageCount
from conveyor.store.queuecounts import SecondCount

HOUR_S = 3600.0


class QueueRow(NamedTuple):
    """Queued tasks of one stage: how many, the earliest second one became runnable, and how many are at most
    each AGE_BUCKETS bound old (cumulative), with the sum of their ages. Ages are to the second (a task's
    ``available_at`` rounded down), so a task reads up to a second older than it is."""

    pipeline: str
    stage: str
    tasks: int
    oldest_at: float
    age_sum: float
    within: tuple[int, ...]


class QuotaRow(NamedTuple):
    """One limited model's use of the current window, and its limits (None: not limited)."""

    key: str
    tokens: int
    requests: int
    tpm: int | None
    rpm: int | None


class Snapshot(NamedTuple):
    now: float
    queued: list[QueueRow]
    running: list[StageCount]
    reviews: list[StageCount]
    totals: list[MetricIncrement]
    dead_last_hour: int
    quota: list[QuotaRow]
    alerts: list[AlertRow]


def snapshot(store: SqlStore, pipelines: Iterable[Pipeline] = ()) -> Snapshot:
    """Everything one scrape reports, each part a bounded read (the open-task counts per second and the leases,
    the running totals, the last hour of dead letters, the quota's window, a row per declared alert)."""
    now = store.clock()
    return Snapshot(now, queue_rows(store.queued_seconds(), now), store.running_counts(),
                    store.review_backlog(), store.metric_totals(), store.dead_letters_since(now - HOUR_S),
                    quota_rows(store, pipelines), store.alert_rows())


def queue_rows(seconds: Iterable[SecondCount], now: float) -> list[QueueRow]:
    """Per stage, the queued tasks' count, oldest second and age histogram, from their counts per second."""
    by_stage: defaultdict[tuple[str, str], list[SecondCount]] = defaultdict(list)
    for row in seconds:
        by_stage[row.pipeline, row.stage].append(row)
    rows = []
    for (pipeline, stage), counts in sorted(by_stage.items()):
        ages = [(max(0.0, now - c.second), c.tasks) for c in counts]
        within = tuple(sum(n for age, n in ages if age <= bound) for bound in AGE_BUCKETS)
        rows.append(QueueRow(pipeline, stage, sum(n for _, n in ages), float(min(c.second for c in counts)),
                             sum(age * n for age, n in ages), within))
    return rows


def quota_rows(store: SqlStore, pipelines: Iterable[Pipeline]) -> list[QuotaRow]:
    limits: dict[str, RateLimit] = {}
    for pipeline in pipelines:
        limits.update(limits_of(pipeline))
    rows = []
    for usage in store.quota_usage(window_seconds()):
        key = str(usage["key"])
        provider, _, model = key.rpartition("/")
        limit = find_limit(limits, provider, model) if limits else None
        rows.append(QuotaRow(key, _int(usage["tokens"]), _int(usage["requests"]),
                             limit.tpm if limit else None, limit.rpm if limit else None))
    return rows


def labels(total: MetricIncrement) -> list[str]:
    """The label values of a running total."""
    return total.labels.split(LABEL_SEP) if total.labels else []


def _int(value: Any) -> int:
    return int(value or 0)
