"""`conveyor diff RUN_A RUN_B`: what a reprocess changed, item by item (both backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.service.diff import diff_runs, field_changes
from conveyor.store import open_store
from tests.helpers import cli, submit_and_work, write_pipeline
from tests.test_reconcile_report import BAD, GOOD, PIPE, UNSURE, manifest

UNCHANGED = [{"key": f"same{i}.txt", "text": f"same{i} letter"} for i in range(5)]


def _diff(store_url: str, blobs: Path, run_a: str, run_b: str, **options: Any) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return diff_runs(store, FilesystemBlobs(blobs), run_a, run_b, **options)
    finally:
        store.close()


@pytest.fixture
def runs(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Run A; then run B, a reprocess with the extraction's version bumped: b.md's title and c's nested word
    count change, a.txt now fails, g.txt (awaiting review in A) is now sure, d.txt is gone, h.txt is new."""
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    first = submit_and_work(target, manifest(tmp_path, GOOD + BAD + UNSURE[:1] + UNCHANGED, "a.jsonl"),
                            store_url, blobs)
    for name, value in {"EXTRACT_VERSION": "2", "UPPER": "b.md", "NEST": "c", "FAIL": "a.txt",
                        "SURE": "g.txt"}.items():
        monkeypatch.setenv(name, value)
    lines = [line for line in GOOD + BAD + UNSURE[:1] + UNCHANGED if line["key"] != "d.txt"]
    again = write_pipeline(tmp_path, PIPE, "again.py")  # a module of its own, loaded with the new environment
    second = submit_and_work(again, manifest(tmp_path, [*lines, {"key": "h.txt", "text": "hotel invoice nine"}],
                                              "b.jsonl"), store_url, blobs)
    return first.run_id, second.run_id


def test_a_reprocess_item_by_item(tmp_path: Path, store_url: str, runs: tuple[str, str]) -> None:
    run_a, run_b = runs
    report = _diff(store_url, tmp_path / "blobs", run_a, run_b)
    assert report["run_a"] == run_a and report["run_b"] == run_b and report["pipeline"] == "report"
    # unchanged: the five same*.txt, and e.txt/f.txt (failed the same way in both)
    assert report["counts"] == {"new": 1, "removed": 1, "changed": 2, "unchanged": 7, "newly_failing": 1,
                                "newly_accepted": 1}
    items = {i["item_key"]: i for i in report["items"]}
    assert list(items) == sorted(items), "key order"
    assert {k: i["change"] for k, i in items.items()} == {
        "a.txt": "newly_failing", "b.md": "changed", "c": "changed", "d.txt": "removed", "g.txt": "newly_accepted",
        "h.txt": "new"}
    assert items["b.md"]["fields"] == [{"field": "title", "a": "beta", "b": "BETA"}]
    assert items["c"]["fields"] == [{"field": "n.words", "a": 3, "b": 103}]
    assert (items["a.txt"]["outcome_a"], items["a.txt"]["outcome_b"]) == ("published", "failed")
    assert (items["g.txt"]["outcome_a"], items["g.txt"]["outcome_b"]) == ("awaiting_review", "published")
    assert (items["d.txt"]["outcome_b"], items["h.txt"]["outcome_a"]) == (None, None)

    small_chunks = _diff(store_url, tmp_path / "blobs", run_a, run_b, chunk=2)
    assert small_chunks == report, "chunks of two items merge to the same answer"
    limited = _diff(store_url, tmp_path / "blobs", run_a, run_b, limit=2)
    assert limited["counts"] == report["counts"] and limited["items"] == report["items"][:2]
    assert _diff(store_url, tmp_path / "blobs", run_a, run_a)["counts"]["unchanged"] == 12


def test_diff_through_the_cli(tmp_path: Path, store_url: str, runs: tuple[str, str]) -> None:
    args = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    data = json.loads(cli("diff", *runs, *args, "--limit", "3", "--json", cwd=tmp_path, check=True).stdout)
    assert set(data) == {"run_a", "run_b", "pipeline", "counts", "items"} and len(data["items"]) == 3
    assert set(data["items"][0]) == {"item_key", "change", "outcome_a", "outcome_b", "fields"}
    human = cli("diff", *runs, *args, cwd=tmp_path, check=True).stdout
    assert "changed 2" in human and "newly_failing 1" in human and "title" in human and "BETA" in human
    changed = sum(n for change, n in data["counts"].items() if change != "unchanged")
    one = cli("diff", *runs, *args, "--limit", "1", cwd=tmp_path, check=True).stdout
    assert f"… and {changed - 1:,} more changed item(s)" in one, one


def test_runs_of_two_pipelines_are_not_compared(tmp_path: Path, store_url: str, runs: tuple[str, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPE_NAME", "other")
    other = submit_and_work(write_pipeline(tmp_path, PIPE, "other.py"), manifest(tmp_path, GOOD, "o.jsonl"),
                            store_url, tmp_path / "blobs")
    proc = cli("diff", runs[0], other.run_id, "--db", store_url, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "one pipeline" in proc.stderr and "'report'" in proc.stderr and "'other'" in proc.stderr
    unknown = cli("diff", runs[0], "r-nope", "--db", store_url, cwd=tmp_path)
    assert unknown.returncode == 2 and "no run 'r-nope'" in unknown.stderr


def test_field_changes() -> None:
    a = {"title": "x", "n": {"words": 3, "pages": 1}, "tags": [1, 2], "flag": 1, "gone": "y"}
    b = {"title": "x", "n": {"words": 4, "pages": 1}, "tags": [1, 2, 3], "flag": True, "added": None}
    assert field_changes(a, b) == [
        {"field": "added", "a": None, "b": None}, {"field": "flag", "a": 1, "b": True},
        {"field": "gone", "a": "y", "b": None}, {"field": "n.words", "a": 3, "b": 4},
        {"field": "tags", "a": [1, 2], "b": [1, 2, 3]}]
    assert field_changes("old", "new") == [{"field": "(record)", "a": "old", "b": "new"}]
    assert field_changes({"n": {"a": 1}}, {"n": [1]}) == [{"field": "n", "a": {"a": 1}, "b": [1]}]
    assert field_changes(a, dict(a)) == []
