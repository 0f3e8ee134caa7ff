"""Review decisions: no lease is held, so each is fenced by the task still awaiting review."""

from __future__ import annotations

from collections import Counter
from typing import Any

from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Seed
from conveyor.runtime.transitions.events import JobEvents, event
from conveyor.runtime.transitions.outcome import ReviewTaken
from conveyor.runtime.transitions.readiness import Readiness
from conveyor.runtime.transitions.tally import Tally
from conveyor.runtime.values import Ref
from conveyor.store import (
    AttemptRecord,
    ClaimedTask,
    NewOutput,
)
from conveyor.store.queuecounts import OPEN_STATUSES, OpenTally
from conveyor.store.reviews import ReviewEntry
from conveyor.store.runtotals import RunTally

# A decision's task status: accepted answers succeed, a rejection ends the task, an escalation queues it again.
DECIDED_STATUS = {"approved": "succeeded", "edited": "succeeded", "accepted": "succeeded", "rejected": "rejected",
                  "escalated": "queued"}


class Reviews(JobEvents, Readiness):
    def decide(self, entry: ReviewEntry, decision: str, by: str, why: str | None, now: float,
               output: Ref | None = None, edits: str | None = None) -> int:
        """Apply a decision on a review entry in one transaction; returns the tasks it queued.

        ``approved``/``edited``/``accepted`` (the deadline's "accept"): the task succeeds with ``output``
        (the candidate, or the edited record), memoised under its task key like any accepted answer, and
        its item continues down the pipeline. ``rejected``: the task ends ``rejected``. ``escalated`` (the
        deadline's "escalate"): the task runs once more at its strongest tier, and a refusal there fails it.
        Every other task awaiting review under the same task key (a re-run's, another run's: they waited on
        this answer) takes the same decision, successors and all. Raises ReviewTaken when someone decided
        first."""
        task = self.store.reviewed_task(entry.task_id)
        stage = self.pipeline[entry.stage]
        with self.store.transaction():
            if task is None or not self.store.decide_review(entry.id, decision, by, why, edits, now):
                raise ReviewTaken(entry.id)
            # Read with the entry held: a task that joined the wait has committed by now (store: hold_open_reviews).
            others = [t for t in self.store.awaiting_under(task.task_key) if t.id != task.id]
            owners = self.owners([task.run_id, *(t.run_id for t in others)])
            others = [t for t in others if owners[t.run_id] == owners[task.run_id]]  # its tenant's waits only
            self.store.decide_reviews_of([t.id for t in others], decision, by, why, edits, now)
            totals, opened = RunTally(), OpenTally()
            done, queued = self._settle(task, stage.accept, decision, by, why, now, output, totals, opened, True)
            if not done:
                raise ReviewTaken(entry.id)
            settled = [task]
            for other in others:
                done, more = self._settle(other, stage.accept, decision, by, why, now, output, totals, opened, False)
                if done:
                    settled.append(other)
                    queued += more
            decided = [self._decided(t, decision, by, why, now) for t in settled]
            self.store.insert_attempts(decided)
            for t in settled:
                totals.move(t.run_id, t.stage, ("awaiting_review", 0), (DECIDED_STATUS[decision], 0))
                if DECIDED_STATUS[decision] in OPEN_STATUSES:  # escalated: runnable again now, at a stronger tier
                    opened.add(self.pipeline.name, t.stage, now)
            totals.attempts({t.id: t.stage for t in settled}, decided)
            self.store.add_run_totals(totals)  # once per transaction (see store.insert_tasks)
            self.store.add_open_tasks(opened)
            for t in settled:
                self._tell_job(t, decision, by, now)
                self._tally_decision(t.stage, decision)
            self.store.notify()
        self.trace("a review decision", lambda tracer: tracer.record_attempts(
            self.store, self.pipeline.name, {t.id: t for t in settled}, decided))
        return queued

    def _settle(self, task: ClaimedTask, accept: Any, decision: str, by: str, why: str | None, now: float,
                output: Ref | None, totals: RunTally, opened: OpenTally, memo: bool) -> tuple[bool, int]:
        """One task awaiting review takes the decision: (whether it still awaited it, the tasks it queued).
        ``memo``: the decision is stored as the memo's answer for the key (once per decision)."""
        if decision in ("approved", "edited", "accepted"):
            assert output is not None
            return self._accept_reviewed(task, output, now, totals, opened, memo)
        if decision == "rejected":
            message = f"rejected by {by}" + (f": {why}" if why else "")
            done = self.store.reject_reviewed(task.id, message, now)
            if done and memo:  # the memo's answer for this input: a re-run asks neither the model nor people
                self.store.insert_outputs([self.refusal(task, Failure("rejected", False, message), now)])
            ended = self.expander.ended(task.run_id, task.item_key, task.root_key, task.stage, "rejected",
                                        task.siblings)
            if done and ended:  # a gather that waited on this child may be ready
                return done, self.write_planned(ended, (), now, totals, opened)
            return done, 0
        tier = len(accept.tiers) + 1 if accept is not None else task.tier + 1
        return self.store.escalate_reviewed(task.id, tier, f"review deadline passed: {why or ''}", now), 0

    def _decided(self, task: ClaimedTask, decision: str, by: str, why: str | None, now: float) -> AttemptRecord:
        stage = self.pipeline[task.stage]
        return AttemptRecord(
            task.id, task.run_id, task.attempts, decision, 0, None, why, f"review:{by}", None, stage.version,
            self._code(stage.name), now, 0.0, tier=task.tier, config_hash=stage.config_hash)

    def _tally_decision(self, stage: str, decision: str) -> None:
        """A decision that ends the task (an escalation runs it again) counts as its end."""
        tally = Tally(self.pipeline)
        if decision in ("approved", "edited", "accepted"):
            tally.finished(stage, "succeeded")
        elif decision == "rejected":
            tally.finished(stage, "rejected")
        if tally.sums:
            self.store.add_metric_totals(tally.rows())

    def _tell_job(self, task: ClaimedTask, decision: str, by: str, now: float) -> None:
        """A job's events for a decision on its answer: the stage done when it was accepted; its end, if this
        was its last open task."""
        job = self.jobs_among([task.run_id]).get(task.run_id)
        if job is None:
            return
        if decision in ("approved", "edited", "accepted"):
            self.store.insert_events([event(job, "job.stage_done", now, stage=task.stage, item_key=task.item_key,
                                            decision=decision, by=by)])
        self.settle_jobs([task.run_id], now)

    def _accept_reviewed(self, task: ClaimedTask, output: Ref, now: float, totals: RunTally,
                         opened: OpenTally, memo: bool) -> tuple[bool, int]:
        if not self.store.accept_reviewed(task.id, output.digest, output.kind, now):
            return False, 0
        if memo:
            self.store.insert_outputs([NewOutput(task.task_key, task.stage, output.kind, output.digest,
                                                 output.inline, output.size, task.run_id, now,
                                                 self.memos[task.stage].code)])
        seeds, items = self.expander.successors(
            Seed(task.run_id, task.item_key, task.root_key, task.stage, output, task.siblings), output, now)
        return True, self.write_planned(seeds, items, now, totals, opened)

    def expire_reviews(self, now: float, limit: int = 200, run_id: str | None = None) -> Counter[str]:
        """Entries of this pipeline (of one run, when given) whose deadline passed take the outcome recorded
        with them when they were opened (``Review(on_deadline=...)``)."""
        counts: Counter[str] = Counter()
        for entry in self.store.due_reviews(self.pipeline.name, now, limit, run_id):
            decision = {"reject": "rejected", "accept": "accepted", "escalate": "escalated"}[entry.on_deadline]
            output = Ref(entry.candidate_kind, entry.candidate_digest, entry.candidate_size, entry.candidate_inline)
            try:
                self.decide(entry, decision, "deadline", f"no decision within the deadline ({entry.on_deadline})",
                            now, output)
            except ReviewTaken:
                continue
            counts[decision] += 1
        return counts
