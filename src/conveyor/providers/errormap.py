"""HTTP answers to error classes, shared by the adapters; and strict JSON-object parsing.

| answer                                                     | error_class    | retryable |
| ---------------------------------------------------------- | -------------- | --------- |
| 429 (not ``insufficient_quota``)                           | rate_limited   | yes       |
| 503, 529, type ``overloaded_error``, "overloaded" message   | overloaded     | yes       |
| 408, 504                                                   | timeout        | yes       |
| other 5xx, 409                                             | server_error   | yes       |
| 400/413/422 saying the context length was exceeded          | context_length | no        |
| 400 with code content_filter / content policy              | content_policy | no        |
| other 4xx                                                  | bad_request    | no        |
| 401, 402, 403, 429 ``insufficient_quota``                  | auth           | no        |
| 404                                                        | not_found      | no        |
"""

from __future__ import annotations

import json
import re
from typing import Any

from conveyor.providers.base import ProviderError
from conveyor.providers.headers import exhausted_reset, rate_limits, retry_after

_CONTEXT = re.compile(
    r"context[_ ]length|context window|maximum context|prompt is too long|too many (input )?tokens"
    r"|exceeds? (the )?context|context limit|input is too long",
    re.IGNORECASE,
)
_CONTEXT_CODES = {"context_length_exceeded", "string_above_max_length", "prompt_too_long"}
_POLICY = re.compile(r"content[_ ]filter|content[_ ](management )?policy|responsibleaipolicy", re.IGNORECASE)
_OVERLOADED = re.compile(r"overloaded", re.IGNORECASE)


def from_status(
    provider: str, status: int, *, message: str, error_type: str | None = None, code: str | None = None,
    headers: Any = None,
) -> ProviderError:
    """The ProviderError for an HTTP error answer (status, body type/code/message, headers)."""
    label = " ".join(x for x in (error_type, code) if x)
    detail = f"{label}: {message}" if label and label not in message else message
    wait = retry_after(headers)

    def err(error_class: str, after: float | None = None) -> ProviderError:
        return ProviderError(error_class, detail, retry_after=after, status_code=status, provider=provider)

    tags = f"{error_type or ''} {code or ''}"
    if status == 429 and "insufficient_quota" not in tags:
        return err("rate_limited", wait if wait is not None else exhausted_reset(rate_limits(headers)))
    if status in (503, 529) or "overloaded" in tags or (status >= 500 and _OVERLOADED.search(message)):
        return err("overloaded", wait)
    if status in (408, 504):
        return err("timeout", wait)
    if status >= 500 or status == 409:
        return err("server_error", wait)
    if status in (401, 402, 403) or status == 429:
        return err("auth")
    if status == 404:
        return err("not_found")
    return err(_bad_request_class(message, code, error_type))


def _bad_request_class(message: str, code: str | None, error_type: str | None) -> str:
    if (code in _CONTEXT_CODES) or _CONTEXT.search(message):
        return "context_length"
    if _POLICY.search(f"{code or ''} {error_type or ''}") or _POLICY.search(message):
        return "content_policy"
    return "bad_request"


def body_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) from an error body: ``{"error": {...}}`` or the inner object itself."""
    if not isinstance(body, dict):
        return None, None, (body if isinstance(body, str) and body else None)
    inner = body.get("error")
    obj = inner if isinstance(inner, dict) else body
    found = [obj.get(k) for k in ("type", "code", "message")]
    typ, code, msg = (str(v) if v is not None and not isinstance(v, (dict, list)) else None for v in found)
    return typ, code, msg


def parse_json_object(text: str, *, lenient: bool = False) -> dict[str, Any] | None:
    """The JSON object in ``text``, or None. ``lenient`` also strips code fences and surrounding prose."""
    candidates = [text]
    if lenient:
        stripped = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", text)
        start, end = stripped.find("{"), stripped.rfind("}")
        candidates += [stripped] + ([stripped[start:end + 1]] if 0 <= start < end else [])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
