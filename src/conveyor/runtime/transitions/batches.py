"""The provider batch lane's transitions: tasks parked on batch requests are woken when those settle.

Parking happens in a commit (``Commits._park``: the fenced running → queued move, its ``deferred`` attempt);
waking is a change of the parked tasks' ``available_at`` to now, made here in the transaction that stores what
the batch answered, so a task is never woken before its answer can be read.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.runtime.transitions.base import Base
from conveyor.store.provider_batch import Settled


class BatchWakes(Base):
    def settle_batch_requests(self, settled: Sequence[Settled], now: float, batch_id: int | None = None,
                              status: str = "") -> int:
        """Store what became of batch requests (ending batch ``batch_id``) and wake the tasks waiting on the
        settled ones; returns the tasks woken."""
        return self.store.settle_requests(settled, now, batch_id, status)
