"""What a tenant may see: the runs of its own jobs (a job's id is its run's id), with their reviews and dead
letters. A call made for an operator, or from the command line, passes no tenant (None) and sees every run."""

from __future__ import annotations

from conveyor.store import RunRecord, SqlStore


def visible(store: SqlStore, tenant: str | None, run_id: str) -> bool:
    """Whether ``tenant`` may see run ``run_id`` (anyone may, for tenant None)."""
    if tenant is None:
        return True
    job = store.jobs_of_runs([run_id]).get(run_id)
    return job is not None and job.tenant == tenant


def tenant_runs(store: SqlStore, tenant: str, limit: int, before: float | None = None) -> list[RunRecord]:
    """The runs of ``tenant``'s jobs, newest first (those made before ``before``, when given)."""
    runs = (store.get_run(job.job_id) for job in store.list_jobs(tenant, limit, before))
    return [run for run in runs if run is not None]
