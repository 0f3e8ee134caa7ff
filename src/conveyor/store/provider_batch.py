"""The provider batch lane's rows: model requests parked for a provider's Batch API, the tasks waiting on them,
the batch files made of them, and the lease of the one keeper per pipeline that packs and polls them.

A parked task stays ``queued`` (open, counted as before) but holds no lease and is not claimable before its
request's deadline (``available_at``); when its request settles, ``available_at`` becomes now and the stage
runs again, answered from the stored result. Its deferred attempt is recorded and refunded, as a release is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.queuecounts import OpenTally, QueueCountQueries

SETTLED = ("answered", "failed", "direct")
CHUNK = 500


class BatchRequest(NamedTuple):
    custom_id: str
    pipeline: str
    stage: str
    model: str
    body: str
    max_tries: int
    created_at: float
    deadline_at: float


class Waiter(NamedTuple):
    custom_id: str
    task_id: int
    run_id: str
    created_at: float


class Parked(NamedTuple):
    """A leased task given back to wait for its requests: not claimable before ``available_at``."""

    available_at: float
    task_id: int
    lease_token: int


class RequestState(NamedTuple):
    custom_id: str
    state: str
    answer: str | None
    error_class: str | None
    error: str | None
    deadline_at: float


class PendingRequest(NamedTuple):
    custom_id: str
    body: str
    tries: int
    deadline_at: float


class PendingGroup(NamedTuple):
    """The pending requests of one model: how many, the oldest and the newest request time."""

    model: str
    requests: int
    oldest: float
    newest: float


class ProviderBatch(NamedTuple):
    id: int
    pipeline: str
    provider: str
    model: str
    tag: str
    provider_batch_id: str | None
    state: str
    status: str | None
    requests: int
    bytes: int
    create_tries: int
    created_at: float
    submitted_at: float | None
    next_poll_at: float | None
    polls: int
    ended_at: float | None
    answered: int
    failed: int
    retried: int
    direct: int


class Settled(NamedTuple):
    """What became of one request of a batch: ``state`` answered, failed, direct, or pending (batched again)."""

    custom_id: str
    state: str
    answer: str | None = None
    error_class: str | None = None
    error: str | None = None


BATCH_COLUMNS = ", ".join(ProviderBatch._fields)

PARK = """
UPDATE tasks SET status = 'queued', attempts = attempts - 1, lease_owner = NULL, lease_expires_at = NULL,
    available_at = ? WHERE id = ? AND lease_token = ? AND status = 'running'
"""


def _marks(n: int) -> str:
    return ",".join("?" * n)


class ProviderBatchQueries(QueueCountQueries):
    db: Dialect

    # --- parking (inside a commit's transaction) ---------------------------

    def park_tasks(self, parked: Sequence[Parked]) -> int:
        """Give leased tasks back to wait for their requests (fenced); returns the rows changed."""
        return self.db.update_many(PARK, list(parked)) if parked else 0

    def add_batch_requests(self, requests: Sequence[BatchRequest], waiters: Sequence[Waiter], now: float,
                           opened: OpenTally, direct_answers: Sequence[tuple[str, str]] = ()) -> None:
        """Record requests (one already recorded is kept) and who waits on them, and the answers of requests
        called directly (kept for the stage's next run); a waiter whose request is settled already (another
        task asked the same) is woken at once (its move counted in ``opened``, which the caller writes)."""
        self.db.executemany("UPDATE provider_batch_requests SET state = 'answered', answer = ?, settled_at = ? "
                            "WHERE custom_id = ?", [(answer, now, key) for key, answer in direct_answers])
        self.db.executemany(
            "INSERT INTO provider_batch_requests (custom_id, pipeline, stage, model, body, max_tries, created_at, "
            "deadline_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending') ON CONFLICT (custom_id) DO NOTHING",
            list(requests))
        self.db.executemany("INSERT INTO provider_batch_waiters (custom_id, task_id, run_id, created_at) "
                            "VALUES (?, ?, ?, ?) ON CONFLICT (custom_id, task_id) DO NOTHING", list(waiters))
        ids = sorted({w.custom_id for w in waiters})
        for i in range(0, len(ids), CHUNK):
            part = ids[i:i + CHUNK]
            self._due_now(
                f"id IN (SELECT w.task_id FROM provider_batch_waiters w JOIN provider_batch_requests r ON "
                f"r.custom_id = w.custom_id WHERE r.state IN {SETTLED!r} AND w.custom_id IN ({_marks(len(part))}))",
                part, now, opened)

    def batch_answers(self, task_ids: Sequence[int]) -> dict[int, list[RequestState]]:
        """The requests each task waited on, with what became of them."""
        found: dict[int, list[RequestState]] = {}
        for i in range(0, len(task_ids), CHUNK):
            part = list(task_ids[i:i + CHUNK])
            rows = self.db.execute(
                f"SELECT w.task_id, r.custom_id, r.state, r.answer, r.error_class, r.error, r.deadline_at "
                f"FROM provider_batch_waiters w JOIN provider_batch_requests r ON r.custom_id = w.custom_id "
                f"WHERE w.task_id IN ({_marks(len(part))})", part)
            for task_id, *rest in rows:
                found.setdefault(int(task_id), []).append(RequestState(*rest))
        return found

    def forget_batch_requests(self, task_ids: Sequence[int]) -> None:
        """Ended tasks' waits, and those of their requests that are settled (a request still in a batch stays:
        the batch answers it, for any other task waiting on it)."""
        for i in range(0, len(task_ids), CHUNK):
            part = list(task_ids[i:i + CHUNK])
            marks = _marks(len(part))
            self.db.execute(
                f"DELETE FROM provider_batch_requests WHERE state IN {SETTLED!r} AND custom_id IN "
                f"(SELECT custom_id FROM provider_batch_waiters WHERE task_id IN ({marks}))", part)
            self.db.execute(f"DELETE FROM provider_batch_waiters WHERE task_id IN ({marks})", part)

    # --- the keeper ---------------------------------------------------------

    def take_batch_keeper(self, pipeline: str, owner: str, now: float, until: float) -> bool:
        """Take or renew the lease on keeping ``pipeline``'s provider batches; False while another holds it."""
        rows = self.db.execute(
            "INSERT INTO provider_batch_keepers (pipeline, owner, until) VALUES (?, ?, ?) ON CONFLICT (pipeline) "
            "DO UPDATE SET owner = excluded.owner, until = excluded.until WHERE provider_batch_keepers.owner = "
            "excluded.owner OR provider_batch_keepers.until < ? RETURNING owner", (pipeline, owner, until, now))
        return bool(rows)

    def drop_batch_keeper(self, pipeline: str, owner: str) -> None:
        self.db.execute("DELETE FROM provider_batch_keepers WHERE pipeline = ? AND owner = ?", (pipeline, owner))

    def pending_groups(self, pipeline: str) -> list[PendingGroup]:
        rows = self.db.execute(
            "SELECT model, COUNT(*), MIN(created_at), MAX(created_at) FROM provider_batch_requests "
            "WHERE pipeline = ? AND state = 'pending' GROUP BY model ORDER BY model", (pipeline,))
        return [PendingGroup(str(m), int(n), float(a), float(b)) for m, n, a, b in rows]

    def pending_requests(self, pipeline: str, model: str, limit: int) -> list[PendingRequest]:
        rows = self.db.execute(
            "SELECT custom_id, body, tries, deadline_at FROM provider_batch_requests WHERE pipeline = ? "
            "AND model = ? AND state = 'pending' ORDER BY created_at, custom_id LIMIT ?", (pipeline, model, limit))
        return [PendingRequest(*r) for r in rows]

    def pack_batch(self, batch: ProviderBatch, custom_ids: Sequence[str]) -> int:
        """Record a batch file about to be created (state ``creating``, its tag known) and move its requests
        into it, in one transaction; returns its row id."""
        with self.db.transaction():
            rows = self.db.execute(
                "INSERT INTO provider_batches (pipeline, provider, model, tag, state, requests, bytes, created_at) "
                "VALUES (?, ?, ?, ?, 'creating', ?, ?, ?) RETURNING id",
                (batch.pipeline, batch.provider, batch.model, batch.tag, batch.requests, batch.bytes,
                 batch.created_at))
            batch_id = int(rows[0][0])
            moved = self.db.executemany_count(
                "UPDATE provider_batch_requests SET state = 'packed', batch_id = ?, tries = tries + 1 "
                "WHERE custom_id = ? AND state = 'pending'", [(batch_id, c) for c in custom_ids])
            if moved != len(custom_ids):
                raise RuntimeError(f"provider batch {batch.tag}: {len(custom_ids) - moved} requests were packed "
                                   "by another keeper")
        return batch_id

    def open_batches(self, pipeline: str) -> list[ProviderBatch]:
        """Batches not ended yet: being created, or submitted."""
        rows = self.db.execute(f"SELECT {BATCH_COLUMNS} FROM provider_batches WHERE pipeline = ? AND state <> "
                               "'ended' ORDER BY id", (pipeline,))
        return [ProviderBatch(*r) for r in rows]

    def note_create_try(self, batch_id: int) -> None:
        self.db.execute("UPDATE provider_batches SET create_tries = create_tries + 1 WHERE id = ?", (batch_id,))

    def record_submitted(self, batch_id: int, provider_batch_id: str, status: str, now: float,
                         next_poll_at: float) -> None:
        """The provider's id of a batch just created (or adopted): from now on it is polled, never created."""
        self.db.execute(
            "UPDATE provider_batches SET provider_batch_id = ?, state = 'submitted', status = ?, submitted_at = ?, "
            "next_poll_at = ? WHERE id = ? AND provider_batch_id IS NULL", (provider_batch_id, status, now,
                                                                            next_poll_at, batch_id))

    def note_poll(self, batch_id: int, status: str, next_poll_at: float) -> None:
        self.db.execute("UPDATE provider_batches SET status = ?, next_poll_at = ?, polls = polls + 1 WHERE id = ?",
                        (status, next_poll_at, batch_id))

    def packed_bodies(self, batch_id: int) -> list[tuple[str, str, int]]:
        """(custom_id, body, tries) of the requests of a batch, in the order its file lists them."""
        rows = self.db.execute("SELECT custom_id, body, tries FROM provider_batch_requests WHERE batch_id = ? "
                               "AND state = 'packed' ORDER BY custom_id", (batch_id,))
        return [(str(c), str(b), int(t)) for c, b, t in rows]

    def packed_requests(self, batch_id: int) -> list[tuple[str, int, int]]:
        """(custom_id, tries, max_tries) of the requests still in a batch."""
        rows = self.db.execute("SELECT custom_id, tries, max_tries FROM provider_batch_requests WHERE batch_id = ? "
                               "AND state = 'packed'", (batch_id,))
        return [(str(c), int(t), int(m)) for c, t, m in rows]

    def settle_requests(self, settled: Sequence[Settled], now: float, batch_id: int | None = None,
                        status: str = "") -> int:
        """Store what became of requests, in one transaction: answers, failures, requests sent back to be
        batched again (``pending``) or to be called directly; wake the tasks waiting on the settled ones; with
        ``batch_id``, end that batch. Returns the tasks woken."""
        counts = {state: sum(1 for s in settled if s.state == state) for state in ("answered", "failed", "direct")}
        with self.db.transaction():
            self.db.executemany(
                "UPDATE provider_batch_requests SET state = ?, answer = ?, error_class = ?, error = ?, "
                "settled_at = ?, batch_id = NULL WHERE custom_id = ? AND state IN ('pending', 'packed')",
                [(s.state, s.answer, s.error_class, s.error, None if s.state == "pending" else now, s.custom_id)
                 for s in settled])
            woken = self._wake([s.custom_id for s in settled if s.state != "pending"], now)
            if batch_id is not None:
                self.db.execute(
                    "UPDATE provider_batches SET state = 'ended', status = ?, ended_at = ?, answered = ?, failed = ?, "
                    "direct = ?, retried = ? WHERE id = ?", (status, now, counts["answered"], counts["failed"],
                                                              counts["direct"], len(settled) - sum(counts.values()),
                                                              batch_id))
        return woken

    def _wake(self, custom_ids: Sequence[str], now: float) -> int:
        woken, opened = 0, OpenTally()
        for i in range(0, len(custom_ids), CHUNK):
            part = list(custom_ids[i:i + CHUNK])
            woken += self._due_now(
                f"available_at > ? AND id IN (SELECT task_id FROM provider_batch_waiters WHERE custom_id IN "
                f"({_marks(len(part))}))", [now, *part], now, opened)
        self.add_open_tasks(opened)
        if woken:
            self.db.notify()
        return woken

    def _due_now(self, condition: str, params: Sequence[object], now: float, opened: OpenTally) -> int:
        """Make the queued tasks that meet ``condition`` runnable now; their move between seconds is counted in
        ``opened`` (the queue's counts, store/queuecounts.py), so they are read first, locked."""
        rows = self.db.execute(f"SELECT id, pipeline, stage, available_at FROM tasks WHERE status = 'queued' AND "
                               f"{condition}{self.db.row_lock}", list(params))
        if not rows:
            return 0
        self.db.execute(f"UPDATE tasks SET available_at = ? WHERE id IN ({_marks(len(rows))})",
                        (now, *(r[0] for r in rows)))
        for _, pipeline, stage, available_at in rows:
            opened.move(str(pipeline), str(stage), float(available_at), now)
        return len(rows)

    def overdue_requests(self, pipeline: str, now: float) -> list[str]:
        """Pending requests past their deadline: called directly instead."""
        rows = self.db.execute("SELECT custom_id FROM provider_batch_requests WHERE pipeline = ? AND state = "
                               "'pending' AND deadline_at <= ?", (pipeline, now))
        return [str(r[0]) for r in rows]

    # --- reading --------------------------------------------------------------

    def provider_batches(self, pipeline: str | None = None, limit: int = 100) -> list[ProviderBatch]:
        where, params = ("WHERE pipeline = ? ", [pipeline]) if pipeline else ("", [])
        rows = self.db.execute(f"SELECT {BATCH_COLUMNS} FROM provider_batches {where}ORDER BY id DESC LIMIT ?",
                               [*params, limit])
        return [ProviderBatch(*r) for r in rows]

    def batch_request_states(self, pipeline: str | None = None) -> dict[str, int]:
        where, params = ("WHERE pipeline = ? ", [pipeline]) if pipeline else ("", [])
        rows = self.db.execute(f"SELECT state, COUNT(*) FROM provider_batch_requests {where}GROUP BY state", params)
        return {str(s): int(n) for s, n in rows}

    def waiting_tasks(self, run_id: str) -> dict[str, int]:
        """Tasks of a run parked on requests not settled yet, by stage. A run with none parked (most runs: every
        `conveyor status` asks) is told by the waiters alone, which hold only the tasks parked now, instead of a
        walk over every task of the run."""
        if not self.db.execute("SELECT 1 FROM provider_batch_waiters WHERE run_id = ? LIMIT 1", (run_id,)):
            return {}
        rows = self.db.execute(
            "SELECT t.stage, COUNT(DISTINCT t.id) FROM tasks t JOIN provider_batch_waiters w ON w.task_id = t.id "
            "JOIN provider_batch_requests r ON r.custom_id = w.custom_id WHERE t.run_id = ? AND w.run_id = ? "
            "AND t.status = 'queued' AND r.state IN ('pending', 'packed') GROUP BY t.stage", (run_id, run_id))
        return {str(s): int(n) for s, n in rows}
