"""Claim floors: where a PostgreSQL claim starts its walk of the queue while an old snapshot is held.

A claim reads ``tasks_runnable`` (pipeline, stage, lane_rank, available_at) from its low end. Each claimed task
leaves its queued row version there, dead once the claim commits; a scan that meets a dead entry marks it so
that later scans skip it without a visit to the table, and vacuum removes it. Neither can happen while any
transaction holds a snapshot older than the claim (a report left open, a forgotten ``psql`` session, a
``REPEATABLE READ`` reader): every claim then visits the table for every task claimed since that snapshot was
taken, from the oldest, and the queue slows down with every task it runs. Measured on this host with such a
reader (bench/bloat.py): after 1.8 million tasks a claim of 500 read 27,700 pages and took 566 ms.

So when a claim statement is slow (``SLOW_CLAIM_S``), the store remembers, per (pipeline, stage, lane), the
``available_at`` below which it has already taken everything it could, and its next claims of that stage run
one lane at a time from there (``lane_rank = ? AND available_at >= ?``: the index is entered at the floor).
The floor is the latest ``available_at`` claimed when a claim got all it asked for; when it got less, every
runnable task up to the claim's ``now`` was seen, and the floor moves to ``now - FLOOR_MARGIN_S`` (a task that
another transaction was queueing at that moment, with an earlier ``available_at``, is not skipped for good).

A task can still be queued below a floor: released by a worker that drains, its lease reclaimed, its retry due
early, claimed by a transaction that rolled back. Floors are dropped ``FLOOR_RESCAN_S`` after they were set, so
such a task waits at most that long; the next claim walks the whole queue again (slowly) and sets them anew.
Without an old snapshot no claim is slow, and no floor is ever set: the claim statement is the usual one.

Two other walks meet the same dead entries and use floors alike. A worker's backlog read (how many tasks of a
stage are runnable, up to the pipeline's ``max_backlog``) counts each lane from its claim floor. The reclaim scan
(leases whose expiry has passed, read through ``tasks_leased``) meets an entry for every task leased since the
snapshot, all of them expired: when it is slow it keeps a floor per pipeline (``ReclaimFloors``), the expiry
below which a complete scan returned every lease, and scans from there; a lease is given an expiry in the future
and only ever moved later, so nothing below the floor can expire afterwards (save a lease written by a worker
whose clock is behind by more than ``FLOOR_MARGIN_S``: it is reclaimed at the next rescan, within
``FLOOR_RESCAN_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

SLOW_CLAIM_S = 0.05  # a claim statement this slow is walking dead entries
FLOOR_RESCAN_S = 30.0  # floors are dropped this long after they were set
FLOOR_MARGIN_S = 5.0  # how far below a claim's clock its floor is set when the queue was exhausted
LANES = (0, 1)  # lane ranks (runtime/lanes.py LANE_RANKS), claimed in this order


K = TypeVar("K")
V = TypeVar("V")


def _current(floors: dict[K, tuple[float, V]], key: K, monotonic: Callable[[], float]) -> V | None:
    """The floor kept under ``key``, or None when there is none or it was set over FLOOR_RESCAN_S ago (dropped)."""
    entry = floors.get(key)
    if entry is None:
        return None
    if monotonic() - entry[0] > FLOOR_RESCAN_S:
        del floors[key]
        return None
    return entry[1]


class ClaimFloors:
    """The floors of one store (one worker process), per (pipeline, stage)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._floors: dict[tuple[str, str], tuple[float, dict[int, float]]] = {}  # (set at, lane -> floor)
        self._split: set[str] = set()  # pipelines whose next claim goes stage by stage (see split)

    def lanes(self, pipeline: str, stage: str) -> dict[int, float] | None:
        """The stage's floors by lane (a lane without one is walked from its start), or None: claim as usual."""
        return _current(self._floors, (pipeline, stage), self._monotonic)

    def engage(self, pipeline: str, stage: str, claimed: Iterable[tuple[int, float]], got_all: bool,
               now: float) -> None:
        """After a slow usual claim: floors from what it claimed, (lane_rank, available_at) pairs."""
        floors: dict[int, float] = {}
        for lane, available_at in claimed:
            floors[lane] = max(floors.get(lane, available_at), available_at)
        if not got_all:  # every runnable task up to now was seen, in every lane
            floors = dict.fromkeys(LANES, now - FLOOR_MARGIN_S)
        self._floors[pipeline, stage] = (self._monotonic(), floors)

    def advance(self, pipeline: str, stage: str, lane: int, claimed: Iterable[float], got_all: bool,
                now: float) -> None:
        """After a claim of one lane from its floor."""
        entry = self._floors.get((pipeline, stage))
        if entry is None:
            return
        floors = entry[1]
        if got_all:
            latest = max(claimed, default=None)
            if latest is not None:
                floors[lane] = max(floors.get(lane, latest), latest)
        else:
            floors[lane] = max(floors.get(lane, now - FLOOR_MARGIN_S), now - FLOOR_MARGIN_S)

    def split(self, pipeline: str) -> None:
        """A claim of several stages in one statement (store/tasks.py ``_claim_stages``) was slow: which stage's
        walk made it so is not known, so the next claim goes stage by stage, each timed on its own (a slow one
        engages that stage's floors), instead of engaging every stage's."""
        self._split.add(pipeline)

    def one_by_one(self, pipeline: str) -> bool:
        """Whether this claim goes stage by stage (once after a slow claim of several stages)."""
        if pipeline in self._split:
            self._split.discard(pipeline)
            return True
        return False

    def drop(self) -> None:
        self._floors.clear()
        self._split.clear()


class ReclaimFloors:
    """Per pipeline, the lease expiry below which the reclaim scan has returned every expired lease."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._floors: dict[str, tuple[float, float]] = {}  # pipeline -> (set at, floor)

    def floor(self, pipeline: str) -> float | None:
        """The pipeline's floor, or None: scan from the start (none was slow, or the rescan is due)."""
        return _current(self._floors, pipeline, self._monotonic)

    def scanned(self, pipeline: str, expiries: list[float], limit: int, now: float, slow: bool) -> None:
        """After a scan that returned ``expiries`` (ascending) of at most ``limit``: a slow one from the start
        sets the floor, any from a floor moves it. A full page says everything below its last expiry was seen;
        a short one, everything below ``now``."""
        entry = self._floors.get(pipeline)
        if entry is None and not slow:
            return
        seen = expiries[-1] if len(expiries) >= limit else now - FLOOR_MARGIN_S
        if entry is None:
            self._floors[pipeline] = (self._monotonic(), seen)
        else:
            self._floors[pipeline] = (entry[0], max(entry[1], seen))

    def drop(self) -> None:
        self._floors.clear()
