"""Keeping a run's budget and its circuit breaker, seen from one worker process.

The budget's rule is the store's (store/budget.py); this side asks it and waits when told to. Before a provider
call of a run with a budget, its estimated cost (the quota's token estimate at the model's price: prompt tokens
in, ``max_tokens`` out) is reserved under the lease of the task making the call; after it, the reservation is
settled to the real cost. A call that fits only once the calls in flight settle waits for them, for at most
``patience`` seconds (a few lease lengths: a dead worker's reservations are counted at their estimate when its
lease is reclaimed, so a longer wait means a call that hangs); then, like one that does not fit even with
nothing in flight, it pauses the run, and the call raises ``RunPaused``: the task is given back untouched (its
attempt refunded), nothing in flight is lost, and no worker claims the run's tasks until `conveyor resume RUN
--budget-usd MORE`. The breaker pauses a run the same way when its calls all fail one systemic way
(pipeline/budget.py ``Breaker``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from conveyor.pipeline import Breaker
from conveyor.store import Lease, SqlStore
from conveyor.store.budget import EXHAUSTED, GRANTED, NO_BUDGET, PAUSED, WAIT, Reservation

T = TypeVar("T")
BUDGET_READ_S = 5.0  # how long a run's "has no budget" is believed before it is read again
WAIT_S = 0.2  # how often a call that fits only once others settle asks again
PATIENCE_LEASES = 3  # how many lease lengths such a call waits before it pauses the run
SYSTEMIC = ("auth",)


class RunPaused(BaseException):
    """The run this call belongs to is paused (its budget is spent, or its breaker tripped): the task is given
    back untouched. A BaseException, like cancellation, so a stage's ``except Exception`` cannot swallow it."""

    def __init__(self, run_id: str, why: str) -> None:
        self.run_id = run_id
        self.why = why
        super().__init__(f"run {run_id} is paused: {why}")


Db = Callable[[Callable[[SqlStore], T]], Awaitable[T]]


class BudgetKeeper:
    """Reservations against run budgets, for one worker process (calls the store through ``db``).

    ``patience``: how long a call waits for calls in flight to settle before it pauses the run; ``clock`` and
    ``sleep`` measure and pass that wait (tests hand in their own)."""

    def __init__(self, db: Db[Any], clock: Callable[[], float] = time.monotonic, patience: float = 90.0,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._db = db
        self._clock = clock
        self._sleep = sleep
        self.patience = patience
        self._unbudgeted: dict[str, float] = {}  # run -> when it was last seen to have no budget

    async def reserve(self, run_id: str, usd: float | None, model: str,
                      lease: Lease | None = None) -> Reservation | None:
        """Reserve ``usd`` (None: the model has no price) for a call of ``run_id`` made under ``lease``; returns
        the reservation (None for a run without a budget). Raises RunPaused when the run is paused or its budget
        would pass."""
        seen = self._unbudgeted.get(run_id)
        if seen is not None and self._clock() - seen < BUDGET_READ_S:
            return None
        if usd is None:
            budget, paused = await self._db(lambda s: s.run_budget(run_id))
            if budget is None and paused is None:
                self._no_budget(run_id)
                return None
            why = f"model {model!r} has no price, so the run's budget cannot be kept; add it to CONVEYOR_PRICES"
            await self._db(lambda s: s.pause_run(run_id, "budget", why))
            raise RunPaused(run_id, paused or why)
        answer, held = await self._ask(run_id, usd, f"its budget would pass: a call to {model} needs ${usd:.4f} more",
                                       lease)
        if answer == GRANTED:
            return held
        if answer == NO_BUDGET:
            self._no_budget(run_id)
            return None
        assert answer in (PAUSED, EXHAUSTED)
        spent, reserved = await self._db(lambda s: s.spent(run_id))
        raise RunPaused(run_id, f"budget: ${spent:.4f} spent, ${reserved:.4f} reserved by calls in flight")

    async def _ask(self, run_id: str, usd: float, note: str, lease: Lease | None) -> tuple[str, Reservation | None]:
        """The store's answer, asked again while it says WAIT (room only once the calls in flight settle: to
        less than they reserved, mostly, or at their estimate when their worker died), telling it how long."""
        started = self._clock()

        def ask(store: SqlStore) -> tuple[str, Reservation | None]:
            return store.reserve_budget(run_id, usd, note, lease, self._clock() - started, self.patience)

        while True:
            answer, held = await self._db(ask)
            if answer != WAIT:
                return answer, held
            await self._sleep(WAIT_S)

    def _no_budget(self, run_id: str) -> None:
        if len(self._unbudgeted) >= 10_000:  # a run per API job: forget old runs (a read brings one back)
            self._unbudgeted.clear()
        self._unbudgeted[run_id] = self._clock()

    async def settle(self, held: Reservation | None, cost: float) -> None:
        """Settle a granted reservation to what the call cost (a run without a budget reserved nothing)."""
        if held is not None:
            await self._db(lambda s: s.settle_budget([(held, cost)]))


class BreakerWatch:
    """The breaker's view from one worker: each run's provider calls over the last window."""

    def __init__(self, breaker: Breaker | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.breaker = breaker
        self._clock = clock
        self._calls: dict[str, deque[tuple[float, str | None]]] = {}

    def record(self, run_id: str, error_class: str | None) -> str | None:
        """Note a call's outcome; return why the run's breaker trips now, or None."""
        b = self.breaker
        if b is None:
            return None
        now = self._clock()
        calls = self._calls.setdefault(run_id, deque())
        calls.append((now, error_class))
        while calls and calls[0][0] < now - b.window_s:
            calls.popleft()
        if error_class is None or len(calls) < b.min_calls:
            return None
        classes = [c for _, c in calls]
        for systemic in SYSTEMIC:
            if all(c == systemic for c in classes):
                return (f"breaker: every one of the last {len(calls)} provider calls failed with {systemic} "
                        f"(a bad key, or no credit left?)")
        limited = sum(1 for c in classes if c == "rate_limited")
        if limited >= b.rate_limited_share * len(classes):
            return (f"breaker: {limited} of the last {len(calls)} provider calls were answered 429, more than "
                    f"{b.rate_limited_share:.0%}: is the declared limit above the account's?")
        return None
