"""`conveyor replay`: re-opening a selection (succeeded work too), downstream, dry runs, corrected sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime import target as target_module
from conveyor.service.replay import ReplayOptions, replay, requeue
from conveyor.service.selection import Selection, parse_where
from conveyor.store import open_store
from tests.helpers import cli, cli_json, query, reconciled, submit_and_work, work, write_pipeline

PIPE = """
    import os
    from conveyor import Pipeline, Retry, TerminalError

    pipe = Pipeline("reopen", retry=Retry(max_attempts=1))
    PARSER = os.environ.get("PARSER", "1.24.9")

    @pipe.stage(version="1", provenance={"parser": PARSER})
    def parse(ctx, source: bytes) -> dict:
        text = source.decode()
        if "poison" in text and PARSER == "1.24.9":
            raise TerminalError("a cid leaked", error_class="cid_leak")
        return {"text": text}

    @pipe.stage(after=parse, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return doc["text"].split()

    @pipe.stage(after=split)
    def measure(ctx, word: str) -> int:
        return len(word)

    @pipe.stage(after=parse)
    def title(ctx, doc: dict) -> str:
        return doc["text"].split()[0].title()
"""
TEXTS = {"a.txt": "alpha beta", "b.txt": "poison gamma", "c.txt": "gamma delta", "d.txt": "poison eta theta"}


def _setup(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, parser: str = "1.24.9") -> tuple[str, str]:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    for name, text in TEXTS.items():
        (docs / name).write_text(text)
    target = _target(tmp_path, monkeypatch, parser)
    return target, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id


def _target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: str) -> str:
    monkeypatch.setenv("PARSER", parser)
    target_module._cache.clear()
    return write_pipeline(tmp_path, PIPE, name=f"pipe_{parser.replace('.', '_')}.py")


def _replay(store_url: str, tmp_path: Path, selection: Selection, **options: Any) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return replay(store, FilesystemBlobs(tmp_path / "blobs"), selection, ReplayOptions(**options))
    finally:
        store.close()


def _tasks(store_url: str, run_id: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = query(store_url, "SELECT item_key, stage, id, status, task_key, finished_at, replay_id FROM tasks "
                 "WHERE run_id = ?", run_id)
    return {(r[0], r[1]): tuple(r[2:]) for r in rows}


def test_downstream_reopens_exactly_what_lies_after_the_selected_tasks(tmp_path: Path, store_url: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, run_id = _setup(tmp_path, store_url, monkeypatch, "1.25.0")
    before = _tasks(store_url, run_id)
    fixed = _target(tmp_path, monkeypatch, "1.25.1")  # a new parser version: parse runs again on every item
    done = _replay(store_url, tmp_path, Selection(runs=(run_id,), stages=("parse",), item_glob="[ac].txt"),
                   reason="reprocess", note="parser 1.25.1", downstream=True, target=fixed)
    after = _tasks(store_url, run_id)
    selected = {"a.txt", "c.txt"}
    below = {k for k in before if k[0].split("¶")[0] in selected and k[1] != "parse"}
    assert {k for k, v in after.items() if v[1] == "queued"} == {(i, "parse") for i in selected}
    assert {k for k, v in after.items() if v[1] == "superseded"} == below
    untouched = {k for k in before if k[0].split("¶")[0] not in selected}
    assert all(after[k] == before[k] for k in untouched), "tasks of other items are left exactly as they were"
    assert done["reopened"] == 2 and done["superseded"] == len(below)
    assert done["stages"]["parse"] == {"reopen": 2, "memo": 0, "run": 2, "superseded": 0}
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 2, "in_progress": 2}

    work(fixed, store_url, tmp_path / "blobs", run_id=run_id)
    final = _tasks(store_url, run_id)
    assert set(final) == set(before), "each item still has one task per stage: the superseded rows were made again"
    assert {v[1] for v in final.values()} == {"succeeded"}
    assert all(final[k][0] == before[k][0] for k in before), "made again in the same rows"
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 4}
    # The reason is on every task it touched and in their attempt histories.
    rows = query(store_url, "SELECT a.outcome, a.message, t.item_key FROM attempts a JOIN tasks t ON t.id = a.task_id "
                 "WHERE a.run_id = ? AND a.outcome IN ('replayed', 'superseded')", run_id)
    assert {(r[0], r[2]) for r in rows} >= {("replayed", "a.txt"), ("replayed", "c.txt"), ("superseded", "a.txt¶0")}
    assert {r[1] for r in rows} == {"reprocess: parser 1.25.1"}
    assert query(store_url, "SELECT reason, note, reopened, superseded FROM replays") == [
        ("reprocess", "parser 1.25.1", 2, len(below))]


def test_a_parser_fix_reruns_what_failed_under_the_old_version(tmp_path: Path, store_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _, run_id = _setup(tmp_path, store_url, monkeypatch)
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 2, "failed": 2}
    fixed = _target(tmp_path, monkeypatch, "1.24.10")
    selection = Selection(runs=(run_id,), stages=("parse",), error_classes=("cid_leak",),
                          where=parse_where("parser < 1.24.10"))
    done = _replay(store_url, tmp_path, selection, reason="reprocess", target=fixed)
    assert done["reopened"] == 2 and done["superseded"] == 0, "failed tasks have nothing downstream yet"
    work(fixed, store_url, tmp_path / "blobs", run_id=run_id)
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 4}
    assert query(store_url, "SELECT DISTINCT value FROM provenance WHERE run_id = ? AND stage = 'parse' AND "
                 "item_key IN ('b.txt', 'd.txt')", run_id) == [("1.24.10",)]


def _dump(store_url: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("tasks", "outputs", "attempts", "items", "provenance", "replays", "dead_letters", "reviews", "runs")
    return {t: sorted(map(tuple, query(store_url, f"SELECT * FROM {t}")), key=repr) for t in tables}


def test_a_dry_run_changes_nothing(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, run_id = _setup(tmp_path, store_url, monkeypatch)
    before = _dump(store_url)
    blobs_before = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    (tmp_path / "docs" / "a.txt").write_text("alpha corrected " + "x" * 20_000)  # a source bigger than inline
    fixed = _target(tmp_path, monkeypatch, "1.24.10")
    for reason, downstream in (("reprocess", True), ("source-corrected", False), ("retry", False)):
        plan = _replay(store_url, tmp_path, Selection(runs=(run_id,)), reason=reason, downstream=downstream,
                       dry_run=True, target=fixed)
        assert plan["dry_run"] and plan["replay_id"] is None and plan["reopened"] > 0
    assert _dump(store_url) == before
    assert sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file()) == blobs_before


def test_an_unchanged_stage_is_answered_by_the_memo_and_a_changed_source_needs_its_reason(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target, run_id = _setup(tmp_path, store_url, monkeypatch, "1.25.0")
    calls = reconciled(store_url, run_id)["stage_calls"]
    same = _replay(store_url, tmp_path, Selection(runs=(run_id,), stages=("parse",)), reason="reprocess",
                   downstream=True)
    assert same["stages"]["parse"] == {"reopen": 4, "memo": 4, "run": 0, "superseded": 0}
    work(target, store_url, tmp_path / "blobs", run_id=run_id)
    assert reconciled(store_url, run_id)["stage_calls"] == calls, "one lookup per task, no stage call"
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 4}

    (tmp_path / "docs" / "c.txt").write_text("gamma delta epsilon")
    plain = _replay(store_url, tmp_path, Selection(runs=(run_id,), item_glob="c.txt", stages=("parse",)),
                    reason="reprocess")
    assert plain["reopened"] == 0 and plain["skipped"] == {"source_changed": 1}
    fixed = _replay(store_url, tmp_path, Selection(runs=(run_id,), item_glob="c.txt"), reason="source-corrected")
    assert fixed["reopened"] == 1 and fixed["sources_corrected"] == 1 and fixed["downstream"]
    work(target, store_url, tmp_path / "blobs", run_id=run_id)
    measured = query(store_url, "SELECT item_key FROM tasks WHERE run_id = ? AND stage = 'measure' AND root_key = "
                     "'c.txt' AND status = 'succeeded' ORDER BY item_key", run_id)
    assert [r[0] for r in measured] == ["c.txt¶0", "c.txt¶1", "c.txt¶2"], "the new source's three words"
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 4}


REVIEWED = """
    from conveyor import Pipeline, Retry
    from conveyor.acceptance import Accept, Review

    pipe = Pipeline("reviewed", retry=Retry(max_attempts=1))

    @pipe.stage(version="1", config={"model": "small"},
                accept=Accept(confidence="confidence", threshold=0.9, escalate=[{"model": "big"}],
                              review=Review(deadline="48h")))
    def extract(ctx, source: bytes) -> dict:
        return {"text": source.decode(), "confidence": 0.5, "model": ctx.config["model"]}
"""


def test_requeue_runs_rejected_answers_again_from_the_first_tier(tmp_path: Path, store_url: str) -> None:
    from conveyor.runtime.target import load_target

    target = write_pipeline(tmp_path, REVIEWED)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "x.txt").write_text("some text")
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    env = {"CONVEYOR_REVIEWER": "ann"}
    listed = cli_json("review", "list", "--db", store_url, cwd=tmp_path, env=env)
    review_id = str(listed["reviews"][0]["id"])
    cli("review", "reject", review_id, "--why", "wrong", "--db", store_url, cwd=tmp_path, env=env, check=True)
    assert reconciled(store_url, run_id)["outcomes"] == {"rejected": 1}
    assert query(store_url, "SELECT tier FROM tasks WHERE run_id = ?", run_id) == [(1,)]

    store = open_store(store_url)
    try:
        done = requeue(load_target(target), store, FilesystemBlobs(tmp_path / "blobs"), run_id, "extract",
                       "the rule was wrong", ("rejected",))
    finally:
        store.close()
    assert done["requeued"] == 1
    assert query(store_url, "SELECT status, tier, attempts FROM tasks WHERE run_id = ?", run_id) == [("queued", 0, 0)]
    work(target, store_url, tmp_path / "blobs", run_id=run_id)
    tiers = query(store_url, "SELECT outcome, tier FROM attempts WHERE run_id = ? AND tier IS NOT NULL ORDER BY id",
                  run_id)
    assert [tuple(r) for r in tiers][-2:] == [("escalated", 0), ("awaiting_review", 1)], \
        "asked again from tier 0, not answered by the memoised rejection"
    assert reconciled(store_url, run_id)["outcomes"] == {"awaiting_review": 1}


def test_replay_cli_processes_in_one_step_and_says_what_is_wrong(tmp_path: Path, store_url: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, run_id = _setup(tmp_path, store_url, monkeypatch)
    fixed = _target(tmp_path, monkeypatch, "1.24.10")
    common = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    plan = cli_json("replay", "--run", run_id, "--status", "failed", "--reason", "retry", "--target", fixed,
                    "--dry-run", *common, cwd=tmp_path)
    assert plan["dry_run"] and plan["stages"]["parse"]["run"] == 2
    done = cli("replay", "--run", run_id, "--status", "failed", "--reason", "retry", "--note", "parser fixed",
               "--target", fixed, "--process", "--workers", "1", "--json", *common, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    data = json.loads(done.stdout)
    assert data["reopened"] == 2 and data["processed"][0]["outcomes"] == {"completed": 4}
    if not store_url.startswith("sqlite"):
        return  # the one-line errors below are the command line's, the same on every backend
    for args, words in ((["--reason", "because"], "--reason 'because'"),
                        (["--reason", "retry", "--run", "r-none"], "no run"),
                        (["--reason", "retry", "--target", "nowhere.py:pipe"], "nowhere.py")):
        wrong = cli("replay", *args, *common, cwd=tmp_path)
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and words in wrong.stderr, wrong.stderr


POISONED = """
    import os
    from conveyor import Pipeline, Retry

    pipe = Pipeline("poisoned", retry=Retry(max_attempts=1))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> str:
        return source.decode()

    @pipe.stage(after=parse)
    def work(ctx, text: str) -> str:
        if "poison" in text:
            raise ValueError("cannot digest " + text)
        return text.upper()
"""


def test_dlq_replay_of_a_superseded_task_says_superseded(tmp_path: Path, store_url: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in {"a.txt": "poison one", "b.txt": "poison two", "c.txt": "fine"}.items():
        (docs / name).write_text(text)
    target = write_pipeline(tmp_path, POISONED)
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    letters = {r[1]: int(r[0]) for r in query(store_url, "SELECT id, item_key FROM dead_letters WHERE run_id = ?",
                                               run_id)}
    assert sorted(letters) == ["a.txt", "b.txt"]
    replayed = _replay(store_url, tmp_path, Selection(runs=(run_id,), stages=("parse",), item_glob="a.txt"),
                       reason="reprocess", downstream=True)  # a's work task is superseded, its letter closed
    assert replayed["superseded"] == 1

    done = cli_json("dlq", "replay", str(letters["a.txt"]), str(letters["b.txt"]), "--reason", "fixed",
                    "--db", store_url, cwd=tmp_path)
    assert done["replayed"] == 1  # b
    assert done["skipped"] == [{"id": letters["a.txt"], "why": "superseded", "replay": replayed["replay_id"]}]
    again = cli("dlq", "replay", str(letters["a.txt"]), str(letters["b.txt"]), "9999", "--reason", "fixed",
                "--db", store_url, cwd=tmp_path)
    assert again.returncode == 0
    assert again.stdout.splitlines() == [
        "replayed 0 task(s): fixed",
        f"dead letter {letters['a.txt']} was superseded: replay {replayed['replay_id']} queued its task again (or "
        "replaced it) since; `conveyor show RUN ITEM` says what became of it",
        f"dead letter {letters['b.txt']} was replayed already; its task has a newer outcome",
        "no dead letter 9999; `conveyor dlq list` shows their ids"]
    assert query(store_url, "SELECT status FROM tasks WHERE run_id = ? AND item_key = 'a.txt' AND stage = 'work'",
                 run_id) == [("superseded",)], "a superseded task is not queued by a dlq replay"
