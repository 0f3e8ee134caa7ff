"""A run's progress: per-stage counts and the timeline the dashboard and the report plot, on both backends."""

from __future__ import annotations

from pathlib import Path

from conveyor.blobs import FilesystemBlobs
from conveyor.service.progress import timeline
from conveyor.store import open_store
from tests.helpers import make_docs, submit_and_work, work, write_pipeline

PIPE = """
    from conveyor import Pipeline

    pipe = Pipeline("progress")

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        if b"poison" in source:
            raise ValueError("poison document")
        return {"n": len(source)}

    @pipe.stage(after=parse)
    def extract(ctx, doc: dict) -> dict:
        return {"m": doc["n"] * 2}
"""


def test_the_timeline_counts_every_attempt_once(tmp_path: Path, store_url: str) -> None:
    docs = make_docs(tmp_path / "docs", 12)
    (docs / "bad.txt").write_text("poison")
    done = submit_and_work(write_pipeline(tmp_path, PIPE), docs, store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        entries = timeline(store, done.run_id)
        attempts = store.attempt_counts(done.run_id)
    finally:
        store.close()
    assert entries, "a finished run has at least one bucket"
    assert [e["t"] for e in entries] == sorted(e["t"] for e in entries)
    assert sum(e["succeeded"] for e in entries) == 24  # 12 parse + 12 extract
    assert sum(e["accepted"] for e in entries) == 12  # the record stage: extract
    assert sum(e["attempts"] for e in entries) == sum(
        attempts.get(k, 0) for k in ("succeeded", "cached", "failed", "retry", "dead_lettered"))
    assert sum(e["failed"] for e in entries) >= 1


GATED = """
    import os, time
    from conveyor import Pipeline

    pipe = Pipeline("overview")

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        return {"n": len(source)}

    @pipe.stage(after=parse)
    def extract(ctx, doc: dict) -> dict:
        return {"m": doc["n"]}
"""


def test_the_overview_counts_tasks_by_state_and_ages_the_queue(tmp_path: Path, store_url: str) -> None:
    from conveyor.runtime.target import load_target
    from conveyor.service.progress import overview
    from conveyor.service.submit import submit

    target = write_pipeline(tmp_path, GATED)
    docs = make_docs(tmp_path / "docs", 30)
    store = open_store(store_url)
    try:
        run_id = submit(load_target(target), target, str(docs), store, FilesystemBlobs(tmp_path / "blobs")).run_id
        queued = overview(store, run_id, age_cap=7)
        assert queued["stages"]["parse"] == {"queued": 30}
        bins = queued["stage_activity"]["parse"]["queue_ages"]
        assert bins[0] == {"le": 1.0, "tasks": 7, "capped": True}, "a fresh queue: every task in the first bin"
        assert sum(b["tasks"] for b in bins[1:]) == 0 and bins[-1]["le"] is None
        assert queued["accepted"] == 0 and queued["expected"] == 30
    finally:
        store.close()
    work(target, store_url, tmp_path / "blobs", run_id=run_id)
    store = open_store(store_url)
    try:
        done = overview(store, run_id)
    finally:
        store.close()
    assert done["stages"] == {"parse": {"succeeded": 30}, "extract": {"succeeded": 30}}
    assert done["accepted"] == 30 and done["published"] == 0 and done["status"] == "finished"
    assert done["stage_activity"]["extract"]["queue_ages"] == []
    # "document 0".."document 29" have two lengths: extract runs twice, the memo answers the other 28
    assert done["stage_calls"] == 32 and done["stage_activity"]["extract"] == {
        "calls": 2, "cached": 28, "oldest_queued_age_s": None, "queue_ages": []}
