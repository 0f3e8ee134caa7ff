"""`conveyor run --dry-run` and forecasts: nothing created, the memo's answers counted exactly, costs forecast
from history or from a sample run in a scratch store (publish stages left out); `Pipeline(budget_usd=...)`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.errors import PipelineError
from conveyor.pipeline import Pipeline
from conveyor.runtime import target as target_module
from conveyor.runtime.target import load_target
from conveyor.service.dryrun import dry_run
from conveyor.store import open_store
from tests.helpers import cli, make_docs, reconciled, submit_and_work, write_pipeline

FAKE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.base import Completion, PriceTable

    class Provider:
        name = "fake"
        prices = PriceTable.from_dict({"m": [1000.0, 2000.0]})

        async def chat(self, messages, *, model, max_tokens=512, **options):
            words = len(messages[-1]["content"].split())
            cost, priced = self.prices.cost_for(model, model, 10 * words, 20)
            return Completion("ok " * words, None, model, 10 * words, 20, cost, None, None, 0.01, priced=priced)

    pipe = Pipeline("forecast", provider=Provider, retry=Retry(max_attempts=2),
                    budget_usd=float(os.environ["BUDGET"]) if os.environ.get("BUDGET") else None)

    @pipe.stage(version="1")
    def read(ctx, source: bytes) -> str:
        return source.decode()

    @pipe.stage(after=read, version="1", concurrency=2)
    async def ask(ctx, text: str) -> str:
        return (await ctx.chat([{"role": "user", "content": text}], model="m", max_tokens=20)).text

    @pipe.stage(after=ask, kind="publish")
    def publish(ctx, answer: str) -> None:
        with open(os.environ["SINK"], "a") as sink:
            sink.write(ctx.item_key + "\\n")
"""


def _plan(target: str, docs: Path, store_url: str, blobs: Path, sample: int = 3) -> dict:
    store = open_store(store_url)
    try:
        return dry_run(load_target(target), target, str(docs), store, FilesystemBlobs(blobs), 2, sample)
    finally:
        store.close()


def test_a_dry_run_before_a_first_run_creates_nothing_and_measures_a_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    target = write_pipeline(tmp_path, FAKE)
    docs = make_docs(tmp_path / "docs", 12, "a question with six words {i}")
    done = cli("run", target, "--input", str(docs), "--dry-run", "--json", cwd=tmp_path,
               env={"SINK": str(tmp_path / "sink.log")})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert not (tmp_path / ".conveyor").exists(), "a dry run creates no store and no blob folder"
    assert not (tmp_path / "sink.log").exists(), "the sample ran no publish stage"
    assert data["items"] == 12 and data["stages"]["read"] == {"tasks": 12, "memo": 0, "run": 12, "estimated": 0}
    assert data["stages"]["ask"]["run"] == 12 and data["stages"]["ask"]["estimated"] == 12
    assert data["sampled"]["items"] == 3 and data["sampled"]["provider_calls"] == 3
    # Each call: 60 prompt tokens, 20 completion tokens at $1000 / $2000 per million.
    per_call = (60 * 1000 + 20 * 2000) / 1e6
    forecast = data["forecast"]
    assert forecast["stages"]["ask"]["cost"] == pytest.approx(12 * per_call)
    assert forecast["tokens"] == pytest.approx(12 * 80) and forecast["unknown_stages"] == ["publish"]
    assert "sample" in forecast["basis"]
    nothing = cli("run", target, "--input", str(docs), "--dry-run", "--sample", "0", "--json", cwd=tmp_path,
                  env={"SINK": str(tmp_path / "sink.log")})
    assert json.loads(nothing.stdout)["sampled"] is None and json.loads(nothing.stdout)["forecast"]["cost"] == 0


def test_after_a_run_the_memo_answers_are_counted_and_history_forecasts_the_rest(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    target = write_pipeline(tmp_path, FAKE)
    first = make_docs(tmp_path / "first", 8, "a question with six words {i}")
    run_id = submit_and_work(target, first, store_url, tmp_path / "blobs").run_id
    again = _plan(target, first, store_url, tmp_path / "blobs")
    assert {s: (c["memo"], c["run"]) for s, c in again["stages"].items()} == {
        "read": (8, 0), "ask": (8, 0), "publish": (8, 0)}, "every task of the same input is answered"
    assert again["forecast"]["cost"] == 0 and again["sampled"] is None
    more = make_docs(tmp_path / "more", 10, "another question of seven words here {i}")
    plan = _plan(target, more, store_url, tmp_path / "blobs")
    assert plan["stages"]["ask"]["run"] == 10 and plan["sampled"] is None and "history" in plan["forecast"]["basis"]
    real = submit_and_work(target, more, store_url, tmp_path / "blobs").run_id
    cost = reconciled(store_url, real)["usage"]["cost"]
    forecast = plan["forecast"]
    assert abs(forecast["cost"] - cost) <= max(forecast["cost_margin"], 0.3 * cost), (forecast, cost)
    assert reconciled(store_url, run_id)["outcomes"] == {"published": 8}


def test_a_pipeline_budget_pauses_its_runs(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PipelineError, match="budget"):
        Pipeline("p", budget_usd=-1)
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    monkeypatch.setenv("BUDGET", "0.5")
    target_module._cache.clear()
    target = write_pipeline(tmp_path, FAKE, name="budgeted.py")
    docs = make_docs(tmp_path / "docs", 10, "a question with six words {i}")
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    report = reconciled(store_url, run_id)
    assert report["status"] == "paused_budget" and report["budget"]["usd"] == 0.5
    # A call is reserved at its estimate ($0.054: the prompt's length, 20 tokens out) and costs $0.10: the run
    # passes its budget by at most one call's difference.
    calls = report["usage"]["provider_calls"]
    assert report["usage"]["cost"] <= 0.5 + 0.1 and calls in (5, 6), report["usage"]
    assert report["outcomes"] == {"in_progress": 10 - calls, "published": calls}
