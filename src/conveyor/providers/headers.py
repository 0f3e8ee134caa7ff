"""Reading Retry-After and the providers' rate-limit headers.

OpenAI style: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` with
resets as durations (``"1m2.5s"``, ``"250ms"``). Anthropic style:
``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``
with resets as RFC 3339 times. Both become one flat dict of floats, e.g.
``{"limit_tokens": 2e6, "remaining_tokens": 1.99e6, "reset_tokens_s": 0.4}``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor.retry_after import sane_delay, sane_delay_ms

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


def header(headers: Any, name: str) -> str | None:
    """One header from an httpx-like headers object or a plain dict (any case)."""
    if headers is None:
        return None
    try:
        value = headers.get(name)
        if value is None and isinstance(headers, Mapping):
            value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    except Exception:  # a headers object that cannot be read has no headers worth trusting
        return None
    return None if value is None else str(value)


def parse_duration(raw: str | None) -> float | None:
    """Seconds from ``"6m0s"``, ``"1.5s"``, ``"250ms"`` or a bare number of seconds (``sane_delay``'s rule)."""
    if not raw:
        return None
    raw = raw.strip()
    try:
        return sane_delay(float(raw))
    except ValueError:
        pass
    parts = _DURATION.findall(raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        return None
    return sane_delay(sum(float(n) * _UNIT_S[u] for n, u in parts))


def seconds_until(raw: str | None, now: float | None = None) -> float | None:
    """Seconds from now until an RFC 3339 or HTTP date, or a number of seconds as is."""
    if not raw:
        return None
    plain = parse_duration(raw)
    if plain is not None:
        return plain
    from email.utils import parsedate_to_datetime  # here: the email package costs every command 30 ms to import

    now = time.time() if now is None else now
    for parse in (lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")), parsedate_to_datetime):
        try:
            when = parse(raw)
        except (TypeError, ValueError, IndexError):
            continue
        if when.tzinfo is not None:
            return sane_delay(max(0.0, when.timestamp() - now))
    return None


def retry_after(headers: Any) -> float | None:
    """``retry-after-ms`` (milliseconds), else ``retry-after`` (seconds or an HTTP date); None when neither is sane."""
    from_ms = sane_delay_ms(header(headers, "retry-after-ms"))
    return from_ms if from_ms is not None else sane_delay(header(headers, "retry-after"))


def rate_limits(headers: Any) -> dict[str, float] | None:
    """The OpenAI- or Anthropic-style rate-limit headers as one flat dict; None when there are none."""
    out: dict[str, float] = {}
    for kind in ("requests", "tokens"):
        _put(out, f"limit_{kind}", _number(header(headers, f"x-ratelimit-limit-{kind}")))
        _put(out, f"remaining_{kind}", _number(header(headers, f"x-ratelimit-remaining-{kind}")))
        _put(out, f"reset_{kind}_s", parse_duration(header(headers, f"x-ratelimit-reset-{kind}")))
    for kind in _KINDS:
        key = kind.replace("-", "_")
        prefix = f"anthropic-ratelimit-{kind}"
        _put(out, f"limit_{key}", _number(header(headers, f"{prefix}-limit")))
        _put(out, f"remaining_{key}", _number(header(headers, f"{prefix}-remaining")))
        _put(out, f"reset_{key}_s", seconds_until(header(headers, f"{prefix}-reset")))
    return out or None


def exhausted_reset(limits: Mapping[str, float] | None) -> float | None:
    """When a 429 carries no Retry-After: the reset of a limit whose remaining is 0."""
    if not limits:
        return None
    waits = [limits[f"reset_{k}_s"] for k in ("requests", "tokens", "input_tokens", "output_tokens")
             if limits.get(f"remaining_{k}") == 0 and f"reset_{k}_s" in limits]
    return max(waits) if waits else None


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _put(out: dict[str, float], key: str, value: float | None) -> None:
    if value is not None and key not in out:
        out[key] = value
