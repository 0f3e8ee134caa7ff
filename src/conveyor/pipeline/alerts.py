"""A pipeline's alerts: on rates, not sizes. Declarations only (runtime/alerts.py evaluates them).

``Pipeline("manuals", alerts=Alerts(dead_letters_per_hour=50, review_overdue=True, webhook="https://ops/hook"))``
raises ``dead_letters_per_hour`` while more than 50 of its tasks were dead-lettered in the last hour, and
``review_overdue`` while any of its review entries is undecided past its deadline. Each raise and each
resolution is logged at WARNING (logger ``conveyor.alerts``), written to the event outbox (``alert.firing``,
``alert.resolved``; delivered to ``webhook`` by ``conveyor serve``'s relay) and counted in the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from conveyor.errors import PipelineError

DEAD_LETTERS_PER_HOUR = "dead_letters_per_hour"
REVIEW_OVERDUE = "review_overdue"
ALERT_NAMES = (DEAD_LETTERS_PER_HOUR, REVIEW_OVERDUE)
MAX_URL = 2048


@dataclass(frozen=True)
class Alerts:
    """When to raise an alert for a pipeline, and where to send it.

    ``dead_letters_per_hour``: fire while more than this many of the pipeline's tasks were dead-lettered in
    the last hour (0: any dead letter fires); resolved once the last hour holds at most this many. None: off.
    ``review_overdue``: fire while any review entry of the pipeline is undecided past its deadline.
    ``webhook``: an http(s) URL that gets each ``alert.firing`` and ``alert.resolved`` event, signed like
    job webhooks (Standard Webhooks); the server's webhook policy (``--allow-webhook``) applies to it.
    """

    dead_letters_per_hour: int | None = None
    review_overdue: bool = False
    webhook: str | None = None

    def __post_init__(self) -> None:
        per_hour = self.dead_letters_per_hour
        if per_hour is not None and (isinstance(per_hour, bool) or not isinstance(per_hour, int) or per_hour < 0):
            raise PipelineError(f"Alerts(dead_letters_per_hour={per_hour!r}) must be a whole number >= 0 "
                                "(dead letters in the last hour above which the alert fires), or None")
        if not isinstance(self.review_overdue, bool):
            raise PipelineError(f"Alerts(review_overdue={self.review_overdue!r}) must be True or False")
        if self.webhook is not None:
            check_url(self.webhook, "Alerts(webhook=...)")
        if not self.thresholds():
            raise PipelineError("Alerts(...) declares no alert; give dead_letters_per_hour=N and/or "
                                "review_overdue=True")

    def thresholds(self) -> dict[str, float]:
        """The declared alerts by name, each with the value above which it fires."""
        found: dict[str, float] = {}
        if self.dead_letters_per_hour is not None:
            found[DEAD_LETTERS_PER_HOUR] = float(self.dead_letters_per_hour)
        if self.review_overdue:
            found[REVIEW_OVERDUE] = 0.0
        return found


def check_url(url: object, where: str) -> str:
    """``url`` when it is an http(s) URL with a host and no credentials (its shape only: where it resolves to is
    checked by the relay at each delivery); a one-line PipelineError naming ``where`` otherwise."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise PipelineError(f"{where}: {url!r} must be an http(s) URL of at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError as exc:
        raise PipelineError(f"{where}: {url[:200]!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PipelineError(f"{where}: {url[:200]!r} must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise PipelineError(f"{where} must not carry a user name or password; alert webhooks are signed")
    return url


def declared_alerts(alerts: object, pipeline: str) -> Alerts | None:
    """``Pipeline(alerts=...)`` checked: an Alerts or None."""
    if alerts is not None and not isinstance(alerts, Alerts):
        raise PipelineError(f"Pipeline({pipeline!r}, alerts={alerts!r}): pass conveyor.Alerts(...) or None")
    return alerts
