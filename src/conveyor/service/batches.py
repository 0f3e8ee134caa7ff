"""Batches: a JSONL manifest submitted through the API, as one run whose items are the manifest's lines.

A batch is accepted in one transaction (its Idempotency-Key, its run, its job row of kind 'batch' and a
``batch.accepted`` event) once its manifest is kept in the blob store and checked whole, so a bad line leaves
nothing behind. The run is made ``abandoned`` (nothing read yet): its items are then read by
service/submit.py's ``submit``, which takes the run over as it takes over any unfinished submission. A server
killed while reading thus leaves a run that any server (the same one, restarted) finishes from the stored
manifest without duplicating an item. ``BatchKeeper`` does that, beside the app, and ends each batch whose
run has no open task: ``batch.finished`` with the outcome counts, in the transaction that records its end.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import BlobUnavailable, Conflict, NotFound, UserError
from conveyor.pipeline import Pipeline
from conveyor.pipeline import params as params_rule
from conveyor.runtime.heartbeat import stopped, submitter_id
from conveyor.runtime.target import absolute_target
from conveyor.runtime.transitions.events import event
from conveyor.service.inputs import SourceItem, check_manifest, manifest_items
from conveyor.service.jobs import JobRequest, check_request, earlier_job, request_hash, take_key
from conveyor.service.report import REFUSED, status_report
from conveyor.service.submit import SubmitOptions, Submitted, recorded_params, run_params, stages_json, submit
from conveyor.service.tenancy import TenantView, owned_key
from conveyor.service.tokens import webhook_secret
from conveyor.store import UNFINISHED_RUNS, RunRecord, SqlStore, open_store
from conveyor.store.jobs import JobRow

log = logging.getLogger("conveyor.api")

MANIFEST_INPUT = "api-manifest:"  # a batch run's input: this and its manifest's digest (never a path to read)
WAITING_NOTE = "accepted; its items are being read from the manifest"
MADE = ("published", "completed", "accepted")


@dataclass(frozen=True)
class BatchRequest:
    """What a client asks for besides its manifest."""

    pipeline: str
    lane: str = "bulk"
    webhook_url: str | None = None
    idempotency_key: str | None = None

    def as_job(self) -> JobRequest:
        return JobRequest(self.pipeline, self.lane, None, self.webhook_url, None, self.idempotency_key)


@dataclass(frozen=True)
class BatchCreated:
    batch_id: str
    created: bool  # False: an earlier request with the same Idempotency-Key made this batch
    items: int


def new_batch_id(now: float) -> str:
    return time.strftime("b%Y%m%d-%H%M%S-", time.gmtime(now)) + secrets.token_hex(8)


def create_batch(view: TenantView, blobs: Blobs, pipeline: Pipeline, target: str, digest: str,
                 request: BatchRequest, now: float | None = None) -> BatchCreated:
    """Record a batch of the caller's tenant for the manifest kept in ``blobs`` as ``digest``, checked whole
    first (InputError naming the line); its items are read afterwards (``ingest``), under the tenant's keys.
    An Idempotency-Key works as for jobs: the same request returns the batch the first one made (``created``
    False), another body is a Conflict."""
    wanted = request.as_job()
    check_request(wanted)
    store, tenant = view.store, view.tenant
    now = store.clock() if now is None else now
    fingerprint = request_hash("batch", wanted, digest)
    earlier = earlier_job(view, wanted, fingerprint, now)
    if earlier is not None:
        return _earlier(store, earlier)
    with manifest_file(blobs, digest) as path:
        count = check_manifest(path)
    if request.webhook_url is not None:
        webhook_secret(store, tenant)  # a tenant made without a token (--no-auth's) gets its signing secret now
    batch_id = new_batch_id(now)
    job = JobRow(batch_id, tenant, "batch", None, pipeline.name, request.lane, request.webhook_url, None,
                 fingerprint, request.idempotency_key, now)
    values = run_params(pipeline)  # the server's: a request sets none
    run = RunRecord(batch_id, pipeline.name, absolute_target(target), MANIFEST_INPUT + digest, "abandoned", count,
                    pipeline.has_publish, stages_json(pipeline, values), now, None, None, request.lane,
                    submitter_id(), now, WAITING_NOTE, budget_usd=pipeline.budget_usd,
                    params=params_rule.encode(values) if values else None)
    with store.transaction():
        if not take_key(view, request.idempotency_key, fingerprint, batch_id, now):
            taken = earlier_job(view, wanted, fingerprint, now)
            if taken is None:  # taken and expired in between: vanishingly rare; the client may retry
                raise Conflict("Idempotency-Key was being used by another request; retry")
            return _earlier(store, taken)
        store.create_run(run)
        store.insert_job(job)
        store.insert_events([event(job, "batch.accepted", now, batch_id=batch_id, pipeline=pipeline.name,
                                   items=count, lane=request.lane)])
    return BatchCreated(batch_id, True, count)


def _earlier(store: SqlStore, batch_id: str) -> BatchCreated:
    run = store.get_run(batch_id)
    return BatchCreated(batch_id, False, run.expected if run is not None else 0)


@contextmanager
def manifest_file(blobs: Blobs, digest: str) -> Iterator[Path]:
    """The stored manifest as a file: the blob itself where the blob store keeps files, else a copy."""
    path_for = getattr(blobs, "path_for", None)
    if path_for is not None:
        yield Path(path_for(digest))
        return
    with tempfile.NamedTemporaryFile(prefix="conveyor-manifest-") as copy:
        copy.write(blobs.get(digest))
        copy.flush()
        yield Path(copy.name)


# --- reading a batch -----------------------------------------------------------------------------------------

def get_batch(view: TenantView, batch_id: str) -> JobRow:
    """The batch, if the caller may see it; NotFound otherwise, the same either way."""
    return view.job(batch_id, "batch")


def batch_view(view: TenantView, batch_id: str) -> dict[str, Any]:
    """What a client may learn of a batch: where it stands, and its items by outcome (as reconcile counts them)."""
    job = get_batch(view, batch_id)
    run = view.run(job)
    report = status_report(view.store, run)
    return {
        "batch_id": job.job_id, "job_id": job.job_id, "run_id": run.run_id, "pipeline": job.pipeline,
        "lane": job.lane, "status": batch_status(job, run), "expected": run.expected, "read": report["expected"],
        "outcomes": report["outcomes"], "unaccounted": run.expected - sum(report["outcomes"].values()),
        "outcome": job.outcome, "created_at": job.created_at, "submitted_at": run.submitted_at,
        "finished_at": job.finished_at, "webhook_url": job.webhook_url,
    }


def batch_status(job: JobRow, run: RunRecord) -> str:
    """submitting (its items are being read), running, or finished (no task of it is open)."""
    if job.finished_at is not None:
        return "finished"
    return "submitting" if run.status in UNFINISHED_RUNS else "running"


def batch_outcome(outcomes: Mapping[str, int]) -> str:
    """completed (no item refused), failed (no item made it) or partial (some of each)."""
    refused = sum(outcomes.get(name, 0) for name in REFUSED)
    if not refused:
        return "completed"
    return "partial" if any(outcomes.get(name) for name in MADE) else "failed"


# --- the keeper's work ---------------------------------------------------------------------------------------

def finish_batches(store: SqlStore, now: float | None = None, limit: int = 500) -> list[str]:
    """End every unfinished batch whose items are all read and none of whose tasks is open; their ids."""
    finished = []
    for job in store.unfinished_batches(limit):
        run = store.get_run(job.job_id)
        if run is None or run.status in UNFINISHED_RUNS or store.has_open_tasks(run.run_id):
            continue  # still being read, or work queued, running or awaiting review
        if finish_batch(store, job, run, store.clock() if now is None else now):
            finished.append(job.job_id)
    return finished


def finish_batch(store: SqlStore, job: JobRow, run: RunRecord, now: float) -> bool:
    """In one transaction: the batch's end and its ``batch.finished`` event (with the outcome counts), when no
    task of it is open; False when one is, or another keeper ended it first."""
    with store.transaction():
        store.lock_job(job.job_id)
        if store.open_job_tasks(job.job_id):
            return False
        outcomes = status_report(store, run)["outcomes"]
        outcome = batch_outcome(outcomes)
        if not store.finish_job(job.job_id, outcome, now):
            return False
        store.insert_events([event(job, "batch.finished", now, batch_id=job.job_id, outcome=outcome,
                                   outcomes=outcomes, expected=run.expected)])
    return True


def stalled_batches(store: SqlStore, now: float | None = None, limit: int = 500) -> list[JobRow]:
    """Unfinished batches whose reading stopped (its server was killed, or failed on the way): abandoned, or
    being read by a submitter that is gone or silent for ABANDON_AFTER_S. A batch just accepted counts once
    the process that accepted it is gone, or ABANDON_AFTER_S later."""
    now = store.clock() if now is None else now
    found = []
    for job in store.unfinished_batches(limit):
        run = store.get_run(job.job_id)
        if run is None or run.status not in UNFINISHED_RUNS:
            continue
        if stopped(run.submitter, run.heartbeat_at or run.created_at, now):
            found.append(job)
    return found


def ingest(store_url: str, blobs: Blobs, pipeline: Pipeline, batch_id: str,
           stop: threading.Event | None = None) -> Submitted | None:
    """Read the batch's manifest into its run, taking its submission over (service/submit.py); items read
    before are skipped. Runs with a store of its own; ``stop`` set: the reading stops, leaving the run
    abandoned, to be finished later. None when the run is read already."""
    store = open_store(store_url, migrate=False)
    try:
        run = store.get_run(batch_id)
        if run is None or not run.input.startswith(MANIFEST_INPUT):
            raise NotFound(f"no batch {batch_id!r}")
        if run.status not in UNFINISHED_RUNS:
            return None
        if run.stages != stages_json(pipeline, recorded_params(run)):
            raise _Unreadable(f"its pipeline {pipeline.name!r} changed since it was accepted (a stage, version, "
                              "config or its code); serve the pipeline it was accepted for to finish it")
        job = store.get_job(batch_id)
        with manifest_file(blobs, run.input.removeprefix(MANIFEST_INPUT)) as path:
            items = _until(_owned(manifest_items(path), job.tenant if job else None), stop)
            return submit(pipeline, run.target, run.input, store, blobs, items=items, lane=run.lane,
                          options=SubmitOptions(resume=batch_id))
    finally:
        store.close()


def _owned(items: Iterator[SourceItem], tenant: str | None) -> Iterator[SourceItem]:
    """A tenant's manifest items under the tenant's own keys (service/tenancy.py)."""
    for item in items:
        yield item if tenant is None else item._replace(key=owned_key(tenant, item.key))


class _Unreadable(UserError):
    """This server cannot read the batch: the pipeline it serves is not the one the batch was accepted for."""


class _Stopped(Exception):
    """The server is stopping: the batch's reading stops, to be taken up again."""


def _until(items: Iterator[SourceItem], stop: threading.Event | None) -> Iterator[SourceItem]:
    for item in items:
        if stop is not None and stop.is_set():
            raise _Stopped("the server is stopping")
        yield item


class BatchKeeper:
    """Beside the app (``start``/``stop``): reads accepted batches in threads of their own (``ingest``), takes
    over batches whose reading stopped, and ends finished ones, every ``interval`` seconds. Several servers
    may keep one store: taking a submission over and ending a batch are each decided by one row."""

    def __init__(self, store_url: str, blobs: Blobs, pipelines: Mapping[str, tuple[Pipeline, str]],
                 interval: float = 1.0) -> None:
        self.store_url, self.blobs, self.pipelines, self.interval = store_url, blobs, pipelines, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reading: dict[str, threading.Thread] = {}
        self._refused: set[str] = set()  # batches this server cannot read (their pipeline changed): said once

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="conveyor-batches", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            reading = list(self._reading.values())
        for thread in reading:
            thread.join(timeout=10)

    def ingest(self, batch_id: str, pipeline: str) -> bool:
        """Read the batch in a thread of its own, unless this server reads it already or does not serve its
        pipeline."""
        served = self.pipelines.get(pipeline)
        with self._lock:
            if served is None or batch_id in self._reading or batch_id in self._refused or self._stop.is_set():
                return False
            thread = threading.Thread(target=self._read, args=(batch_id, served[0]), daemon=True,
                                      name=f"conveyor-batch-{batch_id}")
            self._reading[batch_id] = thread
        thread.start()
        return True

    def _read(self, batch_id: str, pipeline: Pipeline) -> None:
        try:
            ingest(self.store_url, self.blobs, pipeline, batch_id, self._stop)
        except _Stopped:
            pass
        except _Unreadable as exc:
            self._refused.add(batch_id)
            log.warning("batch %s cannot be read by this server: %s", batch_id, exc,
                        extra={"event": "batch_refused", "run": batch_id})
        except BlobUnavailable as exc:  # the object store is away for now: a later round takes the batch up again
            log.warning("reading batch %s stopped: %s; it is taken up again", batch_id, exc,
                        extra={"event": "batch_read_failed", "run": batch_id})
        except UserError as exc:  # another server took it over first
            log.info("batch %s: %s", batch_id, exc, extra={"event": "batch_taken", "run": batch_id})
        except Exception:
            log.warning("reading batch %s stopped; it is taken up again", batch_id, exc_info=True,
                        extra={"event": "batch_read_failed", "run": batch_id})
        finally:
            with self._lock:
                self._reading.pop(batch_id, None)

    def _run(self) -> None:
        store: SqlStore | None = None
        while not self._stop.wait(self.interval):
            try:
                store = store or open_store(self.store_url, migrate=False)
                self.tick(store)
            except Exception:  # the store may be down for a while; the next tick tries again
                log.warning("the batch keeper's round failed", exc_info=True, extra={"event": "batch_keeper_failed"})
                if store is not None:
                    store.close()
                store = None
        if store is not None:
            store.close()

    def tick(self, store: SqlStore) -> None:
        """One round: end finished batches, take up stalled ones."""
        for batch_id in finish_batches(store):
            log.info("batch %s finished", batch_id, extra={"event": "batch_finished", "run": batch_id})
        for job in stalled_batches(store):
            if self.ingest(job.job_id, job.pipeline):
                log.info("taking up batch %s, whose reading stopped", job.job_id,
                         extra={"event": "batch_resumed", "run": job.job_id})


__all__ = ["BatchCreated", "BatchKeeper", "BatchRequest", "batch_view", "create_batch",
           "finish_batches", "get_batch", "ingest", "stalled_batches"]
