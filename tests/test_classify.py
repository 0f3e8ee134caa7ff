"""Error classification: what retries, what fails at once, and when to come back."""

from __future__ import annotations

import pytest

from conveyor import Retry, RetryLater, TerminalError
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
