"""What an operator does: re-open a selection of tasks (replay; requeue is one), replay dead letters."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from conveyor.runtime.reopen import Plan
from conveyor.runtime.transitions.events import event
from conveyor.store import SqlStore


def reopen(store: SqlStore, plan: Plan, replay_id: int, run_id: str, message: str, worker: str,
           now: float) -> tuple[list[int], dict[str, int]]:
    """Write one page of a replay in one transaction: the planned tasks queued again (their memoised refusals
    forgotten, open reviews and dead letters closed, the reason recorded as an attempt of each), what lies
    downstream of them superseded, corrected sources recorded. Returns (ids re-opened, superseded by stage)."""
    with store.transaction():
        reopened = store.reopen(plan.reopen, plan.forget, message, worker, now, plan.run_of)
        superseded = store.supersede(plan.downstream, replay_id, message, worker, now) if plan.downstream else {}
        if plan.regroup:  # made again once the re-opened members settle (runtime/transitions/groups.py)
            store.reopen_group_waits(sorted(plan.regroup))
        if plan.corrected:
            store.correct_sources(run_id, plan.corrected)
        reopen_jobs(store, {run_id, *plan.run_of.values()}, now)
        store.notify()
    return reopened, superseded


def replay_dead_letters(store: SqlStore, ids: Sequence[int], reason: str, now: float) -> list[int]:
    """Queue dead-lettered tasks again with a fresh attempt budget; the reason is recorded with each entry.
    Returns the ids replayed. Only the jobs of the entries replayed now re-open: an entry replayed before (whose
    task may have ended again, and its job with it) leaves its job as it is."""
    with store.transaction():
        replayed = store.replay_dead_letters(ids, reason, now)
        if replayed:
            reopen_jobs(store, store.runs_of_dead_letters(replayed), now)
    return replayed


def reopen_jobs(store: SqlStore, run_ids: Collection[str], now: float) -> None:
    """Jobs among ``run_ids`` that had ended are open again: ``job.reopened`` tells their clients."""
    reopened = store.reopen_jobs(sorted(run_ids))
    if reopened:
        jobs = store.jobs_of_runs(reopened)
        store.insert_events([event(jobs[j], "job.reopened", now) for j in reopened])
