"""Counters and the attempt-duration histogram, from the store's running totals (metric_totals)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from conveyor.service.metrics import labels
from conveyor.store.metrics import ATTEMPT_BUCKETS, MetricIncrement

# running total -> (metric family name, help, label names); names end in _total in the exposition
COUNTERS = {
    "tasks_finished": ("conveyor_tasks_finished", "Tasks that reached an end, by outcome "
                       "(succeeded, cached, failed, rejected, dead_lettered)", ["pipeline", "stage", "outcome"]),
    "retries": ("conveyor_retries", "Attempts that failed and were scheduled again, by error class",
                ["pipeline", "stage", "error_class"]),
    "dead_letters": ("conveyor_dead_letters", "Tasks dead-lettered (attempts exhausted, poison), by error class",
                     ["pipeline", "stage", "error_class"]),
    "items_accepted": ("conveyor_items_accepted", "Answers that passed a stage's acceptance boundary "
                       "(or a reviewer)", ["pipeline"]),
    "items_published": ("conveyor_items_published", "Items a publish stage published", ["pipeline"]),
    "provider_requests": ("conveyor_provider_requests", "Provider calls made by attempts", ["model"]),
    "provider_tokens": ("conveyor_provider_tokens", "Provider tokens (kind: prompt, completion)", ["model", "kind"]),
    "provider_cost_usd": ("conveyor_provider_cost_usd", "Provider cost in US dollars (priced models)", ["model"]),
    "provider_rate_limited": ("conveyor_provider_rate_limited", "Attempts that ended in a provider 429",
                              ["model"]),
}


def totals_families(totals: Sequence[MetricIncrement]) -> Iterator[Metric]:
    families = {key: CounterMetricFamily(name, doc, labels=names) for key, (name, doc, names) in COUNTERS.items()}
    durations: defaultdict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * (len(ATTEMPT_BUCKETS) + 1))
    sums: defaultdict[tuple[str, ...], float] = defaultdict(float)
    for total in totals:
        values = labels(total)
        if total.name in families:
            families[total.name].add_metric(values, total.value)
        elif total.name == "attempt_duration_bucket":
            durations[tuple(values[:2])][int(values[2])] += total.value
        elif total.name == "attempt_duration_sum":
            sums[tuple(values)] += total.value
    yield from families.values()
    yield attempt_histogram(durations, sums)


def attempt_histogram(durations: dict[tuple[str, ...], list[float]],
                      sums: dict[tuple[str, ...], float]) -> Metric:
    family = HistogramMetricFamily("conveyor_attempt_duration_seconds",
                                   "Duration of attempts that ran (memo answers excluded)",
                                   labels=["pipeline", "stage"])
    bounds = [repr(float(b)) for b in ATTEMPT_BUCKETS] + ["+Inf"]
    for key, counts in sorted(durations.items()):
        cumulative, running = [], 0.0
        for bound, n in zip(bounds, counts, strict=True):
            running += n
            cumulative.append((bound, running))
        family.add_metric(list(key), cumulative, sums.get(key, 0.0))
    return family
