"""How many tasks of each stage a worker may hold at once.

A worker should lease only what it can finish well within a lease: a slow
sync stage claimed 500 at a time would hold work other workers could do, and
a crash would put all of it under suspicion. The pace of each stage (seconds
per task, divided by how many run at once) is learned as a moving average.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from conveyor.pipeline import Stage

SMOOTHING = 0.2


class Pacing:
    def __init__(self, stages: Iterable[Stage], lease_seconds: float, batch_size: int, guarded_slots: int) -> None:
        self.budget = max(0.5, lease_seconds / 4)  # seconds of work to hold per stage
        self.batch_size = batch_size
        self._parallel = {s.name: _parallel(s, guarded_slots) for s in stages}
        self._pace: dict[str, float] = {}

    def record_many(self, durations: Iterable[tuple[str, float]]) -> None:
        """Fold each finished task's (stage, seconds) into its stage's pace, in turn: a committed batch's, in one
        call."""
        parallel, pace = self._parallel, self._pace
        for stage, seconds in durations:
            per_task = max(seconds, 1e-6) / parallel[stage]
            old = pace.get(stage)
            pace[stage] = per_task if old is None else old + SMOOTHING * (per_task - old)

    def caps(self, in_flight: Mapping[str, int], bound: int | None = None) -> dict[str, int]:
        """For each stage, how many more tasks to claim now: at most ``bound`` held (default: a batch)."""
        return {stage: max(0, self.cap(stage, bound) - in_flight.get(stage, 0)) for stage in self._parallel}

    def cap(self, stage: str, bound: int | None = None) -> int:
        """How many tasks of ``stage`` to hold: what its pace finishes within the budget, at most ``bound``. A
        commit's own new tasks are bounded by the worker's in-flight room, not a batch: a fan-out of 2 makes
        twice the tasks its commit settled, and they are best leased as they are made (Claim.fresh_limit)."""
        bound = self.batch_size if bound is None else bound
        floor = 2 * self._parallel[stage]
        pace = self._pace.get(stage)
        if pace is None:
            return min(bound, max(floor, 8))
        return min(bound, max(floor, int(self.budget / pace)))


def _parallel(stage: Stage, guarded_slots: int) -> int:
    if stage.is_async:
        return stage.concurrency
    return guarded_slots if stage.guarded else 1
