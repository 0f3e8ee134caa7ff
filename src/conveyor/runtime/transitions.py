"""Every state transition of a task, in one place, in batches.

queued → running (claim, attempt counted) → succeeded | queued again after a
backoff (retry) | failed (terminal) | dead_lettered (attempts exhausted).
A running task whose lease expired goes back to queued, or to the dead-letter
list when that was its last attempt. Nothing else changes a task's state: the
worker claims, renews, releases and asks for memo answers here; a submission
admits its items here; requeue and dead-letter replay happen here.

A commit is prepared first (rows built, memo lookups for the successors done:
reads only) and then written in one short transaction of plain statements, so
a SQLite writer holds the lock only while writing. Every update is fenced by
the lease token: if any task's lease was lost meanwhile, the transaction is
rolled back and redone for the tasks still held, and the others are recorded
as ``lease_lost`` and discarded.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor import __version__
from conveyor.acceptance.judge import Verdict
from conveyor.errors import PipelineError
from conveyor.pipeline import Pipeline
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import BAD_INPUT_KIND, Expander, Seed, task_key
from conveyor.runtime.memo import refusal_ref
from conveyor.runtime.services import Usage
from conveyor.runtime.values import Ref
from conveyor.store import (
    AttemptRecord,
    ClaimedTask,
    Crashed,
    Ended,
    Lease,
    NewDeadLetter,
    NewItem,
    NewOutput,
    NewPublication,
    NewTasks,
    Notice,
    PlainAttempt,
    Requeued,
    Retried,
    SqlStore,
    StoredOutput,
    Succeeded,
    TaskStatus,
)

log = logging.getLogger("conveyor.transitions")


@dataclass(slots=True)
class Outcome:
    """What one attempt of one task came to, before it is committed."""

    task: ClaimedTask
    started: float
    duration: float
    invoked: bool
    output: Ref | None = None
    cached: bool = False
    failure: Failure | None = None
    usage: Usage | None = None
    stale: bool = False  # answered from an output that other code made under the same stage version
    value: Any = None  # a publish stage's staged record (stages with ``into``), published as it commits
    verdict: Verdict | None = None  # what the acceptance boundary made of the answer (stages with ``accept``)
    candidate: Ref | None = None  # a refused answer, stored for a reviewer


@dataclass
class Writes:
    """Every row one commit writes, prepared before its transaction opens."""

    succeeded: list[Succeeded] = field(default_factory=list)
    retry: list[Retried] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)
    outputs: list[NewOutput] = field(default_factory=list)
    dead: list[NewDeadLetter] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    plain_attempts: list[PlainAttempt] = field(default_factory=list)
    tasks: NewTasks = field(default_factory=NewTasks)
    items: list[NewItem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    publications: list[NewPublication] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def fenced(self) -> int:
        return len(self.succeeded) + len(self.retry) + len(self.ended)


@dataclass(frozen=True)
class Claim:
    """What a commit may claim for its worker in the same transaction."""

    pipeline: str
    stages: Sequence[str]  # in claim order: later stages first
    limit: int
    owner: str
    lease_seconds: float
    run_id: str | None = None
    caps: Mapping[str, int] | None = None  # at most this many of a stage

    def cap(self, stage: str) -> int:
        return self.limit if self.caps is None else self.caps.get(stage, self.limit)


class LeaseLost(Exception):
    """A fenced update missed: some lease was lost since the commit was prepared."""


class MemoTaken(Exception):
    """Another worker memoised some of these task keys first (the same work, done twice at once)."""


class Transitions:
    def __init__(self, pipeline: Pipeline, store: SqlStore, worker: str, rng: random.Random | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.expander = Expander(pipeline, store)
        self.memos = self.expander.memos
        self.stale_stages: set[str] = set()  # stages whose memo answers came from other code (committed)
        self.worker = worker
        self.rng = rng or random.Random()

    # --- claims, leases and memo answers: the worker's side --------------------------------------------

    def claim(self, stages: Sequence[str], limit: int, now: float, lease_seconds: float, run_id: str | None = None,
              caps: Mapping[str, int] | None = None) -> list[ClaimedTask]:
        """Lease up to ``limit`` runnable tasks (at most ``caps[stage]`` of a stage), later stages first;
        the attempt is counted now."""
        return self.store.claim(self.pipeline.name, stages, limit, self.worker, now, lease_seconds, run_id, caps)

    def claim_suspect(self, now: float, lease_seconds: float, run_id: str | None = None) -> list[ClaimedTask]:
        """Lease one task that was in flight when a worker died; the worker runs it alone."""
        return self.store.claim_suspect(self.pipeline.name, self.worker, now, lease_seconds, run_id)

    def renew(self, leases: Sequence[Lease], expires_at: float) -> int:
        """Extend the leases still held; returns how many were."""
        return self.store.renew_leases(leases, expires_at)

    def release(self, leases: Sequence[Lease]) -> None:
        """Give leased tasks back untouched (a clean shutdown); the attempt is not counted."""
        self.store.release(leases)

    def answers(self, claimed: Sequence[ClaimedTask], fresh: Sequence[ClaimedTask],
                now: float) -> tuple[list[Outcome], list[ClaimedTask]]:
        """The outcomes of tasks that need no stage call, and the tasks left to run. A task from the
        queue is looked up in the memo first (another worker may have done the same work meanwhile, or
        this is a redelivery); a fresh one was looked up as it was created. Either may be refused on a
        guard that is checked before its input is read."""
        memo = self.store.lookup_outputs([t.task_key for t in claimed]) if claimed else {}
        answered: list[Outcome] = []
        to_run: list[ClaimedTask] = []
        for task in (*fresh, *claimed):
            outcome = self._answer(task, memo.get(task.task_key), now)
            if outcome is None:
                to_run.append(task)
            else:
                answered.append(outcome)
        return answered, to_run

    def _answer(self, task: ClaimedTask, hit: StoredOutput | None, now: float) -> Outcome | None:
        memo, stage = self.memos[task.stage], self.pipeline[task.stage]
        if hit is not None and hit.kind == "failed":
            failure = memo.failure(hit.inline)
            if failure is not None:
                return Outcome(task, now, 0.0, False, cached=True, failure=failure, stale=memo.stale(hit.code))
        elif hit is not None:
            return Outcome(task, now, 0.0, False, Ref(hit.kind, hit.digest, hit.size, hit.inline), cached=True,
                           stale=memo.stale(hit.code))
        if stage.max_input_bytes is not None and task.input_size > stage.max_input_bytes:
            message = (f"input of {task.input_size:,} bytes exceeds max_input_bytes={stage.max_input_bytes:,} "
                       f"of stage {stage.name!r}; it was not read")
            return Outcome(task, now, 0.0, False, failure=Failure(
                "input_too_large", False, message, deterministic=True,
                guard=("max_input_bytes", stage.max_input_bytes)))
        return None

    # --- admission: a submission's items --------------------------------------------------------------

    def admit(self, run_id: str, sources: Sequence[tuple[str, Ref]], now: float,
              bad: Sequence[tuple[str, str]] = ()) -> tuple[int, int]:
        """Create root items (key, source) and their tasks. An item that settled in the latest earlier run
        of the same graph, from the same source, is copied from there (store/replay.py); the others are
        planned through the memo. Items in ``bad`` (key, why) have no readable source: each of their root
        tasks ends ``failed`` with error class ``bad_input`` at once. Returns (tasks answered from the
        memo, tasks queued to run). The planning (memo lookups, rows) is done before the write
        transaction opens: with SQLite's one writer, workers keep committing meanwhile."""
        x = self.expander
        items = [NewItem(run_id, key, None, key, ref.digest, ref.size, now) for key, ref in sources]
        items += [NewItem(run_id, key, None, key, None, None, now) for key, _ in bad]
        base = x.replay_base(run_id)
        replayed = set(self.store.settled_roots(base, [(key, ref.digest) for key, ref in sources])) if base else set()
        seeds = [seed for key, ref in sources if key not in replayed for seed in x.roots(run_id, key, ref)]
        tasks, new_items, cached = x.plan(seeds, now, items)
        x.refuse_bad(tasks, run_id, bad, now)
        notices = self.stale_notices(x.take_stale(), now)
        with self.store.transaction():
            self.store.insert_items(new_items)
            if base and replayed:
                cached += self.store.copy_settled(base, run_id, [key for key, _ in sources if key in replayed], now,
                                                  x.lane_rank(run_id), x.has_fanout)
                self.store.copy_notices(base, run_id)
            if tasks:
                self.store.insert_tasks(tasks)
            if notices:
                self.store.add_notices(notices)
        return cached, len(tasks.queued)

    # --- commits ----------------------------------------------------------------------------------------

    def commit(self, outcomes: Sequence[Outcome], now: float) -> Counter[str]:
        """Commit a batch of outcomes in one transaction; return counts by what happened."""
        return self.commit_and_claim(outcomes, now, None)[0]

    def commit_and_claim(
        self, outcomes: Sequence[Outcome], now: float, claim: Claim | None,
    ) -> tuple[Counter[str], list[ClaimedTask], list[ClaimedTask]]:
        """Commit, then with ``claim`` claim the next batch in the same transaction, saving a round trip
        and a commit. Returns (counts, fresh, claimed): ``fresh`` tasks were created by this commit and
        claimed as they were inserted (their memo lookup was made while preparing it), ``claimed`` ones
        come from the queue."""
        writes = self.prepare(outcomes, now)
        self._take_fresh(writes, claim, now)
        try:
            with self.store.transaction():
                fresh = self._write(writes)
                self.stale_stages.update(n.stage for n in writes.notices)
                return writes.counts, fresh, self._claim(claim, now, fresh)
        except (LeaseLost, MemoTaken):
            pass
        # Redo, inside one transaction, for the leases still held, and with the memo's answer for any key
        # another worker memoised first: every item then builds on the one output a task key has, which is
        # also what a re-run copies or looks up (the losing attempt is still recorded as invoked).
        with self.store.transaction():
            held = self.store.held_leases([Lease(o.task.id, o.task.lease_token) for o in outcomes])
            kept = self._adopt_memo([o for o in outcomes if o.task.id in held])
            writes = self.prepare(kept, now)
            writes.attempts += [self._lost(o) for o in outcomes if o.task.id not in held]
            writes.counts["lease_lost"] = len(outcomes) - len(held)
            self._take_fresh(writes, claim, now)
            fresh = self._write(writes, memo_checked=False)
            self.stale_stages.update(n.stage for n in writes.notices)
            return writes.counts, fresh, self._claim(claim, now, fresh)

    def _adopt_memo(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Outcomes whose own result lost a memo race take the memo's result instead."""
        fresh = [o for o in outcomes if not o.cached and (o.output is not None or _memoised(o.failure))]
        memo = self.store.lookup_outputs([o.task.task_key for o in fresh])
        adopted: dict[int, Outcome] = {}
        for o in fresh:
            hit = memo.get(o.task.task_key)
            if hit is None or (o.output is not None and hit.digest == o.output.digest and hit.kind == o.output.kind):
                continue
            if hit.kind == "failed":
                failure = self.memos[o.task.stage].failure(hit.inline)
                if failure is None:
                    continue  # a refusal under another guard value: this outcome replaces it
                adopted[o.task.id] = Outcome(o.task, o.started, o.duration, o.invoked, failure=failure, usage=o.usage)
            else:
                output = Ref(hit.kind, hit.digest, hit.size, hit.inline)
                adopted[o.task.id] = Outcome(o.task, o.started, o.duration, o.invoked, output, usage=o.usage)
        return [adopted.get(o.task.id, o) for o in outcomes]

    def _take_fresh(self, w: Writes, claim: Claim | None, now: float) -> None:
        """Claim new tasks as they are created, within the claim's room and per-stage caps: the
        row is inserted already leased to this worker instead of being queued and then claimed."""
        if claim is None or not w.tasks.queued:
            return
        room, taken, keep, running = claim.limit, Counter[str](), [], w.tasks.running
        expires = now + claim.lease_seconds
        for row in w.tasks.queued:
            stage = row[2]
            if room and taken[stage] < claim.cap(stage) and (claim.run_id is None or row[0] == claim.run_id):
                running.append((*row, claim.owner, expires, now))
                room -= 1
                taken[stage] += 1
            else:
                keep.append(row)
        w.tasks.queued = keep

    def _claim(self, claim: Claim | None, now: float, fresh: Sequence[ClaimedTask]) -> list[ClaimedTask]:
        if claim is None or claim.limit <= len(fresh):
            return []
        taken = Counter(t.stage for t in fresh)
        caps = {stage: max(0, claim.cap(stage) - taken[stage]) for stage in claim.stages}
        return self.store.claim(claim.pipeline, claim.stages, claim.limit - len(fresh), claim.owner, now,
                                claim.lease_seconds, claim.run_id, caps)

    def _write(self, w: Writes, memo_checked: bool = True) -> list[ClaimedTask]:
        changed = self.store.mark_succeeded(w.succeeded) + self.store.mark_retry(w.retry)
        changed += self.store.mark_ended(w.ended)
        if changed != w.fenced:
            raise LeaseLost
        if self.store.insert_outputs(w.outputs) != len(w.outputs) and memo_checked:
            raise MemoTaken
        if w.notices:
            self.store.add_notices(w.notices)
        if w.publications:
            w.counts["published_versions"] = self.store.publish(w.publications)
        self.store.insert_dead_letters(w.dead)
        self.store.insert_attempts(w.attempts, w.plain_attempts)
        if w.items:
            self.store.insert_items(w.items)
        return self.store.insert_tasks(w.tasks) if w.tasks else []

    # --- preparing a commit (reads only) ------------------------------------

    def prepare(self, outcomes: Sequence[Outcome], now: float) -> Writes:
        w = Writes()
        outcomes = _first_per_key(outcomes)
        self._succeed(w, [o for o in outcomes if o.failure is None], now)
        self._fail(w, [o for o in outcomes if o.failure is not None], now)
        stale = self.expander.take_stale()
        stale.update((o.task.run_id, o.task.stage) for o in outcomes if o.stale)
        w.notices = self.stale_notices(stale, now)
        if stale:
            w.counts["stale_code"] = sum(stale.values())
        return w

    def stale_notices(self, stale: Counter[tuple[str, str]], now: float) -> list[Notice]:
        """Notice rows for memo answers made by other code under the same stage version (stale_code)."""
        return [Notice(run_id, "stale_code", stage, self.pipeline[stage].version, self.memos[stage].code, count, now)
                for (run_id, stage), count in stale.items()]

    def _succeed(self, w: Writes, done: Sequence[Outcome], now: float) -> None:
        seeds: list[Seed] = []
        for o in done:
            task, out = o.task, o.output
            assert out is not None
            if not o.cached:
                w.outputs.append(NewOutput(task.task_key, task.stage, out.kind, out.digest, out.inline, out.size,
                                           task.run_id, now, self.memos[task.stage].code))
            w.succeeded.append(Succeeded(out.digest, out.kind, int(o.cached), now, task.id, task.lease_token))
            if o.value is not None and not o.cached:
                w.publications.append(self._publication(o, now))
            more, items = self.expander.successors(
                Seed(task.run_id, task.item_key, task.root_key, task.stage, out), out, now)
            seeds += more
            w.items += items
            if o.usage is None or not o.usage.calls:
                w.plain_attempts.append(PlainAttempt(
                    task.id, task.run_id, task.attempts, "cached" if o.cached else "succeeded", int(o.invoked),
                    self.worker, task.lease_token, self.pipeline[task.stage].version, __version__, o.started,
                    o.duration))
            else:
                w.attempts.append(self._attempt(o, "cached" if o.cached else "succeeded", None))
        w.tasks, w.items, cached = self.expander.plan(seeds, now, w.items)
        w.counts.update(succeeded=len(done), cached=cached + sum(1 for o in done if o.cached))

    def _publication(self, o: Outcome, now: float) -> NewPublication:
        task, staged = o.task, o.value
        assert o.output is not None and self.pipeline[task.stage].into is not None
        return NewPublication(self.pipeline[task.stage].into, task.item_key, self.pipeline.name, task.run_id, task.id,
                              o.output.digest, json.dumps(staged["fields"], sort_keys=True, ensure_ascii=False),
                              staged["text"], staged["vectors"], now)

    def _fail(self, w: Writes, failed: Sequence[Outcome], now: float) -> None:
        for o in failed:
            f, task = o.failure, o.task
            assert f is not None
            full = _full(f)
            if not f.retryable:
                w.ended.append(Ended(TaskStatus.FAILED, f.error_class, full, now, int(o.cached), task.id,
                                     task.lease_token))
                if f.deterministic and not o.cached:
                    ref = refusal_ref(Failure(f.error_class, False, full, guard=f.guard))
                    w.outputs.append(NewOutput(task.task_key, task.stage, ref.kind, ref.digest, ref.inline,
                                               ref.size, task.run_id, now, self.memos[task.stage].code))
                w.attempts.append(self._attempt(o, "cached" if o.cached else "failed", f))
                w.counts.update(failed=1, cached=int(o.cached))
            elif task.attempts >= self.pipeline[task.stage].retry.attempts_for(f.error_class):
                w.ended.append(Ended(TaskStatus.DEAD_LETTERED, f.error_class, full, now, 0, task.id,
                                     task.lease_token))
                w.dead.append(NewDeadLetter(task.id, task.run_id, task.item_key, task.stage, f.error_class, full,
                                            task.attempts, now))
                w.attempts.append(self._attempt(o, "dead_lettered", f))
                w.counts["dead_lettered"] += 1
                log.warning("dead-lettered %s at %s after %d attempts (%s)", task.item_key, task.stage,
                            task.attempts, f.error_class, extra={
                                "event": "dead_lettered", "run": task.run_id, "stage": task.stage,
                                "item": task.item_key, "attempt": task.attempts})
            else:
                w.retry.append(Retried(now + self._delay(task, f), f.error_class, f.message, task.id,
                                       task.lease_token))
                w.attempts.append(self._attempt(o, "retry", f))
                w.counts["retried"] += 1

    def _delay(self, task: ClaimedTask, failure: Failure) -> float:
        if failure.retry_after is not None:
            return failure.retry_after
        return self.pipeline[task.stage].retry.delay(task.attempts, self.rng)

    # --- expired leases ----------------------------------------------------

    def reclaim_expired(self, now: float, limit: int = 1000) -> Counter[str]:
        """Requeue tasks whose worker stopped renewing its lease.

        Which task killed the worker is unknown when it held several: each gets
        its attempt back and becomes a suspect, and suspects run alone. A task
        that was the worker's only one in flight is charged the attempt, so an
        item that kills its worker every time reaches the dead-letter list after
        ``max_attempts_by_class["lease_expired"]`` (else ``max_attempts``)
        attempts of its own. How many tasks a worker held is counted once, when
        its death is first noticed (store: lost_workers), so it is judged the
        same way however many scans it takes to reclaim its tasks.
        """
        counts: Counter[str] = Counter()
        with self.store.transaction():
            expired = self.store.expired_leases(self.pipeline.name, now, limit)
            if not expired:
                return counts
            held = self.store.note_lost_workers(sorted({str(lease.lease_owner) for lease in expired}), now)
            requeue: list[Crashed] = []
            w = Writes()
            for lease in expired:
                alone = held.get(str(lease.lease_owner), 1) <= 1
                message = (f"worker {lease.lease_owner} stopped renewing its lease during attempt {lease.attempts} "
                           f"(it died or stalled){'' if alone else ' with other tasks in flight: attempt refunded'}")
                log.warning("reclaimed %s at %s from worker %s", lease.item_key, lease.stage, lease.lease_owner,
                            extra={"event": "lease_reclaimed", "run": lease.run_id, "stage": lease.stage,
                                   "item": lease.item_key, "attempt": lease.attempts})
                w.attempts.append(AttemptRecord(
                    lease.id, lease.run_id, lease.attempts, "lease_expired", 0, "lease_expired", message,
                    lease.lease_owner, lease.lease_token, None, __version__, None, None))
                if alone and lease.attempts >= self._lease_budget(lease.stage, lease.max_attempts):
                    w.ended.append(Ended(TaskStatus.DEAD_LETTERED, "lease_expired", message, now, 0, lease.id,
                                         lease.lease_token))
                    w.dead.append(NewDeadLetter(lease.id, lease.run_id, lease.item_key, lease.stage, "lease_expired",
                                                message, lease.attempts, now))
                else:
                    requeue.append(Crashed(now, message, 0 if alone else 1, lease.id, lease.lease_token))
            self.store.requeue_crashed(requeue)
            self.store.mark_ended(w.ended)
            self.store.insert_dead_letters(w.dead)
            self.store.insert_attempts(w.attempts)
            self.store.notify()
        counts.update(requeued=len(requeue), dead_lettered=len(w.dead))
        return counts

    def _lease_budget(self, stage: str, recorded: int) -> int:
        """Attempts a task may spend on lost leases: its stage's policy for ``lease_expired``."""
        try:
            return self.pipeline[stage].retry.attempts_for("lease_expired")
        except PipelineError:  # a stage this version of the pipeline no longer declares
            return recorded

    def _lost(self, o: Outcome) -> AttemptRecord:
        failure = Failure("lease_lost", True, "the lease expired before this attempt committed; result discarded")
        return self._attempt(o, "lease_lost", failure)

    def _attempt(self, o: Outcome, outcome: str, f: Failure | None) -> AttemptRecord:
        stage, u = self.pipeline[o.task.stage], o.usage
        record = AttemptRecord(
            o.task.id, o.task.run_id, o.task.attempts, outcome, int(o.invoked),
            f.error_class if f else None, f.message if f else None, self.worker, o.task.lease_token,
            stage.version, __version__, o.started, o.duration,
        )
        if u is None or not u.calls:
            return record
        return record._replace(provider_calls=u.calls, prompt_tokens=u.prompt_tokens,
                               completion_tokens=u.completion_tokens, cost=u.cost,
                               model=",".join(sorted(u.models)) or None,
                               prompt_version=",".join(sorted(u.prompt_versions)) or None,
                               unpriced_calls=u.unpriced_calls)


def _first_per_key(outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
    """Outcomes of one task key in one batch end with one result, the first: a later one takes it as
    answered (the memo keeps one output per key, and every item must build on that one)."""
    first: dict[str, Outcome] = {}
    result: list[Outcome] | None = None
    for index, o in enumerate(outcomes):
        if o.cached or (o.output is None and not _memoised(o.failure)):
            continue
        winner = first.setdefault(o.task.task_key, o)
        if winner is o:
            continue
        result = result if result is not None else list(outcomes)
        result[index] = Outcome(o.task, o.started, o.duration, o.invoked, winner.output, cached=True,
                                failure=winner.failure, usage=o.usage)
    return outcomes if result is None else result


def _memoised(failure: Failure | None) -> bool:
    """A failure that is stored in the memo like an output (a refusal decided by the input)."""
    return failure is not None and not failure.retryable and failure.deterministic


def _full(failure: Failure) -> str:
    return f"{failure.message}\n{failure.detail}".strip()


# --- what an operator does: requeue a selection, replay dead letters ------------------------------------

def requeue(store: SqlStore, pipeline: Pipeline, run_id: str, stage: str, reason: str, statuses: Sequence[str],
            error_class: str | None, stage_version: str | None, now: float) -> tuple[int, int]:
    """Queue ended tasks of ``stage`` again under its current version and config, with a fresh attempt
    budget; their memoised refusals are forgotten and ``reason`` is recorded in each one's history.
    Returns (requeued, skipped): a ``bad_input`` task has no source to run again."""
    spec = pipeline[stage]
    rows: list[Requeued] = []
    forget: list[str] = []
    skipped = 0
    for task_id, item_key, old_key, kind, digest, inline, size in store.tasks_to_requeue(
            run_id, stage, statuses, error_class, stage_version):
        if kind == BAD_INPUT_KIND:
            skipped += 1
            continue
        key = task_key(pipeline.name, spec, Ref(kind, digest, size, inline), item_key)
        rows.append(Requeued(key, spec.version, spec.config_hash, now, task_id))
        forget += [old_key, key]
    return store.requeue(rows, forget, reason, now, run_id), skipped


def replay_dead_letters(store: SqlStore, ids: Sequence[int], reason: str, now: float) -> int:
    """Queue dead-lettered tasks again with a fresh attempt budget; the reason is recorded with each entry."""
    return store.replay_dead_letters(ids, reason, now)
