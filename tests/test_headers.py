"""The provider side of Retry-After: headers and ProviderError go through the same sane-delay rule."""

from __future__ import annotations

import pickle
import time
from email.utils import formatdate
from typing import Any

import pytest

from conveyor.providers.base import ProviderError
from conveyor.providers.errormap import from_status
from conveyor.providers.headers import parse_duration, rate_limits, retry_after, seconds_until
from conveyor.retry_after import MAX_RETRY_AFTER_S


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "soon"}, None), ({"retry-after": "-1"}, None), ({"retry-after": "1e999"}, None),
    ({"retry-after": "nan"}, None), ({"retry-after": ""}, None), ({"retry-after": "  3 "}, 3.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0), ({"retry-after": "172800"}, MAX_RETRY_AFTER_S),
    ({"retry-after": formatdate(time.time() + 2 * 86_400, usegmt=True)}, MAX_RETRY_AFTER_S),
    ({"retry-after-ms": "1e999"}, None), ({"retry-after-ms": "nan"}, None), ({"retry-after-ms": "-5"}, None),
    ({"retry-after-ms": "soon", "retry-after": "2"}, 2.0), ({"retry-after-ms": "250"}, 0.25),
])
def test_retry_after_header_is_a_sane_delay_or_nothing(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


class UnreadableHeaders:
    def get(self, name: str) -> str:
        raise RuntimeError("stream closed")


def test_headers_that_cannot_be_read_are_no_headers() -> None:
    assert retry_after(UnreadableHeaders()) is None
    assert rate_limits(UnreadableHeaders()) is None


@pytest.mark.parametrize("raw", ["1e999", "nan", "inf", "-1"])
def test_a_reset_duration_that_is_not_a_finite_number_is_ignored(raw: str) -> None:
    assert parse_duration(raw) is None and seconds_until(raw) is None
    assert rate_limits({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": raw}) == {
        "remaining_tokens": 0}


def test_a_reset_beyond_a_day_is_cut_to_a_day() -> None:
    assert parse_duration("100h") == MAX_RETRY_AFTER_S
    assert seconds_until("2999-01-01T00:00:00Z") == MAX_RETRY_AFTER_S


@pytest.mark.parametrize(("given", "kept"), [
    (float("inf"), None), (float("nan"), None), (-1.0, None), (2.0, 2.0), (3 * 86_400, MAX_RETRY_AFTER_S)])
def test_provider_error_keeps_only_a_sane_retry_after(given: Any, kept: float | None) -> None:
    error = ProviderError("rate_limited", "429", retry_after=given, status_code=429)
    assert error.retry_after == kept
    assert pickle.loads(pickle.dumps(error)).retry_after == kept  # it crosses the guarded-stage boundary
    assert ("retry after" in str(error)) == (kept is not None)


def test_a_429_with_an_infinite_retry_after_falls_back_to_the_exhausted_reset() -> None:
    headers = {"retry-after": "1e999", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.5s"}
    assert from_status("openai", 429, message="slow", headers=headers).retry_after == 1.5
