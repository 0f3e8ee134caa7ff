"""The fleet's provider quota ledger: a sliding window of granted requests, and pauses.

Every worker process asks here before it sends a request to a limited
provider model. A grant is a row (when, tokens, one request); the sum over
the last window (60 s) is what the whole fleet has in flight or has spent,
and a request is granted only when it fits under the limit. The row first
holds the estimate (prompt + max_tokens) and is settled to the real usage
once the answer is known. Reservations for one key are serialised (SQLite's
single writer; a transaction-scoped advisory lock on PostgreSQL), and the
clock is the database's on PostgreSQL, so machines need not agree on time.

A sliding window is stricter than a token bucket: it never lets more than
the limit into any 60-second window, which is how providers (and the
simulator) count.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect

NEVER = 0  # in QuotaAnswer.grants: the request is larger than the whole limit
SPREAD_PARTS = 60  # with spread: a sixtieth of the limit per sixtieth of the window
IN_WINDOW = "quota_key = ? AND at > ? AND (settled = 0 OR at > ?)"  # key, since - window, since


class QuotaAnswer(NamedTuple):
    """Per request: the grant id, None (not now), or NEVER; and when to ask again."""

    now: float
    grants: list[int | None]
    wait: float | None
    paused: bool = False


class QuotaQueries:
    db: Dialect

    def quota_clock(self) -> float:
        """The fleet's clock: PostgreSQL's on PostgreSQL, this machine's on SQLite."""
        return self.db.clock()

    def reserve_quota(
        self, key: str, requests: Sequence[tuple[str, int]], *, tpm: int | None, rpm: int | None,
        interactive_share: float, window: float, worker: str, now: float | None = None, spread: bool = False,
    ) -> QuotaAnswer:
        """Grant, in order, the ``(lane, tokens)`` requests that fit; a lane stops at its first refusal.

        Interactive requests come first in ``requests``. While interactive work is about (an
        interactive grant or a refused interactive request within the window), bulk requests may
        use only ``1 - interactive_share`` of each limit. With ``spread``, grants are also held to
        a sixtieth of each limit per sixtieth of the window (a second, at the real window), for
        providers that enforce a minute's limit per second; one request always fits an empty second.
        """
        with self.db.transaction():
            self.db.lock(f"conveyor.quota:{key}")
            now = self.quota_clock() if now is None else now
            paused = self._paused_until(key)
            if paused is not None and paused > now:
                return QuotaAnswer(now, [None] * len(requests), paused - now, paused=True)
            since = now - window
            # A grant counts for a window after it was settled, and for as long as it is in flight
            # (up to two windows, in case its worker died with it).
            tokens, count, last_interactive = self.db.execute(
                "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(requests), 0), MAX(CASE WHEN lane = 'interactive' "
                f"AND at > ? THEN at END) FROM quota_grants WHERE {IN_WINDOW}", (since, key, since - window, since))[0]
            tokens, count = int(tokens), int(count)
            recent_tokens = recent_count = 0
            if spread:
                recent = now - window / SPREAD_PARTS
                recent_tokens, recent_count = (int(v) for v in self.db.execute(
                    "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(requests), 0) FROM quota_grants "
                    "WHERE quota_key = ? AND at > ? AND granted_at > ?", (key, recent, recent))[0])
            active = last_interactive is not None or any(lane == "interactive" for lane, _ in requests)
            grants: list[int | None] = []
            blocked: dict[str, int] = {}  # lane -> tokens of its first refused request
            for lane, want in requests:
                cap_tokens, cap_requests = _caps(lane, active, tpm, rpm, interactive_share)
                if tpm is not None and want > tpm:
                    grants.append(NEVER)
                    continue
                fits = ((cap_tokens is None or tokens + want <= cap_tokens)
                        and (cap_requests is None or count + 1 <= cap_requests))
                if spread and recent_count and fits:
                    fits = ((cap_tokens is None or recent_tokens + want <= cap_tokens / SPREAD_PARTS)
                            and (cap_requests is None or recent_count + 1 <= max(1.0, cap_requests / SPREAD_PARTS)))
                if lane in blocked or not fits:
                    blocked.setdefault(lane, want)
                    grants.append(None)
                    continue
                grants.append(self._insert_grant(key, lane, now, want, 1, 0, worker))
                tokens, count = tokens + want, count + 1
                recent_tokens, recent_count = recent_tokens + want, recent_count + 1
            if "interactive" in blocked:
                self._insert_grant(key, "interactive", now, 0, 0, 1, worker)  # demand: bulk leaves the share
            wait = None
            if blocked:
                wait = min(self._wait(key, since, window, now, tokens, count, want,
                                      *_caps(lane, active, tpm, rpm, interactive_share))
                           for lane, want in blocked.items())
                if spread:
                    wait = min(wait, window / SPREAD_PARTS / 2)
            if random.random() < 0.02:
                self.db.execute("DELETE FROM quota_grants WHERE quota_key = ? AND at < ?", (key, now - 3 * window))
        return QuotaAnswer(now, grants, wait)

    def _insert_grant(self, key: str, lane: str, now: float, tokens: int, requests: int, settled: int,
                      worker: str) -> int:
        rows = self.db.execute(
            "INSERT INTO quota_grants (quota_key, lane, granted_at, at, tokens, requests, settled, worker) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id", (key, lane, now, now, tokens, requests, settled, worker))
        return int(rows[0][0])

    def _wait(self, key: str, since: float, window: float, now: float, tokens: int, count: int, want: int,
              cap_tokens: float | None, cap_requests: float | None) -> float:
        """Seconds until enough of the window's grants age out for a request of ``want`` tokens."""
        need_tokens = 0.0 if cap_tokens is None else tokens + want - cap_tokens
        need_requests = 0.0 if cap_requests is None else count + 1 - cap_requests
        freed_tokens = freed_requests = 0
        for at, row_tokens, row_requests in self.db.execute(
                "SELECT at, tokens, requests FROM quota_grants WHERE quota_key = ? AND at > ? AND settled = 1 "
                "ORDER BY at", (key, since)):
            freed_tokens += row_tokens
            freed_requests += row_requests
            if freed_tokens >= need_tokens and freed_requests >= need_requests:
                return max(0.001, float(at) + window - now)
        return window  # what is left is in flight: it frees when settled, so ask again soon

    def settle_quota(self, rows: Sequence[tuple[int, float, int]]) -> None:
        """rows: (tokens actually used, seconds to move the grant later, grant id).

        Moving a grant to when its answer came back keeps the ledger's window from
        ending before the provider's does (the provider counted the request on arrival).
        """
        with self.db.transaction():
            self.db.executemany("UPDATE quota_grants SET tokens = ?, settled = 1, at = at + ? WHERE id = ?", rows)

    def pause_quota(self, key: str, seconds: float, reason: str) -> float:
        """Stop every worker from calling ``key`` for ``seconds`` (never shortening a pause); returns until."""
        with self.db.transaction():
            until = self.quota_clock() + seconds
            self.db.execute(
                "INSERT INTO quota_pauses (quota_key, paused_until, reason) VALUES (?, ?, ?) "
                "ON CONFLICT (quota_key) DO UPDATE SET "
                "paused_until = CASE WHEN excluded.paused_until > quota_pauses.paused_until "
                "THEN excluded.paused_until ELSE quota_pauses.paused_until END, reason = excluded.reason",
                (key, until, reason[:500]))
        return until

    def quota_paused_for(self, key: str) -> float:
        """Seconds the fleet must still wait before calling ``key`` (0.0 when not paused)."""
        now = self.quota_clock()
        until = self._paused_until(key)
        return max(0.0, until - now) if until is not None else 0.0

    def _paused_until(self, key: str) -> float | None:
        rows = self.db.execute("SELECT paused_until FROM quota_pauses WHERE quota_key = ?", (key,))
        return float(rows[0][0]) if rows else None

    def quota_usage(self, window: float) -> list[dict[str, object]]:
        """Per model: what the fleet holds in the current window, what is in flight, and any pause."""
        now = self.quota_clock()
        since = now - window
        rows = self.db.execute(
            "SELECT quota_key, COALESCE(SUM(tokens), 0), COALESCE(SUM(requests), 0), "
            "SUM(CASE WHEN settled = 0 AND requests > 0 THEN 1 ELSE 0 END), "
            "MAX(CASE WHEN lane = 'interactive' THEN at END) FROM quota_grants "
            "WHERE at > ? AND (settled = 0 OR at > ?) GROUP BY quota_key", (since - window, since))
        pauses = {str(key): (round(float(until) - now, 3), reason) for key, until, reason in self.db.execute(
            "SELECT quota_key, paused_until, reason FROM quota_pauses WHERE paused_until > ?", (now,))}
        held = {str(key): (int(tokens), int(requests), int(flying), last is not None and float(last) > since)
                for key, tokens, requests, flying, last in rows}
        usage = []
        for key in sorted(held.keys() | pauses.keys()):
            tokens, requests, flying, interactive = held.get(key, (0, 0, 0, False))
            paused_for, reason = pauses.get(key, (0.0, None))
            usage.append({"key": key, "tokens": tokens, "requests": requests, "in_flight": flying,
                          "interactive_active": interactive, "paused_for_s": paused_for, "pause_reason": reason})
        return usage

    def quota_window(self, key: str, since: float, until: float) -> tuple[int, int]:
        """(tokens, requests) the ledger holds for grants made in [since, until)."""
        row = self.db.execute(
            "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(requests), 0) FROM quota_grants "
            "WHERE quota_key = ? AND at >= ? AND at < ?", (key, since, until))[0]
        return int(row[0]), int(row[1])


def _caps(lane: str, active: bool, tpm: int | None, rpm: int | None,
          share: float) -> tuple[float | None, float | None]:
    factor = 1.0 if lane == "interactive" or not active else 1.0 - share
    return (None if tpm is None else tpm * factor, None if rpm is None else rpm * factor)
