"""The clock a worker stamps leases, retries and schedules with: the store's.

On one machine (SQLite) that is the machine's own clock. Against a shared
PostgreSQL every worker reads the server's time instead, so a machine whose
clock is a minute ahead neither takes over live leases nor schedules retries
a minute late. Asking the server on every read would cost a round trip, so
the worker asks it now and then (``sync``) and counts the time since with
the monotonic clock, which no change of the machine's wall clock can move.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class FleetClock:
    """Epoch seconds on the store's clock. Call it like ``time.time``."""

    __slots__ = ("_base", "local", "shared")

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self.shared = False
        self._base = 0.0  # store time minus monotonic time, once synced

    def __call__(self) -> float:
        return self._base + time.monotonic() if self.shared else self.local()

    def sync(self, store_clock: Callable[[], float], local_is_store: bool) -> None:
        """Read the store's clock (``store_clock``) unless this machine's clock is the store's."""
        if local_is_store:
            return
        before = time.monotonic()
        server = store_clock()
        after = time.monotonic()
        self._base = server - (before + after) / 2  # the server read its clock about half way through
        self.shared = True
