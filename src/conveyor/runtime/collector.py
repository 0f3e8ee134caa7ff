"""The cyclic garbage collector while a worker runs: fewer, cheaper collections.

A worker's hot path allocates a few tuples per task (claimed rows, outcomes, the rows of a commit) and frees
them a batch later by reference counting; the collector finds nothing to free among them, but with the default
thresholds two workers through 60,000 tasks ran it 923 times, and each full collection walked every object the
imports and the pipeline left: 1.3 s of their 6 s of CPU (bench/fleetprofile.py). While a worker runs, what
exists at its start is frozen (``gc.freeze``: kept out of every collection; not when the program froze objects
of its own, which are left as they are) and the youngest generation collected every 20,000 allocations instead
of 700. Both are put back when the last worker of the process returns, so a program that runs a worker in
process keeps its own settings afterwards. Memory is not at stake: what reference counting frees (all of the
hot path's garbage) goes at once whatever the collector does.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000
_lock = threading.Lock()
_held = 0  # workers running in this process (a program may run several, in threads)
_saved: tuple[int, ...] = ()  # the thresholds before the first of them, put back after the last
_froze = False  # whether the first one froze (not when the program had frozen objects of its own: left as they are)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """For the block: what exists now frozen, the youngest generation collected less often. Blocks of several
    threads nest: the first one in changes the settings, the last one out puts them back."""
    global _held, _saved, _froze
    with _lock:
        if not _held:
            _saved, _froze = gc.get_threshold(), gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
            gc.set_threshold(max(_saved[0], YOUNG_THRESHOLD), *_saved[1:])
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if not _held:
                gc.set_threshold(*_saved)
                if _froze:
                    gc.unfreeze()
