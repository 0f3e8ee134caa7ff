"""A Prometheus collector over the store: every scrape reads one ``service.metrics.snapshot``.

Registered on a registry of its own (never prometheus_client's global one), so several apps or tests in one
process never share metrics. Every metric is documented in the site's metrics reference (reference/metrics.md,
generated from this collector when the site is built).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from conveyor.metrics.families import totals_families
from conveyor.pipeline import Pipeline
from conveyor.service.metrics import Snapshot, snapshot
from conveyor.store import SqlStore, open_store
from conveyor.store.metrics import AGE_BUCKETS

StoreSource = Callable[[], AbstractContextManager[SqlStore]]
STAGE = ["pipeline", "stage"]


class StoreCollector(Collector):
    """Reads the store at each scrape; ``stores`` lends a store for the scrape's thread."""

    def __init__(self, stores: StoreSource, pipelines: Sequence[Pipeline] = ()) -> None:
        self.stores = stores
        self.pipelines = list(pipelines)

    def describe(self) -> list[Metric]:
        return []  # nothing read at registration

    def collect(self) -> Iterator[Metric]:
        with self.stores() as store:
            snap = snapshot(store, self.pipelines)
        yield from queue_families(snap)
        yield from review_families(snap)
        yield from totals_families(snap.totals)
        yield from quota_families(snap)
        yield from alert_families(snap)
        last_hour = GaugeMetricFamily("conveyor_dead_letters_last_hour",
                                      "Dead letters created in the last hour (all pipelines)")
        last_hour.add_metric([], snap.dead_last_hour)
        yield last_hour


def queue_families(snap: Snapshot) -> Iterator[Metric]:
    tasks = GaugeMetricFamily("conveyor_tasks", "Open tasks by state (queued, running, awaiting_review)",
                              labels=[*STAGE, "state"])
    oldest = GaugeMetricFamily("conveyor_queue_oldest_age_seconds",
                               "Age of the oldest queued task (since it became runnable)", labels=STAGE)
    ages = GaugeHistogramMetricFamily("conveyor_queue_age_seconds",
                                      "Queued tasks by age (since they became runnable)", labels=STAGE)
    for row in snap.queued:
        buckets = [(_le(b), float(n)) for b, n in zip(AGE_BUCKETS, row.within, strict=True)]
        ages.add_metric([row.pipeline, row.stage], [*buckets, ("+Inf", float(row.tasks))], row.age_sum)
        tasks.add_metric([row.pipeline, row.stage, "queued"], row.tasks)
        oldest.add_metric([row.pipeline, row.stage], max(0.0, snap.now - row.oldest_at))
    for r in snap.running:
        tasks.add_metric([r.pipeline, r.stage, "running"], r.tasks)
    for r in snap.reviews:
        tasks.add_metric([r.pipeline, r.stage, "awaiting_review"], r.tasks)
    yield from (tasks, oldest, ages)


def review_families(snap: Snapshot) -> Iterator[Metric]:
    backlog = GaugeMetricFamily("conveyor_review_backlog", "Review entries waiting for a decision", labels=STAGE)
    oldest = GaugeMetricFamily("conveyor_review_oldest_age_seconds", "Age of the oldest undecided review entry",
                               labels=STAGE)
    for r in snap.reviews:
        backlog.add_metric([r.pipeline, r.stage], r.tasks)
        oldest.add_metric([r.pipeline, r.stage], max(0.0, snap.now - (r.oldest_at or snap.now)))
    yield from (backlog, oldest)


def quota_families(snap: Snapshot) -> Iterator[Metric]:
    doc = "of the fleet's quota window (sliding, 60 s) for a limited provider model"
    used_t = GaugeMetricFamily("conveyor_quota_tokens_used", f"Tokens held {doc}", labels=["key"])
    limit_t = GaugeMetricFamily("conveyor_quota_tokens_limit", "Declared tokens per minute (tpm)", labels=["key"])
    used_r = GaugeMetricFamily("conveyor_quota_requests_used", f"Requests held {doc}", labels=["key"])
    limit_r = GaugeMetricFamily("conveyor_quota_requests_limit", "Declared requests per minute (rpm)", labels=["key"])
    for q in snap.quota:
        used_t.add_metric([q.key], q.tokens)
        used_r.add_metric([q.key], q.requests)
        if q.tpm is not None:
            limit_t.add_metric([q.key], q.tpm)
        if q.rpm is not None:
            limit_r.add_metric([q.key], q.rpm)
    yield from (used_t, limit_t, used_r, limit_r)


def alert_families(snap: Snapshot) -> Iterator[Metric]:
    """Each declared alert (conveyor.Alerts): whether it fires now, and how many times it fired."""
    firing = GaugeMetricFamily("conveyor_alert_firing", "1 while the alert fires, else 0",
                               labels=["pipeline", "alert"])
    fired = CounterMetricFamily("conveyor_alerts", "Times the alert fired (episodes, each counted once across "
                                "the fleet)", labels=["pipeline", "alert"])
    for row in snap.alerts:
        firing.add_metric([row.pipeline, row.alert], 1 if row.state == "firing" else 0)
        fired.add_metric([row.pipeline, row.alert], row.firings)
    yield from (firing, fired)


def _le(bound: float) -> str:
    return repr(float(bound))


def new_registry(stores: StoreSource, pipelines: Sequence[Pipeline] = ()) -> CollectorRegistry:
    """A fresh registry holding one StoreCollector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(stores, pipelines))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format (version 0.0.4)."""
    return generate_latest(registry)


def shared_store(url: str) -> StoreSource:
    """One store for every scrape, opened at the first and lent to one scrape at a time (the exporter answers
    each scrape in a thread of its own); reopened after an error. Kept open, its page cache stays warm."""
    lock, held = threading.Lock(), list[SqlStore]()

    @contextmanager
    def lend() -> Iterator[SqlStore]:
        with lock:
            if not held:
                held.append(open_store(url, migrate=False))
            try:
                yield held[0]
            except BaseException:
                held.pop().close()
                raise
    return lend


def serve_metrics(port: int, url: str, pipelines: Sequence[Pipeline], addr: str = "0.0.0.0") -> Any:
    """Serve /metrics on ``port`` from a daemon thread (``conveyor worker --metrics-port``)."""
    return start_http_server(port, addr=addr, registry=new_registry(shared_store(url), pipelines))
