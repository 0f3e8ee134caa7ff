"""A gather knows how many children it waits for from its children's own rows (issue 28, point 6): each task of a
fan-out child carries the number of children its parent's fan-out made. A commit that settles every child of a
parent decides the gather without reading the run; children settled in different commits (two workers at once)
still make it exactly once; a replay whose fan-out makes another number of children is gathered over the new set.
Both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import (
    make_docs,
    query,
    reconciled,
    submit_and_work,
    submit_run,
    work,
    workers_until_idle,
    write_pipeline,
)

COUNTED = """
import os
import time
from conveyor import Pipeline

pipe = Pipeline("counted")

@pipe.stage(kind="fanout")
def split(ctx, source):
    return [source.decode() + f"-{i}" for i in range(2)]

@pipe.stage(after=split)
def shout(ctx, part):
    time.sleep(0.005)
    return part.upper()

@pipe.stage(after=shout, kind="gather")
def collect(ctx, parts):
    with open(os.environ["GATHER_CALLS"], "a") as calls:  # one line per call, whichever process makes it
        calls.write(ctx.item_key + "\\n")
    return parts
"""


def _value(store_url: str, run_id: str, item: str, stage: str) -> object:
    rows = query(store_url, "SELECT o.inline FROM tasks t JOIN outputs o ON o.task_key = t.task_key "
                            "WHERE t.run_id = ? AND t.item_key = ? AND t.stage = ?", run_id, item, stage)
    assert rows, f"no output of {stage} for {item}"
    return json.loads(bytes(rows[0][0]))


def test_a_commit_that_settles_every_child_decides_the_gather_without_reading_the_run(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.store.barriers import BarrierQueries

    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("GATHER_CALLS", str(calls))
    read: list[int] = []
    children_states = BarrierQueries.children_states

    def counted(self, run_id, parents, stages):  # type: ignore[no-untyped-def]
        read.append(len(parents))
        return children_states(self, run_id, parents, stages)
    monkeypatch.setattr(BarrierQueries, "children_states", counted)
    target = write_pipeline(tmp_path, COUNTED)
    done = submit_and_work(target, make_docs(tmp_path / "docs", 5), store_url, tmp_path / "blobs", batch_size=50)
    assert read == []  # every parent's children settled in one commit, which knew their count
    assert query(store_url, "SELECT DISTINCT siblings FROM tasks WHERE run_id = ? AND stage = 'shout'",
                 done.run_id) == [(2,)]
    assert query(store_url, "SELECT DISTINCT siblings FROM tasks WHERE run_id = ? AND stage <> 'shout'",
                 done.run_id) == [(0,)]
    assert _value(store_url, done.run_id, "doc0003.txt", "collect") == ["DOCUMENT 3-0", "DOCUMENT 3-1"]
    assert sorted(calls.read_text().split()) == [f"doc{i:04d}.txt" for i in range(5)]
    assert reconciled(store_url, done.run_id)["outcomes"] == {"completed": 5}


def test_two_workers_settling_the_last_children_of_a_parent_at_once_make_its_gather_exactly_once(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One child at a time per commit: the fan-out's commit takes one child as it makes it, the other worker
    claims its sibling, and the two settle at about the same moment in two processes. Each commit knows the count
    but not the other's child: the later one (by the parent's row lock) sees both and makes the gather."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("GATHER_CALLS", str(calls))
    target = write_pipeline(tmp_path, COUNTED)
    run_id = submit_run(target, make_docs(tmp_path / "docs", 40), store_url, tmp_path / "blobs")
    workers_until_idle(target, store_url, tmp_path / "blobs", batch_size=1)
    assert query(store_url, "SELECT status, COUNT(*) FROM tasks WHERE run_id = ? AND stage = 'collect' "
                            "GROUP BY status", run_id) == [("succeeded", 40)]
    made = calls.read_text().split()
    assert sorted(made) == [f"doc{i:04d}.txt" for i in range(40)]  # each gather ran once, none was missed
    assert query(store_url, "SELECT COUNT(*) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE a.run_id = ? "
                            "AND t.stage = 'collect' AND a.invoked = 1", run_id) == [(40,)]
    assert _value(store_url, run_id, "doc0017.txt", "collect") == ["DOCUMENT 17-0", "DOCUMENT 17-1"]
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 40}


REFANNED = """
import os
from conveyor import Pipeline

pipe = Pipeline("refanned")
PARTS = int(os.environ["PARTS"])

@pipe.stage(kind="fanout", version=str(PARTS))
def split(ctx, source):
    return [f"{source.decode()}-{i}/{PARTS}" for i in range(PARTS)]

@pipe.stage(after=split)
def shout(ctx, part):
    return part.upper()

@pipe.stage(after=shout, kind="gather")
def collect(ctx, parts):
    return parts
"""


def test_a_replayed_fanout_that_makes_another_number_of_children_is_gathered_over_the_new_set(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three children, then a replay of the fan-out that makes two (the third child's rows stay superseded), then
    one that makes four: each time the gather waits for the new children, one commit each, and takes them alone."""
    from conveyor.blobs import FilesystemBlobs
    from conveyor.runtime import target as target_module
    from conveyor.service.replay import ReplayOptions, replay
    from conveyor.service.selection import Selection
    from conveyor.store import open_store

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a")
    (docs / "b.txt").write_text("b")

    def declared(parts: int) -> str:
        monkeypatch.setenv("PARTS", str(parts))
        target_module._cache.clear()
        return write_pipeline(tmp_path, REFANNED, name=f"v{parts}.py")

    done = submit_and_work(declared(3), docs, store_url, tmp_path / "blobs", batch_size=1)
    assert _value(store_url, done.run_id, "a.txt", "collect") == ["A-0/3", "A-1/3", "A-2/3"]
    for parts in (2, 4):
        target = declared(parts)
        store = open_store(store_url)
        try:
            report = replay(store, FilesystemBlobs(tmp_path / "blobs"),
                            Selection(runs=(done.run_id,), stages=("split",), item_glob="a.txt"),
                            ReplayOptions(reason="reprocess", downstream=True, target=target))
        finally:
            store.close()
        assert report["reopened"] == 1
        assert query(store_url, "SELECT status FROM tasks WHERE run_id = ? AND item_key = 'a.txt' AND "
                                "stage = 'collect'", done.run_id) == [("superseded",)]
        work(target, store_url, tmp_path / "blobs", run_id=done.run_id, batch_size=1)
        assert _value(store_url, done.run_id, "a.txt", "collect") == [f"A-{i}/{parts}" for i in range(parts)]
        assert _value(store_url, done.run_id, "b.txt", "collect") == ["B-0/3", "B-1/3", "B-2/3"]  # not replayed
        assert query(store_url, "SELECT item_key, status, siblings FROM tasks WHERE run_id = ? AND stage = 'shout' "
                                "AND root_key = 'a.txt' ORDER BY item_key", done.run_id) == [
            (f"a.txt\u00b6{i}", "succeeded" if i < parts else "superseded", parts if i < parts else 3)
            for i in range(max(parts, 3))]
        assert reconciled(store_url, done.run_id)["outcomes"] == {"completed": 2}
