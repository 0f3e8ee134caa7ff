"""The HTTP service's rows: tenants and API tokens, jobs, idempotency keys, and the event outbox.

A job is a run the API created (its id is the run's id). Its events are the outbox: each is written in
the transaction of the change it tells of (store/jobs.py is called from runtime/transitions), read by
id for Server-Sent Events, and delivered to the job's webhook by the relay, which leases pending
deliveries so that several servers share them (``FOR UPDATE SKIP LOCKED`` on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.memokey import key64
from conveyor.store.records import DeadLetter
from conveyor.store.reports import DLQ_COLUMNS
from conveyor.store.reviews import REVIEW_COLUMNS, ReviewEntry
from conveyor.store.tasks import chunks

OPEN_STATUSES = ("queued", "running", "awaiting_review")

JOB_COLUMNS = ("job_id, tenant, kind, item_key, pipeline, lane, webhook_url, metadata, request_hash, idempotency_key, "
               "created_at, finished_at, outcome")
EVENT_COLUMNS = "id, job_id, type, data, created_at, delivery, delivery_attempts, delivered_at, delivery_error"


def owned_key(tenant: str, key: str) -> str:
    """The stored item key of a tenant's ``key``: ``@tenant/key`` (a tenant name has no ``/``, so no two
    tenants' keys meet). ``conveyor publications @acme/contract-42`` lists tenant acme's item (service/tenancy.py)."""
    return f"@{tenant}/{key}"


def client_key(tenant: str, stored: str) -> str:
    """The key as the tenant chose it (a stored key of another namespace is returned whole)."""
    prefix = f"@{tenant}/"
    return stored[len(prefix):] if stored.startswith(prefix) else stored


class TokenRow(NamedTuple):
    token_id: str
    tenant: str
    operator: bool
    label: str | None
    created_at: float
    revoked_at: float | None


class JobRow(NamedTuple):
    job_id: str
    tenant: str
    kind: str  # 'job' (one document) or 'batch' (a manifest)
    item_key: str | None  # a job's document (its root item); None for a batch
    pipeline: str
    lane: str
    webhook_url: str | None
    metadata: str | None  # JSON
    request_hash: str
    idempotency_key: str | None
    created_at: float
    finished_at: float | None = None
    outcome: str | None = None


class NewEvent(NamedTuple):
    job_id: str
    type: str
    data: str  # JSON
    created_at: float
    delivery: str | None  # 'pending' when the job has a webhook, else None
    next_delivery_at: float | None


class EventRow(NamedTuple):
    id: int
    job_id: str
    type: str
    data: str
    created_at: float
    delivery: str | None
    delivery_attempts: int
    delivered_at: float | None
    delivery_error: str | None


class Delivery(NamedTuple):
    """A pending webhook delivery the relay leased: the event and where it goes."""

    id: int
    job_id: str
    type: str
    data: str
    created_at: float
    attempts: int
    url: str
    tenant: str
    secret: str
    job: bool = True  # False for an event that is not a job's (an alert): its data names no job
    lease_until: float = 0.0  # the lease this relay holds: its result is recorded only while it still does


class JobTask(NamedTuple):
    id: int
    task_key: str
    stage: str
    item_key: str
    status: str
    attempts: int
    cached: bool
    error_class: str | None
    last_error: str | None
    output_kind: str | None
    output_digest: str | None
    finished_at: float | None


class JobQueries:
    db: Dialect

    # --- tenants and tokens ---------------------------------------------------

    def ensure_tenant(self, tenant: str, secret: str, now: float) -> str:
        """The tenant's webhook secret, ``secret`` when the tenant is new."""
        with self.db.transaction():
            self.db.execute("INSERT INTO tenants (tenant, webhook_secret, created_at) VALUES (?, ?, ?) "
                            "ON CONFLICT (tenant) DO NOTHING", (tenant, secret, now))
            return str(self.db.execute("SELECT webhook_secret FROM tenants WHERE tenant = ?", (tenant,))[0][0])

    def tenant_secret(self, tenant: str) -> str | None:
        rows = self.db.execute("SELECT webhook_secret FROM tenants WHERE tenant = ?", (tenant,))
        return str(rows[0][0]) if rows else None

    def insert_token(self, token_id: str, token_hash: str, tenant: str, operator: bool, label: str | None,
                     now: float) -> None:
        with self.db.transaction():
            self.db.execute("INSERT INTO api_tokens (token_id, token_hash, tenant, operator, label, created_at) "
                            "VALUES (?, ?, ?, ?, ?, ?)", (token_id, token_hash, tenant, int(operator), label, now))

    def token_by_hash(self, token_hash: str) -> TokenRow | None:
        rows = self.db.execute("SELECT token_id, tenant, operator, label, created_at, revoked_at FROM api_tokens "
                               "WHERE token_hash = ?", (token_hash,))
        return _token(rows[0]) if rows else None

    def token_by_id(self, token_id: str) -> TokenRow | None:
        rows = self.db.execute("SELECT token_id, tenant, operator, label, created_at, revoked_at FROM api_tokens "
                               "WHERE token_id = ?", (token_id,))
        return _token(rows[0]) if rows else None

    def revoke_token(self, token_id: str, now: float) -> bool:
        """Revoke a token; False when it was revoked already (or does not exist)."""
        with self.db.transaction():
            return self.db.execute_rowcount("UPDATE api_tokens SET revoked_at = ? WHERE token_id = ? "
                                            "AND revoked_at IS NULL", (now, token_id)) == 1

    def list_tokens(self, tenant: str | None = None) -> list[TokenRow]:
        where, params = ("WHERE tenant = ?", (tenant,)) if tenant else ("", ())
        rows = self.db.execute("SELECT token_id, tenant, operator, label, created_at, revoked_at FROM api_tokens "
                               f"{where} ORDER BY created_at", params)
        return [_token(r) for r in rows]

    # --- jobs -----------------------------------------------------------------

    def insert_job(self, job: JobRow) -> None:
        marks = ", ".join("?" * len(job))
        self.db.execute(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({marks})", tuple(job))

    def get_job(self, job_id: str) -> JobRow | None:
        rows = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
        return JobRow(*rows[0]) if rows else None

    def jobs_of_runs(self, run_ids: Sequence[str]) -> dict[str, JobRow]:
        """The jobs among ``run_ids`` (a run the API did not create has none)."""
        found: dict[str, JobRow] = {}
        for part in chunks(list(run_ids), 500):
            marks = ",".join("?" * len(part))
            for row in self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id IN ({marks})", part):
                found[str(row[0])] = JobRow(*row)
        return found

    def list_jobs(self, tenant: str | None, limit: int, before: float | None = None) -> list[JobRow]:
        clauses, params = _given((("tenant = ?", tenant), ("created_at < ?", before)))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs {where} ORDER BY created_at DESC LIMIT ?",
                               (*params, limit))
        return [JobRow(*r) for r in rows]

    def lock_job(self, job_id: str) -> None:
        """Hold the job's row until the transaction ends: two commits that settle a job's last tasks at once
        then decide its end one after the other (SQLite's single writer does this already)."""
        self.db.execute(f"SELECT job_id FROM jobs WHERE job_id = ?{self.db.row_lock}", (job_id,))

    def lock_jobs(self, job_ids: Sequence[str]) -> None:
        """Hold these jobs' rows until the transaction ends, taken in one order (by id), so that transactions
        that lock several at once never wait on each other in a circle."""
        for part in chunks(sorted(set(job_ids)), 500):
            marks = ",".join("?" * len(part))
            self.db.execute(f"SELECT job_id FROM jobs WHERE job_id IN ({marks}) ORDER BY job_id{self.db.row_lock}",
                            part)

    def open_job_tasks(self, run_id: str) -> int:
        """Tasks of a job's run that are not at an end (queued, running, awaiting review), and its groups not
        made yet (store/groups.py: they will be tasks)."""
        marks = ",".join("?" * len(OPEN_STATUSES))
        rows = self.db.execute(f"SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status IN ({marks})"
                               " UNION ALL SELECT COUNT(*) FROM group_waits WHERE run_id = ? AND made_at IS NULL",
                               (run_id, *OPEN_STATUSES, run_id))
        return sum(int(r[0]) for r in rows)

    def has_open_tasks(self, run_id: str) -> bool:
        """Whether any task of the run is not at an end, or a group of it is still to be made: stops at the first
        one (a batch is asked often)."""
        marks = ",".join("?" * len(OPEN_STATUSES))
        return bool(self.db.execute(f"SELECT 1 FROM tasks WHERE run_id = ? AND status IN ({marks}) LIMIT 1",
                                    (run_id, *OPEN_STATUSES))
                    or self.db.execute("SELECT 1 FROM group_waits WHERE run_id = ? AND made_at IS NULL LIMIT 1",
                                       (run_id,)))

    def finish_job(self, job_id: str, outcome: str, now: float) -> bool:
        """Record the job's end; False when it had ended with this outcome already."""
        return self.db.execute_rowcount(
            "UPDATE jobs SET finished_at = ?, outcome = ? WHERE job_id = ? AND (finished_at IS NULL OR outcome <> ?)",
            (now, outcome, job_id, outcome)) == 1

    def reopen_jobs(self, run_ids: Sequence[str]) -> list[str]:
        """Jobs among ``run_ids`` that had ended and are open again (a replay); returns their ids."""
        reopened: list[str] = []
        for part in chunks(list(run_ids), 500):
            marks = ",".join("?" * len(part))
            rows = self.db.execute(f"SELECT job_id FROM jobs WHERE job_id IN ({marks}) AND finished_at IS NOT NULL",
                                   part)
            ids = [str(r[0]) for r in rows]
            if ids:
                marks = ",".join("?" * len(ids))
                self.db.execute(f"UPDATE jobs SET finished_at = NULL, outcome = NULL WHERE job_id IN ({marks})", ids)
            reopened += ids
        return reopened

    def runs_of_dead_letters(self, ids: Sequence[int], replayed_at: float | None = None) -> set[str]:
        """The runs these dead letters belong to (a replay re-opens their jobs); with ``replayed_at``, only
        those of the dead letters replayed then (the ones a replay just queued again, not those replayed
        before, whose jobs may have ended since)."""
        runs: set[str] = set()
        when, at = ("AND replayed_at = ?", [replayed_at]) if replayed_at is not None else ("", [])
        for part in chunks(list(ids), 500):
            marks = ",".join("?" * len(part))
            runs.update(str(r[0]) for r in self.db.execute(
                f"SELECT DISTINCT run_id FROM dead_letters WHERE id IN ({marks}) {when}", [*part, *at]))
        return runs

    def unfinished_batches(self, limit: int) -> list[JobRow]:
        rows = self.db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE kind = 'batch' AND finished_at IS NULL "
                               "ORDER BY created_at LIMIT ?", (limit,))
        return [JobRow(*r) for r in rows]

    def job_tasks(self, run_id: str, limit: int) -> list[JobTask]:
        """A job's tasks (its document's and its children's), in the order they were made."""
        rows = self.db.execute(
            "SELECT id, task_key, stage, item_key, status, attempts, cached, error_class, last_error, output_kind, "
            "output_digest, finished_at FROM tasks WHERE run_id = ? ORDER BY id LIMIT ?", (run_id, limit))
        return [JobTask(int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), bool(r[6]), *r[7:]) for r in rows]

    def memo_made_by(self, tenant: str, task_keys: Sequence[str]) -> set[str]:
        """The task keys among ``task_keys`` whose memo output a job (or batch) of ``tenant`` made: a job may
        tell its client of a memo hit on its own tenant's earlier work, never on another's."""
        wanted, found = set(task_keys), set[str]()
        for part in chunks([key64(k) for k in wanted], self.db.in_chunk):
            where, params = self.db.one_of("o.key64", part, "bigint")
            found.update(str(r[0]) for r in self.db.execute(
                f"SELECT o.task_key FROM outputs o JOIN jobs j ON j.job_id = o.run_id WHERE {where} AND j.tenant = ?",
                (*params, tenant)) if r[0] in wanted)
        return found

    # --- idempotency keys -----------------------------------------------------

    def claim_idempotency_key(self, tenant: str, key: str, request_hash: str, job_id: str, now: float) -> bool:
        """Take ``key`` for ``job_id`` (in the caller's transaction); False when the tenant holds it already
        (a concurrent transaction that took it first is waited for)."""
        return self.db.execute_rowcount(
            "INSERT INTO idempotency_keys (tenant, key, request_hash, job_id, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, key) DO NOTHING", (tenant, key, request_hash, job_id, now)) == 1

    def idempotency_key(self, tenant: str, key: str, kept_since: float) -> tuple[str, str] | None:
        """(request hash, job id) the key names, when it was taken after ``kept_since``."""
        rows = self.db.execute("SELECT request_hash, job_id FROM idempotency_keys WHERE tenant = ? AND key = ? "
                               "AND created_at >= ?", (tenant, key, kept_since))
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def forget_idempotency_keys(self, tenant: str, key: str, before: float) -> None:
        """Drop an expired key, so that it may name a new job."""
        self.db.execute("DELETE FROM idempotency_keys WHERE tenant = ? AND key = ? AND created_at < ?",
                        (tenant, key, before))

    def expire_idempotency_keys(self, before: float, limit: int = 5000) -> int:
        with self.db.transaction():
            rows = self.db.execute("SELECT tenant, key FROM idempotency_keys WHERE created_at < ? LIMIT ?",
                                   (before, limit))
            self.db.executemany("DELETE FROM idempotency_keys WHERE tenant = ? AND key = ?", rows)
            return len(rows)

    # --- the outbox -----------------------------------------------------------

    def insert_events(self, events: Sequence[NewEvent]) -> None:
        """Events into the outbox, each written under its job's row lock (held until the transaction ends):
        a writer that comes second waits for the first one's commit before its events take their ids, so a
        job's events take ids in the order they commit, and a reader that follows a job by id never passes
        one that commits later (on PostgreSQL; SQLite has one writer at a time). Ids come from a sequence
        whose values only grow (never cached per session), which this relies on."""
        self.lock_jobs([e.job_id for e in events])
        self.db.executemany("INSERT INTO events (job_id, type, data, created_at, delivery, next_delivery_at) "
                            "VALUES (?, ?, ?, ?, ?, ?)", events)

    def events_after(self, job_id: str, after: int, limit: int) -> list[EventRow]:
        rows = self.db.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
                               (job_id, after, limit))
        return [EventRow(*r) for r in rows]

    def lease_deliveries(self, now: float, lease_s: float, limit: int) -> list[Delivery]:
        """Pending deliveries that are due, leased for ``lease_s`` (another relay skips them meanwhile): of a
        job's events for one URL, only the first pending one, so that they arrive in order (see _DUE)."""
        with self.db.transaction():
            rows = self.db.execute(f"SELECT id FROM events e WHERE {_DUE} ORDER BY next_delivery_at LIMIT ? "
                                   f"{self.db.skip_locked}", (now, now, limit))
            ids = [int(r[0]) for r in rows]
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            # The lease's end is its fencing token: a relay takes a lease only past the last one's end, so each
            # lease of an event ends later than the one before.
            self.db.execute(f"UPDATE events SET delivery_lease_until = ? WHERE id IN ({marks})", (now + lease_s, *ids))
            # A job's event goes to its job's webhook, signed with its tenant's secret; an alert's names both.
            rows = self.db.execute(
                "SELECT e.id, e.job_id, e.type, e.data, e.created_at, e.delivery_attempts, "
                "COALESCE(e.webhook_url, j.webhook_url), t.tenant, t.webhook_secret, e.tenant IS NULL, "
                "e.delivery_lease_until FROM events e LEFT JOIN jobs j ON j.job_id = e.job_id AND e.tenant IS NULL "
                f"JOIN tenants t ON t.tenant = COALESCE(e.tenant, j.tenant) WHERE e.id IN ({marks}) ORDER BY e.id",
                ids)
            return [Delivery(int(r[0]), r[1], r[2], r[3], float(r[4]), int(r[5]), r[6], r[7], r[8], bool(r[9]),
                             float(r[10])) for r in rows]

    def delivery_done(self, event_id: int, lease_until: float, now: float) -> bool:
        """Record a delivery that arrived; False (nothing recorded) when its lease passed to another relay."""
        with self.db.transaction():
            return self.db.execute_rowcount(
                "UPDATE events SET delivery = 'delivered', delivered_at = ?, delivery_lease_until = NULL, "
                f"delivery_attempts = delivery_attempts + 1, delivery_error = NULL WHERE {_LEASED}",
                (now, event_id, lease_until)) == 1

    def delivery_missed(self, event_id: int, lease_until: float, error: str, retry_at: float | None) -> bool:
        """A delivery that did not succeed: tried again at ``retry_at``, or failed for good (None); False
        (nothing recorded) when its lease passed to another relay."""
        with self.db.transaction():
            if retry_at is None:
                return self.db.execute_rowcount(
                    "UPDATE events SET delivery = 'failed', delivery_lease_until = NULL, "
                    f"delivery_attempts = delivery_attempts + 1, delivery_error = ? WHERE {_LEASED}",
                    (error, event_id, lease_until)) == 1
            if self.db.execute_rowcount(
                    "UPDATE events SET next_delivery_at = ?, delivery_lease_until = NULL, "
                    f"delivery_attempts = delivery_attempts + 1, delivery_error = ? WHERE {_LEASED}",
                    (retry_at, error, event_id, lease_until)) != 1:
                return False
            # The job's later events wait for this one: put off with it, a relay's poll does not read them
            # again and again meanwhile (a receiver that is away may have many waiting).
            self.db.execute(
                "UPDATE events SET next_delivery_at = ? WHERE delivery = 'pending' AND next_delivery_at < ? "
                "AND job_id = (SELECT job_id FROM events WHERE id = ?) AND id > ? AND COALESCE(webhook_url, '') = "
                "(SELECT COALESCE(webhook_url, '') FROM events WHERE id = ?)",
                (retry_at, retry_at, event_id, event_id, event_id))
            return True

    def deliveries(self, tenant: str | None, state: str | None, limit: int) -> list[tuple[EventRow, str | None]]:
        """Events with a webhook (of ``tenant``; in delivery ``state``), newest first, with the URL."""
        clauses, params = _given((("j.tenant = ?", tenant), ("e.delivery = ?", state)))
        clauses.append("e.delivery IS NOT NULL")
        cols = ", ".join(f"e.{c.strip()}" for c in EVENT_COLUMNS.split(","))
        # Alerts' events have no job: an operator (no tenant) sees them too.
        rows = self.db.execute(f"SELECT {cols}, COALESCE(e.webhook_url, j.webhook_url) FROM events e LEFT JOIN jobs j "
                               f"ON j.job_id = e.job_id WHERE {' AND '.join(clauses)} ORDER BY e.id DESC LIMIT ?",
                               (*params, limit))
        return [(EventRow(*r[:-1]), r[-1]) for r in rows]

    # --- what a tenant sees: the runs of its own jobs -------------------------

    def tenant_reviews(self, tenant: str, run_id: str | None, stage: str | None, include_decided: bool,
                       limit: int, after: int | None = None, reason_class: str | None = None) -> list[ReviewEntry]:
        """Review entries of ``tenant``'s jobs, as ``reviews()`` lists them."""
        clauses, params = _narrowed(tenant, (("run_id", run_id), ("stage", stage), ("reason_class", reason_class)),
                                    after)
        if not include_decided:
            clauses.append("decided_at IS NULL")
        rows = self.db.execute(f"SELECT {REVIEW_COLUMNS} FROM reviews WHERE {' AND '.join(clauses)} ORDER BY id "
                               "LIMIT ?", (*params, limit))
        return [ReviewEntry(*r) for r in rows]

    def tenant_review_reasons(self, tenant: str, run_id: str | None, stage: str | None) -> list[tuple[str, int]]:
        """(reason class, open entries) of ``tenant``'s queue, as ``review_reasons()`` counts them."""
        clauses, params = _narrowed(tenant, (("run_id", run_id), ("stage", stage)))
        rows = self.db.execute(f"SELECT reason_class, COUNT(*) FROM reviews WHERE {' AND '.join(clauses)} AND "
                               "decided_at IS NULL GROUP BY reason_class ORDER BY COUNT(*) DESC, reason_class", params)
        return [(str(r[0]), int(r[1])) for r in rows]

    def tenant_dead_letters(self, tenant: str, run_id: str | None, stage: str | None, error_class: str | None,
                            include_replayed: bool, limit: int, after: int | None = None) -> list[DeadLetter]:
        """Dead letters of ``tenant``'s jobs, as ``dead_letters()`` lists them."""
        clauses, params = _narrowed(tenant, (("run_id", run_id), ("stage", stage), ("error_class", error_class)),
                                    after)
        if not include_replayed:
            clauses.append("replayed_at IS NULL")
        rows = self.db.execute(f"SELECT {DLQ_COLUMNS} FROM dead_letters WHERE {' AND '.join(clauses)} ORDER BY id "
                               "LIMIT ?", (*params, limit))
        return [DeadLetter(*r) for r in rows]

    # --- the relay ------------------------------------------------------------

    def delivery_due(self, now: float) -> bool:
        """Whether a delivery may be sent now (due, not leased, the first pending one of its job's events for
        its URL): read outside a transaction, so an idle relay polls without taking SQLite's write lock
        (``lease_deliveries`` does)."""
        return bool(self.db.execute(f"SELECT 1 FROM events e WHERE {_DUE} LIMIT 1", (now, now)))


# A delivery that may be sent now (parameters: now, now): pending, due, not leased, and the first pending one of
# its job's events for its URL. An event waits while an earlier one of its job is pending (in flight or waiting
# to be tried again), so a retried early event never arrives after a later one; a failed one stops no other.
# A job's events take ids in commit order (insert_events), so "earlier" is a smaller id.
_DUE = ("e.delivery = 'pending' AND e.next_delivery_at <= ? "
        "AND (e.delivery_lease_until IS NULL OR e.delivery_lease_until < ?) "
        "AND NOT EXISTS (SELECT 1 FROM events p WHERE p.job_id = e.job_id AND p.delivery = 'pending' "
        "AND p.id < e.id AND COALESCE(p.webhook_url, '') = COALESCE(e.webhook_url, ''))")
# The delivery's row while the relay that recorded its result still holds its lease (parameters: id, lease end).
_LEASED = "id = ? AND delivery_lease_until = ? AND delivery = 'pending'"


def _narrowed(tenant: str, filters: Sequence[tuple[str, str | None]],
              after: int | None = None) -> tuple[list[str], list[Any]]:
    """WHERE clauses (and their parameters) for the rows of ``tenant``'s runs matching the given ``filters``
    (with ids after ``after``, when given)."""
    clauses, params = _given([*((f"{column} = ?", value) for column, value in filters), ("id > ?", after)])
    return ["run_id IN (SELECT job_id FROM jobs WHERE tenant = ?)", *clauses], [tenant, *params]


def _given(conditions: Sequence[tuple[str, Any]]) -> tuple[list[str], list[Any]]:
    """The conditions (``"column = ?"``, value) whose value is given (not None), and their parameters."""
    used = [(sql, value) for sql, value in conditions if value is not None]
    return [sql for sql, _ in used], [value for _, value in used]


def _token(row: tuple[Any, ...]) -> TokenRow:
    return TokenRow(str(row[0]), str(row[1]), bool(row[2]), row[3], float(row[4]), row[5])
