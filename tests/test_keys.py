"""Keys that cannot collide: the memo belongs to its pipeline, item keys are unique, children have a
namespace of their own, config hashes are canonical (both backends where a store is involved)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline
from conveyor.errors import InputError, PipelineError
from conveyor.service.inputs import check_input, iter_items, printable_name
from conveyor.store import CHILD_MARK, open_store
from tests.helpers import SRC, cli, make_docs, reconciled, submit_and_work, write_pipeline

# --- 1. the memo belongs to its pipeline --------------------------------------------------------------

TWIN = """
    import os
    from conveyor import Pipeline

    pipe = Pipeline(os.environ["PIPE_NAME"])

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        return {"by": os.environ["PIPE_NAME"], "text": source.decode()}

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, doc: dict) -> None:
        with open(os.environ["SINK"], "a") as sink:
            sink.write(f"{os.environ['PIPE_NAME']} {ctx.item_key} {doc['by']}\\n")
"""


def test_two_pipelines_sharing_a_stage_name_never_answer_each_other(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink = tmp_path / "sink.log"
    monkeypatch.setenv("SINK", str(sink))
    docs = make_docs(tmp_path / "docs", 4)
    first = write_pipeline(tmp_path, TWIN, "one.py")
    second = write_pipeline(tmp_path, TWIN, "two.py")

    monkeypatch.setenv("PIPE_NAME", "alpha")
    done = submit_and_work(first, docs, store_url, tmp_path / "blobs")
    assert reconciled(store_url, done.run_id)["stage_calls"] == 8
    monkeypatch.setenv("PIPE_NAME", "beta")
    done = submit_and_work(second, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)

    assert report["stage_calls"] == 8, "beta's parse and publish must run: nothing of alpha answers them"
    assert report["cached"] == 0 and report["outcomes"] == {"published": 4}
    published = sorted(sink.read_text().split("\n")[:-1])
    assert published == sorted([f"alpha doc{i:04d}.txt alpha" for i in range(4)]
                               + [f"beta doc{i:04d}.txt beta" for i in range(4)])


# --- 6. unique keys; children in a namespace of their own ---------------------------------------------

def _manifest(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_a_duplicate_manifest_key_is_refused_naming_both_lines(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"key": "a", "text": "1"}, {"key": "b", "text": "2"}, "", {"key": "c", "text": "3"},
        {"key": "b", "text": "other"}])
    with pytest.raises(InputError, match=r"m\.jsonl:5: key 'b' is also on line 2"):
        check_input(manifest)


def test_a_duplicate_key_leaves_nothing_behind(tmp_path: Path) -> None:
    write_pipeline(tmp_path, TWIN)
    manifest = _manifest(tmp_path / "m.jsonl", [{"key": f"k{i}", "text": str(i)} for i in range(6000)]
                         + [{"key": "k17", "text": "again"}])
    proc = cli("submit", "pipe.py:pipe", "--input", str(manifest), "--db", f"sqlite:///{tmp_path}/c.db",
               cwd=tmp_path, env={"PIPE_NAME": "dup", "SINK": str(tmp_path / "sink")})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {manifest}:6001: key 'k17' is also on line 18; keys must be unique "
                                   "within a manifest")
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        assert store.list_runs() == [] and store.db.execute("SELECT COUNT(*) FROM items") == [(0,)]
    finally:
        store.close()


FANOUT = """
    from conveyor import Pipeline

    pipe = Pipeline("split")

    @pipe.stage(kind="fanout")
    def split(ctx, source: bytes) -> list[str]:
        return source.decode().split()

    @pipe.stage(after=split)
    def shout(ctx, word: str) -> str:
        return f"{ctx.item_key}={word.upper()}"
"""


def test_a_root_key_that_looks_like_a_child_key_keeps_its_own_item(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, FANOUT)
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"key": "x", "text": "a b"}, {"key": "x#1", "text": "c d e"}, {"key": "x#0", "text": "f"}])
    done = submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert report["expected"] == 3 and report["outcomes"] == {"completed": 3} and report["unaccounted"] == 0
    store = open_store(store_url)
    try:
        items = dict(store.db.execute("SELECT item_key, root_key FROM items WHERE run_id = ?", (done.run_id,)))
        shouted = dict(store.db.execute("SELECT item_key, root_key FROM tasks WHERE run_id = ? AND stage = 'shout'",
                                        (done.run_id,)))
    finally:
        store.close()
    assert items == {"x": "x", "x#1": "x#1", "x#0": "x#0", f"x{CHILD_MARK}0": "x", f"x{CHILD_MARK}1": "x",
                     f"x#1{CHILD_MARK}0": "x#1", f"x#1{CHILD_MARK}1": "x#1", f"x#1{CHILD_MARK}2": "x#1",
                     f"x#0{CHILD_MARK}0": "x#0"}
    assert shouted == {k: v for k, v in items.items() if CHILD_MARK in k}


@pytest.mark.parametrize(("key", "message"), [
    (f"a{CHILD_MARK}1", "names fan-out child items"),
    ("tab\there", "control character"),
    ("x" * 1001, "at most 1,000"),
    ("", 'missing or empty "key"'),
    (7, 'missing or empty "key"'),
])
def test_keys_that_could_collide_or_break_are_refused(tmp_path: Path, key: Any, message: str) -> None:
    manifest = _manifest(tmp_path / "m.jsonl", [{"key": "fine", "text": "1"}, {"key": key, "text": "2"}])
    with pytest.raises(InputError, match=r"m\.jsonl:2: .*" + message.replace(".", r"\.")):
        check_input(manifest)


def test_printable_names_are_unambiguous() -> None:
    raw = [b"plain.txt", b"caf\xc3\xa9.txt", b"latin1-caf\xe9.txt", b"back\\slash", b"x\\xe9", b"tab\tname",
           "pil\u00b6crow".encode(), b"c1-\xc2\x85"]
    keys = [printable_name(name) for name in raw]
    assert keys == ["plain.txt", "café.txt", "latin1-caf\\xe9.txt", "back\\\\slash", "x\\\\xe9", "tab\\x09name",
                    "pil\\u00b6crow", "c1-\\u0085"]
    assert len(set(keys)) == len(keys)
    assert all(key.isprintable() for key in keys)


@pytest.mark.skipif(sys.platform != "linux", reason="needs a filesystem that takes any bytes as a name")
def test_non_utf8_file_names_are_items_with_readable_keys(tmp_path: Path, store_url: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in (b"ok.txt", b"caf\xe9.txt", b"x\\xe9.txt"):
        with open(os.path.join(os.fsencode(docs), name), "wb") as out:
            out.write(b"some words")
    assert [item.key for item in iter_items(docs)] == ["caf\\xe9.txt", "ok.txt", "x\\\\xe9.txt"]
    target = write_pipeline(tmp_path, FANOUT)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert report["expected"] == 3 and report["outcomes"] == {"completed": 3}


# --- 8. config is hashed from a canonical form --------------------------------------------------------

def test_config_hash_is_canonical_and_stable_across_processes() -> None:
    pipe = Pipeline("cfg")
    a = pipe.stage(lambda ctx, x: x, name="a", config={"model": "m", "params": {"t": 0.5, "k": [1, 2]}})
    b = Pipeline("cfg2").stage(lambda ctx, x: x, name="a", config={"params": {"k": (1, 2), "t": 0.5}, "model": "m"})
    assert a.config_hash == b.config_hash
    code = ("from conveyor import Pipeline\n"
            "config = {'model': 'm', 'params': {'t': 0.5, 'k': [1, 2]}}\n"
            "print(Pipeline('p').stage(lambda c, x: x, name='a', config=config).config_hash)")
    hashes = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": SRC, "PYTHONHASHSEED": str(seed)}).stdout.strip()
              for seed in (1, 2, 3)}
    assert hashes == {a.config_hash}


@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), {"nested": {3: "int key"}}, b"bytes"])
def test_a_config_value_that_is_not_json_like_is_a_declaration_error(value: Any) -> None:
    with pytest.raises(PipelineError, match=r"stage 'a': config\['v'\]"):
        Pipeline("cfg").stage(lambda ctx, x: x, name="a", config={"v": value})


def test_an_unchanged_manifest_is_checked_once_and_a_changed_one_again(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conveyor.service import submit as submission

    checked: list[str] = []
    check = submission.check_input

    def counted(path: str, skip: bool = False) -> None:
        checked.append(str(path))
        check(path, skip)

    monkeypatch.setattr(submission, "check_input", counted)
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    monkeypatch.setenv("PIPE_NAME", "checked")
    target = write_pipeline(tmp_path, TWIN)
    manifest = _manifest(tmp_path / "m.jsonl", [{"key": "a", "text": "1"}, {"key": "b", "text": "2"}])
    submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    assert checked == [str(manifest)], "the same manifest, unchanged, is read once for checking"
    with manifest.open("a") as more:
        more.write(json.dumps({"key": "a", "text": "again"}) + "\n")
    with pytest.raises(InputError, match=r"m\.jsonl:3: key 'a' is also on line 1"):
        submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    assert len(checked) == 2


def test_a_folder_path_too_long_for_a_key_gets_a_short_unique_one(tmp_path: Path, store_url: str) -> None:
    docs = tmp_path / "docs"
    deep = docs
    for part in range(8):
        deep = deep / (f"{part}" * 200)  # eight folders of 200 characters: a 1,600-character relative path
    deep.mkdir(parents=True)
    (deep / "a.txt").write_text("one two")
    (deep / "b.txt").write_text("three")
    keys = [item.key for item in iter_items(docs)]
    assert len(keys) == 2 and len(set(keys)) == 2 and all(len(key) <= 1000 for key in keys)
    target = write_pipeline(tmp_path, FANOUT)
    report = reconciled(store_url, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id)
    assert report["outcomes"] == {"completed": 2}
