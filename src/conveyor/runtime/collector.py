"""The cyclic garbage collector while a worker runs: fewer, cheaper collections.

A worker's hot path allocates a few tuples per task (claimed rows, outcomes, the rows of a commit) and frees
them a batch later; none of them form cycles, so the collector finds nothing to free, but with the default
thresholds it ran about 460 times per 1,000 tasks and each full collection walked every object the imports and
the pipeline left (bench/fleetprofile.py: 1.3 s of the two workers' 6 s at 60,000 tasks). While a worker runs,
what exists at its start is frozen (``gc.freeze``: kept out of every collection, it is the program itself) and
the youngest generation collected every 20,000 allocations instead of 700. Both are put back when it returns,
so a program that runs a worker in process keeps its own settings afterwards. Memory is not at stake: objects
freed by reference counting (all of the hot path's) go at once whatever the collector does.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """For the block: what exists now frozen, the youngest generation collected less often."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
