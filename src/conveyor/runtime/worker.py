"""A worker: claim tasks in batches under a lease, run them, commit in groups.

Sync stages without guards run in a thread, a claimed batch at a time; async
stages run concurrently on the event loop (bounded per stage); sync stages
with a timeout or memory limit run in killable child processes. Results are
group-committed; leases are renewed while work is in flight; expired leases
of dead workers are reclaimed by whoever notices first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from conveyor.blobs import Blobs
from conveyor.pipeline import Pipeline, Stage
from conveyor.runtime.classify import Failure, classify
from conveyor.runtime.context import Context
from conveyor.runtime.guard import GuardedPool
from conveyor.runtime.transitions import Outcome, Transitions
from conveyor.runtime.values import Ref, decode, encode, fanout_refs, parse_failure_memo, store_value
from conveyor.store import ClaimedTask, SqlStore, StoredOutput, open_store

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")


@dataclass
class WorkerOptions:
    run_id: str | None = None
    until_idle: bool = False
    batch_size: int = 500
    max_inflight: int = 1000
    flush_interval: float = 0.05
    poll_interval: float = 0.5
    lease_seconds: float | None = None
    shutdown_grace: float = 10.0
    guarded_processes: int = max(1, os.cpu_count() or 1)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self, pipeline: Pipeline, target: str, store_url: str, blobs: Blobs,
        options: WorkerOptions | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipeline = pipeline
        self.target = target
        self.store_url = store_url
        self.blobs = blobs
        self.opts = options or WorkerOptions()
        self.clock = clock
        self.id = worker_id()
        self.lease = self.opts.lease_seconds or pipeline.lease_seconds
        self.stats: Counter[str] = Counter()
        self._stages = sorted((s.name for s in pipeline), key=pipeline.depth, reverse=True)
        self._semaphores = {s.name: asyncio.Semaphore(s.concurrency) for s in pipeline if s.is_async}
        self._leases: dict[int, int] = {}
        self._results: list[Outcome] = []
        self._followers: dict[str, list[ClaimedTask]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._pool: GuardedPool | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- entry points ----------------------------------------------------

    def run(self) -> Counter[str]:
        """Process tasks until stopped (or, with ``until_idle``, until none are left)."""
        asyncio.run(self._main())
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
        self.transitions = Transitions(self.pipeline, self.store, self.id)
        keeper = asyncio.create_task(self._keep_leases())
        try:
            await self._loop_until_done()
        finally:
            keeper.cancel()
            await self._shutdown()

    def _install_signals(self) -> None:
        assert self._loop is not None and self._stop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._loop.add_signal_handler(sig, self._stop.set)
            except (ValueError, RuntimeError, NotImplementedError):
                return  # not the main thread: the caller stops us with request_stop()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the one thread that owns the connection."""
        assert self._loop is not None
        return await self._loop.run_in_executor(self._db, fn, *args)

    # --- the loop --------------------------------------------------------

    async def _loop_until_done(self) -> None:
        assert self._stop is not None
        idle_sleep, last_flush, claim_again = 0.01, time.monotonic(), True
        while not self._stop.is_set():
            room = min(self.opts.batch_size, self.opts.max_inflight - len(self._leases)) if claim_again else 0
            if self._flush_due(last_flush):
                # One transaction commits the finished batch and claims the next one.
                claimed = await self._flush(room)
                last_flush, claim_again = time.monotonic(), True
            elif room > 0:
                claimed = await self._claim(room)
            else:
                claimed = []
            if claimed:
                await self._dispatch(claimed)
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
            if self.opts.until_idle and await self._call(self.store.open_tasks, self.opts.run_id,
                                                         self.pipeline.name) == 0:
                return
            await self._idle(idle_sleep)
            idle_sleep, claim_again = min(idle_sleep * 2, self.opts.poll_interval), True

    def _flush_due(self, last_flush: float) -> bool:
        if not self._results:
            return False
        return (len(self._results) >= self.opts.batch_size or not self._running
                or time.monotonic() - last_flush >= self.opts.flush_interval)

    async def _claim(self, room: int) -> list[ClaimedTask]:
        claimed = await self._call(self.store.claim, self.pipeline.name, self._stages, room, self.id,
                                   self.clock(), self.lease, self.opts.run_id)
        self._track(claimed)
        return claimed

    def _track(self, claimed: list[ClaimedTask]) -> None:
        for task in claimed:
            self._leases[task.id] = task.lease_token

    async def _idle(self, seconds: float) -> None:
        assert self._stop is not None
        due = await self._call(self.store.next_due, self.pipeline.name, self.opts.run_id)
        if due is not None:
            seconds = max(0.0, min(seconds, due - self.clock()))
        if self.store.backend == "postgres" and seconds > 0.05:
            await asyncio.to_thread(self.store.wait_for_work, seconds)
        else:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=seconds)
            except TimeoutError:
                pass

    async def _flush(self, claim: int = 0) -> list[ClaimedTask]:
        """Commit the finished outcomes; in the same transaction, claim up to ``claim`` new tasks."""
        batch, self._results = self._results, []
        claim_args = (self.pipeline.name, self._stages, claim, self.id, self.lease, self.opts.run_id) if claim else None
        counts, claimed = await self._call(self.transitions.commit_and_claim, batch, self.clock(), claim_args)
        for outcome in batch:
            self._leases.pop(outcome.task.id, None)
        self._track(claimed)
        self.stats.update(counts)
        self.stats["stage_calls"] += sum(1 for o in batch if o.invoked)
        return claimed

    # --- running tasks ---------------------------------------------------

    async def _dispatch(self, claimed: list[ClaimedTask]) -> None:
        memo = await self._call(self.store.lookup_outputs, [t.task_key for t in claimed])
        inline: list[tuple[ClaimedTask, Stage]] = []
        for task in claimed:
            stage = self.pipeline[task.stage]
            refused = self._precheck(task, stage, memo.get(task.task_key))
            if refused is not None:
                self._results.append(refused)
                continue
            if task.task_key in self._followers:
                # The same work is already running here: wait for it instead of paying twice.
                self._followers[task.task_key].append(task)
                continue
            self._followers[task.task_key] = []
            if stage.is_async:
                self._spawn(self._run_async(task, stage))
            elif stage.guarded:
                self._spawn(self._run_guarded(task, stage))
            else:
                inline.append((task, stage))
        if inline:
            self._spawn(self._run_inline(inline))

    def _precheck(self, task: ClaimedTask, stage: Stage, hit: StoredOutput | None) -> Outcome | None:
        now = self.clock()
        if hit is not None and hit.kind == "failed":
            error_class, message = parse_failure_memo(hit.inline or b"{}")
            return Outcome(task, now, 0.0, False, cached=True,
                           failure=Failure(error_class, False, message, deterministic=True))
        if hit is not None:
            return Outcome(task, now, 0.0, False, Ref(hit.kind, hit.digest, hit.size, hit.inline), cached=True)
        if stage.max_input_bytes is not None and task.input_size > stage.max_input_bytes:
            message = (f"input of {task.input_size:,} bytes exceeds max_input_bytes={stage.max_input_bytes:,} "
                       f"of stage {stage.name!r}; it was not read")
            return Outcome(task, now, 0.0, False, failure=Failure("input_too_large", False, message,
                                                                  deterministic=True))
        return None

    def _spawn(self, coro: Any) -> None:
        job = asyncio.create_task(coro)
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _run_inline(self, batch: list[tuple[ClaimedTask, Stage]]) -> None:
        assert self._loop is not None
        outcomes = await self._loop.run_in_executor(
            self._cpu, lambda: [self._execute_sync(t, s) for t, s in batch])
        for outcome in outcomes:
            self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        """Record an attempt's outcome, and the same outcome for tasks that waited on it."""
        self._results.append(outcome)
        now = self.clock()
        for task in self._followers.pop(outcome.task.task_key, ()):
            self._results.append(Outcome(task, now, 0.0, False, outcome.output, cached=True,
                                         failure=outcome.failure))

    def _execute_sync(self, task: ClaimedTask, stage: Stage) -> Outcome:
        started, t0 = self.clock(), time.perf_counter()
        try:
            value = self._load(task)
        except Exception as exc:
            return Outcome(task, started, time.perf_counter() - t0, False, failure=classify(exc))
        try:
            output = self._store_output(stage, stage.fn(self._context(task), value))
        except Exception as exc:
            failure = classify(exc, stage.retry.terminal, traceback.format_exc())
            return Outcome(task, started, time.perf_counter() - t0, True, failure=failure)
        return Outcome(task, started, time.perf_counter() - t0, True, output)

    async def _run_async(self, task: ClaimedTask, stage: Stage) -> None:
        started, t0 = self.clock(), time.perf_counter()
        invoked = False
        try:
            value = self._load(task) if task.input_inline is not None else await asyncio.to_thread(self._load, task)
            async with self._semaphores[stage.name]:
                invoked = True
                result = await asyncio.wait_for(stage.fn(self._context(task), value), stage.timeout)
            output = await asyncio.to_thread(self._store_output, stage, result)
            self._finish(Outcome(task, started, time.perf_counter() - t0, True, output))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure = classify(exc, stage.retry.terminal, traceback.format_exc())
            if isinstance(exc, TimeoutError) and stage.timeout is not None:
                failure = Failure("timeout", True, f"stage {stage.name} exceeded its {stage.timeout:g}s timeout")
            self._finish(Outcome(task, started, time.perf_counter() - t0, invoked, failure=failure))

    async def _run_guarded(self, task: ClaimedTask, stage: Stage) -> None:
        started, t0 = self.clock(), time.perf_counter()
        try:
            value = await asyncio.to_thread(self._load, task)
        except Exception as exc:
            self._finish(Outcome(task, started, time.perf_counter() - t0, False, failure=classify(exc)))
            return
        if self._pool is None:
            self._pool = GuardedPool(_absolute_target(self.target), self.opts.guarded_processes)
        result = await self._pool.call(stage.name, value, self._context(task).fields(),
                                       timeout=stage.timeout, max_memory_bytes=stage.max_memory_bytes)
        if not result.ok:
            self._finish(Outcome(task, started, result.duration, True, failure=result.failure))
            return
        try:
            output = await asyncio.to_thread(self._store_output, stage, result.value)
        except Exception as exc:
            failure = classify(exc, stage.retry.terminal, traceback.format_exc())
            self._finish(Outcome(task, started, result.duration, True, failure=failure))
            return
        self._finish(Outcome(task, started, result.duration, True, output))

    def _load(self, task: ClaimedTask) -> Any:
        data = task.input_inline if task.input_inline is not None else self.blobs.get(task.input_digest)
        return decode(task.input_kind, data)

    def _store_output(self, stage: Stage, result: Any) -> Ref:
        if stage.kind == "fanout":
            _, data = fanout_refs(result, self.blobs)
            import hashlib

            return Ref("fanout", hashlib.sha256(data).hexdigest(), len(data), data)
        return store_value(*encode(result), self.blobs)

    def _context(self, task: ClaimedTask) -> Context:
        return Context(task.run_id, task.item_key, task.stage, task.attempts, task.task_key, self.pipeline.name,
                       task.input_digest)

    # --- leases and shutdown ---------------------------------------------

    async def _keep_leases(self) -> None:
        """Renew our leases and reclaim dead workers' ones, every third of a lease."""
        interval = max(0.2, self.lease / 3)
        while True:
            await asyncio.sleep(interval)
            if self._leases:
                await self._call(self.store.renew_leases, list(self._leases.items()), self.clock() + self.lease)
            counts = await self._call(self.transitions.reclaim_expired, self.clock())
            self.stats.update({f"reclaimed_{k}": v for k, v in counts.items()})

    async def _shutdown(self) -> None:
        if self._running:
            await asyncio.wait(self._running, timeout=self.opts.shutdown_grace)
        for job in list(self._running):
            job.cancel()
        if self._running:
            await asyncio.wait(self._running, timeout=5)
        if self._pool is not None:
            await self._pool.close()
        if self._results:
            await self._flush()
        if self._leases:
            await self._call(self.store.release, list(self._leases.items()))
            self.stats["released"] += len(self._leases)
            self._leases.clear()
        await self._call(self.store.close)
        self._db.shutdown(wait=True)
        self._cpu.shutdown(wait=False, cancel_futures=True)


def _absolute_target(target: str) -> str:
    module_ref, _, attr = target.rpartition(":")
    if module_ref.endswith(".py") or "/" in module_ref:
        return f"{os.path.abspath(module_ref)}:{attr}"
    return target
