"""Bad input is an item with an outcome, not a stopped run (both backends where a store is involved)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.errors import BlobUnwritable, InputError
from conveyor.runtime.target import load_target
from conveyor.runtime.values import INLINE_MAX
from conveyor.service.inputs import check_input, iter_items
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import cli, cli_json, reconciled, submit_and_work, write_pipeline

PIPE = """
    from conveyor import Pipeline, Retry

    pipe = Pipeline("inputs", retry=Retry(max_attempts=2, base=0.01))

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        return source.decode()

    @pipe.stage(after=parse)
    def upper(ctx, text: str) -> str:
        return text.upper()
"""


def _broken_folder(root: Path) -> Path:
    """A folder with two good files and every kind of entry that cannot be a source."""
    docs = root / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "good.txt").write_text("good")
    (docs / "sub" / "nested.txt").write_text("nested")
    (docs / "dangling").symlink_to(root / "nowhere.txt")
    (docs / "folder-link").symlink_to(docs / "sub")
    os.mkfifo(docs / "pipe")
    locked = docs / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    return docs


def _unreadable_is_testable() -> bool:
    return os.geteuid() != 0  # root reads a file whatever its mode



def _not_done(report: dict[str, Any]) -> dict[str, str]:
    return {e["item_key"]: e["tasks"][0]["error"] for e in report["not_done"]}


def test_a_folder_with_broken_entries_runs_every_good_item_and_names_each_bad_one(
    tmp_path: Path, store_url: str,
) -> None:
    docs = _broken_folder(tmp_path)
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)

    bad = {"dangling": "is a symlink to a missing file", "folder-link": "is a symlink to a folder",
           "pipe": "is a FIFO (named pipe), not a regular file"}
    if _unreadable_is_testable():
        bad["locked.txt"] = "is not readable"
    good = 2 + (0 if _unreadable_is_testable() else 1)
    assert report["expected"] == good + len(bad)
    assert report["outcomes"] == {"completed": good, "failed": len(bad)}
    assert report["unaccounted"] == 0 and report["stage_calls"] == 2 * good
    errors = _not_done(report)
    assert set(errors) == set(bad)
    for key, why in bad.items():
        assert why in errors[key]
    assert all(e["error_classes"] == ["bad_input"] for e in report["not_done"])


def test_a_manifest_line_whose_source_is_broken_is_a_bad_input_item(tmp_path: Path, store_url: str) -> None:
    _broken_folder(tmp_path)
    lines = [{"key": "ok", "text": "fine"}, {"key": "missing", "path": "docs/nope.txt"},
             {"key": "dir", "path": "docs/sub"}, {"key": "fifo", "path": "docs/pipe"},
             {"key": "dangling", "path": "docs/dangling"}, {"key": "file", "path": "docs/good.txt"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert report["expected"] == 6 and report["outcomes"] == {"completed": 2, "failed": 4}
    errors = _not_done(report)
    assert errors["missing"] == "path 'docs/nope.txt' (line 2) does not exist"
    assert "(line 3) is a folder, not a file" in errors["dir"]
    assert "FIFO" in errors["fifo"] and "symlink to a missing file" in errors["dangling"]


def test_strict_inputs_refuses_the_submission_and_leaves_nothing(tmp_path: Path) -> None:
    write_pipeline(tmp_path, PIPE)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"key": "a", "text": "x"}\n{"key": "b", "path": "missing.txt"}\n')
    db = f"sqlite:///{tmp_path}/c.db"
    proc = cli("submit", "pipe.py:pipe", "--input", str(manifest), "--db", db, "--strict-inputs", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {manifest}:2: path 'missing.txt' does not exist; fix it "
                                   "(or leave out --strict-inputs)")
    assert cli_json("status", "--db", db, cwd=tmp_path)["runs"] == []


def test_bad_lines_are_user_errors_unless_skipped(tmp_path: Path, store_url: str) -> None:
    manifest = tmp_path / "items.jsonl"
    manifest.write_text('{"key": "a", "text": "one"}\nnot json\n{"text": "no key"}\n{"key": "b", "text": "two"}\n')
    with pytest.raises(InputError, match=r"items\.jsonl:2: not valid JSON"):
        check_input(manifest)
    check_input(manifest, skip_bad_lines=True)
    assert [(i.key, i.problem is not None) for i in iter_items(manifest, skip_bad_lines=True)] == [
        ("a", False), ("items.jsonl:2", True), ("items.jsonl:3", True), ("b", False)]

    target = write_pipeline(tmp_path, PIPE)
    db = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    refused = cli("run", target, "--input", str(manifest), *db, cwd=tmp_path)
    assert refused.returncode == 2 and "items.jsonl:2: not valid JSON" in refused.stderr
    assert "--skip-bad-lines" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    summary = cli_json("run", target, "--input", str(manifest), "--skip-bad-lines", "--workers", "1", *db,
                       cwd=tmp_path)
    assert summary["expected"] == 4 and summary["outcomes"] == {"completed": 2, "failed": 2}
    assert _not_done(summary) == {"items.jsonl:2": summary["not_done"][0]["tasks"][0]["error"],
                                  "items.jsonl:3": "items.jsonl:3: missing or empty \"key\""}
    assert summary["not_done"][0]["tasks"][0]["error"].startswith("items.jsonl:2: not valid JSON")


def test_a_run_with_bad_input_exits_4_and_an_empty_folder_warns(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = tmp_path / "docs"
    docs.mkdir()
    db = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    empty = cli("run", target, "--input", str(docs), "--json", *db, cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout)["expected"] == 0
    assert f"warning: --input {docs} holds no items; the run expects 0" in empty.stderr

    (docs / "a.txt").write_text("a")
    (docs / "gone").symlink_to(tmp_path / "gone.txt")
    failed = cli("run", target, "--input", str(docs), "--json", *db, cwd=tmp_path)
    assert failed.returncode == 4, failed.stderr
    assert json.loads(failed.stdout)["outcomes"] == {"completed": 1, "failed": 1}


def test_a_bad_input_item_is_tried_again_by_a_rerun_once_its_file_is_fixed(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a")
    (docs / "b.txt").symlink_to(tmp_path / "b-source.txt")
    first = reconciled(store_url, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id)
    assert first["outcomes"] == {"completed": 1, "failed": 1}
    (tmp_path / "b-source.txt").write_text("b")
    second = reconciled(store_url, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id)
    assert second["outcomes"] == {"completed": 2}
    assert second["stage_calls"] == 2 and second["cached"] == 2


def test_the_current_folder_as_input_leaves_conveyors_own_store_out(tmp_path: Path) -> None:
    write_pipeline(tmp_path, PIPE)
    (tmp_path / "notes.txt").write_text("a note")
    first = cli_json("run", "pipe.py:pipe", "--input", ".", "--workers", "1", cwd=tmp_path)
    assert first["expected"] == 2, "pipe.py and notes.txt"
    second = cli("run", "pipe.py:pipe", "--input", ".", "--workers", "1", "--json", cwd=tmp_path)
    assert json.loads(second.stdout)["expected"] == 2, "the store the first run made is not an item"
    assert "conveyor's own" in second.stderr


def test_a_manifest_written_with_a_utf8_signature_reads_as_written(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"\xef\xbb\xbf" + b'{"key": "a", "text": "one"}\n{"key": "b", "text": "two"}\n')
    check_input(manifest)
    assert [item.key for item in iter_items(manifest)] == ["a", "b"]


class _SlowBlobs(FilesystemBlobs):
    """A folder store whose file puts take a while, in a shuffled order of completion, counting how many run
    at once; ``refuse`` names a file whose put fails as a full disk would."""

    def __init__(self, root: Path, refuse: str | None = None) -> None:
        super().__init__(root)
        self.refuse, self.lock, self.running, self.most, self.puts = refuse, threading.Lock(), 0, 0, 0

    def put_file(self, path: Path) -> tuple[str, int]:
        with self.lock:
            self.running += 1
            self.most, self.puts = max(self.most, self.running), self.puts + 1
        try:
            time.sleep(0.01 + (hash(path.name) % 5) / 200)
            if path.name == self.refuse:
                raise BlobUnwritable(f"cannot write to the blob store {self.root}: No space left on device")
            return super().put_file(path)
        finally:
            with self.lock:
                self.running -= 1


def _mixed_folder(root: Path) -> dict[str, bytes]:
    """Files larger than INLINE_MAX (stored as blobs) between small ones (inline); their bytes by key."""
    files = {f"doc{i:02d}.txt": (f"{i} " * (INLINE_MAX // 2 + 40 * i) if i % 4 else f"small {i}").encode()
             for i in range(24)}
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_large_sources_are_stored_several_at_a_time_each_under_its_own_item(tmp_path: Path) -> None:
    files = _mixed_folder(tmp_path / "docs")
    blobs = _SlowBlobs(tmp_path / "blobs")
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        done = submit(load_target(write_pipeline(tmp_path, PIPE)), "pipe.py:pipe", str(tmp_path / "docs"), store,
                      blobs)
        rows = dict(store.db.execute("SELECT item_key, source_digest FROM items WHERE run_id = ?", (done.run_id,)))
    finally:
        store.close()
    assert blobs.puts == 18 and blobs.most > 1  # the 18 large files, not one at a time
    assert rows == {key: hashlib.sha256(data).hexdigest() for key, data in files.items()}
    assert all(blobs.get(rows[key]) == data for key, data in files.items() if len(data) > INLINE_MAX)


def test_a_source_the_blob_store_refuses_stops_the_submission_as_a_serial_read_would(tmp_path: Path) -> None:
    _mixed_folder(tmp_path / "docs")
    blobs = _SlowBlobs(tmp_path / "blobs", refuse="doc06.txt")
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        with pytest.raises(BlobUnwritable, match="No space left on device"):
            submit(load_target(write_pipeline(tmp_path, PIPE)), "pipe.py:pipe", str(tmp_path / "docs"), store, blobs)
        assert store.db.execute("SELECT COUNT(*) FROM runs")[0][0] == 0  # nothing was written: nothing is left
    finally:
        store.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("conveyor-source")]
