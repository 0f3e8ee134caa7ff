"""Job events: what the API's clients learn, written in the transaction of the change each tells of.

A job is a run the API created for one document (store/jobs.py). Its events: ``job.accepted`` (service/jobs.py,
with the job), ``job.stage_done`` (a task of it succeeded), ``job.awaiting_review`` (an answer waits for people),
and, once none of its tasks is open any more, its end: ``job.published``, ``job.completed``, ``job.failed``,
``job.dead_lettered`` or ``job.rejected`` (the item's outcome, as reconcile gives it). A replay that re-opens an
ended job says ``job.reopened``. Runs that are not jobs cost one cached lookup per run and write nothing.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from conveyor.pipeline import Pipeline
from conveyor.runtime.transitions.base import Base
from conveyor.store import ClaimedTask, SqlStore
from conveyor.store.jobs import JobRow, NewEvent, client_key
from conveyor.store.reports import OutcomeStages

FINAL_EVENTS = ("published", "completed", "failed", "dead_lettered", "rejected")
_CACHE = 4096  # runs remembered per worker: whether each is a job


class JobEvents(Base):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._job_cache: OrderedDict[str, JobRow | None] = OrderedDict()

    def owners(self, run_ids: Iterable[str]) -> dict[str, str | None]:
        """Each run's tenant: its job's (an API job or batch), None for a run the API did not create. Work waits
        on, and is settled by, only what its own tenant can see (a review entry is its tenant's to decide)."""
        wanted = sorted(set(run_ids))
        jobs = self.store.jobs_of_runs(wanted) if wanted else {}
        return {run_id: jobs[run_id].tenant if run_id in jobs else None for run_id in wanted}

    def jobs_among(self, run_ids: Iterable[str]) -> dict[str, JobRow]:
        """The single-document jobs among these runs (cached: a run's job never changes kind)."""
        cache = self._job_cache
        wanted = set(run_ids)
        unknown = [r for r in wanted if r not in cache]
        if unknown:
            found = self.store.jobs_of_runs(unknown)
            for run_id in unknown:
                job = found.get(run_id)
                cache[run_id] = job if job is not None and job.kind == "job" else None
            while len(cache) > _CACHE:
                cache.popitem(last=False)
        jobs = {}
        for run_id in wanted:
            job = cache.get(run_id)
            if job is not None:
                jobs[run_id] = job
        return jobs

    def task_events(self, tasks: Mapping[int, ClaimedTask], succeeded: Sequence[int], awaiting: Sequence[int],
                    ended: Sequence[int], now: float) -> tuple[list[NewEvent], set[str]]:
        """Events for tasks of jobs that succeeded or went to review; and the jobs whose end may have come
        (every job a task of which settled). ``tasks``: task id to task, for the tasks of this commit."""
        jobs = self.jobs_among({t.run_id for t in tasks.values()})
        if not jobs:
            return [], set()
        events: list[NewEvent] = []
        for task_id in succeeded:
            task = tasks.get(task_id)
            if task is not None and task.run_id in jobs:
                events.append(event(jobs[task.run_id], "job.stage_done", now, stage=task.stage, item_key=task.item_key))
        for task_id in awaiting:
            task = tasks.get(task_id)
            if task is not None and task.run_id in jobs:
                events.append(event(jobs[task.run_id], "job.awaiting_review", now, stage=task.stage,
                                    item_key=task.item_key))
        touched = {tasks[i].run_id for i in (*succeeded, *awaiting, *ended) if i in tasks}
        return events, touched & set(jobs)

    def settle_jobs(self, run_ids: Iterable[str], now: float) -> list[NewEvent]:
        """In the caller's transaction: the end of each of these jobs that has no open task any more."""
        jobs = self.jobs_among(run_ids)
        return settle(self.store, [jobs[r] for r in sorted(jobs)], outcome_stages(self.pipeline), now)


def settle(store: SqlStore, jobs: Sequence[JobRow], stages: OutcomeStages, now: float) -> list[NewEvent]:
    """Record the end of each job with no open task (its row locked first, so two commits that settle its last
    tasks at once decide it one after the other) and return the events that tell it; nothing for the rest."""
    events: list[NewEvent] = []
    for job in jobs:
        store.lock_job(job.job_id)
        if store.open_job_tasks(job.job_id):
            continue
        key = job.item_key or job.job_id
        outcome = store.outcomes_of(job.job_id, stages, [key]).get(key, "failed")
        if outcome in FINAL_EVENTS and store.finish_job(job.job_id, outcome, now):
            events.append(event(job, f"job.{outcome}", now, outcome=outcome))
    if events:
        store.insert_events(events)
    return events


def outcome_stages(pipeline: Pipeline) -> OutcomeStages:
    """The stages an item's outcome depends on (as service/records.RunGraph reads them from a run's graph)."""
    accept = tuple(s.name for s in pipeline if s.accept)
    publish = tuple(s.name for s in pipeline if s.kind == "publish")
    past = tuple(s.name for s in pipeline if _ancestors(pipeline, s.name) & set(accept))
    skips = {g: spec for g, spec in pipeline.graph.gathers.items() if pipeline[g].on_child_failure == "skip"}
    skipped = tuple(sorted({name for spec in skips.values() for name in spec.path}))
    return OutcomeStages(publish, accept, past, skipped, tuple(skips))


def _ancestors(pipeline: Pipeline, name: str) -> set[str]:
    return set(pipeline.graph.above(name))


def event(job: JobRow, kind: str, now: float, **data: Any) -> NewEvent:
    """An outbox row for ``job``: pending delivery when the job has a webhook. An item key is told as the job's
    tenant chose it (the store keeps it under the tenant's namespace)."""
    if isinstance(data.get("item_key"), str):
        data["item_key"] = client_key(job.tenant, data["item_key"])
    body = json.dumps({"job_id": job.job_id, **data}, sort_keys=True)
    pending = job.webhook_url is not None
    return NewEvent(job.job_id, kind, body, now, "pending" if pending else None, now if pending else None)
