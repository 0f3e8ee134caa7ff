"""The provider quota, seen from one worker process.

Every ``ctx.chat`` / ``ctx.embed`` passes through a ``QuotaGate`` before it
reaches the provider:

- a model with a declared ``RateLimit`` waits for a grant from the fleet's
  ledger in the store (``store/quota.py``): the estimate (prompt tokens +
  max_tokens) is reserved before the request is sent and settled to the real
  usage after. One pump per model asks for many waiting requests in one
  transaction, interactive ones first, so a busy worker makes a few quota
  round trips a second, not one per call;
- a model without a limit runs under an AIMD concurrency limit: one more
  call in flight per round of successes, half as many after a 429;
- a 429 pauses the model for the whole fleet until its Retry-After (or the
  reset the provider's headers announce), so no worker calls before then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.pipeline import RateLimit
from conveyor.providers.base import ProviderError
from conveyor.store import SqlStore, open_store
from conveyor.store.quota import NEVER

log = logging.getLogger("conveyor.quota")
T = TypeVar("T")

WINDOW_S = 60.0  # providers count per minute; CONVEYOR_QUOTA_WINDOW_S shortens it for tests only
POLL_S = 0.25  # when refused, ask again at least this often: other workers' settlements free room
MIN_SPACING_S = 0.02  # at most ~50 reservation transactions a second per model and process
SETTLE_MARGIN_S = 0.05  # clock granularity between this process and the store
BATCH = 64  # requests asked for in one reservation, per lane
PAUSE_READ_S = 0.1  # how stale a process's view of the fleet's pause may be, for unlimited models
DEFAULT_PAUSE_S = 1.0  # a 429 that says nothing about when to come back
LANES = ("interactive", "bulk")
AIMD_START, AIMD_MAX = 8.0, 1024.0


def window_seconds() -> float:
    """The limits' window: 60 s, unless a test shortens it with CONVEYOR_QUOTA_WINDOW_S."""
    return float(os.environ.get("CONVEYOR_QUOTA_WINDOW_S") or WINDOW_S)


@dataclass
class Ticket:
    """One admitted call: its grant (None when the model has no declared limit) and timings."""

    key: str
    tokens: int
    grant_id: int | None
    granted: float  # this process's clock, no later than the grant itself


@dataclass
class _Model:
    key: str
    limit: RateLimit | None
    waiting: dict[str, deque[tuple[int, asyncio.Future[tuple[int, float]]]]] = field(
        default_factory=lambda: {lane: deque() for lane in LANES})
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    # AIMD, for models without a declared limit
    concurrency: float = AIMD_START
    in_flight: int = 0
    room: asyncio.Condition = field(default_factory=asyncio.Condition)
    last_cut: float = 0.0
    # the fleet's pause, as last seen (monotonic deadline) and when it was last read
    paused_until: float = 0.0
    pause_read: float = float("-inf")


class QuotaGate:
    """Admission to provider calls for one worker process (use from one event loop)."""

    def __init__(self, store_url: str, limits: Mapping[str, RateLimit], worker: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store_url = store_url
        self.limits = dict(limits)
        self.worker = worker
        self.clock = clock
        self._models: dict[str, _Model] = {}
        self._settle: list[tuple[int, float, int]] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="conveyor-quota")
        self._store: SqlStore | None = None
        self.stats: dict[str, float] = {"granted": 0, "waited_s": 0.0, "rate_limited": 0, "paused": 0}
        self.window = window_seconds()

    # --- admission -------------------------------------------------------

    async def acquire(self, key: str, limit: RateLimit | None, tokens: int, lane: str) -> Ticket:
        """Wait until the fleet may send this call; ``key`` is ``provider/model``."""
        model = self._model(key, limit)
        started = self.clock()
        if limit is None:
            await self._wait_pause(model)
            async with model.room:
                await model.room.wait_for(lambda: model.in_flight < int(model.concurrency))
                model.in_flight += 1
            grant_id = None
        else:
            future: asyncio.Future[tuple[int, float]] = asyncio.get_running_loop().create_future()
            model.waiting[lane if lane in LANES else "bulk"].append((tokens, future))
            model.wake.set()
            if model.pump is None or model.pump.done():
                model.pump = asyncio.create_task(self._pump(model))
            grant_id, asked = await future
        now = self.clock()
        self.stats["granted"] += 1
        self.stats["waited_s"] += now - started
        return Ticket(key, tokens, grant_id, now if grant_id is None else asked)

    async def release(self, ticket: Ticket, used: int | None, error: BaseException | None = None) -> None:
        """After the call: settle the grant to ``used`` tokens (None: unknown, keep the estimate),
        adapt the AIMD window, and pause the fleet on a 429."""
        model = self._models[ticket.key]
        rate_limited = isinstance(error, ProviderError) and error.error_class == "rate_limited"
        if ticket.grant_id is not None:
            # The grant counts from its answer on: the request reached the provider before that, and
            # however long the SDK or a busy event loop held it, never after.
            self._settle.append((ticket.tokens if used is None else used,
                                 max(0.0, self.clock() - ticket.granted) + SETTLE_MARGIN_S, ticket.grant_id))
            model.wake.set()
            if model.pump is None or model.pump.done():
                model.pump = asyncio.create_task(self._pump(model))
        else:
            async with model.room:
                model.in_flight -= 1
                if rate_limited:
                    if self.clock() - model.last_cut > 1.0:
                        model.concurrency, model.last_cut = max(1.0, model.concurrency / 2), self.clock()
                else:
                    model.concurrency = min(AIMD_MAX, model.concurrency + 1.0 / model.concurrency)
                model.room.notify_all()
        if rate_limited:
            assert isinstance(error, ProviderError)
            await self._pause(model, error)

    async def _pause(self, model: _Model, error: ProviderError) -> None:
        seconds = error.retry_after if error.retry_after is not None else DEFAULT_PAUSE_S
        self.stats["rate_limited"] += 1
        model.paused_until = max(model.paused_until, self.clock() + seconds)
        await self._db(lambda s: s.pause_quota(model.key, seconds, str(error)))
        if model.limit is not None:
            log.warning("%s answered 429 although the fleet kept to its declared limit %s; is the limit "
                        "higher than the provider's?", model.key, model.limit)

    async def _wait_pause(self, model: _Model) -> None:
        """Unlimited models: honour the fleet's pause (read from the store at most every PAUSE_READ_S)."""
        now = self.clock()
        if now - model.pause_read > PAUSE_READ_S:
            model.pause_read = now
            remaining = await self._db(lambda s: s.quota_paused_for(model.key))
            model.paused_until = max(model.paused_until, self.clock() + remaining)
        delay = model.paused_until - self.clock()
        if delay > 0:
            self.stats["paused"] += 1
            await asyncio.sleep(delay)

    # --- the pump: one per limited model ----------------------------------

    async def _pump(self, model: _Model) -> None:
        limit = model.limit
        assert limit is not None
        while any(model.waiting.values()) or self._settle:
            model.wake.clear()
            for queue in model.waiting.values():  # callers cancelled while waiting
                live = [entry for entry in queue if not entry[1].done()]
                if len(live) != len(queue):
                    queue.clear()
                    queue.extend(live)
            asked = [(lane, tokens, fut) for lane in LANES for tokens, fut in list(model.waiting[lane])[:BATCH]]
            settle, self._settle = self._settle, []
            requests = [(lane, tokens) for lane, tokens, _ in asked]

            def reserve(store: SqlStore, requests: list[tuple[str, int]] = requests,
                        settle: list[tuple[int, float, int]] = settle) -> Any:
                if settle:
                    store.settle_quota(settle)
                if not requests:
                    return None
                return store.reserve_quota(model.key, requests, tpm=limit.tpm, rpm=limit.rpm,
                                           interactive_share=limit.interactive_share, window=self.window,
                                           worker=self.worker, spread=limit.spread)

            asked_at = self.clock()  # before the grant, on this process's clock
            try:
                answer = await self._db(reserve)
            except Exception as exc:  # the store is unreachable: fail the waiting calls, retryably
                for lane, _, fut in asked:
                    model.waiting[lane].popleft()
                    if not fut.done():
                        fut.set_exception(ProviderError("connection", f"quota ledger unavailable: {exc}"))
                continue
            if answer is None:
                continue
            for (lane, tokens, fut), grant in zip(asked, answer.grants, strict=True):
                if grant is None:
                    continue
                model.waiting[lane].remove((tokens, fut))
                if grant == NEVER:
                    if not fut.done():
                        fut.set_exception(ProviderError(
                            "bad_request", f"a request of {tokens} tokens can never fit {model.key}'s limit of "
                            f"{limit.tpm} tokens per minute; shorten the prompt or lower max_tokens"))
                elif fut.done():  # the caller was cancelled meanwhile: hand the grant back unused
                    self._settle.append((0, 0.0, grant))
                else:
                    fut.set_result((grant, asked_at))
            if answer.wait is not None and any(model.waiting.values()):
                pause = min(answer.wait, POLL_S)
                try:
                    await asyncio.wait_for(model.wake.wait(), timeout=pause)
                except TimeoutError:
                    pass
            await asyncio.sleep(MIN_SPACING_S)

    # --- the store, on a thread and connection of its own -------------------

    async def on_store(self, fn: Callable[[SqlStore], T]) -> T:
        """Run ``fn(store)`` on the gate's own store connection (budgets use it too)."""
        return await self._db(fn)

    async def _db(self, fn: Callable[[SqlStore], T]) -> T:
        def call() -> T:
            if self._store is None:
                self._store = open_store(self.store_url, migrate=False)
            return fn(self._store)

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def _model(self, key: str, limit: RateLimit | None) -> _Model:
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = _Model(key, limit)
        return model

    async def close(self) -> None:
        """Flush the last settlements and close the connection."""
        for model in self._models.values():
            if model.pump is not None and not model.pump.done():
                model.pump.cancel()
        if self._settle:
            settle, self._settle = self._settle, []
            try:
                await self._db(lambda s: s.settle_quota(settle))
            except Exception:  # unsettled grants age out of the window on their own
                log.warning("could not settle %d quota grants on shutdown", len(settle))
        if self._store is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._store.close)
        self._pool.shutdown(wait=False)
