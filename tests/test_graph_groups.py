"""Group stages (issue 28, point 3): once per group of a run after every item settled at the parent; group items
`group:KEY` with their own outcome; an unchanged group is a lookup on a re-run; one changed member runs only its
group; large groups in batches folded up a tree, each step memoised; both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import query, reconciled, submit_and_work, write_pipeline

GROUPED = """
from conveyor import Pipeline

pipe = Pipeline("grouped")

@pipe.stage()
def parse(ctx, source):
    text = source.decode()
    if text == "broken":
        raise ValueError("cannot parse")
    return {"letter": text[0], "text": text}

@pipe.stage(after=parse, kind="group", by=lambda doc: doc["letter"])
def by_letter(ctx, key, members):
    return {"key": key, "members": [k for k, _ in members], "texts": sorted(v["text"] for _, v in members)}

@pipe.stage(after=parse, kind="reduce")
def everything(ctx, key, members):
    return {"key": key, "count": len(members)}

@pipe.stage(after=by_letter, kind="publish", into="letters")
def publish(ctx, summary):
    from conveyor.acceptance import Record
    return Record(fields=summary, text=" ".join(summary["texts"]))
"""


def _docs(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder


def _group_outputs(store_url: str, run_id: str, stage: str) -> dict[str, object]:
    rows = query(store_url, "SELECT t.item_key, o.inline, t.cached FROM tasks t JOIN outputs o ON o.task_key = "
                            "t.task_key WHERE t.run_id = ? AND t.stage = ?", run_id, stage)
    return {r[0]: json.loads(bytes(r[1])) for r in rows}


def _ran(store_url: str, run_id: str) -> list[tuple[str, str]]:
    return sorted(query(store_url, "SELECT t.item_key, t.stage FROM attempts a JOIN tasks t ON t.id = a.task_id "
                                   "WHERE a.run_id = ? AND a.invoked = 1", run_id))


def test_groups_run_once_per_group_after_every_member_settled(tmp_path: Path, store_url: str) -> None:
    texts = {"a1.txt": "apple", "a2.txt": "avocado", "b1.txt": "banana", "c1.txt": "cherry", "x.txt": "broken"}
    docs = _docs(tmp_path / "docs", texts)
    target = write_pipeline(tmp_path, GROUPED)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    groups = _group_outputs(store_url, done.run_id, "by_letter")
    assert groups == {
        "group:a": {"key": "a", "members": ["a1.txt", "a2.txt"], "texts": ["apple", "avocado"]},
        "group:b": {"key": "b", "members": ["b1.txt"], "texts": ["banana"]},
        "group:c": {"key": "c", "members": ["c1.txt"], "texts": ["cherry"]}}
    assert _group_outputs(store_url, done.run_id, "everything") == {"group:*": {"key": "*", "count": 4}}
    published = query(store_url, "SELECT item_key FROM publications WHERE collection = 'letters' AND live = 1 "
                                 "ORDER BY item_key")
    assert [r[0] for r in published] == ["group:a", "group:b", "group:c"]
    report = reconciled(store_url, done.run_id)
    assert report["unaccounted"] == 0

    # The same run again: every group is a lookup. One member changed: only its group runs again.
    again = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert [r for r in _ran(store_url, again.run_id) if r[1] != "parse"] == []
    (docs / "b1.txt").write_text("blueberry")
    third = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert [r for r in _ran(store_url, third.run_id) if r[0] != "x.txt"] == [
        ("b1.txt", "parse"), ("group:*", "everything"), ("group:b", "by_letter"), ("group:b", "publish")]


FOLDED = """
from conveyor import Pipeline

pipe = Pipeline("folded")

def combine(ctx, key, parts):
    return {"total": sum(p["total"] for p in parts), "folds": 1 + sum(p["folds"] for p in parts)}

@pipe.stage()
def number(ctx, source):
    return int(source.decode())

@pipe.stage(after=number, kind="reduce", batch=8, fold=combine)
def total(ctx, key, members):
    return {"total": sum(v for _, v in members), "folds": 0}
"""


def test_a_large_group_is_called_on_batches_and_folded_and_an_added_member_costs_a_few_steps(
        tmp_path: Path, store_url: str) -> None:
    docs = _docs(tmp_path / "docs", {f"n{i:04d}.txt": str(i) for i in range(200)})
    target = write_pipeline(tmp_path, FOLDED)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    result = _group_outputs(store_url, done.run_id, "total")["group:*"]
    assert result["total"] == sum(range(200)) and result["folds"] >= 2
    steps = query(store_url, "SELECT COUNT(*) FROM outputs WHERE stage = 'total'")[0][0]
    (docs / "n0200.txt").write_text("200")
    again = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert _group_outputs(store_url, again.run_id, "total")["group:*"]["total"] == sum(range(201))
    new_steps = query(store_url, "SELECT COUNT(*) FROM outputs WHERE stage = 'total'")[0][0] - steps
    assert 2 <= new_steps <= 6, new_steps  # its batch, the folds above it and the group's own answer


def test_replay_downstream_of_a_member_makes_its_groups_again(tmp_path: Path, store_url: str,
                                                             monkeypatch: object) -> None:
    from conveyor.blobs import FilesystemBlobs
    from conveyor.runtime import target as target_module
    from conveyor.service.replay import ReplayOptions, replay
    from conveyor.service.selection import Selection
    from conveyor.store import open_store
    from tests.helpers import work

    docs = _docs(tmp_path / "docs", {"a1.txt": "apple", "b1.txt": "banana", "b2.txt": "berry"})
    target = write_pipeline(tmp_path, GROUPED)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    (docs / "b2.txt").write_text("apricot")  # corrected at the source: b2 moves to group a
    target_module._cache.clear()
    store = open_store(store_url)
    try:
        plan = replay(store, FilesystemBlobs(tmp_path / "blobs"), Selection(runs=(done.run_id,), stages=("parse",),
                      item_glob="b2.txt"), ReplayOptions(reason="source-corrected", downstream=True))
        skipped = replay(store, FilesystemBlobs(tmp_path / "blobs"), Selection(runs=(done.run_id,),
                         stages=("by_letter",)), ReplayOptions(reason="reprocess", dry_run=True))
    finally:
        store.close()
    assert plan["reopened"] == 1
    assert skipped["skipped"] == {"superseded": 2}  # both groups wait to be made again
    work(target, store_url, tmp_path / "blobs", run_id=done.run_id)
    groups = _group_outputs(store_url, done.run_id, "by_letter")
    assert groups["group:a"]["members"] == ["a1.txt", "b2.txt"] and groups["group:b"]["members"] == ["b1.txt"]
    assert _group_outputs(store_url, done.run_id, "everything")["group:*"]["count"] == 3
    assert reconciled(store_url, done.run_id)["unaccounted"] == 0


def test_the_command_line_makes_groups_of_a_run_answered_whole_from_the_memo(tmp_path: Path, store_url: str) -> None:
    from tests.helpers import cli_json

    docs = _docs(tmp_path / "docs", {"a1.txt": "apple", "b1.txt": "banana"})
    target = write_pipeline(tmp_path, GROUPED)
    common = ("--input", str(docs), "--db", store_url, "--blobs", str(tmp_path / "blobs"), "--workers", "1")
    first = cli_json("run", target, *common, cwd=tmp_path)
    again = cli_json("run", target, *common, cwd=tmp_path)
    assert first["outcomes"] == {"completed": 3, "published": 2} and first["unaccounted"] == 0
    assert again["outcomes"] == first["outcomes"] and again["stage_calls"] == 0
    status = cli_json("status", again["run_id"], "--db", store_url, cwd=tmp_path)
    assert status["groups_waiting"] == []
    report = cli_json("reconcile", again["run_id"], "--db", store_url, cwd=tmp_path)
    assert report["groups"] == {"by_letter": {"groups": 2, "members": 2, "left_out": 0},
                                "everything": {"groups": 1, "members": 2, "left_out": 0}}


def test_two_workers_make_each_group_once_and_publish_it_once(tmp_path: Path, store_url: str) -> None:
    from tests.helpers import submit_run, workers_until_idle

    docs = _docs(tmp_path / "docs", {f"{letter}{i}.txt": f"{letter}{i}" for letter in "abcdef" for i in range(20)})
    target = write_pipeline(tmp_path, GROUPED)
    run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
    workers_until_idle(target, store_url, tmp_path / "blobs", batch_size=3)
    rows = query(store_url, "SELECT stage, COUNT(*), SUM(attempts) FROM tasks WHERE run_id = ? AND item_key LIKE "
                            "'group:%' GROUP BY stage ORDER BY stage", run_id)
    assert rows == [("by_letter", 6, 6), ("everything", 1, 1), ("publish", 6, 6)]
    versions = query(store_url, "SELECT item_key, COUNT(*) FROM publications WHERE collection = 'letters' "
                                "GROUP BY item_key")
    assert sorted(versions) == [(f"group:{letter}", 1) for letter in "abcdef"]
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 121, "published": 6}


KILLED = """
import os, time
from pathlib import Path
from conveyor import Pipeline
from conveyor.acceptance import Record

pipe = Pipeline("killed", lease_seconds=2)
MARK = Path(os.environ["MARK"])

@pipe.stage()
def parse(ctx, source):
    return {"letter": source.decode()[0]}

@pipe.stage(after=parse, kind="group", by=lambda doc: doc["letter"])
def by_letter(ctx, key, members):
    if not MARK.exists():  # the first attempt announces itself and hangs until its worker is killed
        MARK.write_text("started")
        time.sleep(60)
    return {"key": key, "count": len(members)}

@pipe.stage(after=by_letter, kind="publish", into="letters")
def publish(ctx, summary):
    return Record(fields=summary, text=summary["key"])
"""


def test_a_group_whose_worker_is_killed_runs_again_once_and_publishes_once(tmp_path: Path, store_url: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import SRC, submit_run, work

    mark = tmp_path / "mark"
    monkeypatch.setenv("MARK", str(mark))
    docs = _docs(tmp_path / "docs", {"a1.txt": "apple", "a2.txt": "avocado"})
    target = write_pipeline(tmp_path, KILLED)
    run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
    env = {**os.environ, "PYTHONPATH": SRC}
    victim = subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--db", store_url, "--blobs",
                               str(tmp_path / "blobs")], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert time.monotonic() < deadline and victim.poll() is None, "the group never started"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    work(target, store_url, tmp_path / "blobs", run_id=run_id)
    assert query(store_url, "SELECT status, attempts FROM tasks WHERE run_id = ? AND stage = 'by_letter'",
                 run_id) == [("succeeded", 2)]
    assert query(store_url, "SELECT item_key, COUNT(*) FROM publications GROUP BY item_key") == [("group:a", 1)]
    assert reconciled(store_url, run_id)["outcomes"] == {"completed": 2, "published": 1}


def _replayed(target: str, store_url: str, blobs: Path, run_id: str, item: str) -> None:
    """Replay ``item``'s parse downstream (its source corrected) and work the run to its end."""
    from conveyor.blobs import FilesystemBlobs
    from conveyor.runtime import target as target_module
    from conveyor.service.replay import ReplayOptions, replay
    from conveyor.service.selection import Selection
    from conveyor.store import open_store
    from tests.helpers import work

    target_module._cache.clear()
    store = open_store(store_url)
    try:
        replay(store, FilesystemBlobs(blobs), Selection(runs=(run_id,), stages=("parse",), item_glob=item),
               ReplayOptions(reason="source-corrected", downstream=True))
    finally:
        store.close()
    work(target, store_url, blobs, run_id=run_id)


FIVE = {"a1.txt": "apple", "a2.txt": "avocado", "b1.txt": "banana", "b2.txt": "berry", "c1.txt": "cherry"}


def test_diff_names_the_members_each_group_gained_lost_or_saw_change(tmp_path: Path, store_url: str) -> None:
    from tests.helpers import cli, cli_json

    docs = _docs(tmp_path / "docs", FIVE)
    target = write_pipeline(tmp_path, GROUPED)
    first = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    (docs / "b2.txt").write_text("apricot")  # b2 moves from group b to group a
    (docs / "c1.txt").write_text("cranberry")  # c1 stays in group c, its output changed
    second = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    common = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    diff = cli_json("diff", first.run_id, second.run_id, *common, cwd=tmp_path)
    by_key = {entry["item_key"]: entry for entry in diff["items"]}
    assert diff["counts"]["changed"] == 6 and diff["counts"]["unchanged"] == 3  # a1, a2, b1 unchanged
    assert set(by_key) == {"b2.txt", "c1.txt", "group:*", "group:a", "group:b", "group:c"}

    def members(key: str, stage: str) -> tuple[list[str], list[str], list[str]]:
        change = by_key[key]["members"][stage]
        return change["added"], change["removed"], change["changed"]
    assert members("group:a", "by_letter") == (["b2.txt"], [], [])
    assert members("group:b", "by_letter") == ([], ["b2.txt"], [])
    assert members("group:c", "by_letter") == ([], [], ["c1.txt"])
    assert members("group:*", "everything") == ([], [], ["b2.txt", "c1.txt"])
    assert {f["field"] for f in by_key["group:a"]["fields"]} >= {"by_letter.members", "publish.text"}
    assert by_key["group:a"]["change"] == "changed" and by_key["group:a"]["outcome_b"] == "published"
    text = cli("diff", first.run_id, second.run_id, *common, cwd=tmp_path).stdout
    assert "group:a: changed (published → published)" in text and "members at by_letter: +1 (b2.txt)" in text


def test_select_filters_group_items_by_stage_and_group_key(tmp_path: Path, store_url: str) -> None:
    from conveyor.service.selection import check, select_report, selection_of
    from conveyor.store import open_store

    docs = _docs(tmp_path / "docs", FIVE)
    target = write_pipeline(tmp_path, GROUPED)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        def picked(**filters: object) -> list[tuple[str, str]]:
            found = select_report(store, check(selection_of(runs=[done.run_id], **filters)))  # type: ignore[arg-type]
            return sorted((t["item_key"], t["stage"]) for t in found["items"])

        assert picked(stages=["by_letter"]) == [("group:a", "by_letter"), ("group:b", "by_letter"),
                                                ("group:c", "by_letter")]
        assert picked(stages=["by_letter"], item="group:b") == [("group:b", "by_letter")]
        assert picked(item="group:b") == [("group:b", "by_letter"), ("group:b", "publish")]
        assert picked(stages=["everything"]) == [("group:*", "everything")]
        assert picked(item="group:[*]") == [("group:*", "everything")]  # the reduce's one group, by its key
        assert picked(stages=["publish"], outcomes=["published"]) == [
            ("group:a", "publish"), ("group:b", "publish"), ("group:c", "publish")]
    finally:
        store.close()


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "with-a-failure"])
def test_a_group_a_replay_made_vanish_is_superseded_not_completed(tmp_path: Path, store_url: str,
                                                                  settled: bool) -> None:
    from conveyor.blobs import FilesystemBlobs
    from conveyor.service.datasets import iter_rows
    from conveyor.service.export import run_export
    from conveyor.service.report import find_run, status_report
    from conveyor.service.selection import check, select_report, selection_of
    from conveyor.service.show import show_item
    from conveyor.store import open_store

    texts = dict(FIVE) | ({} if settled else {"x.txt": "broken"})
    docs = _docs(tmp_path / "docs", texts)
    target = write_pipeline(tmp_path, GROUPED)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    (docs / "c1.txt").write_text("acorn")  # c1 was group c's only member: it moves to group a, group c is no more
    _replayed(target, store_url, tmp_path / "blobs", done.run_id, "c1.txt")
    report = reconciled(store_url, done.run_id)
    # group:a and group:b published; group:* and the five documents completed; group:c superseded.
    expected = {"completed": 6, "published": 2, "superseded": 1} | ({} if settled else {"dead_lettered": 1})
    assert report["outcomes"] == expected and report["unaccounted"] == 0
    assert report["groups"]["by_letter"] == {"groups": 2, "members": 5, "left_out": 0 if settled else 1}
    store = open_store(store_url)
    try:
        assert status_report(store, find_run(store, done.run_id))["outcomes"] == expected
        assert show_item(store, FilesystemBlobs(tmp_path / "blobs"), done.run_id, "group:c")["outcome"] == "superseded"
        assert show_item(store, FilesystemBlobs(tmp_path / "blobs"), done.run_id, "group:a")["outcome"] == "published"
        found = select_report(store, check(selection_of(runs=[done.run_id], outcomes=["superseded"])))
        assert sorted((t["item_key"], t["stage"]) for t in found["items"]) == [("group:c", "by_letter"),
                                                                                ("group:c", "publish")]
        rows = iter_rows(run_export(store, FilesystemBlobs(tmp_path / "blobs"), done.run_id, outcome="all"))
        assert {r["item_key"]: r["outcome"] for r in rows if r["item_key"].startswith("group:")} == {
            "group:*": "completed", "group:a": "published", "group:b": "published", "group:c": "superseded"}
    finally:
        store.close()
    assert _group_outputs(store_url, done.run_id, "by_letter")["group:a"]["members"] == ["a1.txt", "a2.txt", "c1.txt"]


KEYED_BADLY = """
from conveyor import Pipeline

pipe = Pipeline("keyed_badly")

@pipe.stage()
def parse(ctx, source):
    text = source.decode()
    return {"letter": text[0]} if text != "nokey" else {"text": text}

@pipe.stage(after=parse, kind="group", by=lambda doc: doc["letter"])
def by_letter(ctx, key, members):
    return [k for k, _ in members]
"""


def test_members_whose_group_key_raised_are_counted_left_out_with_the_error(tmp_path: Path, store_url: str,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(tmp_path / "docs", {"a1.txt": "apple", "a2.txt": "avocado", "n1.txt": "nokey", "n2.txt": "nokey"})
    target = write_pipeline(tmp_path, KEYED_BADLY)
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert _group_outputs(store_url, done.run_id, "by_letter") == {"group:a": ["a1.txt", "a2.txt"]}
    groups = reconciled(store_url, done.run_id)["groups"]["by_letter"]
    assert groups == {"groups": 1, "members": 2, "left_out": 2, "key_failed": 2,
                      "key_error": "n1.txt: KeyError: 'letter'"}

    from conveyor.cli.render import summary
    summary(reconciled(store_url, done.run_id))
    assert "by_letter: 2 member(s) left out of every group, its by= raised on them" in capsys.readouterr().out

    # The members' outputs change so that every one has a key: the groups made again say nothing is left out.
    (docs / "n1.txt").write_text("nut")
    (docs / "n2.txt").write_text("nutmeg")
    again = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert reconciled(store_url, again.run_id)["groups"]["by_letter"] == {
        "groups": 2, "members": 4, "left_out": 0}
