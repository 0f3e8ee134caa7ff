"""What a commit works with: an attempt's outcome, the rows a commit writes, what it may claim."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.acceptance.judge import Verdict
from conveyor.runtime.attemptlog import AttemptLog
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Pending
from conveyor.runtime.services import Usage
from conveyor.runtime.values import Ref
from conveyor.store import (
    AttemptRecord,
    ClaimedTask,
    Ended,
    Lease,
    NewDeadLetter,
    NewItem,
    NewOutput,
    NewPublication,
    NewTasks,
    Notice,
    PlainAttempt,
    Retried,
    Succeeded,
)
from conveyor.store.jobs import NewEvent
from conveyor.store.journal import CallAnswer
from conveyor.store.metrics import MetricIncrement
from conveyor.store.provenance import ProvenanceRow
from conveyor.store.provider_batch import BatchRequest, Parked, Waiter
from conveyor.store.reviews import AwaitingReview, Escalated, NewReview, Waiting


@dataclass(slots=True)
class Outcome:
    """What one attempt of one task came to, before it is committed."""

    task: ClaimedTask
    started: float
    duration: float
    invoked: bool
    output: Ref | None = None
    cached: bool = False
    failure: Failure | None = None
    usage: Usage | None = None
    stale: bool = False  # answered from an output that other code made under the same stage version
    value: Any = None  # a publish stage's staged record (stages with ``into``), published as it commits
    verdict: Verdict | None = None  # what the acceptance boundary made of the answer (stages with ``accept``)
    candidate: Ref | None = None  # a refused answer, stored for a reviewer
    provenance: dict[str, list[str]] | None = None  # what made the output (runtime/provenance.py)
    released: bool = False  # its run was paused mid-attempt (budget, breaker): given back, attempt refunded
    # Model requests the attempt left to the provider batch lane (runtime/provider_batch.py): the task is parked
    # until they are answered, the attempt refunded.
    deferred: list[BatchRequest] | None = None
    direct_answers: list[tuple[str, str]] | None = None  # (custom_id, answer) of lane calls it made directly
    # An answer already waiting for review under the task's key: the task waits on it (no call, no second entry).
    waits: Waiting | None = None
    # The call journal (runtime/journal.py): answers of calls this attempt made, kept for the task's next attempt
    # whatever this one comes to; ``journaled``: the task had answers kept by earlier attempts (dropped as it ends).
    answers: list[CallAnswer] | None = None
    journaled: bool = False
    # A large group's batch and fold steps (runtime/groups.py): memo rows of their outputs, kept as it commits.
    steps: list[NewOutput] | None = None
    logs: AttemptLog | None = None  # what the stage logged through ``ctx.log``, written with the attempt's row
    unrepaired: str | None = None  # the answer's text before the acceptance boundary repaired its format


@dataclass
class Writes:
    """Every row one commit writes, prepared before its transaction opens."""

    succeeded: list[Succeeded] = field(default_factory=list)
    retry: list[Retried] = field(default_factory=list)
    ended: list[Ended] = field(default_factory=list)
    outputs: list[NewOutput] = field(default_factory=list)
    dead: list[NewDeadLetter] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    plain_attempts: list[PlainAttempt] = field(default_factory=list)
    tasks: NewTasks = field(default_factory=NewTasks)
    items: list[NewItem] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)  # joins and gathers decided in the transaction
    notices: list[Notice] = field(default_factory=list)
    publications: list[NewPublication] = field(default_factory=list)
    escalated: list[Escalated] = field(default_factory=list)
    awaiting: list[AwaitingReview] = field(default_factory=list)
    reviews: list[NewReview] = field(default_factory=list)
    provenance: list[ProvenanceRow] = field(default_factory=list)
    released: list[Lease] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)  # of jobs (runtime/transitions/events.py)
    job_runs: set[str] = field(default_factory=set)  # jobs whose end may come with this commit
    now: float = 0.0  # when the commit was prepared
    tally: list[MetricIncrement] = field(default_factory=list)  # what it adds to the metrics' running totals
    parked: list[Parked] = field(default_factory=list)  # tasks waiting for provider batch answers
    batch_requests: list[BatchRequest] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    direct_answers: list[tuple[str, str]] = field(default_factory=list)
    joined: list[tuple[str, str]] = field(default_factory=list)  # (key, run) of tasks that joined a waiting answer
    reviewed_keys: set[str] = field(default_factory=set)  # keys whose answer this commit sends to review
    call_answers: list[CallAnswer] = field(default_factory=list)  # kept for the tasks' next attempts
    steps: list[NewOutput] = field(default_factory=list)  # memo rows of large groups' steps (insert-or-ignore)
    forget_calls: list[int] = field(default_factory=list)  # tasks that ended: their journal goes
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def fenced(self) -> int:
        return (len(self.succeeded) + len(self.retry) + len(self.ended) + len(self.escalated) + len(self.awaiting)
                + len(self.released) + len(self.parked))


@dataclass(frozen=True)
class Claim:
    """What a commit may claim for its worker in the same transaction."""

    pipeline: str
    stages: Sequence[str]  # in claim order: later stages first
    limit: int
    owner: str
    lease_seconds: float
    run_id: str | None = None
    caps: Mapping[str, int] | None = None  # at most this many of a stage
    paused: tuple[str, ...] = ()  # runs whose tasks at ``paused_stages`` may not be claimed
    paused_stages: frozenset[str] | None = None  # the stages that call models (None: every stage)
    # How many tasks the commit's own successes create that it may lease as they are created (None: ``limit``).
    # A fork (a stage followed by two, a fan-out) makes more tasks than it settles; taken within the worker's
    # in-flight bound, they skip a queue round trip, and a join's parents stay together (issue 28 point 6).
    fresh_limit: int | None = None

    def holds_back(self, run_id: str, stage: str) -> bool:
        """A task of a paused run at a stage that calls models is left queued."""
        return run_id in self.paused and (self.paused_stages is None or stage in self.paused_stages)

    def cap(self, stage: str) -> int:
        return self.limit if self.caps is None else self.caps.get(stage, self.limit)

    @property
    def fresh_room(self) -> int:
        return self.limit if self.fresh_limit is None else max(self.limit, self.fresh_limit)


class LeaseLost(Exception):
    """A fenced update missed: some lease was lost since the commit was prepared."""


class ReviewTaken(Exception):
    """The review entry was decided by someone else first (or its task no longer awaits review)."""


class MemoTaken(Exception):
    """Another worker memoised some of these task keys first (the same work, done twice at once)."""


def _first_per_key(outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
    """Outcomes of one task key in one batch end with one result, the first: a later one takes it as
    answered (the memo keeps one output per key, and every item must build on that one)."""
    first: dict[str, Outcome] = {}
    result: list[Outcome] | None = None
    for index, o in enumerate(outcomes):
        if o.cached or (o.output is None and not _memoised(o.failure)):
            continue
        winner = first.setdefault(o.task.task_key, o)
        if winner is o:
            continue
        result = result if result is not None else list(outcomes)
        result[index] = Outcome(o.task, o.started, o.duration, o.invoked, winner.output, cached=True,
                                failure=winner.failure, usage=o.usage, provenance=winner.provenance)
    return outcomes if result is None else result


def _memoised(failure: Failure | None) -> bool:
    """A failure that is stored in the memo like an output (a refusal decided by the input)."""
    return failure is not None and not failure.retryable and failure.deterministic


def _full(failure: Failure) -> str:
    return f"{failure.message}\n{failure.detail}".strip()
