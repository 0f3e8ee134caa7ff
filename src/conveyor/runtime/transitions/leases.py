"""Claims, leases, memo answers and expired leases: the worker's side of the lifecycle."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from conveyor.errors import PipelineError
from conveyor.runtime.classify import Failure
from conveyor.runtime.provenance import decode
from conveyor.runtime.transitions.events import JobEvents
from conveyor.runtime.transitions.outcome import (
    Outcome,
    Writes,
)
from conveyor.runtime.transitions.readiness import Readiness
from conveyor.runtime.transitions.tally import Tally
from conveyor.runtime.values import Ref
from conveyor.store import (
    AttemptRecord,
    ClaimedTask,
    Crashed,
    Ended,
    ExpiredLease,
    Lease,
    NewDeadLetter,
    StoredOutput,
    TaskStatus,
)
from conveyor.store.queuecounts import OpenTally
from conveyor.store.runtotals import RunTally

log = logging.getLogger("conveyor.transitions")


class Leases(JobEvents, Readiness):
    def claim(self, stages: Sequence[str], limit: int, now: float, lease_seconds: float, run_id: str | None = None,
              caps: Mapping[str, int] | None = None, paused: Sequence[str] = (),
              paused_stages: Collection[str] | None = None) -> list[ClaimedTask]:
        """Lease up to ``limit`` runnable tasks (at most ``caps[stage]`` of a stage), later stages first, none of
        a ``paused`` run at ``paused_stages`` (the stages that call models); the attempt is counted now."""
        return self.store.claim(self.pipeline.name, stages, limit, self.worker, now, lease_seconds, run_id, caps,
                                paused, paused_stages, self.declared, shares=self.expander.join_shares)

    def claim_suspect(self, now: float, lease_seconds: float, run_id: str | None = None,
                      paused: Sequence[str] = ()) -> list[ClaimedTask]:
        """Lease one task that was in flight when a worker died; the worker runs it alone."""
        return self.store.claim_suspect(self.pipeline.name, self.worker, now, lease_seconds, run_id, paused,
                                        self.declared)

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
        answered: list[Outcome] = [self._foreign(t, now) for t in claimed if not self._own_key(t)]
        if answered:
            foreign = {o.task.id for o in answered}
            claimed = [t for t in claimed if t.id not in foreign]
        to_run: list[ClaimedTask] = []
        limits = self.input_limits
        for task in (*fresh, *claimed):
            hit = memo.get(task.task_key) if memo else None
            if hit is None and limits[task.stage] is None:  # no answer, and no guard to check: it runs
                to_run.append(task)
                continue
            outcome = self._answer(task, hit, now)
            if outcome is None:
                to_run.append(task)
            else:
                answered.append(outcome)
        waits = self._waiting(to_run, now)
        waiting = {o.task.id for o in waits}
        return answered + waits, [t for t in to_run if t.id not in waiting]

    def _waiting(self, tasks: Sequence[ClaimedTask], now: float) -> list[Outcome]:
        """Tasks whose key has an answer waiting for review (another run's, or a re-run's of this item): they
        wait on it, with no call and no second entry; its decision settles them all (Reviews.decide)."""
        reviewed = [t for t in tasks if (accept := self.pipeline[t.stage].accept) is not None
                    and accept.review is not None]
        waiting = self.store.waiting_answers([t.task_key for t in reviewed]) if reviewed else {}
        if not waiting:
            return []
        owners = self.owners([*(t.run_id for t in reviewed), *(r for w in waiting.values() for r, _ in w)])
        outcomes = []
        for task in reviewed:
            # only an answer its own tenant waits on: the entry is that tenant's to see and decide
            answer = next((a for run_id, a in waiting.get(task.task_key, ())
                           if owners[run_id] == owners[task.run_id]), None)
            if answer is not None:
                outcomes.append(Outcome(task, now, 0.0, False, waits=answer))
        return outcomes

    def _made_key(self, task: ClaimedTask) -> str:
        ref = Ref(task.input_kind, task.input_digest, task.input_size, task.input_inline)
        return self.expander.key_of(task.run_id, task.stage, ref, task.item_key)

    def _own_key(self, task: ClaimedTask) -> bool:
        """Whether this declaration makes ``task``'s key for its input. Claims take only tasks of this declaration
        (store: claim), so a key it would not make comes from other rules (another conveyor, a hand-made row); a
        fresh task was made here and needs no check."""
        return self._made_key(task) == task.task_key

    def _foreign(self, task: ClaimedTask, now: float) -> Outcome:
        """Not run: nothing is stored under a key this declaration would not make."""
        message = (f"task key {task.task_key[:12]} is not the key this worker's declaration of stage "
                   f"{task.stage!r} makes for its input ({self._made_key(task)[:12]}); it was not run")
        return Outcome(task, now, 0.0, False, failure=Failure("foreign_key", False, message))

    def _answer(self, task: ClaimedTask, hit: StoredOutput | None, now: float) -> Outcome | None:
        memo, stage = self.memos[task.stage], self.pipeline[task.stage]
        if hit is not None and hit.kind == "failed":
            failure = memo.failure(hit.inline)
            if failure is not None:
                return Outcome(task, now, 0.0, False, cached=True, failure=failure, stale=memo.stale(hit.code),
                               provenance=decode(hit.provenance))
        elif hit is not None:
            return Outcome(task, now, 0.0, False, Ref(hit.kind, hit.digest, hit.size, hit.inline), cached=True,
                           stale=memo.stale(hit.code), provenance=decode(hit.provenance))
        if stage.max_input_bytes is not None and task.input_size > stage.max_input_bytes:
            message = (f"input of {task.input_size:,} bytes exceeds max_input_bytes={stage.max_input_bytes:,} "
                       f"of stage {stage.name!r}; it was not read")
            return Outcome(task, now, 0.0, False, failure=Failure(
                "input_too_large", False, message, deterministic=True,
                guard=("max_input_bytes", stage.max_input_bytes)))
        return None

    def run_params(self, run_ids: Collection[str]) -> dict[str, dict[str, Any]]:
        """Each run's parameter values, as it recorded them at submission (the stages' ``ctx.params``)."""
        return {run_id: self.expander.run_params(run_id) for run_id in run_ids}

    def metas(self, tasks: Sequence[ClaimedTask]) -> dict[tuple[str, str], dict[str, Any]]:
        """The manifest ``meta`` of the items whose answers will be judged by checks, by (run, root key)."""
        judged = [(t.run_id, t.root_key) for t in tasks if self.pipeline[t.stage].accept is not None
                  and self.pipeline[t.stage].accept.checks]  # type: ignore[union-attr]
        return {key: json.loads(meta) for key, meta in self.store.item_metas(judged).items()} if judged else {}

    # --- expired leases ----------------------------------------------------

    def reclaim_expired(self, now: float, limit: int = 1000) -> Counter[str]:
        """Requeue tasks whose worker stopped renewing its lease.

        Every task a dead worker held is charged the attempt, so an item that
        kills its worker every time reaches the dead-letter list after
        ``max_attempts_by_class["lease_expired"]`` (else ``max_attempts``)
        deaths, taking down no more workers than it has attempts. Which task
        killed the worker is unknown when it held several, so after a first
        death each is queued as usual and runs beside others again (a healthy
        worker killed is recovered at the fleet's usual pace); a task that dies
        with its worker a second time in a row is a suspect, and suspects run
        alone, so the tasks that shared a poison item's batch are charged once
        more at most. How many tasks a worker held is counted once, when its
        death is first noticed (store: lost_workers), for the message.
        """
        counts: Counter[str] = Counter()
        with self.store.transaction():
            expired = self.store.expired_leases(self.pipeline.name, now, limit)
            if not expired:
                return counts
            held = self.store.note_lost_workers(sorted({str(lease.lease_owner) for lease in expired}), now)
            # Calls in flight under these leases were probably paid: counted at their estimate, in the budget
            # and in the attempt, until a late settlement (a stalled worker's) says what they cost.
            lost = self.store.lose_reservations([Lease(lease.id, lease.lease_token) for lease in expired])
            requeue: list[Crashed] = []
            w, tally = Writes(), Tally(self.pipeline)
            for lease in expired:
                others = held.get(str(lease.lease_owner), 1) - 1
                company = f" with {others:,} other task(s) in flight" if others > 0 else ""
                calls, usd = lost.get(lease.id, (0, 0.0))
                message = (f"worker {lease.lease_owner} stopped renewing its lease during attempt {lease.attempts} "
                           f"(it died or stalled){company}{_lost_calls(calls, usd)}")
                log.info("reclaimed %s at %s from worker %s", lease.item_key, lease.stage, lease.lease_owner,
                         extra={"event": "lease_reclaimed", "run": lease.run_id, "stage": lease.stage,
                                "item": lease.item_key, "attempt": lease.attempts})
                w.attempts.append(AttemptRecord(
                    lease.id, lease.run_id, lease.attempts, "lease_expired", 0, "lease_expired", message,
                    lease.lease_owner, lease.lease_token, None, self._code(lease.stage), None, None,
                    provider_calls=calls, cost=usd))
                if lease.attempts >= self._lease_budget(lease.stage, lease.max_attempts):
                    w.ended.append(Ended(TaskStatus.DEAD_LETTERED, "lease_expired", message, now, 0, lease.id,
                                         lease.lease_token))
                    w.dead.append(NewDeadLetter(lease.id, lease.run_id, lease.item_key, lease.stage, "lease_expired",
                                                message, lease.attempts, now))
                    tally.finished(lease.stage, "dead_lettered", "lease_expired")
                else:
                    # Died with its worker twice in a row (or again while running alone): run it alone from now on.
                    again = lease.crashes > 0 or lease.error_class == "lease_expired"
                    requeue.append(Crashed(now, message, 1 if again else 0, lease.id, lease.lease_token))
                    tally.add("retries", self.pipeline.name, lease.stage, "lease_expired")
            _say_reclaimed(expired)
            self.store.requeue_crashed(requeue)
            self.store.mark_ended(w.ended)
            self.store.insert_dead_letters(w.dead)
            if w.dead:  # they ended: their call journal goes (runtime/journal.py)
                self.store.forget_call_answers([d.task_id for d in w.dead])
            self.store.insert_attempts(w.attempts)
            self.store.add_metric_totals(tally.rows())
            totals, opened = _run_totals(expired, w), _open_moves(self.pipeline.name, expired, w, now)
            ended = [a for d in w.dead for lease in expired if lease.id == d.task_id
                     for a in self.expander.ended(d.run_id, d.item_key, lease.root_key, d.stage, "lease_expired")]
            if ended:  # gathers that waited on these children may be ready
                self.write_planned(ended, (), now, totals, opened)
            self.store.add_run_totals(totals)
            self.store.add_open_tasks(opened)
            if w.dead:
                self.settle_jobs({d.run_id for d in w.dead}, now)
            self.store.notify()
        counts.update(requeued=len(requeue), dead_lettered=len(w.dead))
        # A span for each attempt whose worker died, from its claim to this reclaim, when tracing is on.
        self.trace(f"{len(expired)} reclaimed attempts",
                   lambda tracer: tracer.record_reclaimed(self.store, self.pipeline.name, expired, now))
        return counts

    def _lease_budget(self, stage: str, recorded: int) -> int:
        """Attempts a task may spend on lost leases: its stage's policy for ``lease_expired``."""
        try:
            return self.pipeline[stage].retry.attempts_for("lease_expired")
        except PipelineError:  # a stage this version of the pipeline no longer declares
            return recorded


def _lost_calls(calls: int, usd: float) -> str:
    if not calls:
        return ""
    return f"; its {calls} provider call(s) in flight are counted at their estimate, ${usd:.4f}"


def _run_totals(expired: Sequence[Any], w: Writes) -> RunTally:
    """The reclaimed tasks that ended (dead-lettered) and the attempts recorded, for their runs' totals."""
    totals, leases = RunTally(), {lease.id: lease for lease in expired}
    for e in w.ended:
        lease = leases[e.task_id]
        totals.move(lease.run_id, lease.stage, ("running", 0), (e.status, e.cached))
    totals.attempts({lease.id: lease.stage for lease in expired}, w.attempts)
    return totals


def _open_moves(pipeline: str, expired: Sequence[ExpiredLease], w: Writes, now: float) -> OpenTally:
    """The reclaimed tasks for the queue's counts: dead-lettered ones leave, requeued ones are runnable now."""
    moves, ended = OpenTally(), {e.task_id for e in w.ended}
    for lease in expired:
        if lease.id in ended:
            moves.add(pipeline, lease.stage, lease.available_at, -1)
        else:
            moves.move(pipeline, lease.stage, lease.available_at, now)
    return moves


def _say_reclaimed(expired: Sequence[Any]) -> None:
    """One warning per dead worker (each task's reclaim is logged at INFO): a worker killed with a thousand
    tasks in flight is one line, not a thousand."""
    by_owner: dict[str, list[Any]] = {}
    for lease in expired:
        by_owner.setdefault(str(lease.lease_owner), []).append(lease)
    for owner, leases in by_owner.items():
        shown = ", ".join(f"{lease.item_key} at {lease.stage}" for lease in leases[:3])
        more = f" and {len(leases) - 3:,} more" if len(leases) > 3 else ""
        log.warning("reclaimed %d task(s) from worker %s, which stopped renewing its leases (it died or stalled): "
                    "%s%s", len(leases), owner, shown, more,
                    extra={"event": "leases_reclaimed", "run": leases[0].run_id, "stage": leases[0].stage})
