"""The one rule for a Retry-After: a sane number of seconds, or nothing.

Every delay the engine is told to wait (a ``retry-after`` or ``retry-after-ms``
header, an exception's ``.retry_after``, ``RetryLater(after=...)``) goes through
``sane_delay``. What is not a finite number >= 0 nor an HTTP date is ignored
(None: the normal jittered backoff applies); a longer wait than a day is
clamped to a day, since a provider may say "come back tomorrow" but beyond that
is a bug (an ``inf`` would park a task, or pause a whole fleet, for ever)::

    sane_delay("  3 ")   # 3.0
    sane_delay("1e999")  # None
    sane_delay(2 * 86_400)  # 86400.0

It lives at the package root, beside ``errors``, so that runtime, providers and
``RetryLater`` share it without an import running up a layer.
"""

from __future__ import annotations

import math
import time
from datetime import UTC

MAX_RETRY_AFTER_S = 86_400.0


def sane_delay(value: object, now: float | None = None) -> float | None:
    """Seconds from a number, a header's text of seconds or an HTTP date; None when it is none of these."""
    number = _number(value)
    if number is not None:
        return _clamp(number)
    if isinstance(value, str):
        return _clamp(_until_http_date(value, now))
    return None


def sane_delay_ms(value: object) -> float | None:
    """Seconds from a ``retry-after-ms`` value (milliseconds, never a date)."""
    number = _number(value)
    return None if number is None else _clamp(number / 1000.0)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)  # strips the whitespace around a header's text
    except ValueError:
        return None
    except OverflowError:  # an int too large for a float
        return math.inf


def _clamp(seconds: float | None) -> float | None:
    if seconds is None or not 0.0 <= seconds < math.inf:  # NaN fails every comparison
        return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER_S))  # max: -0.0 becomes 0.0


def _until_http_date(text: str, now: float | None) -> float | None:
    from email.utils import parsedate_to_datetime  # here: importing the email package costs every command 30 ms

    try:
        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": an HTTP date is GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
