"""Alerts on rates (conveyor.Alerts): dead letters per hour over a threshold and reviews past their deadline fire
once per episode across evaluators racing on one store, and resolve once; each transition is logged at WARNING,
written to the outbox and delivered signed to the alert webhook, and shown by the metrics, `conveyor alerts` and
GET /v1/alerts. On both backends."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from conveyor import Alerts, Pipeline
from conveyor.blobs import FilesystemBlobs
from conveyor.errors import PipelineError
from conveyor.metrics import exposition, new_registry
from conveyor.metrics.collector import shared_store
from conveyor.pipeline import Retry
from conveyor.runtime.alerts import Transition, evaluate, operator_webhook_url
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service import review
from conveyor.service.alerts import alerts_secret, list_alerts
from conveyor.service.webhooks import RelaySettings, deliver, parse_policy, webhook_client
from conveyor.store import open_store
from tests.apiserver import make_token, served
from tests.helpers import cli, cli_json, query, submit_and_work, write_pipeline
from tests.test_api_webhooks import Receiver, wait_until
from tests.test_metrics import parse, value

PIPE = """
from conveyor import Alerts, Pipeline, Retry
from conveyor.acceptance import Accept, Review

pipe = Pipeline("watched", retry=Retry(max_attempts=1),
                alerts=Alerts(dead_letters_per_hour=3, review_overdue=True, webhook={webhook!r}))

@pipe.stage()
def parse(ctx, source: bytes) -> dict:
    text = source.decode()
    if text.startswith("poison"):
        raise ValueError("poison document")
    return {{"text": text}}

@pipe.stage(after=parse, accept=Accept(confidence="c", threshold=0.8, review=Review(deadline="1h")))
def judge(ctx, doc: dict) -> dict:
    return {{"c": 0.5 if "unsure" in doc["text"] else 0.9}}
"""

QUICK = RelaySettings(base_s=0.05, cap_s=0.2, deadline_s=30, timeout_s=5)
HOUR = 3600.0


def _run(tmp_path: Path, store_url: str, names: list[str], webhook: str | None = None) -> Pipeline:
    """Run ``names`` (documents) through the watched pipeline; return the pipeline."""
    target = write_pipeline(tmp_path, PIPE.format(webhook=webhook))
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.txt").write_text(f"{name} text")
    # A long lease: the worker's keeper (which evaluates alerts too) does not come round during the run, so the
    # tests decide when alerts are evaluated, and at what time.
    submit_and_work(target, folder, store_url, tmp_path / "blobs", lease_seconds=600)
    return load_target(target)


def _race(store_url: str, pipeline: Pipeline, now: float, evaluators: int = 2) -> list[Transition]:
    """``evaluators`` processes' worth of evaluation at once (each its own store), none skipping its turn."""
    stores = [open_store(store_url) for _ in range(evaluators)]
    start = threading.Barrier(evaluators)
    found: list[Transition] = []
    errors: list[BaseException] = []

    def one(store: Any) -> None:
        start.wait()
        try:
            found.extend(evaluate(store, pipeline, now, every=0, operator_webhook=""))
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for store in stores:
        store.close()
    assert errors == []
    return found


def _store_now(store_url: str) -> float:
    store = open_store(store_url)
    try:
        return store.clock()
    finally:
        store.close()


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "conveyor.alerts" and getattr(r, "event", None) == event]


def _scrape(store_url: str, pipeline: Pipeline) -> dict[str, float]:
    samples = parse(exposition(new_registry(shared_store(store_url), [pipeline])).decode())
    labels = {"pipeline": "watched", "alert": "dead_letters_per_hour"}
    return {"firing": value(samples, "conveyor_alert_firing", **labels),
            "total": value(samples, "conveyor_alerts_total", **labels),
            "overdue": value(samples, "conveyor_alert_firing", pipeline="watched", alert="review_overdue")}


def _delivered(store_url: str, at: float) -> list[str]:
    """Deliver the alert events due at ``at`` (the store clock the evaluations were told) the way the relay does
    (lease, send signed, record), allowed to reach 127.0.0.1; their states after it."""
    store = open_store(store_url)
    policy = parse_policy(["127.0.0.1"])

    async def go() -> list[str]:
        async with webhook_client(QUICK) as client:
            return [await deliver(store, client, d, policy, QUICK) for d in store.lease_deliveries(at, 60, 10)]

    try:
        return asyncio.run(go())
    finally:
        store.close()


def test_dead_letters_per_hour_fire_once_across_racing_evaluators_and_resolve_once(
        store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="conveyor.alerts")
    with Receiver() as receiver:
        pipeline = _run(tmp_path, store_url, ["ok1", "ok2", *(f"poison{i}" for i in range(4))], receiver.url)
        now = _store_now(store_url)
        fired = _race(store_url, pipeline, now)
        assert [(t.alert, t.firing, t.value, t.threshold) for t in fired] == [("dead_letters_per_hour", True, 4, 3)]
        assert _race(store_url, pipeline, now + 60) == []  # still firing: not raised again
        records = _logged(caplog, "alert_firing")
        assert len(records) == 1
        assert (records[0].levelno, records[0].alert, records[0].pipeline, records[0].value,
                records[0].threshold) == (logging.WARNING, "dead_letters_per_hour", "watched", 4, 3)
        rows = query(store_url, "SELECT type, delivery, webhook_url, tenant FROM events WHERE type LIKE 'alert.%'")
        assert rows == [("alert.firing", "pending", receiver.url, "_alerts")]
        assert _scrape(store_url, pipeline) == {"firing": 1, "total": 1, "overdue": 0}

        assert _delivered(store_url, now) == ["delivered"]
        store = open_store(store_url)
        try:
            secret = alerts_secret(store)
        finally:
            store.close()
        sent = Webhook(secret).verify(receiver.calls[0].body, receiver.calls[0].headers)
        assert sent["type"] == "alert.firing"
        assert {k: sent["data"][k] for k in ("alert", "pipeline", "value", "threshold", "since")} == {
            "alert": "dead_letters_per_hour", "pipeline": "watched", "value": 4, "threshold": 3, "since": now}
        assert "job_id" not in sent["data"]

        # An hour later the dead letters have aged out of the window: resolved, once.
        resolved = _race(store_url, pipeline, now + HOUR + 1)
        assert [(t.alert, t.firing, t.value, t.since) for t in resolved] == [("dead_letters_per_hour", False, 0, now)]
        assert _race(store_url, pipeline, now + HOUR + 60) == []
        assert len(_logged(caplog, "alert_resolved")) == 1
        assert _scrape(store_url, pipeline) == {"firing": 0, "total": 1, "overdue": 0}
        assert _delivered(store_url, now + HOUR + 1) == ["delivered"]
    assert [json.loads(c.body)["type"] for c in receiver.calls] == ["alert.firing", "alert.resolved"]
    assert json.loads(receiver.calls[1].body)["data"]["resolved_at"] == now + HOUR + 1


def test_under_the_threshold_nothing_fires(store_url: str, tmp_path: Path) -> None:
    pipeline = _run(tmp_path, store_url, ["ok1", "poison1", "poison2", "poison3"])
    assert _race(store_url, pipeline, _store_now(store_url)) == []  # 3 is not above 3
    assert query(store_url, "SELECT COUNT(*) FROM events WHERE type LIKE 'alert.%'") == [(0,)]
    alerts = list_alerts_of(store_url)
    assert [(a["alert"], a["state"], a["value"], a["threshold"], a["firings"]) for a in alerts] == [
        ("dead_letters_per_hour", "ok", 3, 3, 0), ("review_overdue", "ok", 0, 0, 0)]


def list_alerts_of(store_url: str) -> list[dict[str, Any]]:
    store = open_store(store_url)
    try:
        found: list[dict[str, Any]] = list_alerts(store)["alerts"]
        return found
    finally:
        store.close()


def test_a_review_past_its_deadline_fires_review_overdue_until_it_is_decided(
        store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="conveyor.alerts")
    pipeline = _run(tmp_path, store_url, ["ok1", "unsure1"])
    now = _store_now(store_url)
    assert _race(store_url, pipeline, now) == []  # waiting, within its deadline
    overdue = _race(store_url, pipeline, now + HOUR + 5)
    assert [(t.alert, t.firing, t.value) for t in overdue] == [("review_overdue", True, 1)]
    assert [r.pipeline for r in _logged(caplog, "alert_firing")] == ["watched"]
    assert query(store_url, "SELECT type, delivery FROM events WHERE job_id = 'alert:watched:review_overdue'") == [
        ("alert.firing", None)]  # no webhook declared: recorded, not sent
    store = open_store(store_url)
    try:
        entry = review.review_list(store)["reviews"][0]
        review.reject(store, [entry["id"]], "unreadable", now=now + HOUR + 10)
    finally:
        store.close()
    resolved = _race(store_url, pipeline, now + HOUR + 20)
    assert [(t.alert, t.firing, t.value) for t in resolved] == [("review_overdue", False, 0)]


def test_an_evaluation_made_a_moment_ago_is_not_made_again(store_url: str, tmp_path: Path) -> None:
    pipeline = _run(tmp_path, store_url, [f"poison{i}" for i in range(4)])
    now = _store_now(store_url)
    store = open_store(store_url)
    try:
        assert len(evaluate(store, pipeline, now, every=30, operator_webhook="")) == 1
        assert store.claim_alert_evaluation("watched", pipeline.alerts.thresholds(), now + 10, 30) is False
        assert store.claim_alert_evaluation("watched", pipeline.alerts.thresholds(), now + 31, 30) is True
    finally:
        store.close()


def test_conveyor_alerts_and_get_v1_alerts_list_the_states(store_url: str, tmp_path: Path) -> None:
    pipeline = _run(tmp_path, store_url, [f"poison{i}" for i in range(4)])
    now = _store_now(store_url)
    _race(store_url, pipeline, now)
    shown = cli_json("alerts", "--db", store_url, "--webhook-secret", cwd=tmp_path)
    assert [(a["alert"], a["state"], a["value"], a["since"], a["firings"]) for a in shown["alerts"]] == [
        ("dead_letters_per_hour", "firing", 4, now, 1), ("review_overdue", "ok", 0, shown["alerts"][1]["since"], 0)]
    assert shown["webhook_secret"].startswith("whsec_")
    target = str(tmp_path / "pipe.py") + ":pipe"
    with served(tmp_path, store_url, target, workers=0) as server:
        operator = make_token(store_url, "ops", operator=True)["token"]
        tenant = make_token(store_url, "acme")["token"]
        with server.client(operator) as client:
            answer = client.get("/v1/alerts", params={"pipeline": "watched"})
        with server.client(tenant) as client:
            refused = client.get("/v1/alerts")
    assert answer.status_code == 200
    assert {k: v for k, v in answer.json().items()} == {k: v for k, v in shown.items() if k == "alerts"}
    assert refused.status_code == 403


BAD: list[tuple[Callable[[], Any], str]] = [
    (lambda: Alerts(dead_letters_per_hour=-1), "whole number >= 0"),
    (lambda: Alerts(dead_letters_per_hour=2.5), "whole number >= 0"),
    (lambda: Alerts(dead_letters_per_hour=True), "whole number >= 0"),
    (lambda: Alerts(review_overdue="yes"), "True or False"),
    (lambda: Alerts(), "declares no alert"),
    (lambda: Alerts(review_overdue=False, webhook="https://ops.example/hook"), "declares no alert"),
    (lambda: Alerts(review_overdue=True, webhook="ftp://ops.example/hook"), "http:// or https://"),
    (lambda: Alerts(review_overdue=True, webhook="https://user:pw@ops.example/hook"), "user name or password"),
    (lambda: Alerts(review_overdue=True, webhook="https://ops.example:99999/"), "not a URL"),
    (lambda: Pipeline("p", alerts={"dead_letters_per_hour": 3}), "pass conveyor.Alerts"),
]


@pytest.mark.parametrize(("make", "says"), BAD)
def test_bad_declarations_are_one_line_errors(make: Callable[[], Any], says: str) -> None:
    with pytest.raises(PipelineError) as caught:
        make()
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_good_declaration_names_its_thresholds() -> None:
    alerts = Alerts(dead_letters_per_hour=0, review_overdue=True, webhook="https://ops.example/hook")
    assert alerts.thresholds() == {"dead_letters_per_hour": 0.0, "review_overdue": 0.0}
    assert Pipeline("p", retry=Retry(), alerts=alerts).alerts is alerts
    assert Pipeline("p").alerts is None


def test_a_worker_evaluates_its_pipelines_alerts_as_it_keeps_its_leases(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _run(tmp_path, store_url, [f"poison{i}" for i in range(4)])
    monkeypatch.setenv("CONVEYOR_ALERT_EVERY_S", "0.1")
    worker = Worker(pipeline, str(tmp_path / "pipe.py") + ":pipe", store_url, FilesystemBlobs(tmp_path / "blobs"),
                    WorkerOptions(lease_seconds=0.6, poll_interval=0.05))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: [a["state"] for a in list_alerts_of(store_url)] == ["firing", "ok"], timeout=30)
    finally:
        worker.request_stop()
        thread.join(30)
    assert worker.stats["alerts_fired"] == 1
    assert query(store_url, "SELECT type FROM events WHERE job_id = 'alert:watched:dead_letters_per_hour'") == [
        ("alert.firing",)]


def test_conveyor_serve_evaluates_alerts_and_its_relay_delivers_them_signed(store_url: str, tmp_path: Path) -> None:
    with Receiver() as receiver:
        _run(tmp_path, store_url, [f"poison{i}" for i in range(4)], receiver.url)
        env = {"CONVEYOR_ALERT_EVERY_S": "0.2", "CONVEYOR_WEBHOOK_POLL_S": "0.1"}
        with served(tmp_path, store_url, str(tmp_path / "pipe.py") + ":pipe", "--allow-webhook", "127.0.0.1",
                    workers=0, env=env):
            wait_until(lambda: receiver.calls, timeout=30)
        shown = cli_json("alerts", "--db", store_url, "--webhook-secret", cwd=tmp_path)
    sent = Webhook(shown["webhook_secret"]).verify(receiver.calls[0].body, receiver.calls[0].headers)
    assert (sent["type"], sent["data"]["alert"], sent["data"]["value"]) == ("alert.firing", "dead_letters_per_hour", 4)
    assert len(receiver.calls) == 1
    assert query(store_url, "SELECT delivery FROM events WHERE type = 'alert.firing'") == [("delivered",)]


def test_an_alert_no_longer_declared_is_dropped_at_the_next_evaluation(store_url: str, tmp_path: Path) -> None:
    pipeline = _run(tmp_path, store_url, ["unsure1"])
    now = _store_now(store_url)
    assert [t.alert for t in _race(store_url, pipeline, now + HOUR + 5)] == ["review_overdue"]
    redeclared = Pipeline("watched", alerts=Alerts(dead_letters_per_hour=3))
    store = open_store(store_url)
    try:
        assert evaluate(store, redeclared, now + HOUR + 10, every=0, operator_webhook="") == []
    finally:
        store.close()
    assert [(a["alert"], a["state"]) for a in list_alerts_of(store_url)] == [("dead_letters_per_hour", "ok")]


def test_the_operators_webhook_gets_every_alert_beside_the_declared_one(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = _run(tmp_path, store_url, [f"poison{i}" for i in range(4)], "https://team.example/hook")
    monkeypatch.setenv("CONVEYOR_ALERT_WEBHOOK", "https://ops.example/alerts")
    store = open_store(store_url)
    try:
        assert len(evaluate(store, pipeline, store.clock(), every=0)) == 1
    finally:
        store.close()
    assert sorted(query(store_url, "SELECT webhook_url, delivery FROM events WHERE type = 'alert.firing'")) == [
        ("https://ops.example/alerts", "pending"), ("https://team.example/hook", "pending")]


def test_a_bad_operator_webhook_is_a_one_line_error_before_a_worker_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_ALERT_WEBHOOK", "ops.example/alerts")
    pipeline = Pipeline("watched", alerts=Alerts(review_overdue=True))
    with pytest.raises(PipelineError) as caught:
        Worker(pipeline, "x.py:pipe", f"sqlite:///{tmp_path}/c.db", FilesystemBlobs(tmp_path / "blobs"))
    assert str(caught.value) == ("CONVEYOR_ALERT_WEBHOOK: 'ops.example/alerts' must be http:// or https:// with "
                                 "a host")
    assert operator_webhook_url({"CONVEYOR_ALERT_WEBHOOK": " "}) is None


def test_a_short_conveyor_run_still_raises_the_alert_it_caused(tmp_path: Path) -> None:
    """A run over in less than a keeper round: `conveyor run` evaluates the alerts once more as it ends."""
    target = write_pipeline(tmp_path, """
        from conveyor import Alerts, Pipeline, Retry

        pipe = Pipeline("brief", retry=Retry(max_attempts=1), alerts=Alerts(dead_letters_per_hour=0))

        @pipe.stage
        def parse(ctx, source: bytes) -> dict:
            if source.startswith(b"poison"):
                raise ValueError("poison document")
            return {"n": len(source)}
    """)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("fine")
    (docs / "b.txt").write_text("poison")
    db = f"sqlite:///{tmp_path}/c.db"
    proc = cli("run", target, "--input", str(docs), "--db", db, "--blobs", str(tmp_path / "blobs"), cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr  # an item dead-lettered
    assert "alert dead_letters_per_hour firing on pipeline brief" in proc.stderr
    shown = cli_json("alerts", "--json", "--db", db, cwd=tmp_path)["alerts"]
    assert [(a["alert"], a["state"], a["value"], a["firings"]) for a in shown] == [
        ("dead_letters_per_hour", "firing", 1, 1)]
