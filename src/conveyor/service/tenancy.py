"""What a tenant may see and own: the runs of its own jobs (a job's id is its run's id), with their reviews and dead
letters, and its item keys and publications. A call made for an operator, or from the command line, passes no
tenant (None) and sees every run.

``TenantView`` is the one way the HTTP service reaches a caller's jobs, batches, events and records: built
once per request from the authenticated caller, it narrows every read to what the caller may see, so no
service function has a tenant argument to forget (Django's tenant-aware managers, SQLAlchemy's
``with_loader_criteria``). A tenant's item keys are its own: the store keeps them under the tenant's namespace
(``owned_key``), so two tenants that choose one key have two items, two publications and two publish memos.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import NotFound
from conveyor.service.tokens import Caller
from conveyor.store import RunRecord, SqlStore
from conveyor.store.jobs import EventRow, JobRow, JobTask, client_key, owned_key
from conveyor.store.publications import PublicationVersion
from conveyor.store.reviews import ReviewEntry

__all__ = ["TenantView", "client_key", "owned_key", "tenant_runs", "visible"]


@dataclass(frozen=True)
class TenantView:
    """The store as ``caller`` may see it: a tenant's own jobs and batches, or every one for an operator.
    Another tenant's job is NotFound, the same as a missing one (its existence is not told)."""

    store: SqlStore
    caller: Caller

    @property
    def tenant(self) -> str:
        """The tenant that owns what this caller creates."""
        return self.caller.tenant

    @property
    def scope(self) -> str | None:
        """The tenant reads are narrowed to (None: every tenant's, for an operator)."""
        return self.caller.scope

    def item_key(self, key: str) -> str:
        """The stored key of an item this caller submits under ``key``."""
        return owned_key(self.tenant, key)

    def stored_key(self, run_id: str, key: str) -> str:
        """The stored key of the item of run ``run_id`` that ``key`` names: as its tenant chose it, or as stored."""
        job = self.store.jobs_of_runs([run_id]).get(run_id)
        owned = owned_key(job.tenant, key) if job is not None else key
        return owned if self.store.item_row(run_id, owned) is not None else key

    def job(self, job_id: str, kind: str | None = None) -> JobRow:
        """The job (of ``kind``, when given), NotFound unless this caller may see it."""
        job = self.store.get_job(job_id)
        if job is None or (self.scope is not None and job.tenant != self.scope) or kind not in (None, job.kind):
            raise NotFound(f"no {kind or 'job'} {job_id!r}")
        return job

    def jobs(self, limit: int, before: float | None = None) -> list[JobRow]:
        return self.store.list_jobs(self.scope, limit, before)

    def run(self, job: JobRow) -> RunRecord:
        """The run of a job this view returned (NotFound when it was deleted by hand)."""
        run = self.store.get_run(job.job_id)
        if run is None:
            raise NotFound(f"no {job.kind} {job.job_id!r}")
        return run

    def events(self, job_id: str, after: int, limit: int) -> list[EventRow]:
        self.job(job_id)
        return self.store.events_after(job_id, after, limit)

    def live_record(self, job: JobRow) -> PublicationVersion | None:
        """The live published version of a job's document: its own item's, never another tenant's."""
        if job.item_key is None:
            return None
        live = [v for v in self.store.publication_versions(None, job.item_key) if v.live]
        return live[0] if live else None

    def own_memo(self, job: JobRow, task_keys: Sequence[str]) -> set[str]:
        """The task keys answered from the memo of the job's own tenant's earlier work: a job may say
        ``cached`` for those only, so that no tenant learns that another sent the same document."""
        return self.store.memo_made_by(job.tenant, task_keys) if task_keys else set()

    def tasks(self, job: JobRow, limit: int) -> list[JobTask]:
        """The tasks of a job this view returned."""
        return self.store.job_tasks(job.job_id, limit)

    def reviews(self, job: JobRow, limit: int) -> list[ReviewEntry]:
        """The review entries of a job this view returned."""
        return self.store.reviews(run_id=job.job_id, limit=limit)

    def deliveries(self, state: str | None, limit: int) -> list[tuple[EventRow, str | None]]:
        """Webhook deliveries of the caller's jobs, newest first, with their URLs."""
        return self.store.deliveries(self.scope, state, limit)


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
