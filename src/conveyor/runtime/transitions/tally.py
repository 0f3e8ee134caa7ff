"""What a commit adds to the metrics' running totals (store/metrics.py), read off the attempts it records.

One pass over the commit's attempt rows; the rows written are one per distinct (metric, labels), a handful per
commit, in the commit's own transaction, so a total never counts a commit that did not happen.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from conveyor.pipeline import Pipeline
from conveyor.store import AttemptRecord, NewTasks, PlainAttempt
from conveyor.store.metrics import ATTEMPT_BUCKETS, LABEL_SEP, MetricIncrement

# attempt outcome -> the task's end it records (retries, escalations, reviews and pauses are not ends)
ENDS = {"succeeded": "succeeded", "cached": "cached", "failed": "failed", "dead_lettered": "dead_lettered"}


class Tally:
    """Running-total increments, keyed by (metric, label values)."""

    __slots__ = ("accept", "name", "publish", "sums")

    def __init__(self, pipeline: Pipeline) -> None:
        self.name = pipeline.name
        self.accept = {s.name for s in pipeline if s.accept is not None}
        self.publish = {s.name for s in pipeline if s.kind == "publish"}
        self.sums: defaultdict[tuple[str, str], float] = defaultdict(float)

    def add(self, name: str, *labels: str, value: float = 1.0) -> None:
        self.sums[name, LABEL_SEP.join(labels)] += value

    def rows(self) -> list[MetricIncrement]:
        return [MetricIncrement(name, labels, value) for (name, labels), value in self.sums.items()]

    def finished(self, stage: str, end: str, error_class: str | None = None, count: int = 1) -> None:
        """``count`` tasks ended (``end``: succeeded, cached, failed, rejected, dead_lettered)."""
        name = self.name
        self.add("tasks_finished", name, stage, end, value=count)
        if end == "dead_lettered":
            self.add("dead_letters", name, stage, error_class or "unknown", value=count)
        elif end in ("succeeded", "cached"):
            if stage in self.accept:
                self.add("items_accepted", name, value=count)
            if stage in self.publish and end == "succeeded":
                self.add("items_published", name, value=count)

    def plain(self, stages: Mapping[int, str], attempts: Iterable[PlainAttempt]) -> None:
        """The common rows (a success without a provider call), grouped before they are added: the hot path."""
        # One dict entry per (stage, outcome, duration bucket; -1 for a cached row, which has none): [rows, seconds]
        groups: dict[tuple[str, str, int], list[float]] = {}
        for a in attempts:
            succeeded = a.outcome == "succeeded"
            key = (stages[a.task_id], a.outcome, bisect_left(ATTEMPT_BUCKETS, a.duration) if succeeded else -1)
            group = groups.get(key)
            if group is None:
                groups[key] = [1, a.duration if succeeded else 0.0]
            else:
                group[0] += 1
                if succeeded:
                    group[1] += a.duration
        ends: Counter[tuple[str, str]] = Counter()
        seconds: defaultdict[str, float] = defaultdict(float)
        for (stage, end, bucket), (count, total) in groups.items():
            ends[stage, end] += int(count)
            if bucket >= 0:
                self.add("attempt_duration_bucket", self.name, stage, str(bucket), value=count)
                seconds[stage] += total
        for (stage, end), count in ends.items():
            self.finished(stage, end, count=count)
        for stage, total in seconds.items():
            self.add("attempt_duration_sum", self.name, stage, value=total)

    def planned(self, tasks: NewTasks) -> None:
        """Tasks created already ended: answered from the memo as the stage before them finished (no attempt)."""
        ends: Counter[tuple[str, str]] = Counter()
        for row in tasks.cached:
            ends[row[2], "cached"] += 1
        for row in tasks.failed:
            ends[row[2], "rejected" if row[12] == "rejected" else "failed"] += 1
        for row in tasks.bad:
            ends[row[2], "failed"] += 1
        for (stage, end), count in ends.items():
            self.finished(stage, end, count=count)

    def full(self, stages: Mapping[int, str], attempts: Iterable[AttemptRecord]) -> None:
        for a in attempts:
            stage = stages[a.task_id]
            end = ENDS.get(a.outcome)
            if end is not None:
                if a.error_class is not None and end in ("cached", "failed"):
                    end = "rejected" if a.error_class == "rejected" else "failed"
                self.finished(stage, end, a.error_class)
            elif a.outcome == "retry":
                self.add("retries", self.name, stage, a.error_class or "unknown")
            if a.outcome not in ("cached", "deferred") and a.duration is not None:  # a deferral is not a run
                self.duration(stage, a.duration)
            self.usage(a)

    def duration(self, stage: str, seconds: float) -> None:
        name = self.name
        self.add("attempt_duration_bucket", name, stage, str(bisect_left(ATTEMPT_BUCKETS, seconds)))
        self.add("attempt_duration_sum", name, stage, value=seconds)

    def usage(self, a: AttemptRecord) -> None:
        model = a.model or "unknown"
        if a.error_class == "rate_limited":
            self.add("provider_rate_limited", model)
        if not a.provider_calls:
            return
        self.add("provider_requests", model, value=a.provider_calls)
        self.add("provider_tokens", model, "prompt", value=a.prompt_tokens)
        self.add("provider_tokens", model, "completion", value=a.completion_tokens)
        if a.cost:
            self.add("provider_cost_usd", model, value=a.cost)
