"""A job's events have no gaps and keep their order: a reader that follows a job by event id (Server-Sent
Events, ``Last-Event-ID``) never passes an event that commits later; the relay delivers a job's events to
its webhook one after the other, and a relay whose lease passed to another records nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from conveyor.service import jobs as job_service
from conveyor.store import SqlStore, open_store
from conveyor.store.jobs import JobRow, NewEvent
from tests.helpers import query


@pytest.fixture
def stores(store_url: str) -> Iterator[list[SqlStore]]:
    """Three connections to one store: two writers and a reader."""
    opened = [open_store(store_url) for _ in range(3)]
    try:
        yield opened
    finally:
        for store in opened:
            store.close()


def add_job(store: SqlStore, job_id: str, webhook_url: str | None = None, tenant: str = "acme") -> None:
    store.insert_job(JobRow(job_id, tenant, "job", "k", "api", "interactive", webhook_url, None, "h", None,
                            store.clock()))


def new_event(job_id: str, n: int, at: float, pending: bool = False) -> NewEvent:
    return NewEvent(job_id, "job.stage_done", json.dumps({"job_id": job_id, "n": n}), at,
                    "pending" if pending else None, at if pending else None)


def blocked_or_done(writer: threading.Thread, store_url: str) -> None:
    """Wait until ``writer`` has finished or waits for a lock another transaction holds. On SQLite the
    second writer waits at BEGIN for the first one's commit, whatever the code does: a moment is given."""
    if not store_url.startswith("postgresql"):
        writer.join(0.3)
        return
    deadline = time.monotonic() + 30
    while writer.is_alive() and time.monotonic() < deadline:
        if query(store_url, "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")[0][0]:
            return
        time.sleep(0.01)


def test_a_reader_following_a_job_by_id_sees_an_event_that_commits_late(stores: list[SqlStore],
                                                                        store_url: str) -> None:
    writer_a, writer_b, reader = stores
    add_job(writer_a, "j1")
    now = writer_a.clock()
    seen: list[int] = []
    b = threading.Thread(target=lambda: _write(writer_b, new_event("j1", 2, now)))
    with writer_a.transaction():
        writer_a.insert_events([new_event("j1", 1, now)])  # A writes first and has not committed
        b.start()  # B writes the same job's next event and commits (or waits for A)
        blocked_or_done(b, store_url)
        first = job_service.job_events(reader, None, "j1")  # B's event, or nothing: never A's gap behind it
        seen += [e["data"]["n"] for e in first]
    b.join(30)
    assert not b.is_alive()
    last_event_id = first[-1]["id"] if first else 0
    rest = job_service.job_events(reader, None, "j1", after=last_event_id)  # resumed as Last-Event-ID does
    seen += [e["data"]["n"] for e in rest]
    assert seen == [1, 2]  # both, in the order they committed


def _write(store: SqlStore, e: NewEvent) -> None:
    with store.transaction():
        store.insert_events([e])
