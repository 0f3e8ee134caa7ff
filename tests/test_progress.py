"""A run's progress: per-stage counts and the timeline the dashboard and the report plot, on both backends."""

from __future__ import annotations

from pathlib import Path

from conveyor.service.progress import timeline
from conveyor.store import open_store
from tests.helpers import make_docs, submit_and_work, write_pipeline

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
