"""The review queue: answers waiting for people, and the decisions taken on them.

A task whose answer goes to review leaves ``running`` for ``awaiting_review`` in the commit that ends its
attempt (fenced by its lease like every transition), with its review entry beside it; from then on no
lease is held. A decision changes the task only while it is still ``awaiting_review`` and the entry only
while it is undecided, so two reviewers (or a reviewer and the deadline) cannot both decide it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import ClaimedTask
from conveyor.store.tasks import CLAIM_COLUMNS, FENCE

REVIEW_COLUMNS = (
    "id, task_id, run_id, pipeline, item_key, stage, reason_class, reason, confidence, tier, candidate_kind, "
    "candidate_digest, candidate_inline, candidate_size, deadline_at, on_deadline, created_at, decided_at, "
    "decision, decided_by, why, edits"
)


# The entries the tasks of a run (?) wait on: the entry of each task awaiting review under one of their keys.
WAITED_ON_BY_RUN = ("task_id IN (SELECT w.id FROM tasks w WHERE w.status = 'awaiting_review' AND w.task_key IN "
                    "(SELECT t.task_key FROM tasks t WHERE t.run_id = ? AND t.status = 'awaiting_review'))")


class AwaitingReview(NamedTuple):
    """A leased task whose answer goes to review (fenced by its lease)."""

    error_class: str
    message: str
    output_digest: str
    output_kind: str
    task_id: int
    lease_token: int


class Escalated(NamedTuple):
    """A leased task whose answer was refused: queued again at a stronger tier, at once (fenced)."""

    tier: int
    available_at: float
    error_class: str
    message: str
    task_id: int
    lease_token: int


class Waiting(NamedTuple):
    """An answer waiting for review under a task key: what another task with that key waits on."""

    error_class: str
    message: str
    output_digest: str
    output_kind: str


class NewReview(NamedTuple):
    task_id: int
    run_id: str
    pipeline: str
    item_key: str
    stage: str
    reason_class: str
    reason: str
    confidence: float | None
    tier: int
    candidate_kind: str
    candidate_digest: str
    candidate_inline: bytes | None
    candidate_size: int
    deadline_at: float
    on_deadline: str
    created_at: float


@dataclass(frozen=True)
class ReviewEntry:
    id: int
    task_id: int
    run_id: str
    pipeline: str
    item_key: str
    stage: str
    reason_class: str
    reason: str | None
    confidence: float | None
    tier: int
    candidate_kind: str
    candidate_digest: str
    candidate_inline: bytes | None
    candidate_size: int
    deadline_at: float
    on_deadline: str
    created_at: float
    decided_at: float | None
    decision: str | None
    decided_by: str | None
    why: str | None
    edits: str | None

    @property
    def open(self) -> bool:
        return self.decided_at is None


MARK_AWAITING_REVIEW = f"""
UPDATE tasks SET status = 'awaiting_review', error_class = ?, last_error = ?, output_digest = ?, output_kind = ?,
    lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

# A tier is a fresh try: its attempts are counted from 0 again (each attempt row records its tier).
MARK_ESCALATED = f"""
UPDATE tasks SET status = 'queued', tier = ?, available_at = ?, error_class = ?, last_error = ?, attempts = 0,
    lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

INSERT_REVIEW = """
INSERT INTO reviews (task_id, run_id, pipeline, item_key, stage, reason_class, reason, confidence, tier,
    candidate_kind, candidate_digest, candidate_inline, candidate_size, deadline_at, on_deadline, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

AWAITING = "WHERE id = ? AND status = 'awaiting_review'"


class ReviewQueries:
    db: Dialect

    # --- the worker's side: answers that go to review or to a stronger tier (fenced) ----------------

    def mark_awaiting_review(self, rows: Sequence[AwaitingReview]) -> int:
        return self.db.update_many(MARK_AWAITING_REVIEW, rows)

    def mark_escalated(self, rows: Sequence[Escalated]) -> int:
        return self.db.update_many(MARK_ESCALATED, rows)

    def insert_reviews(self, rows: Sequence[NewReview]) -> None:
        self.db.executemany(INSERT_REVIEW, rows)

    def waiting_answers(self, task_keys: Sequence[str]) -> dict[str, list[tuple[str, Waiting]]]:
        """The answers waiting for review under an undecided entry, for any of ``task_keys``, with the run of each
        entry's task, oldest first: a task with such a key waits on one instead of asking the model again. (Tasks
        that wait with no entry of their own are not waited on: a replay that closed the entry they waited on runs
        the task again, and its new entry's decision settles them too.)"""
        found: dict[str, list[tuple[str, Waiting]]] = {}
        keys = list(dict.fromkeys(task_keys))
        for i in range(0, len(keys), self.db.in_chunk):
            condition, params = self.db.one_of("t.task_key", keys[i:i + self.db.in_chunk], "text")
            for key, run_id, *rest in self.db.execute(
                    "SELECT t.task_key, t.run_id, t.error_class, t.last_error, t.output_digest, t.output_kind "
                    "FROM tasks t JOIN reviews r ON r.task_id = t.id WHERE r.decided_at IS NULL AND "
                    f"t.status = 'awaiting_review' AND {condition} ORDER BY t.id", params):
                found.setdefault(str(key), []).append((str(run_id), Waiting(*rest)))
        return found

    def hold_open_reviews(self, task_keys: Sequence[str]) -> dict[str, set[str]]:
        """Of ``task_keys``, those still under an undecided entry, with the runs of those entries, the entries
        held until the transaction ends: a decision taken meanwhile waits for it, and then finds the tasks that
        joined the wait (Reviews.decide)."""
        keys = sorted(set(task_keys))
        held: dict[str, set[str]] = {}
        for i in range(0, len(keys), self.db.in_chunk):
            condition, params = self.db.one_of("t.task_key", keys[i:i + self.db.in_chunk], "text")
            for key, run_id in self.db.execute(
                    "SELECT t.task_key, t.run_id FROM reviews r JOIN tasks t ON t.id = r.task_id WHERE r.decided_at "
                    f"IS NULL AND t.status = 'awaiting_review' AND {condition}{self.db.row_lock}", params):
                held.setdefault(str(key), set()).add(str(run_id))
        return held

    def awaiting_under(self, task_key: str) -> list[ClaimedTask]:
        """Every task awaiting review under ``task_key`` (of any run), oldest first."""
        rows = self.db.execute(f"SELECT {CLAIM_COLUMNS} FROM tasks WHERE task_key = ? AND status = "
                               "'awaiting_review' ORDER BY id", (task_key,))
        return [ClaimedTask(*r) for r in rows]

    # --- reading the queue ----------------------------------------------------------------------------

    def reviews(self, run_id: str | None = None, stage: str | None = None, include_decided: bool = False,
                limit: int = 1000, after: int | None = None, reason_class: str | None = None) -> list[ReviewEntry]:
        """Review entries by id (those after id ``after``, when given: the next page). A run's entries are its own
        and those its tasks wait on: a task whose key waited for review already joined that entry (a re-run)."""
        clauses, params = _review_filters(run_id, stage, include_decided, reason_class)
        if after is not None:
            clauses.append("id > ?")
            params.append(after)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.db.execute(f"SELECT {REVIEW_COLUMNS} FROM reviews {where} ORDER BY id LIMIT ?", (*params, limit))
        return [ReviewEntry(*r) for r in rows]

    def review_reasons(self, run_id: str | None = None, stage: str | None = None) -> list[tuple[str, int]]:
        """(reason class, open entries) of the queue as ``reviews`` narrows it, the largest first."""
        clauses, params = _review_filters(run_id, stage, False, None)
        rows = self.db.execute(f"SELECT reason_class, COUNT(*) FROM reviews WHERE {' AND '.join(clauses)} "
                               "GROUP BY reason_class ORDER BY COUNT(*) DESC, reason_class", params)
        return [(str(r[0]), int(r[1])) for r in rows]

    def review(self, review_id: int) -> ReviewEntry | None:
        rows = self.db.execute(f"SELECT {REVIEW_COLUMNS} FROM reviews WHERE id = ?", (review_id,))
        return ReviewEntry(*rows[0]) if rows else None

    def due_reviews(self, pipeline: str, now: float, limit: int = 500, run_id: str | None = None
                    ) -> list[ReviewEntry]:
        """Undecided entries of ``pipeline`` (of one run, when given) whose deadline has passed, oldest deadline
        first (the partial index)."""
        scope, params = ("AND run_id = ? ", (run_id,)) if run_id is not None else ("", ())
        rows = self.db.execute(
            f"SELECT {REVIEW_COLUMNS} FROM reviews WHERE decided_at IS NULL AND pipeline = ? AND deadline_at <= ? "
            f"{scope}ORDER BY deadline_at LIMIT ?", (pipeline, now, *params, limit))
        return [ReviewEntry(*r) for r in rows]

    def due_review_counts(self, now: float, run_id: str | None = None) -> list[tuple[str, str, str, int]]:
        """(run id, pipeline, stage, count) of the undecided entries whose deadline has passed (of one run, when
        given), by run: what applying the deadlines would decide."""
        scope, params = ("AND run_id = ? ", (run_id,)) if run_id is not None else ("", ())
        rows = self.db.execute(
            "SELECT run_id, pipeline, stage, COUNT(*) FROM reviews WHERE decided_at IS NULL AND deadline_at <= ? "
            f"{scope}GROUP BY run_id, pipeline, stage ORDER BY run_id, stage", (now, *params))
        return [(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    def reviewed_task(self, task_id: int) -> ClaimedTask | None:
        """The task an entry is about, in the shape a commit plans successors from."""
        rows = self.db.execute(f"SELECT {CLAIM_COLUMNS} FROM tasks WHERE id = ?", (task_id,))
        return ClaimedTask(*rows[0]) if rows else None

    # --- decisions (each inside the caller's transaction) ---------------------------------------------

    def decide_review(self, review_id: int, decision: str, by: str, why: str | None, edits: str | None,
                      now: float) -> bool:
        """Record a decision on an undecided entry; False when it was decided already."""
        return self.db.execute_rowcount(
            "UPDATE reviews SET decided_at = ?, decision = ?, decided_by = ?, why = ?, edits = ? "
            "WHERE id = ? AND decided_at IS NULL", (now, decision, by, why, edits, review_id)) == 1

    def decide_reviews_of(self, task_ids: Sequence[int], decision: str, by: str, why: str | None,
                          edits: str | None, now: float) -> None:
        """The undecided entries of ``task_ids`` take a decision taken on another entry of their task key."""
        for task_id in task_ids:
            self.db.execute("UPDATE reviews SET decided_at = ?, decision = ?, decided_by = ?, why = ?, edits = ? "
                            "WHERE task_id = ? AND decided_at IS NULL", (now, decision, by, why, edits, task_id))

    def accept_reviewed(self, task_id: int, output_digest: str, output_kind: str, now: float) -> bool:
        return self.db.execute_rowcount(
            "UPDATE tasks SET status = 'succeeded', output_digest = ?, output_kind = ?, finished_at = ?, "
            f"input_inline = NULL, error_class = NULL, last_error = NULL {AWAITING}",
            (output_digest, output_kind, now, task_id)) == 1

    def reject_reviewed(self, task_id: int, message: str, now: float) -> bool:
        return self.db.execute_rowcount(
            f"UPDATE tasks SET status = 'rejected', error_class = 'rejected', last_error = ?, finished_at = ? "
            f"{AWAITING}", (message, now, task_id)) == 1

    def escalate_reviewed(self, task_id: int, tier: int, message: str, now: float) -> bool:
        return self.db.execute_rowcount(
            "UPDATE tasks SET status = 'queued', tier = ?, available_at = ?, error_class = 'review_deadline', "
            f"attempts = 0, last_error = ?, output_digest = NULL, output_kind = NULL {AWAITING}",
            (tier, now, message, task_id)) == 1

    def review_counts(self, run_id: str) -> dict[str, Any]:
        """Entries of a run: open, and decided by decision."""
        rows = self.db.execute("SELECT COALESCE(decision, 'open'), COUNT(*) FROM reviews WHERE run_id = ? "
                               "GROUP BY COALESCE(decision, 'open')", (run_id,))
        return {str(r[0]): int(r[1]) for r in rows}


def _review_filters(run_id: str | None, stage: str | None, include_decided: bool,
                    reason_class: str | None) -> tuple[list[str], list[str | int]]:
    clauses: list[str] = [] if include_decided else ["decided_at IS NULL"]
    params: list[str | int] = []
    if run_id is not None:
        clauses.append(f"(run_id = ? OR {WAITED_ON_BY_RUN})")
        params += [run_id, run_id]
    if stage is not None:
        clauses.append("stage = ?")
        params.append(stage)
    if reason_class is not None:
        clauses.append("reason_class = ?")
        params.append(reason_class)
    return clauses, params
