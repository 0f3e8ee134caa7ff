"""Every state transition of a task, in one place, in batches.

queued → running (claim, attempt counted) → succeeded | queued again after a
backoff (retry) | failed (terminal) | dead_lettered (attempts exhausted).
A running task whose lease expired goes back to queued, or to the dead-letter
list when that was its last attempt. A worker commits only the tasks whose
lease it still holds; the rest are recorded as ``lease_lost`` and discarded.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor import __version__
from conveyor.pipeline import Pipeline
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Expander, Seed
from conveyor.runtime.values import Ref, failure_memo
from conveyor.store import AttemptRecord, ClaimedTask, NewItem, SqlStore, StoredOutput

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


class Transitions:
    def __init__(self, pipeline: Pipeline, store: SqlStore, worker: str, rng: random.Random | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.expander = Expander(pipeline, store)
        self.worker = worker
        self.rng = rng or random.Random()

    def commit(self, outcomes: Sequence[Outcome], now: float) -> Counter[str]:
        """Commit a batch of outcomes in one transaction; return counts by what happened."""
        return self.commit_and_claim(outcomes, now, None)[0]

    def commit_and_claim(
        self, outcomes: Sequence[Outcome], now: float, claim: tuple[Any, ...] | None,
    ) -> tuple[Counter[str], list[ClaimedTask]]:
        """Commit, then with ``claim`` = (pipeline, stages, limit, owner, lease seconds, run id, caps)
        claim the next batch in the same transaction, saving a round trip and a commit."""
        counts: Counter[str] = Counter()
        claimed: list[ClaimedTask] = []
        with self.store.transaction():
            held = self.store.held_leases([(o.task.id, o.task.lease_token) for o in outcomes])
            attempts = [self._lost(o) for o in outcomes if o.task.id not in held]
            counts["lease_lost"] = len(attempts)
            mine = [o for o in outcomes if o.task.id in held]
            attempts += self._succeed([o for o in mine if o.failure is None], now, counts)
            attempts += self._fail([o for o in mine if o.failure is not None], now, counts)
            self.store.insert_attempts(attempts)
            if claim is not None:
                pipeline, stages, limit, owner, lease_seconds, run_id, caps = claim
                claimed = self.store.claim(pipeline, stages, limit, owner, now, lease_seconds, run_id, caps)
        return counts, claimed

    def _succeed(self, done: Sequence[Outcome], now: float, counts: Counter[str]) -> list[AttemptRecord]:
        if not done:
            return []
        fresh = [o for o in done if not o.cached]
        self.store.insert_outputs(
            [StoredOutput(o.task.task_key, o.task.stage, o.output.kind, o.output.digest,  # type: ignore[union-attr]
                          o.output.inline, o.output.size) for o in fresh],  # type: ignore[union-attr]
            done[0].task.run_id, now,
        )
        self.store.mark_succeeded(
            [(o.task.id, o.output.digest, o.output.kind, o.cached) for o in done], now  # type: ignore[union-attr]
        )
        seeds: list[Seed] = []
        items: list[NewItem] = []
        for o in done:
            seed = Seed(o.task.run_id, o.task.item_key, o.task.root_key, o.task.stage, o.output)  # type: ignore[arg-type]
            more, new_items = self.expander.successors(seed, o.output, now)  # type: ignore[arg-type]
            seeds.extend(more)
            items.extend(new_items)
        counts["cached"] += len(done) - len(fresh) + self.expander.expand(seeds, now, items)
        counts["succeeded"] += len(done)
        return [self._attempt(o, "cached" if o.cached else "succeeded", None) for o in done]

    def _fail(self, failed: Sequence[Outcome], now: float, counts: Counter[str]) -> list[AttemptRecord]:
        retry: list[tuple[int, float, str, str]] = []
        ended: list[tuple[int, str, str, str]] = []
        memo_ended: list[tuple[int, str, str, str]] = []
        dead: list[tuple[int, str, str, str, str, str, int]] = []
        memos: list[StoredOutput] = []
        attempts: list[AttemptRecord] = []
        for o in failed:
            f, task = o.failure, o.task
            assert f is not None
            limit = self.pipeline[task.stage].retry.attempts_for(f.error_class)
            if not f.retryable:
                (memo_ended if o.cached else ended).append((task.id, "failed", f.error_class, _full(f)))
                if f.deterministic and not o.cached:
                    memos.append(self._failure_memo(task, f))
                attempts.append(self._attempt(o, "cached" if o.cached else "failed", f))
            elif task.attempts >= limit:
                ended.append((task.id, "dead_lettered", f.error_class, _full(f)))
                dead.append((task.id, task.run_id, task.item_key, task.stage, f.error_class, _full(f), task.attempts))
                attempts.append(self._attempt(o, "dead_lettered", f))
            else:
                retry.append((task.id, now + self._delay(task, f), f.error_class, f.message))
                attempts.append(self._attempt(o, "retry", f))
        for task_id, run_id, item_key, stage, error_class, _, attempt in dead:
            log.warning("dead-lettered %s at %s after %d attempts (%s)", item_key, stage, attempt, error_class,
                        extra={"event": "dead_lettered", "run": run_id, "stage": stage, "item": item_key,
                               "attempt": attempt, "task": task_id})
        self.store.mark_retry(retry)
        self.store.mark_ended(ended, now)
        self.store.mark_ended(memo_ended, now, cached=True)
        self.store.insert_dead_letters(dead, now)
        if memos:
            self.store.insert_outputs(memos, failed[0].task.run_id, now)
        counts.update(retried=len(retry), failed=len(ended) + len(memo_ended) - len(dead),
                      dead_lettered=len(dead), cached=len(memo_ended))
        return attempts

    def _failure_memo(self, task: ClaimedTask, f: Failure) -> StoredOutput:
        ref = failure_memo(f.error_class, _full(f))
        return StoredOutput(task.task_key, task.stage, ref.kind, ref.digest, ref.inline, ref.size)

    def _delay(self, task: ClaimedTask, failure: Failure) -> float:
        if failure.retry_after is not None:
            return failure.retry_after
        return self.pipeline[task.stage].retry.delay(task.attempts, self.rng)

    def reclaim_expired(self, now: float, limit: int = 1000) -> Counter[str]:
        """Requeue tasks whose worker stopped renewing its lease.

        Which task killed the worker is unknown when it held several: each gets
        its attempt back and becomes a suspect, and suspects run alone. A task
        that held the worker's only lease is charged the attempt, so an item that
        kills its worker every time reaches the dead-letter list after
        ``max_attempts`` attempts of its own.
        """
        counts: Counter[str] = Counter()
        with self.store.transaction():
            expired = self.store.expired_leases(now, limit)
            if not expired:
                return counts
            held_by = Counter(lease.lease_owner for lease in expired)
            requeue, ended, dead, attempts = [], [], [], []
            for lease in expired:
                alone = held_by[lease.lease_owner] == 1
                message = (f"worker {lease.lease_owner} stopped renewing its lease during attempt {lease.attempts} "
                           f"(it died or stalled){'' if alone else ' with other tasks in flight: attempt refunded'}")
                attempts.append(AttemptRecord(
                    lease.id, lease.run_id, lease.attempts, "lease_expired", 0, "lease_expired", message,
                    lease.lease_owner, lease.lease_token, None, __version__, None, None))
                if alone and lease.attempts >= lease.max_attempts:
                    ended.append((lease.id, "dead_lettered", "lease_expired", message))
                    dead.append((lease.id, lease.run_id, lease.item_key, lease.stage, "lease_expired", message,
                                 lease.attempts))
                else:
                    requeue.append((lease.id, now, message, 0 if alone else 1))
            for lease in expired:
                log.warning("reclaimed %s at %s from worker %s", lease.item_key, lease.stage, lease.lease_owner,
                            extra={"event": "lease_reclaimed", "run": lease.run_id, "stage": lease.stage,
                                   "item": lease.item_key, "attempt": lease.attempts})
            self.store.requeue_crashed(requeue)
            self.store.mark_ended(ended, now)
            self.store.insert_dead_letters(dead, now)
            self.store.insert_attempts(attempts)
            self.store.notify()
        counts.update(requeued=len(requeue), dead_lettered=len(dead))
        return counts

    def _lost(self, o: Outcome) -> AttemptRecord:
        failure = Failure("lease_lost", True, "the lease expired before this attempt committed; result discarded")
        return self._attempt(o, "lease_lost", failure)

    def _attempt(self, o: Outcome, outcome: str, f: Failure | None) -> AttemptRecord:
        stage = self.pipeline[o.task.stage]
        return AttemptRecord(
            o.task.id, o.task.run_id, o.task.attempts, outcome, int(o.invoked),
            f.error_class if f else None, f.message if f else None, self.worker, o.task.lease_token,
            stage.version, __version__, o.started, o.duration,
        )


def _full(failure: Failure) -> str:
    return f"{failure.message}\n{failure.detail}".strip()
