"""The memo answers only what it was asked: guard-dependent refusals follow the guard, one task key ends
with one output per batch, and a dead worker's tasks are judged per worker (both backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conveyor import Pipeline, Retry
from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.transitions import Outcome, Transitions
from conveyor.runtime.values import encode, store_value
from conveyor.service.inputs import SourceItem
from conveyor.service.submit import submit
from conveyor.store import SqlStore, open_store
from tests.helpers import reconciled, submit_and_work, write_pipeline

GUARDED = """
    import os
    from conveyor import Pipeline

    pipe = Pipeline("sized")

    @pipe.stage(max_input_bytes=int(os.environ["LIMIT"]))
    def parse(ctx, source: bytes) -> int:
        return len(source)
"""



def test_raising_a_guard_runs_again_what_the_old_guard_refused(tmp_path: Path, store_url: str) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"key": "small", "text": "x" * 10}) + "\n"
                        + json.dumps({"key": "large", "text": "x" * 300}) + "\n")

    def run(limit: int) -> dict[str, Any]:
        # A file per limit: a pipeline module is loaded once per process.
        target = write_pipeline(tmp_path, GUARDED.replace('int(os.environ["LIMIT"])', str(limit)), f"sized{limit}.py")
        return reconciled(store_url, submit_and_work(target, manifest, store_url, tmp_path / "blobs").run_id)

    first = run(100)
    assert first["outcomes"] == {"completed": 1, "failed": 1} and first["stage_calls"] == 1
    assert first["not_done"][0]["error_classes"] == ["input_too_large"]
    same = run(100)
    assert same["outcomes"] == {"completed": 1, "failed": 1} and same["stage_calls"] == 0, "nothing new to run"
    raised = run(1000)
    assert raised["outcomes"] == {"completed": 2} and raised["stage_calls"] == 1, "the larger item runs now"
    again = run(1000)
    assert again["outcomes"] == {"completed": 2} and again["stage_calls"] == 0
    lowered = run(100)
    assert lowered["outcomes"] == {"completed": 2}, "an output, once made, answers under any guard"


# --- one key, one output -----------------------------------------------------------------------------

TWIN = Pipeline("twins", lease_seconds=30, retry=Retry(max_attempts=3, max_attempts_by_class={"lease_expired": 1}))


@TWIN.stage
def first(ctx: Any, source: bytes) -> str:
    return source.decode()


@TWIN.stage(after=first)
def second(ctx: Any, text: str) -> str:
    return text


THRICE = Pipeline("thrice", lease_seconds=30, retry=Retry(max_attempts=3))


@THRICE.stage(name="first")
def thrice_first(ctx: Any, source: bytes) -> str:
    return source.decode()


T0 = 1_700_000_000.0


def _store_with(store_url: str, tmp_path: Path, items: list[SourceItem]) -> tuple[SqlStore, FilesystemBlobs, str]:
    store = open_store(store_url)
    blobs = FilesystemBlobs(tmp_path / "blobs")
    return store, blobs, submit(TWIN, "twins", "inline", store, blobs, clock=lambda: T0, items=items).run_id


def test_two_outcomes_of_one_task_key_in_one_batch_end_with_the_first_output(tmp_path: Path, store_url: str) -> None:
    items = [SourceItem("one", text=b"same"), SourceItem("two", text=b"same")]
    store, blobs, run_id = _store_with(store_url, tmp_path, items)
    try:
        a, b = store.claim("twins", ["first"], 10, "W", T0, 30, run_id)
        assert a.task_key == b.task_key
        mine = store_value(*encode("first answer"), blobs)
        other = store_value(*encode("a different answer"), blobs)
        counts = Transitions(TWIN, store, "W").commit([Outcome(a, T0, 0.1, True, mine),
                                                      Outcome(b, T0, 0.1, True, other)], T0 + 1)
        assert counts["succeeded"] == 2
        digests = store.db.execute("SELECT item_key, output_digest FROM tasks WHERE run_id = ? AND stage = 'first'",
                                   (run_id,))
        assert dict(digests) == {"one": mine.digest, "two": mine.digest}
        assert store.db.execute("SELECT digest FROM outputs WHERE task_key = ?", (a.task_key,)) == [(mine.digest,)]
        inputs = store.db.execute("SELECT DISTINCT input_digest FROM tasks WHERE run_id = ? AND stage = 'second'",
                                  (run_id,))
        assert inputs == [(mine.digest,)], "every item builds on the one output"
    finally:
        store.close()


# --- dead workers, judged per worker ------------------------------------------------------------------

def _expire(store: SqlStore, task_id: int, at: float) -> None:
    store.db.execute("UPDATE tasks SET lease_expires_at = ? WHERE id = ?", (at, task_id))


def test_a_worker_that_died_with_two_tasks_costs_each_its_attempt_across_scans(tmp_path: Path,
                                                                                store_url: str) -> None:
    items = [SourceItem("one", text=b"1"), SourceItem("two", text=b"2")]
    store, _, run_id = _store_with(store_url, tmp_path, items)
    try:
        a, b = store.claim("twins", ["first"], 10, "dead", T0, 30, run_id)
        _expire(store, a.id, T0 + 5)
        _expire(store, b.id, T0 + 50)  # claimed later, renewed later: its lease runs out after the first's
        reaper = Transitions(TWIN, store, "reaper")
        # Which one killed the worker is unknown; each is charged, so a poison item among them takes down no
        # more workers than it has attempts (lease_expired's budget is 1 here).
        assert reaper.reclaim_expired(T0 + 10) == {"requeued": 0, "dead_lettered": 1}
        assert reaper.reclaim_expired(T0 + 60) == {"requeued": 0, "dead_lettered": 1}
        rows = store.db.execute("SELECT attempts, status FROM tasks WHERE run_id = ? AND stage = 'first' "
                                "ORDER BY id", (run_id,))
        assert rows == [(1, "dead_lettered"), (1, "dead_lettered")]
    finally:
        store.close()


def test_a_task_that_dies_with_its_worker_twice_in_a_row_runs_alone(tmp_path: Path, store_url: str) -> None:
    items = [SourceItem("one", text=b"1"), SourceItem("two", text=b"2")]
    store = open_store(store_url)
    blobs = FilesystemBlobs(tmp_path / "blobs")
    run_id = submit(THRICE, "thrice", "inline", store, blobs, clock=lambda: T0, items=items).run_id
    try:
        reaper = Transitions(THRICE, store, "reaper")
        died = store.claim("thrice", ["first"], 10, "dead", T0, 30, run_id)
        assert reaper.reclaim_expired(T0 + 31) == {"requeued": 2, "dead_lettered": 0}
        # After a first death both run beside others again, at the fleet's pace: an ordinary claim takes them.
        again = store.claim("thrice", ["first"], 10, "dead-too", T0 + 32, 30, run_id)
        assert sorted(t.id for t in again) == sorted(t.id for t in died)
        assert reaper.reclaim_expired(T0 + 63) == {"requeued": 2, "dead_lettered": 0}
        # Twice in a row: suspects, taken one at a time by claim_suspect only.
        assert store.claim("thrice", ["first"], 10, "W", T0 + 64, 30, run_id) == []
        [alone] = store.claim_suspect("thrice", "W", T0 + 64, 30, run_id)
        rows = store.db.execute("SELECT attempts, crashes FROM tasks WHERE run_id = ? AND stage = 'first'",
                                (run_id,))
        assert sorted(rows) == [(2, 1), (3, 1)] and alone.attempts == 3
    finally:
        store.close()


def test_lease_expired_honours_its_own_attempt_budget(tmp_path: Path, store_url: str) -> None:
    store, _, run_id = _store_with(store_url, tmp_path, [SourceItem("only", text=b"1")])
    try:
        [task] = store.claim("twins", ["first"], 10, "dead", T0, 30, run_id)
        counts = Transitions(TWIN, store, "reaper").reclaim_expired(T0 + 60)
        assert counts == {"requeued": 0, "dead_lettered": 1}, "max_attempts_by_class['lease_expired'] is 1"
        assert store.db.execute("SELECT status, error_class FROM tasks WHERE id = ?", (task.id,)) == [
            ("dead_lettered", "lease_expired")]
    finally:
        store.close()


HUNGRY = """
    from conveyor import Pipeline

    pipe = Pipeline("hungry")

    @pipe.stage(max_memory_mb={limit})
    def grow(ctx, source: bytes) -> int:
        return len(bytearray(64 * 2**20))  # 64 MB
"""


def test_a_memory_limit_refusal_answers_only_under_the_same_limit(tmp_path: Path, store_url: str) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"key": "big", "text": "x"}) + "\n")

    def run(limit: int) -> dict[str, Any]:
        target = write_pipeline(tmp_path, HUNGRY.replace("{limit}", str(limit)), f"hungry{limit}.py")
        return reconciled(store_url, submit_and_work(target, manifest, store_url, tmp_path / "blobs").run_id)

    first = run(16)
    assert first["outcomes"] == {"failed": 1} and first["not_done"][0]["error_classes"] == ["memory_limit"]
    assert run(16)["stage_calls"] == 0, "the refusal is memoised under max_memory_mb=16"
    raised = run(512)
    assert raised["outcomes"] == {"completed": 1} and raised["stage_calls"] == 1
