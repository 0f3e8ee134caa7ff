"""Evaluating a pipeline's alerts (conveyor.Alerts): any worker, and ``conveyor serve``, now and then.

Each evaluation reads a rate in bounded work (the pipeline's dead letters of the last hour, its review entries
undecided past their deadline) and moves the alert's state row (store/alerts.py) when the value crossed its
threshold. The move, and the ``alert.firing`` / ``alert.resolved`` events that tell of it, are one transaction
under the row's lock: however many processes evaluate at once, an episode is raised once and resolved once.
A process that finds the alerts evaluated less than ``every`` seconds ago skips its turn, so a fleet evaluates
about once per ``every`` in all.

Each transition is also logged at WARNING on the ``conveyor.alerts`` logger, with the stable fields ``event``
(``alert_firing`` or ``alert_resolved``), ``alert``, ``pipeline``, ``value`` and ``threshold``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from conveyor.pipeline import Pipeline
from conveyor.pipeline.alerts import DEAD_LETTERS_PER_HOUR, REVIEW_OVERDUE, check_url
from conveyor.store import SqlStore, open_store
from conveyor.store.alerts import AlertEvent, AlertRow

log = logging.getLogger("conveyor.alerts")

WINDOW_S = 3600.0  # dead letters are counted over the last hour
COUNT_CAP = 100_000  # a rate is counted up to this (or just past the threshold, when that is higher)
ALERTS_TENANT = "_alerts"  # whose webhook secret signs alert webhooks (no tenant can be named so)
OPERATOR_WEBHOOK = "CONVEYOR_ALERT_WEBHOOK"  # the operator's URL for every pipeline's alerts


def operator_webhook_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """The operator's URL for every pipeline's alerts (``CONVEYOR_ALERT_WEBHOOK``), checked: a one-line error
    for one that is not an http(s) URL."""
    url = environ.get(OPERATOR_WEBHOOK, "").strip()
    return check_url(url, OPERATOR_WEBHOOK) if url else None


def every_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How often alerts are evaluated: 30 s; CONVEYOR_ALERT_EVERY_S changes it (tests shorten it)."""
    value = environ.get("CONVEYOR_ALERT_EVERY_S", "")
    try:
        return max(0.0, float(value)) if value else 30.0
    except ValueError:
        return 30.0


class Transition(NamedTuple):
    """An alert that fired (``firing``) or was resolved: its value and threshold then, and since when it fired."""

    pipeline: str
    alert: str
    firing: bool
    value: float
    threshold: float
    since: float
    at: float

    @property
    def event(self) -> str:
        return "alert.firing" if self.firing else "alert.resolved"


def evaluate(store: SqlStore, pipeline: Pipeline, now: float, every: float | None = None,
             operator_webhook: str | None = None) -> list[Transition]:
    """Evaluate the pipeline's alerts unless another process did within ``every`` seconds; the transitions
    made here (each logged, and in the outbox). ``operator_webhook``: the operator's URL ("": none; None: read
    from CONVEYOR_ALERT_WEBHOOK)."""
    if pipeline.alerts is None:
        return []
    every = every_seconds() if every is None else every
    if not store.claim_alert_evaluation(pipeline.name, pipeline.alerts.thresholds(), now, every):
        return []
    return apply(store, pipeline, now, operator_webhook)


def apply(store: SqlStore, pipeline: Pipeline, now: float, operator_webhook: str | None = None) -> list[Transition]:
    """Read each alert's value and move its state where it crossed its threshold (no claim: see ``evaluate``)."""
    assert pipeline.alerts is not None
    values = {name: reading(store, pipeline.name, name, threshold, now)
              for name, threshold in pipeline.alerts.thresholds().items()}
    urls = webhooks(pipeline, operator_webhook_url() if operator_webhook is None else operator_webhook)
    moved: list[Transition] = []
    with store.transaction():
        for name, threshold in sorted(pipeline.alerts.thresholds().items()):
            value = values[name]
            before = store.move_alert(pipeline.name, name, value > threshold, value, threshold, now)
            if before is not None:
                moved.append(_transition(before, value, threshold, now))
        if moved:
            if urls:
                store.ensure_tenant(ALERTS_TENANT, new_secret(), now)
            store.insert_alert_events([e for t in moved for e in events(t, urls)])
    for transition in moved:
        _log(transition)
    return moved


def reading(store: SqlStore, pipeline: str, alert: str, threshold: float, now: float) -> float:
    """An alert's value now: a count, read in bounded work."""
    cap = max(COUNT_CAP, int(threshold) + 1)
    if alert == DEAD_LETTERS_PER_HOUR:
        return float(store.dead_letters_of_pipeline(pipeline, now - WINDOW_S, cap))
    if alert == REVIEW_OVERDUE:
        return float(store.overdue_reviews(pipeline, now, cap))
    raise ValueError(f"no alert {alert!r}")


def webhooks(pipeline: Pipeline, operator: str | None) -> list[str]:
    """Where the pipeline's alert events go: its declared webhook, and the operator's (each once)."""
    declared = pipeline.alerts.webhook if pipeline.alerts is not None else None
    return list(dict.fromkeys(url for url in (declared, (operator or "").strip() or None) if url))


def events(transition: Transition, urls: Sequence[str]) -> list[AlertEvent]:
    """The outbox rows of a transition: one per webhook URL (one going nowhere when there is none)."""
    t = transition
    data = {"alert": t.alert, "pipeline": t.pipeline, "value": _number(t.value), "threshold": _number(t.threshold),
            "since": t.since}
    if not t.firing:
        data["resolved_at"] = t.at
    body = json.dumps(data, sort_keys=True)
    subject = f"alert:{t.pipeline}:{t.alert}"
    destinations: list[str | None] = [*urls] or [None]
    return [AlertEvent(subject, t.event, body, t.at, url, ALERTS_TENANT) for url in destinations]


def new_secret() -> str:
    """A Standard Webhooks secret, for the alerts' signing tenant when it has none yet."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _transition(before: AlertRow, value: float, threshold: float, now: float) -> Transition:
    firing = before.state != "firing"
    return Transition(before.pipeline, before.alert, firing, value, threshold, now if firing else before.since, now)


def _log(t: Transition) -> None:
    fields = {"event": t.event.replace(".", "_"), "alert": t.alert, "pipeline": t.pipeline,
              "value": _number(t.value), "threshold": _number(t.threshold)}
    if t.firing:
        log.warning("alert %s firing on pipeline %s: %s > %s", t.alert, t.pipeline, fields["value"],
                    fields["threshold"], extra=fields)
    else:
        log.warning("alert %s resolved on pipeline %s: %s <= %s (firing for %.0f s)", t.alert, t.pipeline,
                    fields["value"], fields["threshold"], t.at - t.since, extra=fields)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


class AlertWatch:
    """``conveyor serve``'s evaluator: ``start()`` evaluates the pipelines' alerts every ``every`` seconds from
    a thread with its own store; ``stop()`` ends it. Workers evaluate from their lease keeping instead."""

    def __init__(self, url: str, pipelines: Sequence[Pipeline], every: float | None = None) -> None:
        self.url = url
        self.pipelines = [p for p in pipelines if p.alerts is not None]
        self.every = every_seconds() if every is None else every
        self.operator_webhook = (operator_webhook_url() if self.pipelines else None) or ""  # a bad one fails here
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-alerts", daemon=True)

    def start(self) -> None:
        if self.pipelines:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        store: SqlStore | None = None
        while not self._stop.wait(max(0.05, self.every)):
            try:
                store = store or open_store(self.url, migrate=False)
                for pipeline in self.pipelines:
                    evaluate(store, pipeline, store.clock(), self.every, self.operator_webhook)
            except Exception:  # the store restarting, say: the next turn tries again with a new connection
                log.warning("alert evaluation failed; trying again in %g s", self.every, exc_info=True,
                            extra={"event": "alert_evaluation_failed"})
                if store is not None:
                    _close(store)
                store = None
        if store is not None:
            _close(store)


def _close(store: SqlStore) -> None:
    try:
        store.close()
    except Exception:  # a connection that broke is gone already
        pass
