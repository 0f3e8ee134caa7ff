"""Provenance as indexed rows, and `conveyor select`: filters that combine, versions compared as versions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conveyor.runtime import target as target_module
from conveyor.service.selection import Selection, parse_where, read_items, select_report
from conveyor.store import open_store
from conveyor.store.provenance import sort_key
from tests.helpers import cli, cli_json, query, submit_and_work, write_pipeline

PIPE = """
    import os
    from conveyor import Pipeline, Retry, TerminalError

    pipe = Pipeline("sel", retry=Retry(max_attempts=1))
    PARSER = os.environ.get("PARSER", "1.24.9")

    @pipe.stage(version="1", provenance={"parser": PARSER})
    def parse(ctx, source: bytes) -> dict:
        text = source.decode()
        ctx.provenance["schema"] = "3"
        if "poison" in text and PARSER == "1.24.9":
            raise TerminalError("a cid leaked", error_class="cid_leak")
        if "broken" in text:
            raise TerminalError("cannot parse", error_class="unparseable")
        return {"text": text}

    @pipe.stage(after=parse, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return doc["text"].split()

    @pipe.stage(after=split)
    def measure(ctx, word: str) -> int:
        return len(word)
"""


def _docs(folder: Path) -> Path:
    folder.mkdir()
    texts = {"a.txt": "alpha beta", "b.txt": "poison gamma", "c.txt": "broken delta", "d.txt": "poison again",
             "e.txt": "epsilon zeta eta"}
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder


def _run(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, parser: str, name: str) -> str:
    monkeypatch.setenv("PARSER", parser)
    target_module._cache.clear()
    target = write_pipeline(tmp_path, PIPE, name=name)
    docs = tmp_path / "docs" if (tmp_path / "docs").exists() else _docs(tmp_path / "docs")
    return submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id


def _report(store_url: str, limit: int = 1000, count: bool = False, **filters: object) -> dict:
    store = open_store(store_url)
    try:
        return select_report(store, Selection(**filters), limit, count)  # type: ignore[arg-type]
    finally:
        store.close()


def _keys(report: dict) -> list[tuple[str, str]]:
    return sorted((i["item_key"], i["stage"]) for i in report["items"])


def test_versions_compare_as_versions_not_as_text() -> None:
    assert "1.24.10" < "1.24.9", "text order gets it wrong"
    assert sort_key("1.24.9") < sort_key("1.24.10") < sort_key("1.25")
    assert sort_key("1.24") < sort_key("1.24.1") < sort_key("1.24.1a") < sort_key("1.24.2")
    assert sort_key("1.024") == sort_key("1.24") and sort_key("v2") < sort_key("v10")


def test_provenance_is_recorded_and_versions_select_as_versions(tmp_path: Path, store_url: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    old = _run(tmp_path, store_url, monkeypatch, "1.24.9", "old.py")
    new = _run(tmp_path, store_url, monkeypatch, "1.24.10", "new.py")
    # Every parse task of both runs has its declared and its run-time provenance as rows ...
    rows = query(store_url, "SELECT run_id, name, value FROM provenance WHERE stage = 'parse' ORDER BY run_id, name")
    assert {(r[1], r[2]) for r in rows if r[0] == old} == {("parser", "1.24.9"), ("schema", "3")}
    assert {(r[1], r[2]) for r in rows if r[0] == new} == {("parser", "1.24.10"), ("schema", "3")}
    # ... and its attempts carry the document.
    docs = query(store_url, "SELECT DISTINCT a.provenance FROM attempts a JOIN tasks t ON t.id = a.task_id "
                 "WHERE t.stage = 'parse' AND a.run_id = ?", old)
    assert [json.loads(d[0]) for d in docs] == [{"parser": "1.24.9", "schema": "3"}]

    older = _report(store_url, where=parse_where("parser < 1.24.10"))
    assert {i["run_id"] for i in older["items"]} == {old} and older["count"] == 5
    assert {i["provenance"]["parser"] for i in older["items"]} == {"1.24.9"}
    newer = _report(store_url, where=parse_where("parser >= 1.24.10 and schema = 3"))
    assert {i["run_id"] for i in newer["items"]} == {new} and newer["count"] == 5
    assert _report(store_url, where=parse_where("parser != 1.24.9"), stages=("parse",))["count"] == 5

    # A re-run answered from the memo (its items copied from the latest run) keeps what made each output.
    again = _run(tmp_path, store_url, monkeypatch, "1.24.10", "new.py")
    copied = _report(store_url, runs=(again,), where=parse_where("parser = 1.24.10"))
    assert copied["count"] == 5, "a memoised refusal (c.txt's) keeps its provenance too"
    assert {i["item_key"] for i in copied["items"] if i["status"] == "failed"} == {"c.txt"}


def test_filters_combine(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = time.time() - 1
    run_id = _run(tmp_path, store_url, monkeypatch, "1.24.9", "pipe.py")
    failed = _report(store_url, runs=(run_id,), statuses=("failed",), count=True)
    assert _keys(failed) == [("b.txt", "parse"), ("c.txt", "parse"), ("d.txt", "parse")]
    assert failed["counts"] == {"stages": {"parse": 3}, "outcomes": {"failed": 3}, "items": 3}
    leaked = _report(store_url, runs=(run_id,), error_classes=("cid_leak",), where=parse_where("parser < 1.24.10"))
    assert _keys(leaked) == [("b.txt", "parse"), ("d.txt", "parse")]
    assert leaked["items"][0]["error_class"] == "cid_leak"
    # Any status (the default) includes succeeded work; a glob picks items, fan-out children included by "*".
    every = _report(store_url, runs=(run_id,), item_glob="a.txt*")
    assert _keys(every) == [("a.txt", "parse"), ("a.txt", "split"), ("a.txt¶0", "measure"), ("a.txt¶1", "measure")]
    assert _report(store_url, runs=(run_id,), item_glob="[ae].txt", stages=("parse",),
                   statuses=("succeeded",))["count"] == 2
    # A file of keys names root items; their fan-out children come with them.
    listed = tmp_path / "keys.txt"
    listed.write_text("e.txt\n\nc.txt\n")
    named = _report(store_url, runs=(run_id,), items=read_items(str(listed)))
    assert {i["item_key"].split("¶")[0] for i in named["items"]} == {"c.txt", "e.txt"} and named["count"] == 6
    # Outcomes: the tasks that make an item's outcome, unless a stage or status says otherwise.
    assert _keys(_report(store_url, runs=(run_id,), outcomes=("completed",), stages=("split",))) == [
        ("a.txt", "split"), ("e.txt", "split")]
    assert _report(store_url, runs=(run_id,), outcomes=("failed",))["count"] == 3
    # A time window, and a limit that lists fewer than it counts.
    assert _report(store_url, runs=(run_id,), since=before)["count"] == 12
    assert _report(store_url, runs=(run_id,), until=before)["count"] == 0
    limited = _report(store_url, runs=(run_id,), limit=2)
    assert limited["count"] == 12 and len(limited["items"]) == 2 and limited["truncated"]
    # Built-in names compare too: the stage version, the item's source digest, the stage's code.
    assert _report(store_url, runs=(run_id,), where=parse_where("version >= 1"), stages=("parse",))["count"] == 5
    source = query(store_url, "SELECT source_digest FROM items WHERE run_id = ? AND item_key = 'a.txt'", run_id)[0][0]
    assert _keys(_report(store_url, runs=(run_id,), where=parse_where(f"source = {source}"), stages=("parse",))) == [
        ("a.txt", "parse")]
    code = every["items"][0]["provenance"]["code"]
    assert code and _report(store_url, runs=(run_id,), where=parse_where(f"code = {code}"))["count"] == 5


MODELS = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5, prices={"sim-1": [1.0, 4.0]})

    pipe = Pipeline("models", provider=provider, retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    async def ask(ctx, source: bytes) -> str:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1",
                                prompt_version="ask@2")
        return answer.text
"""


def test_model_revision_and_prompt_version_are_provenance(tmp_path: Path, store_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    from conveyor.providers.simulator import SimConfig, run_simulator
    from tests.helpers import make_docs

    target = write_pipeline(tmp_path, MODELS)
    docs = make_docs(tmp_path / "docs", 3, "question {i}")
    with run_simulator(SimConfig(seed=3)) as url:
        monkeypatch.setenv("SIM_URL", url)
        run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
        again = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    asked = _report(store_url, runs=(run_id,), models=("sim-1",))
    assert asked["count"] == 3
    doc = asked["items"][0]["provenance"]
    assert doc["model"] == "sim-1" and doc["prompt_version"] == "ask@2" and doc["revision"].startswith("sim-1@")
    assert _report(store_url, models=("gpt-4o",))["count"] == 0
    assert _report(store_url, runs=(again,), where=parse_where("prompt_version = ask@2"))["count"] == 3, \
        "memo answers carry the provenance of the call that made them"


def test_select_cli_json_and_its_one_line_errors(tmp_path: Path, store_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _run(tmp_path, store_url, monkeypatch, "1.24.9", "pipe.py")
    common = ("--db", store_url)
    data = cli_json("select", "--run", run_id, "--status", "failed", "--error-class", "cid_leak", "--count", *common,
                    cwd=tmp_path)
    assert data["count"] == 2 and data["counts"]["outcomes"] == {"failed": 2}
    assert set(data["items"][0]) >= {"run_id", "item_key", "stage", "status", "error_class", "provenance"}
    if not store_url.startswith("sqlite"):
        return  # the one-line errors below are the command line's, the same on every backend
    for args, words in ((["--where", "parser <<"], "--where"), (["--status", "done"], "--status 'done'"),
                        (["--items", str(tmp_path / "nope.txt")], "cannot read"), (["--run", "r-nope"], "no run"),
                        (["--outcome", "lost"], "--outcome"), (["--since", "yesterday"], "--since"),
                        (["--stage", "nope"], "--stage 'nope'")):
        wrong = cli("select", *args, *common, cwd=tmp_path)
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and words in wrong.stderr, wrong.stderr
    empty = cli("select", "--json", cwd=tmp_path / "docs")
    assert empty.returncode == 2 and not (tmp_path / "docs" / ".conveyor").exists()


@pytest.mark.parametrize("walk", [1, 5000])
def test_pages_of_one_provenance_condition_read_from_its_rows_are_the_usual_pages(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, walk: int) -> None:
    from conveyor.store import selection as store_selection
    from conveyor.store.selection import ProvenanceTerm, TaskFilter

    run_id = _run(tmp_path, store_url, monkeypatch, "1.24.9", "paged.py")
    monkeypatch.setattr(store_selection, "WALK", walk)  # 1: the first look always falls short, the sort answers
    store = open_store(store_url)
    try:
        for term, found in ((ProvenanceTerm("parser", "=", sort_key("1.24.9")), 5),
                            (ProvenanceTerm("schema", ">=", sort_key("3")), 5),
                            (ProvenanceTerm("parser", "<", sort_key("1.24.0")), 0)):
            f = TaskFilter(runs=(run_id,), provenance=(term,))
            assert len(store._provenance_page_sql(f, None, 2)) == 2, "the provenance rows' statements are asked"
            pages, usual, after = [], [], None
            while True:
                page = [(t.root_key, t.item_key, t.stage) for t in store.task_page(f, after, 2)]
                sql, params = store._task_page_sql(f, after, 2)
                usual.append([(str(r[2]), str(r[3]), str(r[4])) for r in store.db.execute(sql, params)])
                pages.append(page)
                if len(page) < 2:
                    break
                after = page[-1]
            assert pages == usual and sum(map(len, pages)) == found, (term, pages)
        mixed = TaskFilter(runs=(run_id,), stages=("parse",), provenance=(ProvenanceTerm("parser", "=", "x"),))
        assert store._provenance_page_sql(mixed, None, 2) == [], "with another condition, the usual statement"
    finally:
        store.close()
