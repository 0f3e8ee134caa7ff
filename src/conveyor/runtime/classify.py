"""Error classification: which failures retry and which end the task at once.

Retryable: timeouts, connection errors, HTTP 408/429/5xx, RetryLater, and any
exception nobody declared terminal (a poison item then reaches the dead-letter
list after ``max_attempts``). Terminal: TerminalError, types a stage declares
in ``Retry(terminal=...)``, other HTTP 4xx, validation errors.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from conveyor.errors import RetryLater, TerminalError
from conveyor.retry_after import sane_delay, sane_delay_ms

RETRYABLE_STATUS = {408, 409, 425, 429}
SETTLED_BY_CONTENT = frozenset({"context_length", "content_policy"})
# TerminalErrors that are the stage code's fault, not the content's: failed at once but not
# memoised, so a fix of the code (without a version bump) runs the item again.
CODE_FAULTS = frozenset({"unserialisable_output"})


@dataclass(frozen=True)
class Failure:
    """A classified failure, picklable across a process boundary."""

    error_class: str
    retryable: bool
    message: str
    retry_after: float | None = None
    detail: str = ""
    # The content decided it (the stage refused it, or it failed validation): the
    # same input under the same stage version fails the same way, so it is memoised.
    deterministic: bool = False
    # A guard decided it, with this value, e.g. ("max_input_bytes", 20_000_000): the memoised
    # refusal answers only while the stage declares the same value (runtime/memo.py).
    guard: tuple[str, Any] | None = None


def classify(exc: BaseException, terminal: tuple[type[BaseException], ...] = (), detail: str = "") -> Failure:
    """The failure an exception means; never raises, whatever the exception object does."""
    try:
        return _classify(exc, terminal, detail)
    except Exception:  # a status or headers property that raises must not take the worker's batch down
        return Failure(_snake(type(exc).__name__), True, _message(exc), None, detail)


def _classify(exc: BaseException, terminal: tuple[type[BaseException], ...], detail: str) -> Failure:
    message = _message(exc)
    if isinstance(exc, RetryLater):
        return Failure("retry_later", True, message, sane_delay(exc.after), detail)
    if isinstance(exc, TerminalError):
        return Failure(exc.error_class, False, message, None, detail,
                       deterministic=exc.error_class not in CODE_FAULTS)
    if terminal and isinstance(exc, terminal):
        return Failure("terminal", False, message, None, detail, deterministic=True)
    declared = _declared(exc, message, detail)
    if declared is not None:
        return declared
    status = _status_code(exc)
    if status is not None:
        return _classify_status(status, exc, message, detail)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return Failure("timeout", True, message, None, detail)
    if isinstance(exc, (ConnectionError,)):
        return Failure("connection", True, message, None, detail)
    if isinstance(exc, MemoryError):
        return Failure("memory_limit", False, message, None, detail)
    if _is_validation_error(exc):
        return Failure("validation", False, message, None, detail, deterministic=True)
    return Failure(_snake(type(exc).__name__), True, message, None, detail)


def _declared(exc: BaseException, message: str, detail: str) -> Failure | None:
    """An error that names its own class (a provider adapter's, say) is taken at its word."""
    error_class, retryable = getattr(exc, "error_class", None), getattr(exc, "retryable", None)
    if not isinstance(error_class, str) or not isinstance(retryable, bool):
        return None
    # A prompt too long or refused by policy fails the same way for the same input: memoise it.
    return Failure(error_class, retryable, message, _retry_after(exc) if retryable else None, detail,
                   deterministic=not retryable and error_class in SETTLED_BY_CONTENT)


def _classify_status(status: int, exc: BaseException, message: str, detail: str) -> Failure:
    retry_after = _retry_after(exc)
    if status == 429:
        return Failure("rate_limited", True, message, retry_after, detail)
    if status in RETRYABLE_STATUS:
        return Failure(f"http_{status}", True, message, retry_after, detail)
    if status >= 500:
        return Failure("server_error", True, message, retry_after, detail)
    if 400 <= status < 500:
        return Failure(f"http_{status}", False, message, None, detail)
    return Failure(f"http_{status}", True, message, retry_after, detail)


def _status_code(exc: BaseException) -> int | None:
    for holder in (exc, getattr(exc, "response", None)):
        value = getattr(holder, "status_code", None) or getattr(holder, "status", None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    return None


def _retry_after(exc: BaseException) -> float | None:
    """``.retry_after``, else ``retry-after-ms``, else ``retry-after``; a value that is not sane is skipped."""
    explicit = sane_delay(getattr(exc, "retry_after", None))
    if explicit is not None:
        return explicit
    try:
        headers: Any = getattr(getattr(exc, "response", None), "headers", None) or getattr(exc, "headers", None)
        if not headers:
            return None
        from_ms = sane_delay_ms(headers.get("retry-after-ms"))
        return from_ms if from_ms is not None else sane_delay(headers.get("retry-after") or headers.get("Retry-After"))
    except Exception:  # a headers object that cannot be read says nothing about when to come back
        return None


def parse_retry_after(raw: str | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date (``retry_after.sane_delay``)."""
    return sane_delay(raw)


def _message(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:4000]
    except Exception:  # its __str__ raised too
        return f"{type(exc).__name__}: (the exception could not be printed)"


def _is_validation_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "ValidationError" and type(exc).__module__.startswith("pydantic")


def _snake(name: str) -> str:
    out = [("_" + c.lower()) if c.isupper() and i else c.lower() for i, c in enumerate(name)]
    return "".join(out)
