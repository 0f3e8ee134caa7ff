"""Retry policies: how often, how long to wait, which errors never retry."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Retry:
    """A stage's retry policy: exponential backoff with full jitter and a cap.

    The n-th retry waits a uniformly random time in ``[0, min(cap, base * 2**(n-1))]``
    seconds, unless the error carries a Retry-After, which is honoured as given.
    ``max_attempts`` counts every attempt, the first one included.
    ``max_attempts_by_class`` overrides it per error class, and ``terminal``
    lists exception types that fail the task at once::

        Retry(max_attempts=5, base=1.0, cap=60,
              max_attempts_by_class={"rate_limited": 20},
              terminal=(KeyError,))
    """

    max_attempts: int = 3
    base: float = 1.0
    cap: float = 60.0
    max_attempts_by_class: Mapping[str, int] = field(default_factory=dict)
    terminal: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("Retry(max_attempts=...) must be at least 1")
        if self.base < 0 or self.cap < 0:
            raise ValueError("Retry(base=..., cap=...) must be >= 0 seconds")
        object.__setattr__(self, "max_attempts_by_class", dict(self.max_attempts_by_class))
        object.__setattr__(self, "terminal", tuple(self.terminal))

    def attempts_for(self, error_class: str) -> int:
        return self.max_attempts_by_class.get(error_class, self.max_attempts)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.cap, self.base * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0.0, ceiling)
