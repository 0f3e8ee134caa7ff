"""A worker: claim tasks in batches under a lease, run them, commit in groups.

Each loop turn commits what finished (group commit) and, in the same
transaction, claims more, as much as the stages' pace says can be finished
well within a lease. Leases are renewed while work is in flight; expired
leases of dead workers are reclaimed by whoever notices first; a task that
was in flight when its worker died runs alone next time (a "suspect").
On SIGTERM the worker stops claiming, finishes what has started (up to
``shutdown_grace``) and releases the rest. A lost connection to the store (a
restart, a terminated backend) is waited out: every store call is made
again, on a new connection, with backoff, until the store answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from conveyor.blobs import Blobs
from conveyor.pipeline import Pipeline, Stage, declarations
from conveyor.runtime import tracing
from conveyor.runtime.alerts import evaluate as evaluate_alerts
from conveyor.runtime.alerts import every_seconds, operator_webhook_url
from conveyor.runtime.clock import FleetClock
from conveyor.runtime.collector import fewer_collections
from conveyor.runtime.execute import Executor
from conveyor.runtime.expand import RUNS_REMEMBERED
from conveyor.runtime.fleet import FORGET_AFTER_S, beat_seconds, this_process
from conveyor.runtime.heartbeat import submission_alive
from conveyor.runtime.pacing import Pacing
from conveyor.runtime.provider_batch import BatchSettings, batch_stages, lane_from_env
from conveyor.runtime.provider_batch_keeper import BatchKeeper
from conveyor.runtime.services import model_stages
from conveyor.runtime.target import absolute_target
from conveyor.runtime.transitions import Claim, Outcome, Transitions
from conveyor.store import ClaimedTask, Lease, SqlStore, WorkerRow, open_store

log = logging.getLogger("conveyor.worker")
BACKLOG_READ_S = 0.25
PAUSED_READ_S = 1.0
COMPACT_EVERY_S = 60.0  # folding the queue's counts per second (a scrape reads them)
CONFLICT_RETRIES = 5  # a transaction the database rolled back for another's (a deadlock) is made again
RECONNECT_S = (0.1, 5.0)  # the first and the longest wait between calls to a store whose connection was lost
T = TypeVar("T")


@dataclass
class WorkerOptions:
    run_id: str | None = None
    until_idle: bool = False
    batch_size: int = 1000
    max_inflight: int = 2000
    flush_interval: float = 0.05
    poll_interval: float = 0.5
    lease_seconds: float | None = None
    shutdown_grace: float = 10.0
    guarded_processes: int = max(1, os.cpu_count() or 1)
    warn_stale_code: bool = True  # say once per stage when memo answers came from other code (see memo.py)
    # Every model-calling stage on the provider batch lane (`--provider-batch`; also CONVEYOR_PROVIDER_BATCH=1).
    provider_batch: bool = False


def worker_id() -> str:
    host, pid = this_process()
    return f"{host}:{pid}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self, pipeline: Pipeline, target: str, store_url: str, blobs: Blobs,
        options: WorkerOptions | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipeline = pipeline
        self.store_url = store_url
        self.opts = options or WorkerOptions()
        # ``clock`` is this machine's; leases and schedules use the store's (runtime/clock.py).
        self.clock = FleetClock(clock)
        self.id = worker_id()
        self.lease = self.opts.lease_seconds or pipeline.lease_seconds
        self.stats: Counter[str] = Counter()
        self.executor = Executor(pipeline, absolute_target(target), blobs, self.opts.guarded_processes,
                                 self.clock, store_url, self.id, self.lease)
        self.pacing = Pacing(pipeline, self.lease, self.opts.batch_size, self.opts.guarded_processes)
        self._stages = sorted((s.name for s in pipeline), key=pipeline.depth, reverse=True)
        self._leases: dict[int, int] = {}
        self._in_flight: Counter[str] = Counter()
        self._results: list[Outcome] = []
        self._done = 0  # outcomes committed: the fleet view's tasks done
        self._followers: dict[str, list[ClaimedTask]] = {}
        self._answered: dict[str, Outcome] = {}  # results of this worker not committed yet, by task key
        self._warned: set[str] = set()
        self._running: set[asyncio.Task[None]] = set()
        self._alone = False
        # Acceptance boundaries: checks may read the items' manifest meta; reviews may pass their deadline.
        self._judged_with_checks = any(s.accept is not None and s.accept.checks for s in pipeline)
        self._reads_params = any(s.params for s in pipeline)  # stages that read run parameters (ctx.params)
        self._reviewed = any(s.accept is not None and s.accept.review is not None for s in pipeline)
        self._grouped = any(s.kind in ("group", "reduce") for s in pipeline)  # it makes runs' groups when idle
        # Backpressure: stages not claimed while a stage after them has max_backlog tasks queued.
        self._downstream = {s.name: [c.name for c in pipeline.children(s.name)]
                            for s in pipeline if pipeline.children(s.name)}
        self._watched = sorted({c for children in self._downstream.values() for c in children})
        self._held_back: set[str] = set()
        self._depths_read = float("-inf")
        self._paused: tuple[str, ...] = ()  # runs paused in the store or found so by a call here
        self._paused_in_store: tuple[str, ...] = ()
        # What a paused run holds back: its tasks at the stages that call models (the rest still run).
        self._model_stages = frozenset(model_stages(pipeline))
        self._paused_read = float("-inf")
        self._stop: asyncio.Event | None = None
        self._outage: float | None = None  # when the store's connection was lost (monotonic), until it answers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alerts_every = every_seconds()
        self._alerts_hook = (operator_webhook_url() if pipeline.alerts is not None else None) or ""  # checked now
        self._alerts_due = float("-inf")  # the pipeline's alerts (runtime/alerts.py): from the first keeper round
        self._compact_due = time.monotonic() + COMPACT_EVERY_S
        # The provider batch lane (runtime/provider_batch.py): its stages, and the keeper of the batches.
        self._batch_stages = batch_stages(pipeline, self.opts.provider_batch or lane_from_env())
        self.executor.batch_stages = self._batch_stages
        # The stages whose model calls are journaled (runtime/journal.py): async ones that call models, off the lane.
        self._journaled_stages = frozenset(s for s in self._model_stages if pipeline[s].is_async) - self._batch_stages
        self.executor.journaled_stages = self._journaled_stages
        self.batch_keeper: BatchKeeper | None = None
        if self._batch_stages:
            self.batch_keeper = BatchKeeper(pipeline.name, self.id, BatchSettings.from_env(), self._store_call,
                                            self.executor.services.batch_api, self.clock, self._wake_call)

    # --- entry points ----------------------------------------------------

    def run(self) -> Counter[str]:
        """Process tasks until stopped (or, with ``until_idle``, until none are left).

        Raises ProviderUnavailable, before claiming anything, when the stages call a model and no
        provider is configured; or after releasing its tasks, when that is found out on a first call.
        """
        self.executor.check()
        with fewer_collections():
            asyncio.run(self._main())
        if self.executor.fatal is not None:
            raise self.executor.fatal
        return self.stats

    def request_stop(self) -> None:
        """Thread-safe: finish or release in-flight work, then return from ``run``."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._install_signals()
        self._db = ThreadPoolExecutor(1, thread_name_prefix="conveyor-db")
        self._cpu = ThreadPoolExecutor(1, thread_name_prefix="conveyor-stage")
        self.store: SqlStore = await self._call(open_store, self.store_url)
        await self._call(self._sync_clock)
        self.transitions = Transitions(self.pipeline, self.store, self.id)
        self.transitions.batch_stages = self._batch_stages
        await self._call(self._register)
        keeper = asyncio.create_task(self._keep_leases())
        batches = asyncio.create_task(self._keep_provider_batches()) if self.batch_keeper is not None else None
        log.info("worker %s started on %s (%s)", self.id, self.pipeline.name, self.store.backend,
                 extra={"event": "worker_started", "run": self.opts.run_id})
        try:
            await self._loop_until_done()
            await self._drain()
        except Exception:
            if not (self._stop.is_set() and self.store.lost()):  # else: told to stop, with the store out of reach
                raise
        finally:
            keeper.cancel()
            if batches is not None:
                batches.cancel()
            await self._shutdown()

    def _install_signals(self) -> None:
        assert self._loop is not None and self._stop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._loop.add_signal_handler(sig, self._stop.set)
            except (ValueError, RuntimeError, NotImplementedError):
                return  # not the main thread: the caller stops us with request_stop()

    def _register(self) -> None:
        host, pid = this_process()
        now = self.clock()
        self.store.note_declarations(declarations.rows(self.pipeline), now)
        self.store.register_worker(WorkerRow(self.id, host, pid, self.pipeline.name, self.opts.run_id,
                                             beat_seconds(self.lease), now, now, serves=declarations.serves(
                                                 self.pipeline)), now - FORGET_AFTER_S)

    def _sync_clock(self) -> None:
        self.clock.sync(self.store.clock, self.store.db.local_clock)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the one thread that owns the connection. When the connection was lost, the call
        (its transaction rolled back) is made again on a new one after a backoff, until the store answers;
        leases that run out meanwhile are fenced as ever (a stale commit changes nothing)."""
        assert self._loop is not None
        wait, conflicts = RECONNECT_S[0], 0
        while True:
            try:
                result = await self._loop.run_in_executor(self._db, fn, *args)
            except Exception as exc:
                if self._conflicted(exc) and conflicts < CONFLICT_RETRIES:
                    conflicts += 1  # chosen as a deadlock's victim: rolled back whole, made again at once
                    await asyncio.sleep(random.uniform(0, 0.05 * conflicts))
                    continue
                if not self._store_lost(exc):
                    raise
                await asyncio.sleep(random.uniform(wait / 2, wait))
                wait = min(wait * 2, RECONNECT_S[1])
                continue
            if self._outage is not None and not self.store.lost():
                log.info("store reachable again after %.1f s", time.monotonic() - self._outage,
                         extra={"event": "store_back", "run": self.opts.run_id})
                self._outage = None
            return result

    def _conflicted(self, exc: Exception) -> bool:
        store: SqlStore | None = getattr(self, "store", None)
        if store is None or not store.conflicted(exc):
            return False
        self.stats["store_conflicts"] += 1
        log.info("the store rolled back a transaction for another's sake (%s); making it again",
                 str(exc).strip().splitlines()[0], extra={"event": "store_conflict", "run": self.opts.run_id})
        return True

    def _store_lost(self, exc: Exception) -> bool:
        """Whether ``exc`` came from losing the store's connection, worth waiting out: not once the worker was
        told to stop and the outage has lasted its shutdown grace. Logs one line per outage."""
        store: SqlStore | None = getattr(self, "store", None)
        if store is None or not store.lost():
            return False
        if self._outage is None:
            self._outage = time.monotonic()
            self.stats["store_outages"] += 1
            log.warning("lost the connection to the store (%s); trying again every %.0f s at most",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                        RECONNECT_S[1], extra={"event": "store_lost", "run": self.opts.run_id})
        assert self._stop is not None
        return not (self._stop.is_set() and time.monotonic() - self._outage > self.opts.shutdown_grace)

    async def _wake_call(self, *args: Any) -> Any:
        """Transitions.settle_batch_requests on the store's thread: what a batch answered, its tasks woken."""
        return await self._call(self.transitions.settle_batch_requests, *args)

    async def _store_call(self, name: str, *args: Any) -> Any:
        """The store's method ``name``, called on the store's thread (for the provider batch keeper)."""
        return await self._call(getattr(self.store, name), *args)

    # --- the loop --------------------------------------------------------

    async def _loop_until_done(self) -> None:
        assert self._stop is not None
        idle_sleep, last_flush, claim_again = 0.01, time.monotonic(), True
        while not self._stop.is_set() and self.executor.fatal is None:
            fresh: list[ClaimedTask] = []
            if self._flush_due(last_flush):
                # One transaction commits the finished batch and claims the next one, into the room the commit
                # frees, whatever the last claim found: it may have found nothing only because this batch held
                # its stage's cap. (Sized before the commit, that claim took nothing and sent the worker down
                # the idle path once per batch: a count of every queued task and a sleep.)
                room = self._room(freed=len(self._results))
                fresh, claimed = await self._flush(room)
                last_flush, claim_again = time.monotonic(), True
            elif (room := self._room() if claim_again else 0) > 0:
                claimed = await self._claim(room)
            else:
                claimed = []
            if claimed or fresh:
                await self._dispatch(claimed, fresh)
                idle_sleep = 0.01
                continue
            if room > 0:
                claim_again = False
            if self._running:
                await asyncio.wait(self._running, timeout=self.opts.flush_interval,
                                   return_when=asyncio.FIRST_COMPLETED)
                continue
            if self._results:
                continue
            if await self._claim_suspect():
                continue
            if self._grouped and await self._call(self._make_groups):
                claim_again = True
                continue
            if self.opts.until_idle and await self._call(self._idle_for_good):
                return
            await self._idle(idle_sleep)
            idle_sleep, claim_again = min(idle_sleep * 2, self.opts.poll_interval), True

    def _idle_for_good(self) -> bool:
        """No open task (of a run that is not paused), and no live submission that could add some (a
        submission whose submitter stopped beating is marked abandoned on the way)."""
        run_id, pipeline = self.opts.run_id, self.pipeline.name
        paused = self.store.paused_runs(pipeline)
        # Only tasks of this worker's declaration count: it can take no other, and no other worker makes it any.
        declared = self.transitions.declared
        open_tasks = (self.store.any_open_tasks_outside(pipeline, paused, run_id, sorted(self._model_stages),
                                                        declared) if paused
                      else self.store.any_open_tasks(pipeline, run_id, declared))
        if open_tasks:
            return False
        return not submission_alive(self.store, pipeline, run_id, self.clock())

    def _room(self, freed: int = 0) -> int:
        """How many tasks to claim: a batch, within ``max_inflight`` once ``freed`` leases are given up."""
        if self._alone:
            return 0
        return min(self.opts.batch_size, self.opts.max_inflight - len(self._leases) + freed)

    def _flush_due(self, last_flush: float) -> bool:
        if not self._results:
            return False
        return (len(self._results) >= self.opts.batch_size or not self._running
                or time.monotonic() - last_flush >= self.opts.flush_interval)

    async def _claim(self, room: int) -> list[ClaimedTask]:
        await self._read_backlog()
        claimed = await self._call(self.transitions.claim, self._stages, room, self.clock(), self.lease,
                                   self.opts.run_id, self._caps(self._in_flight), self._paused,
                                   self._model_stages)
        self._track(claimed)
        return claimed

    async def _claim_suspect(self) -> bool:
        """With nothing in flight, take one task that was in flight when a worker died, and run it alone."""
        # The runs paused since the last claim first: a suspect whose call found its run paused would otherwise
        # be claimed again at once, for ever (alone, this worker makes no other claim that would read them).
        await self._read_backlog()
        claimed = await self._call(self.transitions.claim_suspect, self.clock(), self.lease, self.opts.run_id,
                                   self._paused)
        if claimed:
            self._alone = True
            self._track(claimed)
            await self._dispatch(claimed)
        return bool(claimed)

    def _caps(self, in_flight: Counter[str], bound: int | None = None) -> dict[str, int]:
        caps = self.pacing.caps(in_flight, bound)
        for stage in self._held_back:
            caps[stage] = 0
        return caps

    async def _read_backlog(self) -> None:
        """Every BACKLOG_READ_S: which stages wait because a stage after them is backed up; every PAUSED_READ_S,
        which runs are paused (their budget spent, their breaker tripped): their tasks are not claimed."""
        if time.monotonic() - self._paused_read >= PAUSED_READ_S:
            self._paused_read = time.monotonic()
            self._paused_in_store = tuple(await self._call(self.store.paused_runs, self.pipeline.name))
            self.executor.services.unpaused(self._paused_in_store)
            # A run a call found paused here is left alone at once, until the store says it was resumed.
            self.executor.paused.intersection_update(self._paused_in_store)
        self._paused = tuple(sorted({*self._paused_in_store, *self.executor.paused}))
        if time.monotonic() - self._depths_read < BACKLOG_READ_S:
            return
        self._depths_read = time.monotonic()
        if not self._watched:
            return
        limit = self.pipeline.max_backlog
        depths = await self._call(self.store.queued_depths, self.pipeline.name, self._watched, limit,
                                  self.opts.run_id)
        held = {name for name, children in self._downstream.items() if any(depths[c] >= limit for c in children)}
        if held != self._held_back:
            log.info("backpressure: holding back %s", sorted(held) or "nothing",
                     extra={"event": "backpressure", "run": self.opts.run_id})
            self.stats["backpressure_holds"] += len(held - self._held_back)
        self._held_back = held

    def _track(self, claimed: list[ClaimedTask]) -> None:
        for task in claimed:
            self._leases[task.id] = task.lease_token
            self._in_flight[task.stage] += 1

    async def _idle(self, seconds: float) -> None:
        assert self._stop is not None
        now = self.clock()
        due = await self._call(self.store.next_due, self.pipeline.name, self._stages, now, self.opts.run_id)
        if due is not None:
            seconds = max(0.0, min(seconds, due - now))
        if self.store.db.wakes_on_notify and seconds > 0.05:
            await asyncio.to_thread(self.store.wait_for_work, seconds)
        else:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=seconds)
            except TimeoutError:
                pass

    async def _flush(self, claim: int = 0) -> tuple[list[ClaimedTask], list[ClaimedTask]]:
        """Commit the finished outcomes; in the same transaction, claim up to ``claim`` new tasks.
        Returns (fresh, claimed): see Transitions.commit_and_claim."""
        batch, self._results = self._results, []
        claim_args = None
        if claim:
            await self._read_backlog()
            # The tasks this commit makes may be leased as they are made up to one batch past the in-flight bound
            # (the commit's claim from the queue still takes at most ``claim``, within the bound). A fan-out of two
            # makes two batches from one while the next batch is in flight: held to the bound, half of them were
            # queued and claimed again, and a worker whose claims then took those stuck to that for the run.
            held = self.opts.max_inflight + self.opts.batch_size
            caps = self._caps(self._in_flight - Counter(o.task.stage for o in batch), held)
            fresh_room = held - len(self._leases) + len(batch)
            claim_args = Claim(self.pipeline.name, self._stages, claim, self.id, self.lease, self.opts.run_id, caps,
                               self._paused, self._model_stages, fresh_room)
        counts, fresh, claimed = await self._call(self.transitions.commit_and_claim, batch, self.clock(),
                                                  claim_args)
        self._answered.clear()
        self._done += len(batch)
        leases, in_flight, calls = self._leases, self._in_flight, 0
        memoised: set[str] = set()
        paced: list[tuple[str, float]] = []
        for outcome in batch:
            task = outcome.task
            leases.pop(task.id, None)
            in_flight[task.stage] -= 1
            memoised.add(task.task_key)
            if outcome.invoked:
                calls += 1
                if not outcome.deferred:  # a deferral says nothing of the stage's pace
                    paced.append((task.stage, outcome.duration))
        self.pacing.record_many(paced)
        self._alone = False
        self._track(fresh)
        self._track(claimed)
        self.stats.update(counts)
        if counts.get("stale_code") and self.opts.warn_stale_code:
            self._warn_stale()
        self.stats["stage_calls"] += calls
        # A fresh task was looked up in the memo as the commit was prepared: one whose key this very commit
        # memoised (its answer was in the batch) is handed back as claimed, to be looked up again at dispatch.
        again = [t for t in fresh if t.task_key in memoised]
        if again:
            fresh, claimed = [t for t in fresh if t.task_key not in memoised], [*claimed, *again]
        return fresh, claimed

    def _warn_stale(self) -> None:
        for stage in sorted(self.transitions.stale_stages - self._warned):
            self._warned.add(stage)
            log.warning("stage %r (version %s) was answered from outputs that other code made under the same "
                        "version: its code changed. Bump version= on that stage to run it again, or accept them "
                        "with --accept-code-change %s", stage, self.pipeline[stage].version, stage,
                        extra={"event": "stale_code", "run": self.opts.run_id, "stage": stage})

    # --- dispatching -------------------------------------------------------

    async def _dispatch(self, claimed: list[ClaimedTask], fresh: list[ClaimedTask] | None = None) -> None:
        """Start claimed tasks, after Transitions.answers has answered those that need no stage call."""
        answered, to_run = await self._call(self.transitions.answers, claimed, fresh or [], self.clock())
        self._results += answered
        on_lane = [t.id for t in to_run if t.stage in self._batch_stages] if self._batch_stages else []
        if on_lane:  # what became of the model requests these tasks left to the provider batch lane
            self.executor.batch_states.update(await self._call(self.store.batch_answers, on_lane))
        journaled = [t.id for t in to_run if t.stage in self._journaled_stages] if self._journaled_stages else []
        if journaled:  # the answers earlier attempts of these tasks were given (runtime/journal.py)
            self.executor.call_answers.update(await self._call(self.store.call_answers, journaled))
        if self._judged_with_checks:
            self.executor.metas.update(await self._call(self.transitions.metas, to_run))
        if self._reads_params:
            unknown = {t.run_id for t in to_run} - self.executor.run_params.keys()
            if unknown:
                if len(self.executor.run_params) >= RUNS_REMEMBERED:
                    self.executor.run_params.clear()
                self.executor.run_params.update(await self._call(self.transitions.run_params, unknown))
        inline: list[tuple[ClaimedTask, Stage]] = []
        followers, finished = self._followers, self._answered
        ways: dict[str, tuple[Stage, int]] = {}  # stage -> (its declaration, 2: async, 1: guarded, 0: inline)
        for task in to_run:
            key = task.task_key
            if key in followers:
                # The same work is already running here: wait for it instead of paying twice.
                followers[key].append(task)
                self.executor.call_answers.pop(task.id, None)  # it makes no call here
                continue
            done = finished.get(key) if finished else None
            if done is not None:  # ... or it finished here and is not committed yet
                self._results.append(_answer(task, done, self.clock()))
                self.executor.call_answers.pop(task.id, None)
                continue
            followers[key] = []
            way = ways.get(task.stage)
            if way is None:
                declared = self.pipeline[task.stage]
                way = ways[task.stage] = (declared, 2 if declared.is_async else 1 if declared.guarded else 0)
            stage, how = way
            if how == 2:
                self._spawn(self.executor.run_async(task, stage, self._finish))
            elif how == 1:
                self._spawn(self.executor.run_guarded(task, stage, self._finish))
            else:
                inline.append((task, stage))
        if inline:
            self._spawn(self._run_inline(inline))

    def _spawn(self, coro: Any) -> None:
        job = asyncio.create_task(coro)
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _run_inline(self, batch: list[tuple[ClaimedTask, Stage]]) -> None:
        assert self._loop is not None
        for outcome in await self._loop.run_in_executor(self._cpu, self.executor.run_inline, batch):
            self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        """Record an attempt's outcome, and the same outcome for tasks that waited on it."""
        self._results.append(outcome)
        key = outcome.task.task_key
        if outcome.output is not None or (outcome.failure is not None and outcome.failure.deterministic):
            self._answered[key] = outcome
        followers = self._followers.pop(key, None)
        if followers:
            now = self.clock()
            for task in followers:
                self._results.append(_answer(task, outcome, now))

    # --- leases and shutdown ---------------------------------------------

    async def _keep_leases(self) -> None:
        """Renew our leases and reclaim dead workers' ones, every third of a lease. A failure of one
        round (the database restarting, say) is logged and the next round tries again: leases must
        not run out because one renewal failed."""
        interval = beat_seconds(self.lease)
        while True:
            await asyncio.sleep(interval)
            # The leases are read here, on the event loop that changes them, not on the store's thread.
            held = [Lease(task_id, token) for task_id, token in self._leases.items()]
            steps = ((self._sync_clock, ()), (self._renew, (held,)), (self._reclaim, (len(held), self._done)),
                     (self._expire_reviews, ()), (self._evaluate_alerts, ()), (self._compact_queue_counts, ()),
                     (self._make_groups, ()))
            for step, args in steps:
                try:
                    await self._call(step, *args)
                except Exception:
                    self.stats["keeper_errors"] += 1
                    if self.store.lost():  # told to stop while the store is out of reach: said once already
                        continue
                    log.exception("lease keeping failed (%s); trying again in %.1f s", step.__name__, interval,
                                  extra={"event": "keeper_error", "run": self.opts.run_id})

    async def _keep_provider_batches(self) -> None:
        """Every second or so: pack, create and poll the pipeline's provider batches when this worker holds
        their keeper lease (runtime/provider_batch_keeper.py). A failed round is logged and tried again."""
        assert self.batch_keeper is not None
        tick = min(1.0, self.batch_keeper.settings.gather_s / 2)
        while True:
            try:
                await self.batch_keeper.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats["provider_batch_errors"] += 1
                log.exception("provider batch keeping failed; trying again in %.1f s", tick,
                              extra={"event": "provider_batch_error", "run": self.opts.run_id})
            await asyncio.sleep(tick)

    def _renew(self, leases: list[Lease]) -> None:
        if leases:
            self.transitions.renew(leases, self.clock() + self.lease)

    def _reclaim(self, held: int, done: int) -> None:
        """Beat (runtime/fleet.py), then reclaim expired leases: one transaction, one write lock, as before."""
        with self.store.transaction():
            self.store.beat_worker(self.id, self.clock(), held, done)
            counts = self.transitions.reclaim_expired(self.clock())
        self.stats.update({f"reclaimed_{k}": v for k, v in counts.items()})

    def _unregister(self) -> None:
        try:
            self.store.stop_worker(self.id, self.clock(), self._done)
        except Exception:  # the store is gone (a restart): the worker is seen as lost, not stopped
            log.warning("could not mark worker %s stopped", self.id, exc_info=not self.store.lost(),
                        extra={"event": "worker_unregister_failed", "run": self.opts.run_id})

    def _expire_reviews(self) -> None:
        if self._reviewed:
            counts = self.transitions.expire_reviews(self.clock())
            self.stats.update({f"review_{k}": v for k, v in counts.items()})

    def _make_groups(self) -> bool:
        """The groups of runs settled at a group stage's parent (runtime/transitions/groups.py): True if that
        queued tasks."""
        if not self._grouped:
            return False
        return self.transitions.make_groups(self.clock(), self.executor.blobs, self.opts.run_id) > 0

    def _compact_queue_counts(self) -> None:
        """Every COMPACT_EVERY_S: fold the open-task counts (store/queuecounts.py) so a scrape reads few rows."""
        if time.monotonic() < self._compact_due:
            return
        self._compact_due = time.monotonic() + COMPACT_EVERY_S
        self.store.compact_open_task_seconds()

    def _evaluate_alerts(self) -> None:
        """Every ``CONVEYOR_ALERT_EVERY_S`` (30 s): the pipeline's alerts, unless another process of the fleet
        evaluated them meanwhile."""
        if self.pipeline.alerts is None or time.monotonic() < self._alerts_due:
            return
        self._alerts_due = time.monotonic() + self._alerts_every
        moved = evaluate_alerts(self.store, self.pipeline, self.clock(), self._alerts_every, self._alerts_hook)
        fired = sum(1 for t in moved if t.firing)
        if fired:
            self.stats["alerts_fired"] += fired

    async def _give_back(self) -> None:
        """Commit what finished; release the leases of what did not."""
        if self._results:
            await self._flush()
        if self._leases:
            await self._call(self.transitions.release, [Lease(*lease) for lease in self._leases.items()])
            self.stats["released"] += len(self._leases)
            self._leases.clear()

    async def _drain(self) -> None:
        """Stop starting tasks; let started ones finish (leases still renewed) up to the grace period."""
        self.executor.stopping.set()
        if self._running:
            await asyncio.wait(self._running, timeout=self.opts.shutdown_grace)

    async def _shutdown(self) -> None:
        self.executor.stopping.set()
        for job in list(self._running):
            job.cancel()
        if self._running:
            await asyncio.wait(self._running, timeout=5)
        if self.batch_keeper is not None:
            self.stats.update({f"provider_{k}": v for k, v in self.batch_keeper.stats.items()})
            with contextlib.suppress(Exception):  # the store is gone: the lease runs out on its own
                await self.batch_keeper.release()
        await self.executor.close()
        gate = self.executor.services.gate
        if gate is not None and gate.stats["granted"]:
            # Provider calls admitted, seconds they waited for the fleet's quota, 429s met, pauses honoured.
            self.stats.update({f"quota_{k}": round(v, 3) for k, v in gate.stats.items()})
        try:
            await self._give_back()
        except Exception:
            if not self.store.lost():
                raise
            log.warning("the store stayed out of reach: %d tasks were neither committed nor given back; their "
                        "leases run out in %.0f s and other workers take them", len(self._leases), self.lease,
                        extra={"event": "give_back_failed", "run": self.opts.run_id})
        await self._call(self._unregister)
        await self._call(self.store.close)
        log.info("worker %s stopped: %s", self.id, dict(self.stats),
                 extra={"event": "worker_stopped", "run": self.opts.run_id})
        self._db.shutdown(wait=True)
        self._cpu.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(tracing.flush)  # spans still buffered leave before the process may exit


def _answer(task: ClaimedTask, done: Outcome, now: float) -> Outcome:
    """``task`` answered by ``done``, the outcome of another task with the same key."""
    if done.deferred:  # it waits on the same requests
        return Outcome(task, now, 0.0, False, deferred=done.deferred)
    if done.verdict is not None and done.failure is not None:  # a refused answer: routed for each task
        return Outcome(task, now, 0.0, False, failure=done.failure, verdict=done.verdict, candidate=done.candidate,
                       provenance=done.provenance)
    return Outcome(task, now, 0.0, False, done.output, cached=True, failure=done.failure, provenance=done.provenance)
