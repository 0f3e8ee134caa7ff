"""Webhooks: a real `conveyor serve` delivers each job event, signed, to a receiver the test runs on
127.0.0.1; retries with backoff, fails for good past the deadline, follows no redirect; and the sending
half of service/webhooks.py checked directly (pinned addresses, DNS rebinding, the schedule)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from standardwebhooks import Webhook

from conveyor.api.relay import Relay
from conveyor.api.settings import ApiSettings
from conveyor.service.jobs import IDEMPOTENCY_TTL_S
from conveyor.service.webhooks import (
    RelaySettings,
    WebhookPolicy,
    check_webhook_url,
    parse_policy,
    payload,
    retry_at,
    send,
    signed_headers,
    targets,
    webhook_client,
)
from conveyor.store import open_store
from conveyor.store.jobs import Delivery, JobRow, NewEvent
from tests.apiserver import SMALL_PIPELINE, Server, make_token, served
from tests.conftest import drop_later, fresh_pg_url
from tests.helpers import query, write_pipeline

FINAL = ("published", "completed", "failed", "dead_lettered", "rejected")
JOB_EVENTS = ["job.accepted", "job.stage_done", "job.stage_done", "job.completed"]
# Test-only: a schedule of tenths of a second and a deadline of seconds instead of a day.
SHORT = {"CONVEYOR_WEBHOOK_RETRY_BASE_S": "0.05", "CONVEYOR_WEBHOOK_RETRY_CAP_S": "0.2",
         "CONVEYOR_WEBHOOK_DEADLINE_S": "2.5", "CONVEYOR_WEBHOOK_TIMEOUT_S": "5", "CONVEYOR_WEBHOOK_POLL_S": "0.1"}
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # a fixed secret for the checks without a store


class Call(NamedTuple):
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


Answer = Callable[[str, int], tuple[int, dict[str, str]]]  # (webhook-id, its nth arrival) -> status, headers


class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST as ``answer`` says and keeps what arrived."""

    def __init__(self, answer: Answer = lambda msg_id, nth: (200, {}), tls: ssl.SSLContext | None = None) -> None:
        self.calls: list[Call] = []
        lock = threading.Lock()
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    nth = sum(1 for c in calls if c.headers.get("webhook-id") == headers.get("webhook-id")) + 1
                    status, extra = answer(headers.get("webhook-id", ""), nth)
                    calls.append(Call(self.path, headers, body, status))
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def ids(self) -> list[str]:
        return [c.headers["webhook-id"] for c in self.calls]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def relay(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server per backend for the delivery tests (each test has its own tenant and receivers), allowed to
    send webhooks to 127.0.0.1, with the short schedule."""
    tmp_path = tmp_path_factory.mktemp("relay")
    url = f"sqlite:///{tmp_path}/conveyor.db" if request.param == "sqlite" else fresh_pg_url()
    try:
        target = write_pipeline(tmp_path, SMALL_PIPELINE)
        with served(tmp_path, url, target, "--allow-webhook", "127.0.0.1", env=SHORT) as server:
            yield server
    finally:
        if request.param == "postgres":
            drop_later(url)


def tenant(server: Server, name: str, operator: bool = False) -> dict[str, Any]:
    """A token (and the webhook secret) of a tenant of its own for one test."""
    return make_token(server.store_url, f"{name}-{time.monotonic_ns()}", operator)


def submit(server: Server, token: str, text: str, webhook_url: str) -> str:
    with server.client(token) as c:
        answer = c.post("/v1/jobs", json={"text": text, "webhook_url": webhook_url})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job_id"]
    return job_id


def deliveries(server: Server, token: str, **params: Any) -> list[dict[str, Any]]:
    with server.client(token) as c:
        answer = c.get("/v1/webhooks/deliveries", params=params)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["deliveries"]
    return found


def wait_until(check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def settled(server: Server, token: str, job_id: str, count: int, state: str) -> list[dict[str, Any]]:
    """The job's ``count`` deliveries once all are in ``state`` (what there is after a timeout)."""
    def check() -> list[dict[str, Any]] | None:
        found = [d for d in deliveries(server, token) if d["job_id"] == job_id]
        return found if len(found) == count and all(d["state"] == state for d in found) else None
    return wait_until(check) or [d for d in deliveries(server, token) if d["job_id"] == job_id]


def test_every_event_of_a_job_reaches_its_webhook_signed(relay: Server) -> None:
    made = tenant(relay, "signed")
    with Receiver() as receiver:
        job_id = submit(relay, made["token"], "hello webhooks", receiver.url)
        assert relay.wait_for(made["token"], job_id, FINAL)["outcome"] == "completed"
        shown = settled(relay, made["token"], job_id, len(JOB_EVENTS), "delivered")
    signer = Webhook(made["webhook_secret"])
    bodies = [signer.verify(c.body, c.headers) for c in receiver.calls]
    assert sorted(b["type"] for b in bodies) == sorted(JOB_EVENTS)
    assert {b["data"]["job_id"] for b in bodies} == {job_id}
    assert [c.headers["webhook-id"] for c in receiver.calls] == [f"evt_{b['data']['event_id']}" for b in bodies]
    assert len(set(receiver.ids())) == len(JOB_EVENTS)  # one id per event
    assert sorted(b["data"]["stage"] for b in bodies if b["type"] == "job.stage_done") == ["parse", "shout"]
    assert {(d["state"], d["attempts"], d["error"], d["url"]) for d in shown} == {
        ("delivered", 1, None, receiver.url)}
    assert all(d["delivered_at"] >= d["created_at"] for d in shown)


def test_a_receiver_that_fails_twice_gets_the_same_event_again_until_it_takes_it(relay: Server) -> None:
    made = tenant(relay, "flaky")
    with Receiver(lambda msg_id, nth: (500 if nth <= 2 else 200, {})) as receiver:
        job_id = submit(relay, made["token"], "flaky receiver", receiver.url)
        shown = settled(relay, made["token"], job_id, len(JOB_EVENTS), "delivered")
    assert {(d["state"], d["attempts"]) for d in shown} == {("delivered", 3)}
    signer = Webhook(made["webhook_secret"])
    for msg_id in set(receiver.ids()):
        tries = [c for c in receiver.calls if c.headers["webhook-id"] == msg_id]
        assert [c.status for c in tries] == [500, 500, 200]
        assert len({c.body for c in tries}) == 1  # the same event, resent: only the signature's time moves
        assert all(signer.verify(c.body, c.headers) for c in tries)


def test_a_delivery_never_taken_fails_at_its_deadline_and_stays_visible(relay: Server) -> None:
    server = relay
    made, other = tenant(server, "deaf"), tenant(server, "other")["token"]
    operator = tenant(server, "ops", operator=True)["token"]
    with Receiver(lambda msg_id, nth: (503, {})) as receiver:
        job_id = submit(server, made["token"], "nobody listens", receiver.url)
        shown = settled(server, made["token"], job_id, len(JOB_EVENTS), "failed")
        failed = deliveries(server, made["token"], state="failed")
        assert deliveries(server, made["token"], state="delivered") == []
        assert deliveries(server, other, state="failed") == []  # another tenant sees none of them
        assert {d["event_id"] for d in failed} <= {d["event_id"] for d in deliveries(server, operator, state="failed")}
        with server.client(made["token"]) as c:
            wrong = c.get("/v1/webhooks/deliveries", params={"state": "lost"})
    assert {d["state"] for d in shown} == {"failed"}
    assert sorted(d["event_id"] for d in failed) == sorted(d["event_id"] for d in shown)
    assert all("HTTP 503" in d["error"] and d["delivered_at"] is None for d in failed)
    # The job's first event is tried until its deadline; the later ones wait for it (a job's events arrive in
    # order), then are tried until theirs, at least once.
    assert [d["attempts"] >= (2 if n == 0 else 1) for n, d in enumerate(sorted(failed, key=lambda d: d["event_id"]))
            ] == [True] * len(failed)
    assert len(receiver.calls) == sum(d["attempts"] for d in failed)
    assert wrong.status_code == 422 and wrong.headers["content-type"].startswith("application/problem+json")


def test_a_redirect_is_not_followed(relay: Server) -> None:
    made = tenant(relay, "moved")
    with Receiver() as elsewhere, Receiver(lambda msg_id, nth: (302, {"location": elsewhere.url})) as receiver:
        job_id = submit(relay, made["token"], "moved", receiver.url)
        shown = settled(relay, made["token"], job_id, len(JOB_EVENTS), "failed")
    assert elsewhere.calls == []
    assert receiver.calls and {c.status for c in receiver.calls} == {302}
    assert {d["state"] for d in shown} == {"failed"}
    assert all("redirect" in d["error"] for d in shown)


REFUSED = ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://[::1]/",
           "http://[::ffff:127.0.0.1]/", "ftp://127.0.0.1/", "http://user:secret@127.0.0.1/"]


def test_a_webhook_to_a_private_address_is_refused_at_submission(tmp_path: Path, store_url: str) -> None:
    made = make_token(store_url, "acme")
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, store_url, target, workers=0) as server, server.client(made["token"]) as c:
        answers = [c.post("/v1/jobs", json={"text": "x", "webhook_url": url}) for url in REFUSED]
        listed = c.get("/v1/jobs").json()["jobs"]
    assert [a.status_code for a in answers] == [422] * len(REFUSED)
    assert {a.headers["content-type"].split(";")[0] for a in answers} == {"application/problem+json"}
    assert {a.json()["code"] for a in answers} == {"webhook_refused"}
    assert listed == []  # nothing was recorded


# --- sending, without a server: pinned addresses, rebinding, the schedule --------------------------------------

def delivery(url: str, attempts: int = 0, created_at: float = 1000.0) -> Delivery:
    return Delivery(7, "j1", "job.completed", json.dumps({"job_id": "j1", "outcome": "completed"}), created_at,
                    attempts, url, "acme", SECRET)


def resolver_of(answers: Sequence[Sequence[str]]) -> Callable[[str, int], Sequence[str]]:
    """A resolver that gives each of ``answers`` in turn (then the last again): DNS that changes its mind."""
    given = list(answers)

    def resolve(host: str, port: int) -> Sequence[str]:
        return given.pop(0) if len(given) > 1 else given[0]
    return resolve


def send_once(d: Delivery, policy: WebhookPolicy, resolver: Callable[[str, int], Sequence[str]]) -> str | None:
    settings = RelaySettings(timeout_s=5, resolver=resolver)

    async def go() -> str | None:
        async with webhook_client(settings) as client:
            return await send(client, d, policy, settings)
    return asyncio.run(go())


def test_a_delivery_connects_to_the_checked_address_and_keeps_the_host_name() -> None:
    with Receiver() as receiver:
        url = f"http://hooks.example:{receiver.port}/in"
        error = send_once(delivery(url), WebhookPolicy(("127.0.0.1/32",)), resolver_of([["127.0.0.1"]]))
    assert error is None
    [call] = receiver.calls
    assert call.path == "/in" and call.headers["host"] == f"hooks.example:{receiver.port}"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert body["type"] == "job.completed" and body["data"] == {"job_id": "j1", "outcome": "completed", "event_id": 7}
    assert call.headers["webhook-id"] == "evt_7"


def test_a_name_that_rebinds_to_a_private_address_at_send_time_is_not_reached() -> None:
    with Receiver() as receiver:
        url = f"http://hooks.example:{receiver.port}/in"
        rebinding = resolver_of([["93.184.216.34"], ["127.0.0.1"]])
        assert check_webhook_url(url, WebhookPolicy(), rebinding) == url  # public when the job was submitted
        error = send_once(delivery(url), WebhookPolicy(), rebinding)
        mixed = send_once(delivery(url), WebhookPolicy(), resolver_of([["93.184.216.34", "127.0.0.1"]]))
    assert error is not None and "loopback" in error
    assert mixed is not None and "loopback" in mixed  # every address is checked, not only the first
    assert receiver.calls == []


def test_an_https_delivery_verifies_tls_against_the_host_name_while_connecting_to_the_address() -> None:
    [target] = targets("https://hooks.example/in?x=1", WebhookPolicy(), resolver_of([["93.184.216.34"]]))
    assert (str(target.url), target.host, target.sni) == ("https://93.184.216.34/in?x=1", "hooks.example",
                                                         "hooks.example")
    [v6] = targets("https://[2606:4700::1111]:8443/", WebhookPolicy())
    assert (str(v6.url), v6.host, v6.sni) == ("https://[2606:4700::1111]:8443/", "[2606:4700::1111]:8443", None)


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A TLS context serving a certificate for hooks.example, and a client context trusting its (test) CA."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-days", "1", *args], cwd=tmp_path, check=True, capture_output=True)
    run("-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=conveyor test CA")
    run("-keyout", "leaf.key", "-out", "leaf.pem", "-subj", "/CN=hooks.example", "-addext",
        "subjectAltName=DNS:hooks.example", "-CA", "ca.pem", "-CAkey", "ca.key")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "leaf.pem", tmp_path / "leaf.key")
    return server, ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))


def test_an_https_delivery_to_a_pinned_address_verifies_the_certificate_of_the_name(
        certificates: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    served_tls, trusting = certificates
    settings = RelaySettings(timeout_s=5, resolver=resolver_of([["127.0.0.1"]]))
    policy = WebhookPolicy(("127.0.0.1",))

    async def go(url: str) -> str | None:
        async with httpx.AsyncClient(verify=trusting, follow_redirects=False, trust_env=False) as client:
            return await send(client, delivery(url), policy, settings)
    with Receiver(tls=served_tls) as receiver:
        right = asyncio.run(go(f"https://hooks.example:{receiver.port}/in"))
        wrong = asyncio.run(go(f"https://elsewhere.example:{receiver.port}/in"))
    assert right is None
    assert [c.headers["host"] for c in receiver.calls] == [f"hooks.example:{receiver.port}"]
    assert wrong is not None and "certificate" in wrong.lower(), wrong


def test_a_signed_body_is_the_same_on_every_attempt() -> None:
    d = delivery("https://hooks.example/in")
    body = payload(d)
    first, later = signed_headers(d, body, time.time() - 60), signed_headers(d._replace(attempts=3), body, time.time())
    assert first["webhook-id"] == later["webhook-id"] == "evt_7"
    assert Webhook(SECRET).verify(body, first) == Webhook(SECRET).verify(payload(d._replace(attempts=3)), later)
    assert json.loads(body)["timestamp"] == "1970-01-01T00:16:40Z"


def test_retries_back_off_with_full_jitter_until_the_deadline() -> None:
    schedule = RelaySettings(base_s=2, cap_s=60, deadline_s=3600)
    ceilings = [retry_at(delivery("u", attempts=n), 2000.0, schedule, draw=lambda: 1.0) - 2000.0
                for n in range(8)]
    assert ceilings == [2, 4, 8, 16, 32, 60, 60, 60]
    assert retry_at(delivery("u", attempts=3), 2000.0, schedule, draw=lambda: 0.0) == 2000.0
    assert retry_at(delivery("u", attempts=500), 2000.0, schedule, draw=lambda: 1.0) == 2060.0
    near_end = 1000.0 + 3600 - 10
    assert retry_at(delivery("u", attempts=9), near_end, schedule, draw=lambda: 1.0) == 1000.0 + 3600
    assert retry_at(delivery("u", attempts=9), 1000.0 + 3600, schedule) is None


# --- relays sharing a store, in this process ---------------------------------------------------------------

QUICK = RelaySettings(base_s=0.05, cap_s=0.2, deadline_s=30, timeout_s=5)


def pending_events(store_url: str, url: str, count: int, tenant: str = "acme") -> None:
    """``count`` jobs of ``tenant`` with a webhook to ``url``, each with an event waiting for delivery (a job's
    own events go one after the other: tests/test_event_order.py)."""
    store = open_store(store_url)
    try:
        now = store.clock()
        for i in range(count):
            store.insert_job(JobRow(f"j-relay-{i}", tenant, "job", "k", "api", "interactive", url, None, "h", None,
                                    now))
        store.insert_events([NewEvent(f"j-relay-{i}", "job.stage_done", json.dumps({"n": i}), now, "pending", now)
                             for i in range(count)])
    finally:
        store.close()


def test_relays_sharing_a_store_deliver_each_event_once(tmp_path: Path, store_url: str) -> None:
    make_token(store_url, "acme")
    with Receiver() as receiver:
        pending_events(store_url, receiver.url, 40)
        relays = [Relay(ApiSettings(store_url, str(tmp_path / "blobs"), webhook_policy=parse_policy(["127.0.0.1"])),
                        QUICK, concurrency=4, poll_s=0.05) for _ in range(2)]
        for relay in relays:
            relay.start()
        try:
            wait_until(lambda: len(receiver.calls) >= 40 and query(
                store_url, "SELECT COUNT(*) FROM events WHERE delivery = 'delivered'") == [(40,)])
        finally:
            for relay in relays:
                relay.stop()
    assert sorted(receiver.ids()) == sorted(f"evt_{i}" for i in range(1, 41))  # every one, none twice


def test_a_delivery_leased_by_a_relay_that_died_is_sent_after_its_lease(tmp_path: Path, store_url: str) -> None:
    make_token(store_url, "acme")
    with Receiver() as receiver:
        pending_events(store_url, receiver.url, 3)
        store = open_store(store_url)
        try:
            assert len(store.lease_deliveries(store.clock(), 1.0, 10)) == 3  # ... and then it was killed
        finally:
            store.close()
        relay = Relay(ApiSettings(store_url, str(tmp_path / "blobs"), webhook_policy=parse_policy(["127.0.0.1"])),
                      QUICK, poll_s=0.05)
        relay.start()
        try:
            time.sleep(0.5)
            early = len(receiver.calls)
            wait_until(lambda: len(receiver.calls) >= 3)
        finally:
            relay.stop()
    assert early == 0  # held by the lease
    assert sorted(receiver.ids()) == ["evt_1", "evt_2", "evt_3"]


def test_without_auth_the_local_users_webhooks_are_signed_too(tmp_path: Path, store_url: str) -> None:
    with Receiver() as receiver:
        pending_events(store_url, receiver.url, 1, tenant="local")  # --no-auth: no token ever made a tenant
        relay = Relay(ApiSettings(store_url, str(tmp_path / "blobs"), auth=False,
                                  webhook_policy=parse_policy(["127.0.0.1"])), QUICK, poll_s=0.05)
        relay.start()
        try:
            wait_until(lambda: receiver.calls)
        finally:
            relay.stop()
    secret = make_token(store_url, "local")["webhook_secret"]  # how the local user learns it
    assert Webhook(secret).verify(receiver.calls[0].body, receiver.calls[0].headers)["data"]["n"] == 0


def test_the_relay_forgets_idempotency_keys_past_their_keeping_time(tmp_path: Path, store_url: str) -> None:
    store = open_store(store_url)
    try:
        now = store.clock()
        store.claim_idempotency_key("acme", "old", "h", "j1", now - IDEMPOTENCY_TTL_S - 60)
        store.claim_idempotency_key("acme", "new", "h", "j2", now - 60)
    finally:
        store.close()
    relay = Relay(ApiSettings(store_url, str(tmp_path / "blobs")), QUICK, poll_s=0.05)
    relay.start()
    try:
        kept = wait_until(lambda: query(store_url, "SELECT key FROM idempotency_keys") == [("new",)], timeout=10)
    finally:
        relay.stop()
    assert kept
