"""`conveyor show RUN ITEM`: one item's tasks with outputs, provenance, attempts and replay reasons; and the
dead-letter table saying when and why an entry was replayed. On both backends."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from conveyor.blobs import FilesystemBlobs
from conveyor.service.show import OUTPUT_MAX, show_item, shown_output
from conveyor.store import open_store
from tests.helpers import cli, cli_json, submit_and_work, work, write_pipeline

PIPE = """
    from conveyor import Pipeline, Retry, TerminalError

    pipe = Pipeline("show", retry=Retry(max_attempts=2, base=0.01))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        ctx.provenance["parser"] = "1.2"
        text = source.decode()
        if text.startswith("bad"):
            raise TerminalError("not a document: it starts with bad", error_class="not_a_document")
        if text.startswith("flaky") and ctx.attempt == 1:
            raise RuntimeError("the parser was busy")
        if text.startswith("poison"):
            raise RuntimeError("poison")
        return {"words": text.split()}

    @pipe.stage(after=parse, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return doc["words"]

    @pipe.stage(after=split, version="1", provenance={"schema": "3"})
    def shout(ctx, word: str) -> str:
        return word.upper()
"""


def _docs(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder


def _db(store_url: str, tmp_path: Path) -> list[str]:
    return ["--db", store_url, "--blobs", str(tmp_path / "blobs")]


def _show(store_url: str, tmp_path: Path, run_id: str, item_key: str, stage: str | None = None) -> dict[str, Any]:
    """show_item in this process (the CLI is checked on its own: it prints the very same document)."""
    store = open_store(store_url)
    try:
        return show_item(store, FilesystemBlobs(tmp_path / "blobs"), run_id, item_key, stage)
    finally:
        store.close()


def _where(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["stage"], t["item_key"]) for t in data["tasks"]]


def test_show_an_item_with_its_children_outputs_provenance_and_attempts(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = _docs(tmp_path / "docs", {"a.txt": "red green", "b.txt": "bad one", "f.txt": "flaky"})
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id

    shown = cli_json("show", run_id, "a.txt", *_db(store_url, tmp_path), cwd=tmp_path)
    assert {k: shown[k] for k in ("run_id", "item_key", "pipeline", "outcome", "meta")} == {
        "run_id": run_id, "item_key": "a.txt", "pipeline": "show", "outcome": "completed", "meta": None}
    assert shown["source"] == {"digest": hashlib.sha256(b"red green").hexdigest(), "size": 9}
    assert _where(shown) == [("parse", "a.txt"), ("split", "a.txt"), ("shout", "a.txt¶0"), ("shout", "a.txt¶1")]
    parse, split, shout_red, shout_green = shown["tasks"]
    assert [t["output"] for t in shown["tasks"]] == [{"words": ["red", "green"]}, {"fanout": 2}, "RED", "GREEN"]
    assert all(t["status"] == "succeeded" and t["output_error"] is None and t["replay"] is None
               and t["cached"] is False and t["error"] is None for t in shown["tasks"])
    assert parse["provenance"]["parser"] == "1.2" and "schema" not in parse["provenance"]
    assert shout_red["provenance"]["schema"] == "3" and "parser" not in shout_red["provenance"]
    assert parse["provenance"]["source"] == shown["source"]["digest"]
    assert parse["provenance"]["stage_version"] == parse["stage_version"] == "1"
    assert parse["provenance"]["config_hash"] == parse["config_hash"]
    (first,) = parse["history"]
    assert {k: first[k] for k in ("attempt", "outcome", "invoked", "error_class", "stage_version", "config_hash",
                                  "provenance", "provider_calls", "cost")} == {
        "attempt": 1, "outcome": "succeeded", "invoked": True, "error_class": None, "stage_version": "1",
        "config_hash": parse["config_hash"], "provenance": {"parser": "1.2"}, "provider_calls": 0, "cost": 0.0}
    assert shout_green["history"][0]["provenance"] == {"schema": "3"}
    assert split["history"][0]["provenance"] is None, "nothing beyond the task's columns"

    # A child key: that child alone (its root's outcome and source); --stage keeps one stage.
    child = _show(store_url, tmp_path, run_id, "a.txt¶1")
    assert _where(child) == [("shout", "a.txt¶1")] and child["outcome"] == "completed"
    assert child["tasks"][0]["output"] == "GREEN" and child["source"] == shown["source"]
    assert _where(_show(store_url, tmp_path, run_id, "a.txt", "shout")) == [("shout", "a.txt¶0"),
                                                                             ("shout", "a.txt¶1")]

    failed = _show(store_url, tmp_path, run_id, "b.txt")
    assert failed["outcome"] == "failed" and _where(failed) == [("parse", "b.txt")]
    (task,) = failed["tasks"]
    assert task["status"] == "failed" and task["error_class"] == "not_a_document"
    assert "not a document: it starts with bad" in task["error"]
    assert task["output"] is None and "failed" in task["output_error"]
    assert [(a["outcome"], a["error_class"]) for a in task["history"]] == [("failed", "not_a_document")]

    retried = _show(store_url, tmp_path, run_id, "f.txt", "parse")["tasks"][0]
    assert retried["status"] == "succeeded" and retried["attempts"] == 2
    assert [(a["attempt"], a["outcome"], a["error_class"]) for a in retried["history"]] == [
        (1, "retry", "runtime_error"), (2, "succeeded", None)]
    assert "the parser was busy" in retried["history"][0]["message"]

    human = cli("show", run_id, "f.txt", *_db(store_url, tmp_path), cwd=tmp_path, check=True).stdout
    assert "parse f.txt: succeeded (2 attempt(s))" in human
    assert "#1 retry [runtime_error]" in human and "parser=1.2" in human


def test_unknown_runs_items_and_stages_are_one_line_errors(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    run_id = submit_and_work(target, _docs(tmp_path / "docs", {"a.txt": "red"}), store_url, tmp_path / "blobs").run_id
    for args, says in ((["no-such-run", "a.txt"], "`conveyor status`"),
                       ([run_id, "nothing.txt"], f"`conveyor select --run {run_id}`"),
                       ([run_id, "a.txt¶7"], f"`conveyor select --run {run_id}`"),
                       ([run_id, "a.txt", "--stage", "nope"], "no such stage (parse, split, shout)")):
        proc = cli("show", *args, *_db(store_url, tmp_path), "--json", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr


def test_show_in_a_folder_without_a_store_creates_nothing(tmp_path: Path) -> None:
    proc = cli("show", "r1", "a.txt", cwd=tmp_path)
    assert proc.returncode == 2 and "no run 'r1'" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_replay_shows_its_reason_and_its_mark_in_the_history(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    run_id = submit_and_work(target, _docs(tmp_path / "docs", {"a.txt": "red green"}), store_url, blobs).run_id
    bumped = write_pipeline(tmp_path, PIPE.replace('after=split, version="1"', 'after=split, version="2"'),
                            "bumped.py")

    replayed = cli_json("replay", "--run", run_id, "--stage", "shout", "--reason", "reprocess", "--note", "why",
                        "--target", bumped, "--by", "ana", *_db(store_url, tmp_path), cwd=tmp_path)
    assert replayed["reopened"] == 2
    work(bumped, store_url, blobs, run_id=run_id)

    shown = cli_json("show", run_id, "a.txt", "--stage", "shout", *_db(store_url, tmp_path), cwd=tmp_path)
    assert [t["output"] for t in shown["tasks"]] == ["RED", "GREEN"] and shown["outcome"] == "completed"
    for task in shown["tasks"]:
        replay = task["replay"]
        assert {k: replay[k] for k in ("id", "reason", "note", "by")} == {
            "id": replayed["replay_id"], "reason": "reprocess", "note": "why", "by": "ana"}
        assert isinstance(replay["at"], float)
        assert task["stage_version"] == task["provenance"]["stage_version"] == "2"
        history = [(a["outcome"], a["stage_version"]) for a in task["history"]]
        assert history == [("succeeded", "1"), ("replayed", None), ("succeeded", "2")]
        mark = task["history"][1]
        assert mark["message"] == "reprocess: why" and mark["invoked"] is False and mark["attempt"] == 0
    parse = _show(store_url, tmp_path, run_id, "a.txt", "parse")["tasks"][0]
    assert parse["replay"] is None, "the replay named shout only"


def test_dlq_table_shows_when_and_why_an_entry_was_replayed(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    run_id = submit_and_work(target, _docs(tmp_path / "docs", {"p.txt": "poison"}), store_url, blobs).run_id
    (entry,) = cli_json("dlq", "list", "--run", run_id, "--db", store_url, cwd=tmp_path)["entries"]
    table = cli("dlq", "list", "--run", run_id, "--db", store_url, cwd=tmp_path, check=True).stdout
    assert "replayed" in table and "fixed" not in table

    cli("dlq", "replay", str(entry["id"]), "--reason", "fixed", "--db", store_url, cwd=tmp_path, check=True)
    work(target, store_url, blobs, run_id=run_id)  # still poison: dead-lettered again, a new entry

    listing = cli_json("dlq", "list", "--all", "--run", run_id, "--db", store_url, cwd=tmp_path)
    old = listing["entries"][0]
    assert set(old) == {"id", "task_id", "run_id", "item_key", "stage", "error_class", "error", "attempts",
                        "dead_lettered_at", "replayed_at", "replay_reason"}
    assert old["replay_reason"] == "fixed" and len(listing["entries"]) == 2
    table = cli("dlq", "list", "--all", "--run", run_id, "--db", store_url, cwd=tmp_path, check=True).stdout
    (row,) = [line for line in table.splitlines() if "fixed" in line]
    assert "p.txt" in row and time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(old["replayed_at"])) in row

    task = _show(store_url, tmp_path, run_id, "p.txt")["tasks"][0]
    assert task["status"] == "dead_lettered"
    assert {k: task["replay"][k] for k in ("id", "reason", "at")} == {"id": None, "reason": "fixed",
                                                                      "at": old["replayed_at"]}
    assert [a["outcome"] for a in task["history"]] == ["retry", "dead_lettered", "retry", "dead_lettered"]


def test_outputs_are_shown_bounded() -> None:
    assert shown_output("bytes", b"hello") == {"bytes": 5, "text": "hello"}
    assert shown_output("bytes", b"\xff\xfe" * 300) == {"bytes": 600, "text": None}
    assert shown_output("bytes", ("é" * 300).encode()) == {"bytes": 600, "text": "é" * 200}
    assert shown_output("fanout", [{"k": "json"}] * 3) == {"fanout": 3}
    assert shown_output("json", {"n": [1, 2]}) == {"n": [1, 2]}
    big = {"text": "x" * (OUTPUT_MAX + 10)}
    cut = shown_output("json", big)
    assert cut["cut"] is True and cut["chars"] == len(json.dumps(big)) and len(cut["head"]) == OUTPUT_MAX
    assert json.dumps(big).startswith(cut["head"])
