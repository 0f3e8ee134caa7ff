"""A re-run copies the items that settled in the latest run of the same graph (store/replay.py), and its rows
are the rows a memo walk gives, on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.service.replay import ReplayOptions, replay
from conveyor.service.selection import Selection
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import submit_and_work, work, write_pipeline

PIPE = """
    from conveyor import Pipeline, TerminalError

    pipe = Pipeline("replay")

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        if source.startswith(b"bad"):
            raise TerminalError("not a document", error_class="not_a_document")
        return {"words": source.decode().split()}

    @pipe.stage(after=parse, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return doc["words"]

    @pipe.stage(after=split)
    def shout(ctx, word: str) -> str:
        return word.upper()

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, doc: dict) -> None:
        pass
"""

ROW = ("stage, item_key, root_key, status, task_key, stage_version, config_hash, input_digest, input_kind, "
       "input_size, output_digest, output_kind, error_class")


def _docs(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder


def _rows(store_url: str, run_id: str) -> set[tuple[Any, ...]]:
    store = open_store(store_url)
    try:
        return set(store.db.execute(f"SELECT {ROW} FROM tasks WHERE run_id = ?", (run_id,)))
    finally:
        store.close()


def _items(store_url: str, run_id: str) -> set[tuple[Any, ...]]:
    store = open_store(store_url)
    try:
        return set(store.db.execute(
            "SELECT item_key, parent_key, root_key, source_digest, source_size FROM items WHERE run_id = ?",
            (run_id,)))
    finally:
        store.close()


def _submit(target: str, docs: Path, store_url: str, blobs: Path, replay: bool = True) -> tuple[str, int, int]:
    """Submit a run (copying settled items, or with ``replay=False`` walking the memo for every task);
    return (run id, tasks cached, tasks copied)."""
    store = open_store(store_url)
    copied: list[int] = []
    original = store.copy_settled

    def counting(*args: Any) -> int:
        copied.append(original(*args))
        return copied[-1]

    store.copy_settled = counting  # type: ignore[method-assign]
    if not replay:
        store.replay_base = lambda *args: None  # type: ignore[method-assign]
    try:
        done = submit(load_target(target), target, str(docs), store, FilesystemBlobs(blobs))
    finally:
        store.close()
    return done.run_id, done.cached, sum(copied)


def test_a_rerun_copies_settled_items_with_the_rows_a_memo_walk_gives(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    # "x#1" is a root whose key looks like a child key of "x": copying x's children must not take it.
    docs = _docs(tmp_path / "docs", {"x": "red green", "x#1": "blue", "y": "one two three", "bad": "bad input"})
    first = submit_and_work(target, docs, store_url, blobs)

    copied_run, cached, copied = _submit(target, docs, store_url, blobs)
    walked_run, walked_cached, walked_copied = _submit(target, docs, store_url, blobs, replay=False)
    assert walked_copied == 0
    # x: parse, split, publish, 2 x shout; x#1: 4; y: 6 -> 15 copied; "bad" failed, so it is walked.
    assert copied == 15
    assert cached == walked_cached == 16, "the refusal is answered from the memo too"
    assert _rows(store_url, copied_run) == _rows(store_url, walked_run) == _rows(store_url, first.run_id)
    assert _items(store_url, copied_run) == _items(store_url, walked_run) == _items(store_url, first.run_id)
    assert work(target, store_url, blobs, run_id=copied_run).get("stage_calls", 0) == 0


def test_a_changed_source_or_graph_is_not_copied(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    docs = _docs(tmp_path / "docs", {"a": "alpha beta", "b": "gamma"})
    submit_and_work(target, docs, store_url, blobs)

    (docs / "b").write_text("gamma delta")
    run_id, _, copied = _submit(target, docs, store_url, blobs)
    assert copied == 5, "a is copied (parse, split, publish, 2 x shout); b's source changed"
    stats = work(target, store_url, blobs, run_id=run_id)
    assert stats["stage_calls"] == 4, "b: parse, split, publish and shout(delta); shout(gamma) is in the memo"

    bumped = write_pipeline(tmp_path, PIPE.replace('version="1"', 'version="2"'), "bumped.py")
    _, _, copied = _submit(bumped, docs, store_url, blobs)
    assert copied == 0, "a new parse version is another graph: nothing is copied, parse runs again"


def test_an_unsettled_item_of_the_base_run_is_walked_not_copied(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    docs = _docs(tmp_path / "docs", {"a": "alpha", "b": "beta"})
    first, _, _ = _submit(target, docs, store_url, blobs)  # submitted, never worked: nothing settled
    second, cached, copied = _submit(target, docs, store_url, blobs)
    assert (cached, copied) == (0, 0)
    assert {r[0] for r in _rows(store_url, second)} == {"parse"}
    assert first != second


def _statements(store_url: str, target: str, docs: Path, blobs: Path) -> tuple[str, int, list[str]]:
    """Submit a re-run; return its run id, the tasks cached and the statements the store ran for it."""
    store = open_store(store_url)
    seen: list[str] = []
    original = store.db.execute

    def recording(sql: str, params: Any = ()) -> Any:
        seen.append(sql)
        return original(sql, params)

    store.db.execute = recording  # type: ignore[method-assign]
    try:
        done = submit(load_target(target), target, str(docs), store, FilesystemBlobs(blobs))
    finally:
        store.close()
    return done.run_id, done.cached, seen


def test_a_base_run_whose_every_task_succeeded_is_taken_on_its_totals_until_a_replay_touches_it(
        tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    docs = _docs(tmp_path / "docs", {"x": "red green", "y": "one two three"})
    submit_and_work(target, docs, store_url, blobs)

    second, cached, seen = _statements(store_url, target, docs, blobs)
    assert cached == 11, "x: parse, split, publish, 2 x shout; y: 6"
    assert not [sql for sql in seen if "status <> 'succeeded'" in sql], "no task row is read to decide"

    # A replay of x in that run, worked to the end: every task succeeded again, but a replay's superseded rows
    # are counted in no total, so from now on the run's roots are decided on their task rows.
    store = open_store(store_url)
    try:
        replay(store, FilesystemBlobs(blobs), Selection(runs=(second,), stages=("parse",), item_glob="x"),
               ReplayOptions(reason="reprocess", downstream=True))
    finally:
        store.close()
    work(target, store_url, blobs, run_id=second)
    _, cached, seen = _statements(store_url, target, docs, blobs)
    assert [sql for sql in seen if "status <> 'succeeded'" in sql]
    assert cached == 11


def test_the_replays_naming_a_run_take_its_id_literally(store_url: str) -> None:
    """Run ids may hold `_` and `%` (LIKE's wildcards) and differ only in case (SQLite's LIKE ignores it): the
    replays of one run never include another's."""
    import json

    store = open_store(store_url)
    try:
        named = {"runX1": "a", "RUN_1": "b", "run%1": "c", "r\\1": "d"}
        ids = {run: store.start_replay(reason, None, "{}", False, json.dumps([run]), 1.0, "t")
               for run, reason in named.items()}
        assert [r[0] for r in store.replays_of("run_1")] == []
        assert [r[0] for r in store.replays_of("runX1")] == [ids["runX1"]]
        assert [r[0] for r in store.replays_of("run%1")] == [ids["run%1"]]
        assert [r[0] for r in store.replays_of("r\\1")] == [ids["r\\1"]]
        assert store.every_task_succeeded("run_1") and store.every_task_succeeded("run%2")
        assert not store.every_task_succeeded("RUN_1")
    finally:
        store.close()
