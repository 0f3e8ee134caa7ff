"""Reconciliation as a product report (both backends): every item in exactly one outcome, what an accepted
item cost, a seeded quality sample by slice, and the exit codes a script reads."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.service import review
from conveyor.service.records import MAX_SLICE_VALUES, RunGraph, SampleOptions, _Picks, record_stage
from conveyor.service.report import exit_code, find_run, reconcile, status_report
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import cli, query, submit_and_work, work, write_pipeline

# An async extraction through an in-process provider (priced: "small" and the escalation tier "big"), behind an
# acceptance boundary: a title starting "unsure" is below the threshold at both tiers and goes to review. The
# record fans out to one part per item ("empty": none, so the item completes without a publication) and each
# part is published. Environment variables make the reprocess of test_diff: EXTRACT_VERSION bumps the stage,
# UPPER/NEST change a field of the listed items, FAIL refuses them, SURE makes them sure.
PIPE = """
    import os
    from conveyor import Pipeline, Retry, TerminalError
    from conveyor.acceptance import Accept, Review
    from conveyor.providers import Completion, PriceTable

    PRICES = PriceTable.from_dict({"small": [1.0, 2.0], "big": [10.0, 20.0]})

    class FakeProvider:
        name = "fake"

        async def chat(self, messages, *, model, prompt_version=None, **options):
            cost, priced = PRICES.cost_for(model, model, 100, 20)
            return Completion(text=messages[0]["content"], data=None, model=model, prompt_tokens=100,
                              completion_tokens=20, cost=cost, request_id=None, prompt_version=prompt_version,
                              latency=0.0, priced=priced)

    pipe = Pipeline(os.environ.get("PIPE_NAME", "report"), provider=FakeProvider,
                    retry=Retry(max_attempts=2, base=0.01, cap=0.01))

    def listed(name):
        return os.environ.get(name, "").split(",")

    @pipe.stage(version=os.environ.get("EXTRACT_VERSION", "1"), config={"model": "small"},
                accept=Accept(confidence="confidence", threshold=0.9, escalate=[{"model": "big"}],
                              review=Review(deadline="1h")))
    async def extract(ctx, source: bytes) -> dict:
        text = source.decode()
        if text.startswith("poison"):
            raise ValueError("cannot parse")
        if text.startswith("refuse") or ctx.item_key in listed("FAIL"):
            raise TerminalError("refused", error_class="unreadable")
        answer = await ctx.chat([{"role": "user", "content": text}], model=ctx.config["model"])
        title, kind = answer.text.split()[:2]
        sure = not title.startswith("unsure") or ctx.item_key in listed("SURE")
        record = {"title": title.upper() if ctx.item_key in listed("UPPER") else title, "kind": kind,
                  "confidence": 0.95 if sure else 0.5,
                  "n": {"words": len(text.split()) + (100 if ctx.item_key in listed("NEST") else 0)}}
        if title == "big":
            record["pad"] = "x" * 20_000  # past the inline limit: the record lives in the blob store
        return record

    @pipe.stage(after=extract, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return [] if doc["title"] == "empty" else [doc]

    @pipe.stage(after=split, kind="publish")
    def publish(ctx, part: dict) -> None:
        return None
"""

GOOD = [{"key": "a.txt", "text": "alpha invoice one", "meta": {"language": "en"}},
        {"key": "b.md", "text": "beta letter two", "meta": {"language": "de"}},
        {"key": "c", "text": "empty invoice three"}]
BAD = [{"key": "d.txt", "text": "refuse letter four"},  # failed (a TerminalError)
       {"key": "e.txt", "text": "poison invoice five"},  # dead-lettered (attempts exhausted)
       {"key": "f.txt", "path": "nope.txt"}]  # failed with bad_input: the path does not exist
UNSURE = [{"key": "g.txt", "text": "unsure letter six", "meta": {"language": "en"}},  # awaits review
          {"key": "r.txt", "text": "unsure invoice seven"}]  # awaits review, then rejected


def manifest(tmp_path: Path, lines: list[dict[str, Any]], name: str = "in.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def target(tmp_path: Path) -> str:
    return write_pipeline(tmp_path, PIPE)


def _report(store_url: str, run_id: str, blobs: Path | None = None, **options: Any) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return reconcile(store, find_run(store, run_id), blobs=FilesystemBlobs(blobs) if blobs else None,
                         sample=SampleOptions(**options))
    finally:
        store.close()


def _decide(store_url: str, blobs: Path, item: str, decision: str) -> None:
    store = open_store(store_url)
    try:
        (entry,) = [e for e in review.review_list(store)["reviews"] if e["item_key"] == item]
        if decision == "reject":
            review.reject(store, [entry["id"]], why="not ours", by="ann")
        else:
            review.approve(store, FilesystemBlobs(blobs), [entry["id"]], by="ann")
    finally:
        store.close()


def _mixed_run(tmp_path: Path, store_url: str, target: str) -> str:
    blobs = tmp_path / "blobs"
    done = submit_and_work(target, manifest(tmp_path, GOOD + BAD + UNSURE), store_url, blobs)
    _decide(store_url, blobs, "r.txt", "reject")
    return done.run_id


# --- every item in exactly one outcome -------------------------------------------------------------------------

def test_every_expected_item_has_exactly_one_outcome(tmp_path: Path, store_url: str, target: str) -> None:
    run_id = _mixed_run(tmp_path, store_url, target)
    report = _report(store_url, run_id)
    assert report["outcomes"] == {"published": 2, "completed": 1, "failed": 2, "dead_lettered": 1,
                                  "awaiting_review": 1, "rejected": 1}
    assert report["expected"] == 8 and report["unaccounted"] == 0
    assert sum(report["outcomes"].values()) + report["unaccounted"] == report["expected"]

    not_done = {e["item_key"]: e for e in report["not_done"]}
    assert sorted(not_done) == ["d.txt", "e.txt", "f.txt", "g.txt", "r.txt"]
    assert not_done["f.txt"]["error_classes"] == ["bad_input"]
    assert not_done["g.txt"]["tasks"][0]["status"] == "awaiting_review"
    assert not_done["g.txt"]["error_classes"] == ["low_confidence"]
    assert not_done["r.txt"]["tasks"][0]["status"] == "rejected" and not_done["r.txt"]["error_classes"] == ["rejected"]
    assert exit_code(report) == 4, "failed, dead-lettered or rejected items outweigh the one awaiting review"

    store = open_store(store_url)
    try:
        status = status_report(store, find_run(store, run_id))
    finally:
        store.close()
    assert status["outcomes"] == report["outcomes"] and status["unaccounted"] == 0

    shown = cli("status", run_id, "--db", store_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "stage" in line and "queued" in line)
    assert "awaiting" in header and "rejected" in header, shown.stdout
    [row] = [line for line in shown.stdout.splitlines() if line.strip("│ ").startswith("extract ")]
    cells = [int(cell) for cell in row.replace("│", " ").split()[1:8]]
    assert sum(cells) == sum(status["stages"]["extract"].values()) == 8, shown.stdout


def test_open_items_are_in_progress_until_accepted_and_items_without_tasks_are_unaccounted(
        tmp_path: Path, store_url: str, target: str) -> None:
    blobs = tmp_path / "blobs"
    store = open_store(store_url)
    try:
        done = submit(load_target(target), target, str(manifest(tmp_path, GOOD + BAD + UNSURE)), store,
                      FilesystemBlobs(blobs))
    finally:
        store.close()
    submitted = _report(store_url, done.run_id)
    assert submitted["outcomes"] == {"in_progress": 7, "failed": 1}, "bad input fails at submit"
    assert exit_code(submitted) == 3

    work(target, store_url, blobs, run_id=done.run_id)
    _decide(store_url, blobs, "g.txt", "approve")  # accepted: its part is queued, not yet published
    accepted = _report(store_url, done.run_id)
    assert accepted["outcomes"]["accepted"] == 1 and accepted["outcomes"]["awaiting_review"] == 1  # r.txt
    assert accepted["unaccounted"] == 0 and exit_code(accepted) == 3

    work(target, store_url, blobs, run_id=done.run_id)
    assert _report(store_url, done.run_id)["outcomes"]["published"] == 3
    query(store_url, "DELETE FROM tasks WHERE run_id = ? AND root_key = ?", done.run_id, "c")
    store = open_store(store_url)
    store.recount_run_totals(done.run_id)  # the rows were changed around the engine
    store.recount_open_task_seconds()
    store.close()
    report = _report(store_url, done.run_id)
    assert report["unaccounted"] == 1 and "missing" not in report["outcomes"]
    assert sum(report["outcomes"].values()) + report["unaccounted"] == report["expected"] == 8
    assert [e for e in report["not_done"] if e["missing"]] == [
        {"item_key": "c", "tasks": [], "missing": True, "error_classes": []}]
    assert exit_code(report) == 3


# --- what an accepted item cost --------------------------------------------------------------------------------

def test_per_accepted_item_counts_every_attempt(tmp_path: Path, store_url: str, target: str) -> None:
    run_id = _mixed_run(tmp_path, store_url, target)
    report = _report(store_url, run_id)
    ((seconds, tokens, cost),) = query(
        store_url, "SELECT SUM(duration), SUM(prompt_tokens + completion_tokens), SUM(cost) FROM attempts "
        "WHERE run_id = ?", run_id)
    outcomes = {r[0] for r in query(store_url, "SELECT outcome FROM attempts WHERE run_id = ?", run_id)}
    assert {"escalated", "rejected", "retry"} <= outcomes, "escalations, review decisions and retries are attempts"
    per_item = report["per_accepted_item"]
    assert per_item["items"] == 3  # 2 published + 1 completed
    assert per_item["seconds"] == pytest.approx(seconds / 3)
    # every extraction's tries: a, b, c once; g and r at both tiers (two unsure items escalated)
    assert tokens == 120 * 7 and per_item["tokens"] == pytest.approx(tokens / 3)
    assert per_item["cost"] == pytest.approx(cost / 3) and cost > 0
    assert report["usage"]["tokens_per_accepted_item"] == pytest.approx(per_item["tokens"])


# --- the quality sample --------------------------------------------------------------------------------------------

LANGUAGES = ("en", "de", "fr")
EXTENSIONS = (".txt", ".md", "")


def _sample_lines() -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for i in range(30):
        line: dict[str, Any] = {"key": f"doc{i:02d}{EXTENSIONS[i % 3]}",
                                "text": f"t{i:02d} {'invoice' if i % 2 else 'letter'} body"}
        if i % 5:
            line["meta"] = {"language": LANGUAGES[i % 3]}
        lines.append(line)
    return [*lines, {"key": "huge.big", "text": "big invoice padded"}, {"key": "poisoned.txt", "text": "poison x"},
            {"key": "wavering.txt", "text": "unsure letter", "meta": {"language": "en"}}]


def test_the_sample_is_sliced_seeded_and_only_of_accepted_records(tmp_path: Path, store_url: str,
                                                                  target: str) -> None:
    blobs = tmp_path / "blobs"
    lines = _sample_lines()
    done = submit_and_work(target, manifest(tmp_path, lines), store_url, blobs)
    report = _report(store_url, done.run_id, blobs, slices=("kind", "n.words"))
    sample = report["sample"]
    assert set(sample) == {"language", "source_type", "kind", "n.words"}
    assert sorted(sample["language"]) == ["de", "en", "fr"]
    assert set(sample["source_type"]) == {".big", ".md", ".txt", "(none)"}
    assert sorted(sample["kind"]) == ["invoice", "letter"] and list(sample["n.words"]) == ["3"]

    by_key = {line["key"]: line for line in lines}
    for name, values in sample.items():
        for value, entries in values.items():
            assert 1 <= len(entries) <= 3
            for entry in entries:
                line = by_key[entry["item_key"]]
                assert entry["outcome"] in ("published", "completed")
                assert entry["record"]["title"] == line["text"].split()[0], "the item's own accepted record"
                if name == "language":
                    assert line["meta"]["language"] == value
                elif name == "source_type":
                    assert (Path(line["key"]).suffix or "(none)") == value
                elif name == "kind":
                    assert entry["record"]["kind"] == value
    assert sample["source_type"][".big"][0]["record"]["pad"] == "x" * 20_000, "read from the blob store"
    sampled = {e["item_key"] for values in sample.values() for es in values.values() for e in es}
    assert not sampled & {"poisoned.txt", "wavering.txt"}, "only items with an accepted record are sampled"

    assert _report(store_url, done.run_id, blobs, slices=("kind", "n.words"))["sample"] == sample, "same seed"
    others = [_report(store_url, done.run_id, blobs, seed=f"s{i}")["sample"] for i in range(4)]
    assert any(o["language"] != sample["language"] for o in others), "another seed, another sample"
    assert _report(store_url, done.run_id, blobs, seed="s1")["sample"] == others[1]
    assert _report(store_url, done.run_id, blobs, size=0)["sample"] == {}
    two = _report(store_url, done.run_id, blobs, size=2)["sample"]
    assert max(len(es) for values in two.values() for es in values.values()) == 2


def test_the_sample_is_bounded() -> None:
    picks = _Picks(3, random.Random("seed"), pool=True)
    for i in range(10_000):
        picks.offer(f"k{i:05d}.e{i % 80}", json.dumps({"language": f"l{i % 7}"}))
    assert len(picks.chosen["source_type"]) == MAX_SLICE_VALUES
    assert len(picks.chosen["language"]) == 7
    assert all(len(keys) == 3 for values in picks.chosen.values() for keys in values.values())
    assert len(picks.pool) == MAX_SLICE_VALUES * 3


def test_the_record_is_the_last_accepting_stage_before_any_fan_out() -> None:
    def stage(name: str, after: str | None = None, kind: str = "map", accept: bool = False) -> dict[str, Any]:
        return {"name": name, "after": after, "kind": kind, **({"accept": True} if accept else {})}

    assert record_stage([stage("parse"), stage("extract", "parse", accept=True), stage("tidy", "extract"),
                         stage("publish", "tidy", "publish")]) == "extract"
    assert record_stage([stage("parse"), stage("tidy", "parse"), stage("chunk", "tidy", "fanout"),
                         stage("embed", "chunk"), stage("publish", "embed", "publish")]) == "tidy"
    assert record_stage([stage("chunk", None, "fanout"), stage("embed", "chunk", accept=True)]) is None


# --- exit codes ----------------------------------------------------------------------------------------------------

def test_exit_codes_through_the_cli(tmp_path: Path, store_url: str, target: str) -> None:
    blobs = tmp_path / "blobs"
    args = ("--db", store_url, "--blobs", str(blobs))

    def code(lines: list[dict[str, Any]], name: str) -> int:
        done = submit_and_work(target, manifest(tmp_path, lines, name), store_url, blobs)
        proc = cli("reconcile", done.run_id, *args, cwd=tmp_path)
        assert proc.stdout and not proc.stderr.strip(), proc.stderr
        return proc.returncode

    assert code(GOOD, "good.jsonl") == 0
    assert code(GOOD + BAD, "bad.jsonl") == 4
    assert code(GOOD + UNSURE[:1], "unsure.jsonl") == 5
    fresh = [{"key": f"new{i}.txt", "text": f"new{i} invoice"} for i in range(3)]  # nothing in the memo answers
    submitted = cli("submit", target, "--input", str(manifest(tmp_path, fresh, "later.jsonl")), *args, "--json",
                    cwd=tmp_path)
    run_id = json.loads(submitted.stdout)["run_id"]
    proc = cli("reconcile", run_id, *args, "--json", cwd=tmp_path)
    assert proc.returncode == 3 and json.loads(proc.stdout)["outcomes"] == {"in_progress": 3}
    shown = cli("reconcile", run_id, *args, "--sample", "2", "--slice", "kind", "--seed", "x", cwd=tmp_path)
    assert shown.returncode == 3 and "expected 3, unaccounted 0" in shown.stdout


# --- an ended run of a simple graph: its troubled items read, the others counted from the run's totals -----------

SIMPLE = """
    from conveyor import Pipeline, Retry, TerminalError
    from conveyor.acceptance import Accept, Review

    pipe = Pipeline("simple", retry=Retry(max_attempts=2, base=0.01, cap=0.01))

    @pipe.stage(accept=Accept(confidence="confidence", threshold=0.9, review=Review(deadline="1h")))
    def extract(ctx, source: bytes) -> dict:
        text = source.decode()
        if text.startswith("poison"):
            raise ValueError("cannot parse")
        if text.startswith("refuse"):
            raise TerminalError("refused", error_class="unreadable")
        return {"title": text.split()[0], "confidence": 0.5 if text.startswith("unsure") else 0.95}

    @pipe.stage(after=extract)
    def shout(ctx, doc: dict) -> dict:
        return {"title": doc["title"].upper()}

    @pipe.stage(after=shout, kind="publish")
    def publish(ctx, doc: dict) -> None:
        return None
"""


def test_an_ended_run_of_a_simple_graph_counts_its_outcomes_as_each_item_would(tmp_path: Path,
                                                                                 store_url: str) -> None:
    from conveyor.service.report import _ended_entry

    target = write_pipeline(tmp_path, SIMPLE)
    done = submit_and_work(target, manifest(tmp_path, GOOD + BAD + UNSURE), store_url, tmp_path / "blobs")
    _decide(store_url, tmp_path / "blobs", "r.txt", "reject")
    # One item loses its publication (completed), one every task (missing), one item that succeeded carries an
    # error class (read whole), as rows changed around the engine would have them.
    query(store_url, "DELETE FROM tasks WHERE run_id = ? AND root_key = ? AND stage = 'publish'", done.run_id, "a.txt")
    query(store_url, "DELETE FROM tasks WHERE run_id = ? AND root_key = ?", done.run_id, "c")
    query(store_url, "UPDATE tasks SET error_class = 'flaky' WHERE run_id = ? AND root_key = ? AND stage = 'shout'",
          done.run_id, "b.md")
    store = open_store(store_url)
    try:
        store.recount_run_totals(done.run_id)
        store.recount_open_task_seconds()
        run = find_run(store, done.run_id)
        status = status_report(store, run)
        assert _ended_entry(store, run, RunGraph.of(run), status) == "extract", "the bounded count is the one asked"
        whole = store.item_outcomes(done.run_id, RunGraph.of(run).stages)
    finally:
        store.close()
    assert whole == {"published": 1, "completed": 1, "missing": 1, "failed": 2, "dead_lettered": 1,
                     "awaiting_review": 1, "rejected": 1}
    assert status["outcomes"] == {k: v for k, v in whole.items() if k != "missing"}
    assert status["unaccounted"] == 1
