"""A job's events have no gaps and keep their order: a reader that follows a job by event id (Server-Sent
Events, ``Last-Event-ID``) never passes an event that commits later; the relay delivers a job's events to
its webhook one after the other, and a relay whose lease passed to another records nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.api.relay import Relay
from conveyor.api.settings import ApiSettings
from conveyor.service import jobs as job_service
from conveyor.service.tenancy import TenantView
from conveyor.service.tokens import Caller, revoke_token
from conveyor.service.webhooks import parse_policy, record
from conveyor.store import SqlStore, open_store
from conveyor.store.jobs import JobRow, NewEvent
from tests.apiserver import SMALL_PIPELINE, Server, make_token, served
from tests.helpers import query, write_pipeline
from tests.test_api_webhooks import QUICK, Receiver, wait_until


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
        first = job_service.job_events(_operator(reader), "j1")  # B's event, or nothing: never A's gap behind it
        seen += [e["data"]["n"] for e in first]
    b.join(30)
    assert not b.is_alive()
    last_event_id = first[-1]["id"] if first else 0
    rest = job_service.job_events(_operator(reader), "j1", after=last_event_id)  # resumed as Last-Event-ID does
    seen += [e["data"]["n"] for e in rest]
    assert seen == [1, 2]  # both, in the order they committed


def _operator(store: SqlStore) -> TenantView:
    return TenantView(store, Caller("ops", operator=True))


def _write(store: SqlStore, e: NewEvent) -> None:
    with store.transaction():
        store.insert_events([e])


# --- webhooks: fenced by the relay's lease, in order per job ------------------------------------------------

def pending(store: SqlStore, job_id: str, count: int, url: str = "http://127.0.0.1:9/hook") -> list[int]:
    """``count`` events of a job with a webhook, due now; their ids."""
    if store.get_job(job_id) is None:
        add_job(store, job_id, url)
    now = store.clock()
    store.insert_events([new_event(job_id, n, now, pending=True) for n in range(count)])
    return [e.id for e in store.events_after(job_id, 0, 1000)][-count:]


def test_a_relay_whose_lease_passed_to_another_records_nothing(store_url: str, stores: list[SqlStore]) -> None:
    make_token(store_url, "acme")
    store = stores[0]
    [event_id] = pending(store, "j1", 1)
    now = store.clock()
    mine = store.lease_deliveries(now, 1.0, 10)  # relay A, then A stalls past its lease ...
    theirs = store.lease_deliveries(now + 2, 60.0, 10)  # ... and relay B takes the delivery over
    assert [d.id for d in mine] == [d.id for d in theirs] == [event_id]
    assert record(store, mine[0], "the receiver answered HTTP 500", QUICK, now + 3) == "lost"
    assert record(store, mine[0], None, QUICK, now + 3) == "lost"
    assert store.lease_deliveries(now + 4, 60.0, 10) == []  # still B's: A cleared no lease, scheduled no retry
    assert record(store, theirs[0], None, QUICK, now + 5) == "delivered"
    assert query(store_url, "SELECT delivery, delivery_attempts, delivery_error FROM events WHERE id = ?",
                 event_id) == [("delivered", 1, None)]


def test_a_jobs_later_events_wait_while_an_earlier_one_is_pending(store_url: str, stores: list[SqlStore]) -> None:
    make_token(store_url, "acme")
    store = stores[0]
    first, second, third = pending(store, "j1", 3)
    [other] = pending(store, "j2", 1)
    now = store.clock()
    leased = {d.id: d for d in store.lease_deliveries(now, 60.0, 10)}
    assert sorted(leased) == [first, other]  # the first of each job: the next waits for it
    assert store.delivery_missed(first, leased[first].lease_until, "HTTP 500", now + 100)  # tried again later
    assert record(store, leased[other], None, QUICK, now) == "delivered"
    assert not store.delivery_due(now + 1)  # j1's later events are due, but its first is still pending
    assert store.lease_deliveries(now + 1, 60.0, 10) == []
    retried = store.lease_deliveries(now + 101, 60.0, 10)
    assert [d.id for d in retried] == [first]
    assert record(store, retried[0], None, QUICK, now + 101) == "delivered"
    then = store.lease_deliveries(now + 102, 60.0, 10)
    assert [d.id for d in then] == [second]
    store.delivery_missed(second, then[0].lease_until, "gone for a day", None)  # failed for good: stops no other
    assert [d.id for d in store.lease_deliveries(now + 103, 60.0, 10)] == [third]


def test_the_relay_delivers_a_jobs_events_in_order_when_the_first_is_retried(tmp_path: Path,
                                                                             store_url: str,
                                                                             stores: list[SqlStore]) -> None:
    make_token(store_url, "acme")
    first: list[str] = []

    def answer(msg_id: str, nth: int) -> tuple[int, dict[str, str]]:
        return (500, {}) if msg_id in first and nth <= 2 else (200, {})  # the first event fails twice

    with Receiver(answer) as receiver:
        ids = [f"evt_{i}" for i in pending(stores[0], "j1", 3, receiver.url)]
        [other] = [f"evt_{i}" for i in pending(stores[0], "j2", 1, receiver.url)]
        first.append(ids[0])
        relay = Relay(ApiSettings(store_url, str(tmp_path / "blobs"), webhook_policy=parse_policy(["127.0.0.1"])),
                      QUICK, poll_s=0.05)
        relay.start()
        try:
            wait_until(lambda: len(receiver.calls) >= 6)
        finally:
            relay.stop()
    assert [i for i in receiver.ids() if i != other] == [ids[0], ids[0], ids[0], ids[1], ids[2]]  # none overtook
    assert receiver.ids().count(other) == 1


# --- Server-Sent Events: a revoked token ends the stream; a cursor out of range is a 422 ----------------------

@pytest.fixture
def server(tmp_path: Path, store_url: str) -> Iterator[Server]:
    """A server with no worker: a job it accepts stays queued, so its event stream stays open."""
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, store_url, target, workers=0, env={"CONVEYOR_SSE_KEEPALIVE_S": "0.3"}) as s:
        yield s


def test_an_event_stream_ends_when_its_token_is_revoked(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        job = c.post("/v1/jobs", json={"text": "waits"}).json()["job_id"]
        with c.stream("GET", f"/v1/jobs/{job}/events") as response:
            lines = response.iter_lines()
            assert "event: job.accepted" in _until(lines, "event: job.accepted")
            store = open_store(server.store_url)
            try:
                revoke_token(store, token)
            finally:
                store.close()
            deadline = time.monotonic() + 30  # keep-alives come every 0.3 s while the stream is open
            for _ in lines:
                if time.monotonic() > deadline:
                    break
            ended = time.monotonic() <= deadline
        again = c.get(f"/v1/jobs/{job}/events")
    assert ended  # the server closed the stream
    assert again.status_code == 403  # and the client's reconnection is refused


def _until(lines: Iterator[str], wanted: str) -> list[str]:
    seen: list[str] = []
    for line in lines:
        seen.append(line)
        if line == wanted:
            break
    return seen


BAD_CURSORS: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({"after": "-1"}, {}), ({"after": str(2**63)}, {}), ({"after": "99999999999999999999"}, {}),
    ({"after": "1e3"}, {}), ({}, {"Last-Event-ID": "99999999999999999999"}), ({}, {"Last-Event-ID": "-1"}),
    ({}, {"Last-Event-ID": str(2**63)}), ({}, {"Last-Event-ID": b"\xb2"}), ({}, {"Last-Event-ID": "12abc"})]


def test_an_event_cursor_out_of_range_is_a_422_before_the_stream_starts(server: Server) -> None:
    with server.client(server.token()) as c:
        job = c.post("/v1/jobs", json={"text": "waits"}).json()["job_id"]
        answers = [c.get(f"/v1/jobs/{job}/events", params=params, headers=headers) for params, headers in BAD_CURSORS]
        with c.stream("GET", f"/v1/jobs/{job}/events", params={"after": str(2**63 - 1)}) as largest:
            first = next(largest.iter_lines())
    assert [a.status_code for a in answers] == [422] * len(BAD_CURSORS), [a.text for a in answers]
    assert {a.headers["content-type"] for a in answers} == {"application/problem+json"}
    assert largest.status_code == 200 and first == "retry: 2000"  # the largest id is a cursor like any other
