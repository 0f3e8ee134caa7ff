"""Error classification: what retries, what fails at once, and when to come back."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest

from conveyor import Retry, RetryLater, TerminalError
from conveyor.retry_after import MAX_RETRY_AFTER_S
from conveyor.runtime.classify import classify, parse_retry_after


class HttpError(Exception):
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.headers = headers or {}


class Declared(Exception):
    def __init__(self, error_class: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(error_class)
        self.error_class, self.retryable, self.retry_after = error_class, retryable, retry_after


@pytest.mark.parametrize(
    ("exc", "error_class", "retryable", "retry_after"),
    [
        (HttpError(429, {"retry-after": "7"}), "rate_limited", True, 7.0),
        (HttpError(429, {"retry-after-ms": "1500"}), "rate_limited", True, 1.5),
        (HttpError(503), "server_error", True, None),
        (HttpError(408), "http_408", True, None),
        (HttpError(400), "http_400", False, None),
        (HttpError(401), "http_401", False, None),
        (TimeoutError("slow"), "timeout", True, None),
        (ConnectionResetError("reset"), "connection", True, None),
        (MemoryError(), "memory_limit", False, None),
        (KeyError("x"), "key_error", True, None),
        (RetryLater(after=30), "retry_later", True, 30.0),
        (TerminalError("bad scan", error_class="unreadable"), "unreadable", False, None),
        (Declared("rate_limited", True, 2.0), "rate_limited", True, 2.0),
        (Declared("context_length", False, 9.0), "context_length", False, None),
    ],
)
def test_classification(exc: BaseException, error_class: str, retryable: bool, retry_after: float | None) -> None:
    failure = classify(exc)
    assert (failure.error_class, failure.retryable, failure.retry_after) == (error_class, retryable, retry_after)


def test_declared_terminal_types_and_validation_are_settled_by_content() -> None:
    assert classify(ValueError("no"), terminal=(ValueError,)).deterministic
    assert classify(TerminalError("refused")).deterministic
    assert not classify(HttpError(400)).deterministic, "a 4xx may be the environment's fault, not the content's"
    pydantic = pytest.importorskip("pydantic")

    class Invoice(pydantic.BaseModel):
        total: int

    with pytest.raises(pydantic.ValidationError) as caught:
        Invoice(total="many")
    failure = classify(caught.value)
    assert (failure.error_class, failure.retryable, failure.deterministic) == ("validation", False, True)


def test_retry_after_as_http_date_and_garbage() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_backoff_is_full_jitter_under_the_cap() -> None:
    import random

    policy = Retry(max_attempts=10, base=1.0, cap=8.0)
    rng = random.Random(7)
    delays = [policy.delay(attempt, rng) for attempt in range(1, 9) for _ in range(200)]
    assert min(delays) >= 0.0 and max(delays) <= 8.0
    assert max(policy.delay(1, rng) for _ in range(500)) <= 1.0
    assert max(policy.delay(6, rng) for _ in range(500)) > 4.0, "later attempts wait longer, up to the cap"


# HTTP dates from now are written when the test runs (not when it is collected, which may be minutes earlier).
IN_AN_HOUR, IN_TWO_DAYS = "<in an hour>", "<in two days>"
PAST = "Wed, 21 Oct 2015 07:28:00 GMT"


def _when(raw: str) -> str:
    ahead = {IN_AN_HOUR: 3600, IN_TWO_DAYS: 2 * 86_400}.get(raw)
    return raw if ahead is None else formatdate(time.time() + ahead, usegmt=True)


@pytest.mark.parametrize(("raw", "seconds"), [
    ("soon", None), ("-1", None), ("1e999", None), ("nan", None), ("inf", None), ("", None), ("  3 ", 3.0),
    (PAST, 0.0), (IN_AN_HOUR, pytest.approx(3600, abs=5)), ("172800", MAX_RETRY_AFTER_S),
    (IN_TWO_DAYS, MAX_RETRY_AFTER_S),
])
def test_a_malformed_retry_after_is_ignored_and_a_long_one_is_cut_to_a_day(raw: str, seconds: Any) -> None:
    failure = classify(HttpError(429, {"retry-after": _when(raw)}))
    assert (failure.error_class, failure.retryable, failure.retry_after) == ("rate_limited", True, seconds)


@pytest.mark.parametrize(("raw", "seconds"), [
    ("soon", None), ("-1", None), ("1e999", None), ("nan", None), ("", None), ("  3 ", 0.003),
    (PAST, None), (IN_AN_HOUR, None), ("172800000", MAX_RETRY_AFTER_S),
])
def test_retry_after_ms_is_milliseconds_and_never_a_date(raw: str, seconds: float | None) -> None:
    assert classify(HttpError(503, {"retry-after-ms": _when(raw)})).retry_after == seconds


def test_an_ignored_retry_after_ms_falls_back_to_retry_after() -> None:
    assert classify(HttpError(429, {"retry-after-ms": "soon", "retry-after": "4"})).retry_after == 4.0


@pytest.mark.parametrize(("explicit", "seconds"), [
    (float("inf"), None), (float("nan"), None), (-1.0, None), ("soon", None), (True, None), (2.5, 2.5),
    (2 * 86_400, MAX_RETRY_AFTER_S),
])
def test_an_exceptions_retry_after_attribute_goes_through_the_same_rule(explicit: Any, seconds: float | None) -> None:
    assert classify(Declared("rate_limited", True, explicit)).retry_after == seconds


@pytest.mark.parametrize("after", [float("nan"), float("inf"), -1, 10**400])
def test_retry_later_refuses_a_delay_that_is_not_a_finite_number(after: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds >= 0"):
        RetryLater(after=after)


def test_retry_later_is_cut_to_a_day() -> None:
    assert RetryLater(after=2 * 86_400).after == MAX_RETRY_AFTER_S
    assert classify(RetryLater(after=0)).retry_after == 0.0


class UnreadableHeaders:
    def __bool__(self) -> bool:
        return True

    def get(self, name: str) -> str:
        raise RuntimeError("connection closed while reading headers")


class BrokenStatus(Exception):
    @property
    def status_code(self) -> int:
        raise RuntimeError("response already closed")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print")


def test_headers_that_cannot_be_read_leave_the_status_classification_alone() -> None:
    error = HttpError(429)
    error.headers = UnreadableHeaders()  # type: ignore[assignment]
    failure = classify(error)
    assert (failure.error_class, failure.retryable, failure.retry_after) == ("rate_limited", True, None)


def test_classify_never_raises_whatever_the_exception_object_does() -> None:
    broken = classify(BrokenStatus("gone"), detail="trace")
    assert (broken.error_class, broken.retryable, broken.detail) == ("broken_status", True, "trace")
    assert broken.message == "BrokenStatus: gone"
    unprintable = classify(Unprintable())
    assert (unprintable.error_class, unprintable.retryable) == ("unprintable", True)
    assert unprintable.message.startswith("Unprintable: ")
