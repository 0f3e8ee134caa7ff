"""Commits: a batch of outcomes written in one fenced transaction, claiming the next batch in it."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Sequence

from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Planned, Seed
from conveyor.runtime.provenance import decode, encode
from conveyor.runtime.transitions.events import JobEvents
from conveyor.runtime.transitions.outcome import (
    Claim,
    LeaseLost,
    MemoTaken,
    Outcome,
    Writes,
    _first_per_key,
    _full,
    _memoised,
)
from conveyor.runtime.transitions.readiness import Readiness
from conveyor.runtime.transitions.tally import Tally
from conveyor.runtime.values import Ref
from conveyor.store import (
    AttemptRecord,
    ClaimedTask,
    Ended,
    Lease,
    NewDeadLetter,
    NewOutput,
    NewPublication,
    PlainAttempt,
    Retried,
    Succeeded,
    TaskStatus,
)
from conveyor.store.metrics import MetricIncrement
from conveyor.store.provenance import rows_for
from conveyor.store.provider_batch import Parked, Waiter
from conveyor.store.queuecounts import OPEN_STATUSES, OpenTally
from conveyor.store.reviews import AwaitingReview, Escalated, NewReview
from conveyor.store.runtotals import RunTally
from conveyor.store.tasks import OutputRows

log = logging.getLogger("conveyor.transitions")



class Commits(JobEvents, Readiness):
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
        if writes.pending:
            self.fresh_statistics()
        self._take_fresh(writes, claim, now)
        where: dict[int, tuple[str, str]] = {}
        since: dict[int, float] = {}
        for o in outcomes:
            task = o.task
            where[task.id] = (task.run_id, task.stage)
            since[task.id] = task.available_at
        # What the commit adds to the runs' totals and the queue's counts, worked out before its transaction: on
        # SQLite the transaction holds the store's one writer lock, which the other workers wait for meanwhile.
        tallies = self._tallies(writes, where, since)
        outputs = self.store.output_rows(writes.outputs)  # the memo's rows, worked out before it too
        try:
            with self.store.transaction():
                fresh = self._write(writes, where, since, tallies=tallies, outputs=outputs)
                self.stale_stages.update(n.stage for n in writes.notices)
                claimed = self._claim(claim, now, fresh)
            self._trace(outcomes, writes)
            return writes.counts, fresh, claimed
        except (LeaseLost, MemoTaken):
            pass
        # Redo, inside one transaction, for the leases still held, and with the memo's answer for any key
        # another worker memoised first: every item then builds on the one output a task key has, which is
        # also what a re-run copies or looks up (the losing attempt is still recorded as invoked).
        with self.store.transaction():
            held = self.store.held_leases([Lease(o.task.id, o.task.lease_token) for o in outcomes])
            kept = self._rejoin(self._adopt_memo([o for o in outcomes if o.task.id in held]))
            writes = self.prepare(kept, now)
            writes.attempts += [self._lost(o) for o in outcomes if o.task.id not in held]
            writes.call_answers += [a for o in outcomes if o.task.id not in held for a in o.answers or ()]
            writes.counts["lease_lost"] = len(outcomes) - len(held)
            self._take_fresh(writes, claim, now)
            fresh = self._write(writes, where, since, memo_checked=False)
            self.stale_stages.update(n.stage for n in writes.notices)
            claimed = self._claim(claim, now, fresh)
        self._trace(outcomes, writes)
        return writes.counts, fresh, claimed

    def _trace(self, outcomes: Sequence[Outcome], w: Writes) -> None:
        """A span for each attempt just committed, when tracing is on."""
        self.trace(f"{len(outcomes)} attempts", lambda tracer: tracer.record_attempts(
            self.store, self.pipeline.name, {o.task.id: o.task for o in outcomes}, [*w.attempts, *w.plain_attempts]))

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
                adopted[o.task.id] = Outcome(o.task, o.started, o.duration, o.invoked, failure=failure, usage=o.usage,
                                             provenance=decode(hit.provenance))
            else:
                output = Ref(hit.kind, hit.digest, hit.size, hit.inline)
                adopted[o.task.id] = Outcome(o.task, o.started, o.duration, o.invoked, output, usage=o.usage,
                                             provenance=decode(hit.provenance))
        return [adopted.get(o.task.id, o) for o in outcomes]

    def _rejoin(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Tasks that were to wait on an answer whose review was decided meanwhile are given back (the attempt
        refunded): claimed again, they find the decision in the memo (or run, after an escalation)."""
        held = self._still_waiting([(o.task.task_key, o.task.run_id) for o in outcomes if o.waits is not None])
        return [o if o.waits is None or (o.task.task_key, o.task.run_id) in held else Outcome(
            o.task, o.started, o.duration, False, failure=Failure(
                "review_decided", True, "the review it was to wait on was decided meanwhile: it is claimed again"),
            released=True) for o in outcomes]

    def _still_waiting(self, joined: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Of the (key, run) of tasks joining a waiting answer, those whose key still has an undecided entry of
        the run's tenant, the entries held until the transaction ends (store: hold_open_reviews)."""
        if not joined:
            return set()
        held = self.store.hold_open_reviews([key for key, _ in joined])
        owners = self.owners([*(run for _, run in joined), *(run for runs in held.values() for run in runs)])
        return {(key, run) for key, run in joined if any(owners[r] == owners[run] for r in held.get(key, ()))}

    def _take_fresh(self, w: Writes, claim: Claim | None, now: float) -> None:
        """Claim new tasks as they are created, within the claim's room and per-stage caps: the
        row is inserted already leased to this worker instead of being queued and then claimed."""
        if claim is None or not w.tasks.queued:
            return
        room, keep, running = claim.fresh_room, [], w.tasks.running
        lease = (claim.owner, now + claim.lease_seconds, now)
        caps = claim.caps or {}
        left: dict[str, int] = {}  # stage -> how many more of it this claim may take
        for row in w.tasks.queued:
            run_id, stage = row[0], row[2]
            if stage not in left:
                left[stage] = caps.get(stage, room)
            if (room and left[stage] > 0 and (claim.run_id is None or run_id == claim.run_id)
                    and not (claim.paused and claim.holds_back(run_id, stage))):
                running.append(row + lease)
                room -= 1
                left[stage] -= 1
            else:
                keep.append(row)
        w.tasks.queued = keep

    def _claim(self, claim: Claim | None, now: float, fresh: Sequence[ClaimedTask]) -> list[ClaimedTask]:
        if claim is None or claim.limit <= len(fresh):
            return []
        taken = Counter(t.stage for t in fresh)
        caps = {stage: max(0, claim.cap(stage) - taken[stage]) for stage in claim.stages}
        return self.store.claim(claim.pipeline, claim.stages, claim.limit - len(fresh), claim.owner, now,
                                claim.lease_seconds, claim.run_id, caps, claim.paused, claim.paused_stages,
                                self.declared, shares=self.expander.join_shares)  # see Expander.join_shares

    def _tallies(self, w: Writes, where: dict[int, tuple[str, str]],
                 since: dict[int, float]) -> tuple[RunTally, OpenTally]:
        """The runs' totals and the queue's counts that a commit's fenced changes move, all of them applied (the
        insert of its new tasks adds the rows it really wrote to both)."""
        return run_totals(w, where), open_moves(w, where, since, self.pipeline.name)

    def _write(self, w: Writes, where: dict[int, tuple[str, str]], since: dict[int, float],
               memo_checked: bool = True, tallies: tuple[RunTally, OpenTally] | None = None,
               outputs: OutputRows | None = None) -> list[ClaimedTask]:
        changed = self.store.mark_succeeded(w.succeeded) + self.store.mark_retry(w.retry)
        changed += self.store.mark_ended(w.ended)
        if w.released:
            changed += self.store.release_leases(w.released)
        if w.parked:
            changed += self.store.park_tasks(w.parked)
        if w.escalated or w.awaiting:
            changed += self.store.mark_escalated(w.escalated) + self.store.mark_awaiting_review(w.awaiting)
        if changed != w.fenced:
            raise LeaseLost
        if w.joined and memo_checked and len(self._still_waiting(w.joined)) != len(set(w.joined)):
            raise MemoTaken  # a review they were to wait on was decided since they were claimed: see _rejoin
        if self.store.insert_outputs(w.outputs if outputs is None else outputs) != len(w.outputs) and memo_checked:
            raise MemoTaken
        if w.steps:  # content-addressed steps: one already kept by another worker is the same answer
            self.store.insert_outputs(w.steps)
        if w.notices:
            self.store.add_notices(w.notices)
        if w.publications:
            w.counts["published_versions"] = self.store.publish(w.publications)
        if w.reviews:
            self.store.insert_reviews(w.reviews)
        if w.provenance:
            self.store.insert_provenance(w.provenance)
        if w.call_answers:
            self.store.keep_call_answers(w.call_answers)
        if w.forget_calls:
            self.store.forget_call_answers(w.forget_calls)
        self.store.insert_dead_letters(w.dead)
        self.store.insert_attempts(w.attempts, w.plain_attempts)
        if w.items:
            self.store.insert_items(w.items)
        totals, opened = tallies if tallies is not None else self._tallies(w, where, since)
        fresh = self.store.insert_tasks(w.tasks, totals, opened) if w.tasks else []
        if w.pending:
            self._write_ready(w, totals, opened)
        if w.job_runs:  # every job this commit may settle, locked at once in one order (store/jobs.py)
            self.store.lock_jobs(sorted(w.job_runs))
        if w.events:
            self.store.insert_events(w.events)
        if w.waiters:
            self.store.add_batch_requests(w.batch_requests, w.waiters, w.now, opened, w.direct_answers)
        if self.batch_stages:
            self._forget_batch_requests(w, where)
        if w.job_runs:
            self.settle_jobs(w.job_runs, w.now)
        with self.store.db.pipelined():  # upserts whose answers are not read: one round trip on PostgreSQL
            if w.tally:
                self.store.add_metric_totals(w.tally)
            self.store.add_run_totals(totals)  # once per transaction, sorted: see insert_tasks
            self.store.add_open_tasks(opened)
        return fresh

    def _write_ready(self, w: Writes, totals: RunTally, opened: OpenTally) -> None:
        """The joins and gathers the plan left pending, decided now that this commit's rows are written."""
        decided = self.decide_waiting(w.pending, w.now, totals, opened)
        w.counts["cached"] += decided.cached
        if decided.tasks.cached or decided.tasks.failed:
            tally = Tally(self.pipeline)
            tally.planned(decided.tasks)
            w.tally += tally.rows()

    def _forget_batch_requests(self, w: Writes, where: dict[int, tuple[str, str]]) -> None:
        """Tasks of the provider batch lane that ended here, or will be tried again, no longer need their
        answered requests: a retry or a replay asks the model again, as on the direct lane (a malformed answer is
        not handed back for ever), and the tables do not grow with every call ever made."""
        ended = [t for t in (*(s.task_id for s in w.succeeded), *(e.task_id for e in w.ended),
                             *(a.task_id for a in w.awaiting), *(r.task_id for r in w.retry),
                             *(e.task_id for e in w.escalated)) if where[t][1] in self.batch_stages]
        if ended:
            self.store.forget_batch_requests(ended)

    # --- preparing a commit (reads only) ------------------------------------

    def prepare(self, outcomes: Sequence[Outcome], now: float) -> Writes:
        w = Writes(now=now)
        outcomes = _first_per_key(outcomes)
        stages: dict[int, str] = {}
        released: list[Outcome] = []
        deferred: list[Outcome] = []
        waiting: list[Outcome] = []
        done: list[Outcome] = []
        failed: list[Outcome] = []
        kept: list[Outcome] = []  # neither released, deferred nor waiting: succeeded or failed
        journaled = False
        for o in outcomes:  # one pass, by what became of each attempt
            stages[o.task.id] = o.task.stage
            if o.answers or o.journaled:
                journaled = True
            if o.waits is not None:
                waiting.append(o)
            if o.released:
                released.append(o)
            elif o.deferred:
                deferred.append(o)
            elif o.waits is None:
                kept.append(o)
                (done if o.failure is None else failed).append(o)
        self._release(w, released)
        self._park(w, deferred)
        self._wait(w, waiting)
        journal = outcomes
        outcomes = kept
        seeds = self._succeed(w, done, now)
        seeds += self._fail(w, failed, now)
        w.tasks, w.items, cached = self.expander.plan(seeds, now, w.items)
        w.pending = self.expander.take_pending()
        w.counts["cached"] += cached
        if journaled:
            self._journal(w, journal)
        stale = self.expander.take_stale()
        stale.update((o.task.run_id, o.task.stage) for o in outcomes if o.stale)
        w.notices = self.stale_notices(stale, now)
        if stale:
            w.counts["stale_code"] = sum(stale.values())
        tasks = {o.task.id: o.task for o in outcomes}
        w.events, w.job_runs = self.task_events(tasks, [s.task_id for s in w.succeeded],
                                                [a.task_id for a in w.awaiting],
                                                [e.task_id for e in w.ended], now)
        w.now = now
        w.tally = self._tally(stages, w)
        return w

    def _tally(self, stages: dict[int, str], w: Writes) -> list[MetricIncrement]:
        tally = Tally(self.pipeline)
        tally.plain(stages, w.plain_attempts)
        tally.full(stages, w.attempts)
        if w.tasks.cached or w.tasks.failed or w.tasks.bad:
            tally.planned(w.tasks)
        return tally.rows()

    def _succeed(self, w: Writes, done: Sequence[Outcome], now: float) -> list[Planned]:
        """Rows of the successes in ``done``; returns what follows them, to plan."""
        seeds: list[Planned] = []
        outputs, succeeded, plain, items = w.outputs, w.succeeded, w.plain_attempts, w.items
        made_by, children, worker, cached = self.made_by, self.expander.children, self.worker, 0
        fanouts = self.expander.fanouts
        for o in done:
            task, out = o.task, o.output
            assert out is not None
            stage = task.stage
            version, code, config_hash = made_by[stage]
            if o.steps:
                w.steps += o.steps
            if o.cached:
                cached += 1
            else:
                outputs.append(NewOutput(task.task_key, stage, out.kind, out.digest, out.inline, out.size,
                                         task.run_id, now, code, None if o.provenance is None else
                                         encode(o.provenance)))
            if o.provenance:
                w.provenance += rows_for(task.run_id, task.root_key, task.item_key, stage, o.provenance)
            succeeded.append(Succeeded(out.digest, out.kind, int(o.cached), now, task.id, task.lease_token))
            if o.value is not None and not o.cached:
                w.publications.append(self._publication(o, now))
            after = children.get(stage)
            if after is not None:  # what Expander.successors plans for a stage whose output goes nowhere else
                seeds += [Seed(task.run_id, task.item_key, task.root_key, c, out, task.siblings) for c in after]
            elif stage in fanouts:
                more, fanned = self.expander.successors(
                    Seed(task.run_id, task.item_key, task.root_key, stage, out, task.siblings), out, now)
                seeds += more
                items += fanned
            else:
                seeds += self.expander.follow(task.run_id, task.item_key, task.root_key, stage, out, task.siblings)
            if (o.usage is None or not o.usage.calls) and o.verdict is None and o.provenance is None and not _logged(o):
                plain.append(PlainAttempt(
                    task.id, task.run_id, task.attempts, "cached" if o.cached else "succeeded", int(o.invoked),
                    worker, task.lease_token, version, code, o.started, o.duration, config_hash))
            else:
                w.attempts.append(self._attempt(o, "cached" if o.cached else "succeeded", None))
        w.counts.update(succeeded=len(done), cached=cached)
        return seeds

    def _release(self, w: Writes, paused: Sequence[Outcome]) -> None:
        """Tasks whose run was paused during the attempt (its budget, its breaker): given back untouched, the
        attempt refunded; what the attempt spent is recorded (outcome ``paused``)."""
        for o in paused:
            w.released.append(Lease(o.task.id, o.task.lease_token))
            w.attempts.append(self._attempt(o, "paused", o.failure))
        if paused:
            w.counts["paused"] += len(paused)

    def _park(self, w: Writes, deferred: Sequence[Outcome]) -> None:
        """Tasks whose stage left model requests to the provider batch lane: given back, not claimable before the
        earliest deadline of those requests (the keeper wakes them when they are answered), the attempt refunded
        and recorded (outcome ``deferred``, with what its earlier calls spent)."""
        for o in deferred:
            assert o.deferred
            requests, task = o.deferred, o.task
            w.parked.append(Parked(min(r.deadline_at for r in requests), task.id, task.lease_token))
            w.batch_requests += requests
            w.waiters += [Waiter(r.custom_id, task.id, task.run_id, w.now) for r in requests]
            w.direct_answers += o.direct_answers or ()
            w.attempts.append(self._attempt(o, "deferred", None))
        if deferred:
            w.counts["deferred"] += len(deferred)

    def _wait(self, w: Writes, waiting: Sequence[Outcome]) -> None:
        """Tasks whose key has an answer waiting for review wait on it too, with no entry of their own: the
        entry's decision settles every task awaiting under the key (Reviews.decide)."""
        for o in waiting:
            task, answer = o.task, o.waits
            assert answer is not None
            w.awaiting.append(AwaitingReview(answer.error_class, answer.message, answer.output_digest,
                                             answer.output_kind, task.id, task.lease_token))
            w.joined.append((task.task_key, task.run_id))
            w.attempts.append(self._attempt(o, "awaiting_review", Failure(answer.error_class, False, answer.message)))
        if waiting:
            w.counts["awaiting_review"] += len(waiting)

    def _journal(self, w: Writes, outcomes: Sequence[Outcome]) -> None:
        """The call journal (runtime/journal.py): a task that goes on keeps the answers its attempt got, for its
        next attempt; one that ended here (or waits for people) needs its journal no more."""
        ended = {s.task_id for s in w.succeeded} | {a.task_id for a in w.awaiting}
        ended.update(e.task_id for e in w.ended if e.status not in OPEN_STATUSES)
        for o in outcomes:
            if o.task.id not in ended:
                w.call_answers += o.answers or ()
            elif o.journaled:
                w.forget_calls.append(o.task.id)

    def _publication(self, o: Outcome, now: float) -> NewPublication:
        task, staged, into = o.task, o.value, self.pipeline[o.task.stage].into
        assert o.output is not None and isinstance(into, str)
        return NewPublication(into, task.item_key, self.pipeline.name, task.run_id, task.id,
                              o.output.digest, json.dumps(staged["fields"], sort_keys=True, ensure_ascii=False),
                              staged["text"], staged["vectors"], now, staged.get("embedding_model"))

    def _fail(self, w: Writes, failed: Sequence[Outcome], now: float) -> list[Planned]:
        """Rows of the failures in ``failed``; returns the arrivals of those that ended at gathers waiting on them."""
        ended = len(w.ended)
        for o in failed:
            f, task = o.failure, o.task
            assert f is not None
            full = _full(f)
            if o.provenance and not (f.retryable and task.attempts < self.pipeline[task.stage].retry.attempts_for(
                    f.error_class)):  # the task ends here (or waits for review): it keeps what made its refusal
                w.provenance += rows_for(task.run_id, task.root_key, task.item_key, task.stage, o.provenance)
            if o.verdict is not None and self._refused(w, o, f, now):
                continue
            if not f.retryable:
                status = TaskStatus.REJECTED if f.error_class == "rejected" else TaskStatus.FAILED
                w.ended.append(Ended(status, f.error_class, full, now, int(o.cached), task.id, task.lease_token))
                if f.deterministic and not o.cached:
                    w.outputs.append(self.refusal(task, Failure(f.error_class, False, full, guard=f.guard), now,
                                                  o.provenance))
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
        if not self.expander.has_barriers:
            return []
        tasks = {o.task.id: o.task for o in failed}
        return [a for e in w.ended[ended:] if e.task_id in tasks
                for a in self.expander.ended(tasks[e.task_id].run_id, tasks[e.task_id].item_key,
                                             tasks[e.task_id].root_key, tasks[e.task_id].stage, e.error_class,
                                             tasks[e.task_id].siblings)]

    def _refused(self, w: Writes, o: Outcome, f: Failure, now: float) -> bool:
        """Route an answer its stage's acceptance boundary refused: a format fault is retried at the same
        tier while its budget lasts (False: the ordinary way), then, like any refusal, tried at the next
        escalation tier, else sent to review when it may be, else failed with its class."""
        task, stage = o.task, self.pipeline[o.task.stage]
        accept, verdict = stage.accept, o.verdict
        assert accept is not None and verdict is not None
        if f.retryable and task.attempts < stage.retry.attempts_for(f.error_class):
            return False
        tiers = len(accept.tiers)
        if task.tier < tiers and f.error_class in accept.escalate_on:
            w.escalated.append(Escalated(task.tier + 1, now, f.error_class, f.message, task.id, task.lease_token))
            w.attempts.append(self._attempt(o, "escalated", f))
            w.counts["escalated"] += 1
        elif accept.review is not None and verdict.reviewable and task.tier <= tiers and o.candidate is not None:
            c = o.candidate
            w.awaiting.append(AwaitingReview(f.error_class, f.message, c.digest, c.kind, task.id, task.lease_token))
            if task.task_key not in w.reviewed_keys:  # one entry per key: another task of it waits on the same
                w.reviewed_keys.add(task.task_key)
                w.reviews.append(NewReview(
                    task.id, task.run_id, self.pipeline.name, task.item_key, task.stage, f.error_class, f.message,
                    verdict.confidence, task.tier, c.kind, c.digest, c.inline, c.size,
                    now + accept.review.deadline_s, accept.review.on_deadline, now))
            w.attempts.append(self._attempt(o, "awaiting_review", f))
            w.counts["awaiting_review"] += 1
        else:  # settled for this input under this version: memoised, so a re-run does not pay for it again
            w.ended.append(Ended(TaskStatus.FAILED, f.error_class, f.message, now, 0, task.id, task.lease_token))
            w.outputs.append(self.refusal(task, Failure(f.error_class, False, f.message), now, o.provenance))
            w.attempts.append(self._attempt(o, "failed", f))
            w.counts["failed"] += 1
        return True

    def _delay(self, task: ClaimedTask, failure: Failure) -> float:
        if failure.retry_after is not None:
            return failure.retry_after
        return self.pipeline[task.stage].retry.delay(task.attempts, self.rng)

    def _lost(self, o: Outcome) -> AttemptRecord:
        failure = Failure("lease_lost", True, "the lease expired before this attempt committed; result discarded")
        return self._attempt(o, "lease_lost", failure)

    def _attempt(self, o: Outcome, outcome: str, f: Failure | None) -> AttemptRecord:
        stage, u = self.pipeline[o.task.stage], o.usage
        record = AttemptRecord(
            o.task.id, o.task.run_id, o.task.attempts, outcome, int(o.invoked),
            f.error_class if f else None, f.message if f else None, self.worker, o.task.lease_token,
            stage.version, self.memos[o.task.stage].code, o.started, o.duration,
            config_hash=stage.config_hash, provenance=encode(o.provenance),
        )
        if o.verdict is not None:
            record = record._replace(tier=o.task.tier, repaired=int(o.verdict.repaired),
                                     confidence=o.verdict.confidence, unrepaired=o.unrepaired)
        if _logged(o):
            assert o.logs is not None
            record = record._replace(logs=o.logs.encoded(), logs_dropped=o.logs.dropped)
        if u is None or not u.calls:
            return record
        return record._replace(provider_calls=u.calls, prompt_tokens=u.prompt_tokens,
                               completion_tokens=u.completion_tokens, cost=u.cost,
                               model=",".join(sorted(u.models)) or None,
                               prompt_version=",".join(sorted(u.prompt_versions)) or None,
                               unpriced_calls=u.unpriced_calls)


def _logged(o: Outcome) -> bool:
    """Whether the attempt logged through ``ctx.log`` (lines kept, or past the bound and counted)."""
    return o.logs is not None and bool(o.logs.lines or o.logs.dropped)


def open_moves(w: Writes, where: dict[int, tuple[str, str]], since: dict[int, float], pipeline: str) -> OpenTally:
    """What a commit's fenced changes (all applied) do to the queue's counts (store/queuecounts.py): leased tasks
    that end or go to review leave the open ones; a retry, an escalation or a task parked to wait for its provider
    batch is runnable again at a new time; a released lease keeps its time. (The new tasks it inserts are counted
    by the insert.)"""
    moves = OpenTally()
    ended = [e.task_id for e in w.ended if e.status not in OPEN_STATUSES]
    left: Counter[tuple[str, int]] = Counter()  # (stage, second of available_at) -> tasks that left the open ones
    floor = math.floor
    for task_id in (*(s.task_id for s in w.succeeded), *ended, *(a.task_id for a in w.awaiting)):
        left[where[task_id][1], floor(since[task_id])] += 1
    for (stage, second), count in left.items():
        moves.add(pipeline, stage, second, -count)
    for task_id, available_at in [*((r.task_id, r.available_at) for r in w.retry),
                                  *((e.task_id, e.available_at) for e in w.escalated),
                                  *((p.task_id, p.available_at) for p in w.parked)]:
        moves.move(pipeline, where[task_id][1], since[task_id], available_at)
    return moves


def run_totals(w: Writes, where: dict[int, tuple[str, str]]) -> RunTally:
    """What a commit's fenced changes (all of them applied: the caller checked the count) and its attempts add
    to its runs' totals. Leased tasks are open; retries, releases and escalations leave them open."""
    totals = RunTally()
    moves: Counter[tuple[str, str, str, int]] = Counter()
    succeeded: Counter[tuple[tuple[str, str], int]] = Counter((where[s.task_id], s.cached) for s in w.succeeded)
    for ((run_id, stage), cached), count in succeeded.items():
        moves[run_id, stage, "succeeded", cached] += count
    for e in w.ended:
        moves[(*where[e.task_id], e.status, e.cached)] += 1
    for a in w.awaiting:
        moves[(*where[a.task_id], "awaiting_review", 0)] += 1
    for (run_id, stage, status, cached), count in moves.items():
        totals.move(run_id, stage, ("running", 0), (status, cached), count)
    stages = {task_id: stage for task_id, (_, stage) in where.items()}
    totals.attempts(stages, w.attempts, w.plain_attempts)
    return totals

