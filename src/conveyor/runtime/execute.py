"""Running one claimed task: read its input, call the stage, store its output.

Three ways, by the stage's shape: sync stages without guards run in a
thread, a claimed batch at a time; async stages run on the event loop,
bounded per stage; sync stages with a timeout or memory limit run in
killable child processes. Each produces an ``Outcome``; none raises for a
stage's failure. Once ``stopping`` is set, tasks not yet started are skipped
(they produce no outcome, so the worker releases them).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor.acceptance.declare import INVALID_FORMAT
from conveyor.acceptance.judge import judge
from conveyor.acceptance.record import publish_once, staged
from conveyor.blobs import Blobs
from conveyor.errors import ProviderUnavailable
from conveyor.pipeline import Pipeline, Stage
from conveyor.pipeline.params import StageParams
from conveyor.runtime.attemptlog import AttemptLog
from conveyor.runtime.budget import RunPaused
from conveyor.runtime.classify import Failure, classify
from conveyor.runtime.context import Context, call_stage
from conveyor.runtime.groups import MEMBERS, Group, StepMemo, Tree, load_group
from conveyor.runtime.guard import GuardedPool
from conveyor.runtime.journal import CallJournal
from conveyor.runtime.provenance import document
from conveyor.runtime.provider_batch import BatchCalls, Deferred
from conveyor.runtime.services import Services
from conveyor.runtime.transitions import Outcome
from conveyor.runtime.values import PARTS, Ref, decode, encode, fanout_refs, load_parts, load_value, store_value
from conveyor.store import ClaimedTask, Lease
from conveyor.store.provider_batch import RequestState

UNREPAIRED_CHARS = 20_000  # characters kept of an answer's text before its repair

Finish = Callable[[Outcome], None]


class StageExit(Exception):
    """SystemExit, KeyboardInterrupt or GeneratorExit raised by an async stage, carried as its cause.

    Left as they are, they would leave the stage's task and stop the worker's event loop (asyncio
    re-raises them out of the loop); as an ordinary exception they are that task's failure.
    """


async def _contained(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except asyncio.CancelledError:
        raise
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise StageExit(f"{type(exc).__name__}: {exc}") from exc


def _made_by(outcome: Outcome, stage: Stage, runtime: dict[str, Any] | None) -> Outcome:
    """``outcome`` with the provenance of what made it: the stage's declared versions, the ones it set in
    ``ctx.provenance`` and the models it called."""
    outcome.provenance = document(stage, runtime, outcome.usage)
    return outcome


def _unrepaired(answer: Any) -> str | None:
    """The text of an answer whose format was repaired, as the stage returned it (cut at UNREPAIRED_CHARS),
    kept with the attempt so the item page shows the answer before and after its repair."""
    text = getattr(answer, "text", answer)
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    return text if len(text) <= UNREPAIRED_CHARS else text[:UNREPAIRED_CHARS - 1] + "…"


def _guarded_failure(stage: Stage, failure: Failure | None) -> Failure:
    """A memory limit hit under ``max_memory_mb`` is the content's refusal under that guard: memoised,
    and answered only while the stage declares the same limit."""
    assert failure is not None
    if failure.error_class == "memory_limit" and stage.max_memory_bytes is not None:
        return Failure("memory_limit", False, failure.message, None, failure.detail, deterministic=True,
                       guard=("max_memory_bytes", stage.max_memory_bytes))
    return failure


class Executor:
    def __init__(self, pipeline: Pipeline, target: str, blobs: Blobs, guarded_processes: int,
                 clock: Callable[[], float], store_url: str | None = None, worker: str = "",
                 lease_seconds: float | None = None) -> None:
        self.pipeline = pipeline
        self.target = target
        self.blobs = blobs
        self.clock = clock
        self.guarded_processes = guarded_processes
        self.stopping = threading.Event()
        # Per async stage, ``concurrency`` slots for bulk work and as many of its own for the interactive
        # lane, so an interactive task never waits behind bulk tasks that hold every slot.
        self._semaphores = {(s.name, rank): asyncio.Semaphore(s.concurrency)
                            for s in pipeline if s.is_async for rank in (0, 1)}
        self._pool: GuardedPool | None = None
        self.services = Services(pipeline, store_url, worker, lease_seconds)
        self.store_url = store_url  # the memo of large groups' batch and fold steps (runtime/groups.py)
        self.steps: dict[int, list[Any]] = {}  # task id -> the steps its group call made, for its outcome
        self.fatal: ProviderUnavailable | None = None  # set when no task can run here: the worker stops
        # Manifest meta of the items whose answers are judged, by (run, root key): filled by the worker.
        self.metas: dict[tuple[str, str], dict[str, Any]] = {}
        # The parameter values of the runs whose tasks run here, as each run recorded them: filled by the worker.
        self.run_params: dict[str, dict[str, Any]] = {}
        self.paused: set[str] = set()  # runs a call found paused here (the worker claims none of their tasks)
        # The provider batch lane: its stages, and the stored states of the requests of the tasks about to run
        # (by task id, filled by the worker before it starts them).
        self.batch_stages: frozenset[str] = frozenset()
        self.batch_states: dict[int, list[RequestState]] = {}
        # The call journals of the async tasks about to run (by task id, filled by the worker before it starts them).
        self.call_answers: dict[int, dict[str, str]] = {}
        self.journaled_stages: frozenset[str] = frozenset()
        self._no_params: dict[str, StageParams] = {}  # by stage: ctx.params of a stage that reads no parameter

    def run_inline(self, batch: list[tuple[ClaimedTask, Stage]]) -> list[Outcome]:
        """Run sync tasks one after another (called on the stage thread)."""
        outcomes = []
        for task, stage in batch:
            if self.stopping.is_set():
                break
            outcomes.append(self._execute_sync(task, stage))
        return outcomes

    def _execute_sync(self, task: ClaimedTask, stage: Stage) -> Outcome:
        started, t0 = self.clock(), time.perf_counter()
        try:
            value = self.load(task)
        except Exception as exc:  # any failure to read input is the task's failure
            return Outcome(task, started, time.perf_counter() - t0, False, failure=classify(exc))
        ctx = self.context(task)
        try:
            result = self._group_call(task, stage, ctx, value) if isinstance(value, Group) else call_stage(
                stage, ctx, value)
            outcome = self.settle(task, stage, value, result, started, time.perf_counter() - t0)
        except BaseException as exc:  # stage code may raise anything, SystemExit and KeyboardInterrupt too
            failure = classify(exc, stage.retry.terminal, traceback.format_exc())
            outcome = Outcome(task, started, time.perf_counter() - t0, True, failure=failure)
        outcome.logs = ctx.kept_lines()
        return _made_by(outcome, stage, ctx.provenance)

    async def run_async(self, task: ClaimedTask, stage: Stage, finish: Finish) -> None:
        started, t0, invoked = self.clock(), time.perf_counter(), False
        ctx = self.context(task, self.services)
        finish = _logged(_journaled(finish, ctx.journal), ctx.kept)
        try:
            value = self.load(task) if task.input_inline is not None else await asyncio.to_thread(self.load, task)
            async with self._semaphores[stage.name, 0 if task.lane_rank == 0 else 1]:
                if self.stopping.is_set():
                    return
                invoked, t0 = True, time.perf_counter()
                call = (self._group_call_async(task, stage, ctx, value) if isinstance(value, Group)
                        else call_stage(stage, ctx, value))
                result = await asyncio.wait_for(_contained(call), stage.timeout)
            if ctx.batch is not None:
                if ctx.batch.deferred:  # the stage swallowed the Deferred signal: it still waits
                    raise Deferred()
                await self.services.charge(task.run_id, ctx.batch.usage, Lease(task.id, task.lease_token))
                ctx.usage.merge(ctx.batch.usage)
            finish(_made_by(await asyncio.to_thread(self.settle, task, stage, value, result, started,
                                                    time.perf_counter() - t0, ctx.usage), stage, ctx.provenance))
        except asyncio.CancelledError:
            raise
        except ProviderUnavailable as exc:
            # Not this task's fault: the worker stops and releases it, attempt refunded (see Worker).
            self.fatal = self.fatal or exc
        except Deferred:  # a model call left to the provider batch lane: the task waits for its answer
            assert ctx.batch is not None
            finish(Outcome(task, started, time.perf_counter() - t0, invoked, usage=ctx.usage,
                           deferred=ctx.batch.deferred, direct_answers=ctx.batch.direct_answers))
        except RunPaused as exc:  # its run's budget is spent, or its breaker tripped: give the task back
            self.paused.add(exc.run_id)  # and claim none of its tasks until the store says it was resumed
            paused = Failure("paused", True, str(exc))
            finish(_made_by(Outcome(task, started, time.perf_counter() - t0, invoked, failure=paused, usage=ctx.usage,
                                    released=True), stage, ctx.provenance))
        except Exception as exc:  # stage code may raise anything
            if ctx.batch is not None:
                ctx.usage.merge(ctx.batch.usage)
            cause = exc.__cause__ if isinstance(exc, StageExit) and exc.__cause__ is not None else exc
            failure = classify(cause, stage.retry.terminal, traceback.format_exc())
            if isinstance(exc, TimeoutError) and stage.timeout is not None:
                failure = Failure("timeout", True, f"stage {stage.name} exceeded its {stage.timeout:g}s timeout")
            finish(_made_by(Outcome(task, started, time.perf_counter() - t0, invoked, failure=failure,
                                    usage=ctx.usage), stage, ctx.provenance))

    async def run_guarded(self, task: ClaimedTask, stage: Stage, finish: Finish) -> None:
        started, t0 = self.clock(), time.perf_counter()
        try:
            value = await asyncio.to_thread(self.load, task)
        except Exception as exc:
            finish(Outcome(task, started, time.perf_counter() - t0, False, failure=classify(exc)))
            return
        if self.stopping.is_set():
            return
        result = await self._guarded_pool().call(stage.name, value, self.context(task).fields(),
                                                 timeout=stage.timeout, max_memory_bytes=stage.max_memory_bytes)
        finish = _logged(finish, result.kept())
        if not result.ok:
            finish(_made_by(Outcome(task, started, result.duration, True,
                                    failure=_guarded_failure(stage, result.failure)), stage, None))
            return
        try:
            outcome = await asyncio.to_thread(self.settle, task, stage, value, result.value, started, result.duration)
        except Exception as exc:
            failure = classify(exc, stage.retry.terminal, traceback.format_exc())
            outcome = Outcome(task, started, result.duration, True, failure=failure)
        finish(_made_by(outcome, stage, result.provenance))

    def _guarded_pool(self) -> GuardedPool:
        if self._pool is None:
            self._pool = GuardedPool(self.target, self.guarded_processes)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        await self.services.close()

    def load(self, task: ClaimedTask) -> Any:
        data = task.input_inline if task.input_inline is not None else self.blobs.get(task.input_digest)
        if task.input_kind == PARTS:
            return load_parts(data, self.blobs)
        if task.input_kind == MEMBERS:
            return load_group(data, self.blobs)
        return decode(task.input_kind, data)

    def _tree(self, task: ClaimedTask, stage: Stage, ctx: Context, group: Group) -> Tree | None:
        """The batch-and-fold tree of a group larger than its stage's members per call (runtime/groups.py)."""
        if stage.members_per_call is None or len(group.members) <= stage.members_per_call:
            return None
        return Tree(stage, ctx.params, group, StepMemo(self.store_url, task.run_id, stage.name),
                    lambda value: store_value(*encode(value), self.blobs), lambda ref: load_value(ref, self.blobs),
                    self.clock)

    def _group_call(self, task: ClaimedTask, stage: Stage, ctx: Context, group: Group) -> Any:
        tree = self._tree(task, stage, ctx, group)
        if tree is None:
            return stage.fn(ctx, group.key, group.members)
        assert stage.fold is not None
        for kind, _, argument in tree.steps():
            tree.made(stage.fn(ctx, group.key, argument) if kind == "batch" else stage.fold(ctx, group.key, argument))
        self.steps[task.id] = tree.memo.kept
        return load_value(tree.result, self.blobs)

    async def _group_call_async(self, task: ClaimedTask, stage: Stage, ctx: Context, group: Group) -> Any:
        tree = self._tree(task, stage, ctx, group)
        if tree is None:
            return await stage.fn(ctx, group.key, group.members)
        assert stage.fold is not None
        for kind, _, argument in tree.steps():
            made = stage.fn(ctx, group.key, argument) if kind == "batch" else stage.fold(ctx, group.key, argument)
            tree.made(await made if inspect.isawaitable(made) else made)
        self.steps[task.id] = tree.memo.kept
        return load_value(tree.result, self.blobs)

    def settle(self, task: ClaimedTask, stage: Stage, source: Any, result: Any, started: float, duration: float,
               usage: Any = None) -> Outcome:
        """The outcome of a stage call that returned ``result``: stored, and first judged when the stage
        declares an acceptance boundary (a refused answer is kept as the candidate a reviewer sees)."""
        if stage.accept is not None:
            verdict = judge(stage.accept, result, source, self.metas.get((task.run_id, task.root_key), {}))
            ref = self.store_output(stage, verdict.record)
            before = _unrepaired(result) if verdict.repaired else None
            if verdict.accepted:
                return Outcome(task, started, duration, True, ref, usage=usage, verdict=verdict, unrepaired=before)
            failure = Failure(str(verdict.refusal), verdict.refusal == INVALID_FORMAT, verdict.message)
            return Outcome(task, started, duration, True, failure=failure, usage=usage, verdict=verdict, candidate=ref,
                           unrepaired=before)
        if isinstance(stage.into, str):
            record = staged(result, stage.name)
            return Outcome(task, started, duration, True, store_value(*encode(record), self.blobs), usage=usage,
                           value=record)
        if stage.into is not None:
            output = self.store_output(stage, result)  # the record, as the memo keeps it
            publish_once(stage.into, self.context(task).idempotency_key, result)
            return Outcome(task, started, duration, True, output, usage=usage)
        return Outcome(task, started, duration, True, self.store_output(stage, result), usage=usage,
                       steps=self.steps.pop(task.id, None) if self.steps else None)

    def store_output(self, stage: Stage, result: Any) -> Ref:
        if stage.kind == "fanout":
            _, data = fanout_refs(result, self.blobs)
            return Ref("fanout", hashlib.sha256(data).hexdigest(), len(data), data)
        return store_value(*encode(result), self.blobs)

    def check(self) -> None:
        """Fail now, with what to set, when the stages need a model provider that is not configured."""
        self.services.check(self.pipeline)

    def context(self, task: ClaimedTask, services: Services | None = None) -> Context:
        stage = self.pipeline[task.stage]
        accept = stage.accept
        config = stage.config if accept is None else accept.config_at(stage.config, task.tier)
        batch = journal = None
        if services is not None:
            if task.stage in self.batch_stages:
                batch = BatchCalls(stage, self.pipeline.name, task.task_key, self.batch_states.pop(task.id, ()),
                                   self.clock())
            if task.stage in self.journaled_stages:
                journal = CallJournal(task.id, self.call_answers.pop(task.id, {}), self.clock)
        if stage.params:
            params = StageParams(stage.name, stage.params, self.run_params.get(task.run_id, {}))
        else:  # reads no run parameter: the same empty mapping for every task of the stage
            empty = self._no_params.get(stage.name)  # (an empty mapping is falsy: compared with None)
            if empty is None:
                empty = self._no_params[stage.name] = StageParams(stage.name, (), {})
            params = empty
        # Context copies ``config``: a stage may change its ``ctx.config`` without changing the stage's.
        return Context(task.run_id, task.item_key, task.stage, task.attempts, task.task_key, self.pipeline.name,
                       task.input_digest, None, services, "interactive" if task.lane_rank == 0 else "bulk", task.tier,
                       config, accept is not None, batch, Lease(task.id, task.lease_token), params, journal)


def _logged(finish: Finish, kept: AttemptLog) -> Finish:
    """``finish`` of an outcome that carries the lines the attempt logged through ``ctx.log``."""

    def done(outcome: Outcome) -> None:
        outcome.logs = kept
        finish(outcome)

    return done


def _journaled(finish: Finish, journal: CallJournal | None) -> Finish:
    """``finish`` of an outcome that carries the attempt's journaled answers, whatever the attempt came to."""
    if journal is None:
        return finish

    def done(outcome: Outcome) -> None:
        refused = outcome.verdict is not None and not outcome.verdict.accepted
        outcome.answers, outcome.journaled = journal.kept_for_next(refused), bool(journal.kept)
        finish(outcome)

    return done
