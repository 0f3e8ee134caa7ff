"""Every state transition of a task, in one package, in batches.

queued → running (claim, attempt counted) → succeeded | queued again after a
backoff (retry) | failed (terminal) | dead_lettered (attempts exhausted).
A running task whose lease expired goes back to queued, or to the dead-letter
list when that was its last attempt. Nothing else changes a task's state: the
worker claims, renews, releases and asks for memo answers here; a submission
admits its items here; replays (requeue among them) and dead-letter replay happen here; so do the
acceptance boundary's escalations, reviews and review decisions.

The parts: ``leases`` (claims, renewals, memo answers, expired leases), ``admission``
(a submission's items), ``commits`` (outcomes, in fenced batches), ``reviews`` (decisions on
answers waiting for people), ``operator`` (replays and requeues re-open tasks; dead-letter replay),
``batches`` (tasks parked on the provider batch lane woken when their requests settle; parking is a commit's).

A commit is prepared first (rows built, memo lookups for the successors done:
reads only) and then written in one short transaction of plain statements, so
a SQLite writer holds the lock only while writing. Every update is fenced by
the lease token: if any task's lease was lost meanwhile, the transaction is
rolled back and redone for the tasks still held, and the others are recorded
as ``lease_lost`` and discarded.
"""

from __future__ import annotations

from conveyor.runtime.transitions.admission import Admission
from conveyor.runtime.transitions.batches import BatchWakes
from conveyor.runtime.transitions.commits import Commits
from conveyor.runtime.transitions.groups import Groups
from conveyor.runtime.transitions.leases import Leases
from conveyor.runtime.transitions.operator import reopen, replay_dead_letters
from conveyor.runtime.transitions.outcome import Claim, LeaseLost, MemoTaken, Outcome, ReviewTaken, Writes
from conveyor.runtime.transitions.reviews import Reviews

__all__ = ["Claim", "LeaseLost", "MemoTaken", "Outcome", "ReviewTaken", "Transitions", "Writes", "reopen",
           "replay_dead_letters"]


class Transitions(Leases, Admission, Commits, Reviews, BatchWakes, Groups):
    """The one owner of task state changes for one pipeline (see the module's docstring)."""
