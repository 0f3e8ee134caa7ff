"""Sliding-window RPM and TPM limits for the provider simulator.

Every admitted request is an entry (admission time, tokens) kept for one
window (60 s). A request is admitted when the window holds fewer than ``rpm``
entries and its token estimate fits in ``tpm`` minus the tokens the window
already holds. The entry first holds the estimate (prompt tokens +
max_tokens) and is settled to the tokens actually charged once the answer is
known. Refused requests leave no entry. A limit of 0 means unlimited.

The limiter is used from one event loop only and needs no lock.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0


@dataclass(slots=True, eq=False)
class Entry:
    """One admitted request: when it was admitted and the tokens it holds."""

    at: float
    tokens: int
    live: bool = True


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused and how long until it would fit."""

    limit: str  # "requests" or "tokens"
    retry_after_s: float
    message: str


class WindowLimiter:
    """RPM and TPM over a sliding window, with reservations settled after the fact."""

    def __init__(
        self, rpm: int, tpm: int, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self.window_s = window_s
        self._clock = clock
        self._entries: deque[Entry] = deque()
        self._tokens = 0

    def _prune(self, now: float) -> None:
        while self._entries and self._entries[0].at <= now - self.window_s:
            gone = self._entries.popleft()
            gone.live = False
            self._tokens -= gone.tokens

    def admit(self, estimate: int) -> Entry | Refusal:
        """Reserve one request and estimate tokens, or say why not and for how long."""
        now = self._clock()
        self._prune(now)
        waits: list[tuple[float, str, str]] = []
        if self.rpm and len(self._entries) >= self.rpm:
            oldest = self._entries[len(self._entries) - self.rpm]
            msg = f"Rate limit reached on requests per min (RPM): Limit {self.rpm}, Used {len(self._entries)}"
            waits.append((oldest.at + self.window_s - now, "requests", msg))
        if self.tpm and self._tokens + estimate > self.tpm:
            msg = (
                f"Rate limit reached on tokens per min (TPM): Limit {self.tpm}, "
                f"Used {self._tokens}, Requested {estimate}"
            )
            waits.append((self._token_wait(now, self._tokens + estimate - self.tpm), "tokens", msg))
        if waits:
            wait, limit, msg = max(waits)
            wait = max(wait, 0.001)
            return Refusal(limit, wait, f"{msg}. Please try again in {wait:.3f}s.")
        entry = Entry(now, estimate)
        self._entries.append(entry)
        self._tokens += estimate
        return entry

    def _token_wait(self, now: float, need: int) -> float:
        freed = 0
        for entry in self._entries:
            freed += entry.tokens
            if freed >= need:
                return entry.at + self.window_s - now
        return self.window_s

    def settle(self, entry: Entry, tokens: int) -> None:
        """Replace an entry's reservation by the tokens actually charged."""
        if entry.live:
            self._tokens += tokens - entry.tokens
        entry.tokens = tokens

    def headers(self) -> dict[str, str]:
        """The x-ratelimit-* headers (only for the limits that are set)."""
        now = self._clock()
        self._prune(now)
        out: dict[str, str] = {}
        reset = duration(self._entries[-1].at + self.window_s - now) if self._entries else "0s"
        if self.rpm:
            out["x-ratelimit-limit-requests"] = str(self.rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.rpm - len(self._entries)))
            out["x-ratelimit-reset-requests"] = reset
        if self.tpm:
            out["x-ratelimit-limit-tokens"] = str(self.tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.tpm - self._tokens))
            out["x-ratelimit-reset-tokens"] = reset
        return out


def duration(seconds: float) -> str:
    """An OpenAI-style duration: "250ms", "1.5s", "1m2.5s"."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """retry-after (integer seconds, rounded up) and retry-after-ms."""
    return {
        "retry-after": str(max(1, math.ceil(retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000))),
    }
