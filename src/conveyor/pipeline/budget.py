"""A pipeline's spending ceiling and its circuit breaker: declarations only (runtime/budget.py keeps them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from conveyor.errors import PipelineError


@dataclass(frozen=True)
class Breaker:
    """When to pause a run because its provider calls fail the same systemic way, instead of burning through
    the manifest: over the last ``window_s`` seconds a worker has made at least ``min_calls`` calls for the run
    and every one failed with ``auth`` (a bad key, no credit), or at least ``rate_limited_share`` of them were
    answered 429. ``Pipeline(breaker=None)`` turns it off."""

    window_s: float = 60.0
    min_calls: int = 10
    rate_limited_share: float = 0.9

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise PipelineError(f"Breaker(window_s={self.window_s!r}) must be > 0 seconds")
        if not isinstance(self.min_calls, int) or self.min_calls < 1:
            raise PipelineError(f"Breaker(min_calls={self.min_calls!r}) must be a positive integer")
        if not 0 < self.rate_limited_share <= 1:
            raise PipelineError(f"Breaker(rate_limited_share={self.rate_limited_share!r}) must be in (0, 1]")


def budget(value: float | None, where: str) -> float | None:
    """A budget in USD: None (no ceiling) or a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PipelineError(f"{where}: {value!r} is not a budget; give a number of US dollars > 0")
    return float(value)
