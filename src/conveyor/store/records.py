"""Frozen records that cross the store boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    AWAITING_REVIEW = "awaiting_review"  # its answer waits for people; no lease is held
    REJECTED = "rejected"  # a reviewer (or a review deadline) refused its answer
    # Replaced: a replay re-opened a task before it on its item, so it waits to be made again from the new
    # input (the successor that commit creates takes its row); it is no part of the item's outcome until then.
    SUPERSEDED = "superseded"


OPEN_STATUSES = (TaskStatus.QUEUED.value, TaskStatus.RUNNING.value)
# Runs whose submission did not finish: being submitted, or abandoned and waiting to be resumed.
UNFINISHED_RUNS = ("submitting", "abandoned")

# A fan-out child's key is its parent's key, this mark and its index ("doc.pdf¶3"). Root keys never hold
# the mark (service/inputs.py refuses or escapes it), so no root can take a child's key; and a root's
# descendants sort in one range, from "<root>¶" up to "<root>" + the mark's successor.
CHILD_MARK = "\u00b6"
CHILD_RANGE_END = chr(ord(CHILD_MARK) + 1)


class NewTasks:
    """Task rows to insert, by shape. Each shape's statement writes NULL itself for the columns it
    does not bind, because sqlite3 binds ``None`` (and ``bytes``) through a slow adaptation path:
    a row of the old one-shape statement took twice as long to bind as it does now.

    Rows are plain tuples, in these column orders (``now`` is the creation time):

    - ``queued``: run_id, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash,
      input_digest, input_kind, input_inline, input_size, max_attempts, lane_rank, now (available_at), now,
      siblings (on a fan-out child's item, how many children its parent's fan-out made; else 0)
    - ``running``: a queued row followed by lease_owner, lease_expires_at, now (started_at): claimed as it is
      created, by the worker that created it (attempt 1, lease token 1), so it never waits in the queue
    - ``cached``: run_id, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash,
      input_digest, input_kind, input_size, output_digest, output_kind, max_attempts, lane_rank, now, now, now,
      siblings: answered from the memo, succeeded at once, without a copy of its input
    - ``failed``: run_id, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash,
      input_digest, input_kind, input_inline, input_size, error_class, last_error, max_attempts, lane_rank,
      now, now, now, siblings: a refusal answered from the memo; it keeps its input so it may be requeued
    - ``bad``: run_id, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash,
      input_digest, input_kind, input_size, error_class, last_error, max_attempts, lane_rank, now, now, now:
      the root task of an item whose source could not be read (bad_input), failed without an attempt (a root's
      task: its siblings are 0, written by the statement)
    """

    __slots__ = ("bad", "cached", "failed", "provenance", "queued", "running")

    def __init__(self) -> None:
        self.queued: list[tuple[Any, ...]] = []
        self.running: list[tuple[Any, ...]] = []
        self.cached: list[tuple[Any, ...]] = []
        self.failed: list[tuple[Any, ...]] = []
        self.bad: list[tuple[Any, ...]] = []
        # Provenance rows (store/provenance.py ProvenanceRow) of the tasks answered from the memo: the
        # provenance of the output they reuse.
        self.provenance: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.queued) + len(self.running) + len(self.cached) + len(self.failed) + len(self.bad)


# The hot records are NamedTuples whose fields follow their table's column order,
# so a batch of them goes to executemany as it is, without a copy per row.


class NewItem(NamedTuple):
    run_id: str
    item_key: str
    parent_key: str | None
    root_key: str
    source_digest: str | None
    source_size: int | None
    created_at: float


# Rows of the fenced transitions (store/tasks.py): each field in the order its statement binds it, the
# task's id and lease token last, for the fence ``WHERE id = ? AND lease_token = ? AND status = 'running'``.

# The leased tasks, as the partial index ``tasks_leased`` is defined (migration 18): statements that scan or count
# them say this, so they read that index. A running task always has a lease expiry; the second term is there so
# that a statement naming one task (the fence above: ``id = ? ... AND status = 'running'``) cannot be served
# from the index, only from the primary key, whatever the planner's statistics say. Before it, PostgreSQL with
# stale statistics (autovacuum off, an ANALYZE that sampled no running task) judged the index empty and walked
# every leased task for each fenced update: lease renewals of 44 s at 2.4 million tasks.
LEASED = "status = 'running' AND lease_expires_at IS NOT NULL"
# An open task, by the partial index that holds it: runnable, suspect (in flight when its worker died), leased.
OPEN_STATES = ("status = 'queued' AND crashes = 0", "status = 'queued' AND crashes > 0", LEASED)


def declared_filter(declared: Mapping[str, tuple[str, str]] | None) -> tuple[str, list[Any]]:
    """A condition on tasks made under these declarations of their stages ({stage: (version, config hash)};
    None: any declaration)."""
    if declared is None:
        return "", []
    if not declared:
        return "AND 1 = 0", []
    ors = " OR ".join("(stage = ? AND stage_version = ? AND config_hash = ?)" for _ in declared)
    return f"AND ({ors})", [v for stage, (version, config) in declared.items() for v in (stage, version, config)]


def open_probes(declared: Mapping[str, tuple[str, str]] | None) -> list[tuple[str, str, list[Any]]]:
    """(state, condition, parameters) probes that find an open task under ``declared``, each served by one
    partial index: the runnable one probed stage by stage, so a backlog of another declaration is not read."""
    if declared is None:
        return [(state, "", []) for state in OPEN_STATES]
    runnable = [(OPEN_STATES[0], "AND stage = ? AND stage_version = ? AND config_hash = ?", [stage, *pair])
                for stage, pair in declared.items()]
    only, among = declared_filter(declared)
    return [*runnable, *((state, only, among) for state in OPEN_STATES[1:])]


class Lease(NamedTuple):
    """A task a worker holds, and the token that proves it."""

    task_id: int
    lease_token: int


class Succeeded(NamedTuple):
    output_digest: str
    output_kind: str
    cached: int
    finished_at: float
    task_id: int
    lease_token: int


class Retried(NamedTuple):
    available_at: float
    error_class: str
    message: str
    task_id: int
    lease_token: int


class Ended(NamedTuple):
    """A task that ends here: ``status`` is ``failed`` or ``dead_lettered``."""

    status: str
    error_class: str
    message: str
    finished_at: float
    cached: int
    task_id: int
    lease_token: int


class Crashed(NamedTuple):
    """A task whose worker died, its attempt spent: queued again (``suspect``: 1 to run alone from now on)."""

    available_at: float
    message: str
    suspect: int
    task_id: int
    lease_token: int


class NewDeadLetter(NamedTuple):
    task_id: int
    run_id: str
    item_key: str
    stage: str
    error_class: str
    error: str
    attempts: int
    created_at: float


class PlainAttempt(NamedTuple):
    """An attempt that succeeded without a provider call: the common row, with no NULL to bind."""

    task_id: int
    run_id: str
    attempt: int
    outcome: str
    invoked: int
    worker: str
    lease_token: int
    stage_version: str
    code_version: str  # the fingerprint of the stage's code (runtime/fingerprint.py)
    started_at: float
    duration: float
    config_hash: str


class Notice(NamedTuple):
    """Something a run should tell its user once per stage (kind ``stale_code``); counts add up."""

    run_id: str
    kind: str
    stage: str
    version: str
    code: str | None
    answers: int  # the tasks it is about (the `count` column)
    created_at: float



class StoredOutput(NamedTuple):
    task_key: str
    stage: str
    kind: str
    digest: str
    inline: bytes | None
    size: int
    code: str | None = None  # the fingerprint of the stage code that made it
    provenance: str | None = None  # its provenance document, JSON (runtime/provenance.py)


class NewOutput(NamedTuple):
    """A memo row to insert: the output of a task key (or a settled failure)."""

    task_key: str
    stage: str
    kind: str
    digest: str
    inline: bytes | None
    size: int
    run_id: str
    created_at: float
    code: str | None = None  # the fingerprint of the stage code that made it
    provenance: str | None = None  # its provenance document, JSON (runtime/provenance.py)


class NewPublication(NamedTuple):
    """One item's record to publish into the built-in target, in the commit that ends its publish task."""

    collection: str
    item_key: str
    pipeline: str
    run_id: str
    task_id: int
    digest: str  # the staged record's digest: publishing the live version's digest again changes nothing
    fields: str  # the record row, JSON
    text: str  # its full-text entry
    vectors: list[list[float]]
    created_at: float
    vector_model: str | None = None  # the embedding model that made ``vectors`` (Record.embedding_model)


class ClaimedTask(NamedTuple):
    id: int
    run_id: str
    stage: str
    item_key: str
    root_key: str
    task_key: str
    input_digest: str
    input_kind: str
    input_inline: bytes | None
    input_size: int
    attempts: int
    max_attempts: int
    lease_token: int
    lane_rank: int = 1
    tier: int = 0  # the escalation tier it runs at (conveyor.acceptance)
    available_at: float = 0.0  # when it became runnable (its second is where the queue's counts hold it)
    siblings: int = 0  # on a fan-out child's item: how many children its parent's fan-out made (0: none known)


class AttemptRecord(NamedTuple):
    task_id: int
    run_id: str
    attempt: int
    outcome: str
    invoked: int
    error_class: str | None
    message: str | None
    worker: str | None
    lease_token: int | None
    stage_version: str | None
    code_version: str | None
    started_at: float | None
    duration: float | None
    provider_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    model: str | None = None
    prompt_version: str | None = None
    unpriced_calls: int = 0
    tier: int | None = None  # the escalation tier of an attempt judged by an acceptance boundary
    repaired: int | None = None  # 1: its answer's format was repaired before it was judged
    confidence: float | None = None  # the answer's confidence, when the stage declares one
    config_hash: str | None = None  # the stage's config hash when it ran (a replay may re-key the task)
    provenance: str | None = None  # its provenance document, JSON (runtime/provenance.py)
    logs: str | None = None  # the lines the stage logged through ctx.log, JSON (runtime/attemptlog.py)
    logs_dropped: int = 0  # lines logged past the attempt's bound, counted, not kept
    unrepaired: str | None = None  # the answer's text before its format was repaired (repaired = 1), cut


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    id: int
    run_id: str
    item_key: str
    stage: str
    attempts: int
    max_attempts: int
    lease_token: int
    lease_owner: str | None
    crashes: int
    root_key: str = ""  # the item's root (its trace lives there: store/traces.py)
    started_at: float | None = None  # when the attempt was claimed
    available_at: float = 0.0  # when it became runnable (store/queuecounts.py)
    error_class: str | None = None  # its last failure's (lease_expired: it died with its worker last time too)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    pipeline: str
    target: str
    input: str
    status: str
    expected: int
    has_publish: bool
    stages: str
    created_at: float
    submitted_at: float | None
    finished_at: float | None
    lane: str = "bulk"
    submitter: str | None = None  # who holds the submission, while it is under way
    heartbeat_at: float | None = None  # the submitter's last sign of life (the store's clock)
    note: str | None = None  # why a submission stopped (status "abandoned"), or why the run is paused
    budget_usd: float | None = None  # the ceiling on its provider spending (None: none)
    spent_usd: float = 0.0  # what its settled provider calls cost (kept only while it has a budget)
    reserved_usd: float = 0.0  # what its calls in flight reserve
    paused: str | None = None  # "budget" or "breaker": none of its tasks is claimed until it is resumed
    params: str | None = None  # its run parameters as canonical JSON (conveyor.pipeline.params); None: none


@dataclass(frozen=True)
class DeadLetter:
    id: int
    task_id: int
    run_id: str
    item_key: str
    stage: str
    error_class: str | None
    error: str | None
    attempts: int
    created_at: float
    replayed_at: float | None
    replay_reason: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "task_id": self.task_id, "run_id": self.run_id, "item_key": self.item_key,
            "stage": self.stage, "error_class": self.error_class, "error": self.error,
            "attempts": self.attempts, "dead_lettered_at": self.created_at,
            "replayed_at": self.replayed_at, "replay_reason": self.replay_reason,
        }
