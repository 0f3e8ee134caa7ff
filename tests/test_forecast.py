"""`conveyor run --dry-run` and forecasts: nothing created, the memo's answers counted exactly, costs forecast
from history or from a sample run in a scratch store (publish stages left out); `Pipeline(budget_usd=...)`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.errors import PipelineError
from conveyor.pipeline import Pipeline, RateLimit
from conveyor.providers.base import PriceTable
from conveyor.runtime import target as target_module
from conveyor.runtime.target import load_target
from conveyor.service.dryrun import dry_run
from conveyor.service.forecast import History, Kept, StageHistory, forecast, groups_of, history, kept_in_flight
from conveyor.store import open_store
from conveyor.store.forecast import ModelUse, StageCosts, StageSpan
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


PRICED = """
    import asyncio
    from conveyor import Pipeline
    from conveyor.providers.base import Completion, PriceTable

    class Provider:
        name = "fake"
        prices = PriceTable.from_dict({"cheap": [1000.0, 2000.0], "dear": [10000.0, 40000.0]})

        async def chat(self, messages, *, model, max_tokens=512, **options):
            words = len(messages[-1]["content"].split())
            cost, priced = self.prices.cost_for(model, model, 10 * words, 20)
            return Completion("ok", None, model + "@rev", 10 * words, 20, cost, None, None, 0.01, priced=priced)

    pipe = Pipeline("priced", provider=Provider)

    @pipe.stage(version="1")
    def read(ctx, source: bytes) -> str:
        return source.decode()

    @pipe.stage(after=read, version="VERSION", concurrency=2, CONFIG)
    async def ask(ctx, text: str) -> str:
        return (await ctx.chat([{"role": "user", "content": text}], model=MODEL, max_tokens=20)).text
"""


def _priced(tmp_path: Path, name: str, model: str, declared: bool = True, version: str = "1") -> str:
    config = f'config={{"model": "{model}"}}' if declared else 'config={}'
    call = 'ctx.config["model"]' if declared else f'"{model}"'
    source = PRICED.replace("CONFIG", config).replace("MODEL", call).replace("VERSION", version)
    return write_pipeline(tmp_path, source, name=name)


def test_after_a_cheap_model_a_forecast_for_the_dearer_one_prices_the_dearer_one(
        tmp_path: Path, store_url: str) -> None:
    cheap = _priced(tmp_path, "cheap.py", "cheap")
    submit_and_work(cheap, make_docs(tmp_path / "first", 8, "a question with six words {i}"), store_url,
                    tmp_path / "blobs")
    docs = make_docs(tmp_path / "more", 10, "another question with six words {i}")
    dear = _priced(tmp_path, "dear.py", "dear")
    plan = _plan(dear, docs, store_url, tmp_path / "blobs")
    # Each call: 60 prompt tokens and 20 completion tokens, at the dear model's $10,000 / $40,000 per million.
    assert plan["forecast"]["cost"] == pytest.approx(10 * (60 * 10_000 + 20 * 40_000) / 1e6)
    assert plan["forecast"]["stages"]["ask"]["models"] == {"0": "dear"}
    real = submit_and_work(dear, docs, store_url, tmp_path / "blobs").run_id
    assert plan["forecast"]["cost"] == pytest.approx(reconciled(store_url, real)["usage"]["cost"])


def test_a_stage_whose_model_cannot_be_known_is_not_priced_as_another_models(
        tmp_path: Path, store_url: str) -> None:
    before = _priced(tmp_path, "before.py", "cheap", declared=False)
    submit_and_work(before, make_docs(tmp_path / "first", 6, "a question with six words {i}"), store_url,
                    tmp_path / "blobs")
    docs = make_docs(tmp_path / "more", 4, "another question with six words {i}")
    same = _plan(before, docs, store_url, tmp_path / "blobs")
    assert same["forecast"]["cost"] == pytest.approx(4 * (60 * 1000 + 20 * 2000) / 1e6)
    # New code that names its model in the code, not in its config: which model it calls cannot be known.
    changed = _plan(_priced(tmp_path, "changed.py", "dear", declared=False, version="2"), docs, store_url,
                    tmp_path / "blobs")
    forecast = changed["forecast"]
    assert forecast["stages"]["ask"]["cost"] is None and forecast["unpriced_stages"] == ["ask"]
    assert forecast["stages"]["ask"]["models"] == {"0": None} and "not known" in forecast["basis"]
    assert same["forecast"]["stages"]["ask"]["models"] == {"0": "cheap"}, "the same declaration asked for cheap"
    assert forecast["tokens"] == pytest.approx(4 * 80), "the tokens are still forecast from the measure"


def test_the_wall_time_is_held_to_the_models_quota_and_to_the_measured_latency() -> None:
    pipe = Pipeline("quota", limits={"m": RateLimit(tpm=100_000)})

    @pipe.stage(version="1", concurrency=4, config={"model": "m", "max_tokens": 100})
    async def ask(ctx: Any, text: str) -> str:
        return text

    measured = StageHistory.of(StageCosts("ask", 50, 50, 50_000, 50 * 1000.0**2, 0.05, 0.0, 100.0, 200.0, 50, 0),
                               {}, [ModelUse("ask", 0, "m", 50, 45_000, 5_000, 0.05, 50, 0)])
    past = History({"ask": measured}, ("r1",), "history", {}, startup=3.0)
    # 1,000 items of 1,000 tokens against 100,000 tokens a minute: the quota paces the run, ten minutes.
    held = forecast(pipe, past, {"ask": 1000}, workers=2, prices=[])
    assert held["seconds"] == pytest.approx(3.0 + 600 + 2.0) and "m's quota paces it" in held["basis"]
    # Without the limit, the measured 2 s a call over 2 workers x 4 calls at once: 250 s.
    free = forecast(pipe, past, {"ask": 1000}, workers=2, limits={}, prices=[])
    assert free["seconds"] == pytest.approx(3.0 + 250 + 2.0)
    # A run that fits in one minute's tokens is not held by the quota: a sliding minute lets it through.
    small = forecast(pipe, past, {"ask": 40}, workers=2, prices=[])
    assert small["seconds"] == pytest.approx(3.0 + 40 * 2.0 / 8 + 2.0)


def _spread_history(per_worker: float = 0.0, filled: bool = False) -> StageHistory:
    """50 attempts of 1,000 tokens with a spread of 300 (500 of them an answer's unused room at max_tokens 600)."""
    return StageHistory.of(StageCosts("ask", 50, 50, 50_000, 50 * (1000.0**2 + 300.0**2), 0.05, 0.0, 100.0, 200.0,
                                      50, 0), {}, [ModelUse("ask", 0, "m", 50, 45_000, 5_000, 0.05, 50, 0)],
                           kept=Kept(per_worker, filled, 2.0))


def _quota_pipe() -> Pipeline:
    pipe = Pipeline("cliff", limits={"m": RateLimit(tpm=100_000)})

    @pipe.stage(version="1", concurrency=4, config={"model": "m", "max_tokens": 600})
    async def ask(ctx: Any, text: str) -> str:
        return text

    return pipe


def test_a_run_at_its_quota_gives_both_sides_of_the_minute_and_the_chance_of_each() -> None:
    past = History({"ask": _spread_history(per_worker=4.0, filled=True)}, ("r1",), "history", {}, startup=3.0)
    # 100 tasks of 1,000 tokens (± their spread) against 100,000 a minute: the run may fit, or its last grants
    # wait for the first ones to age out, a minute later. Both are said, and which is likelier.
    at = forecast(_quota_pipe(), past, {"ask": 100}, workers=2, prices=[])
    low, high = at["seconds_range"]
    # Under: the stages' own 25 s (2 s a call, 8 at once). Over: the last grants a minute after the first.
    assert low == pytest.approx(3.0 + 100 * 2.0 / 8 + 2.0) and high == pytest.approx(3.0 + 60.0 + 2.0)
    cliff = at["quota_cliff"]
    assert cliff["model"] == "m" and cliff["limit"] == 100_000 and 0.0 < cliff["chance_paced"] < 1.0
    assert at["seconds"] == (high if cliff["chance_paced"] >= 0.5 else low)
    assert "m's quota may pace it" in at["basis"] and "seconds_range" in at["basis"]
    # Far from a multiple of the limit, one figure: the range is that figure, and no cliff is named.
    far = forecast(_quota_pipe(), past, {"ask": 40}, workers=2, prices=[])
    assert far["quota_cliff"] is None and far["seconds_range"] == [far["seconds"], far["seconds"]]


def test_calls_in_flight_hold_room_for_as_many_as_the_stage_had_in_flight() -> None:
    # The same 97 tasks on 2 workers: measured with 4 attempts in flight a worker, the calls in flight hold
    # 8 x 500 tokens; with 1 a worker, 2 x 500. 97,000 + 4,000 passes a minute's 100,000; + 1,000 does not.
    crowded = History({"ask": _spread_history(per_worker=4.0)}, ("r1",), "history", {})
    sparse = History({"ask": _spread_history(per_worker=1.0)}, ("r1",), "history", {})
    many = forecast(_quota_pipe(), crowded, {"ask": 97}, workers=2, prices=[])
    few = forecast(_quota_pipe(), sparse, {"ask": 97}, workers=2, prices=[])
    assert many["quota_cliff"]["used"] == pytest.approx(97_000 + 8 * 500)
    assert few["quota_cliff"]["used"] == pytest.approx(97_000 + 2 * 500)
    assert many["quota_cliff"]["chance_paced"] > 0.5 > few["quota_cliff"]["chance_paced"]


def _span(stage: str, start: float, end: float, seconds: float, attempts: int, workers: int = 2,
          run_id: str = "r1") -> StageSpan:
    return StageSpan(run_id, stage, start, end, seconds, attempts, workers)


def _quick_pipe(name: str, concurrency: int = 16, stage: str = "ask") -> Pipeline:
    pipe = Pipeline(name)

    async def ask(ctx: Any, text: str) -> str:
        return text

    ask.__name__ = stage
    pipe.stage(ask, version="1", concurrency=concurrency)
    return pipe


def test_a_stage_is_forecast_at_the_calls_its_workers_kept_in_flight_not_at_its_slots() -> None:
    # 320 attempts of 0.25 s over 10 s on 2 workers: 4 in flight a worker, of its 16 slots (a worker's claims,
    # commits and grants pace quick calls); the stage before it ended at 2 s, so it had a backlog.
    kept = kept_in_flight([_span("ask", 0.0, 10.0, 80.0, 320)], {"r1": _span("read", 0.0, 2.0, 2.0, 320)}, slots=16)
    assert kept[:3] == (pytest.approx(4.0), True, pytest.approx(0.25)) and not kept.beside
    measured = StageHistory.of(StageCosts("ask", 320, 320, 0.0, 0.0, 0.0, 0.0, 80.0, 20.0, 0, 0), {}, kept=kept)
    past = History({"ask": measured}, ("r1",), "history", {}, startup=3.0)
    # 640 attempts of 0.25 s, 4 a worker on 3 workers: 13.3 s (at the 48 slots it would say 3.3 s).
    f = forecast(_quick_pipe("kept"), past, {"ask": 640}, workers=3, prices=[])
    assert f["seconds"] == pytest.approx(3.0 + 640 * 0.25 / 12 + 0.25)
    assert f["stages"]["ask"]["concurrency"] == 12 and f["stages"]["ask"]["slots"] == 48
    assert f["seconds_range"] == [f["seconds"], f["seconds"]]


def test_a_measure_that_could_not_fill_the_slots_gives_the_slots_and_its_own_pace_as_the_range() -> None:
    # Fed by the stage before it: it ended one attempt after that one, having kept 1 a worker busy.
    fed = kept_in_flight([_span("ask", 0.0, 20.25, 40.0, 160)], {"r1": _span("read", 0.0, 20.0, 20.0, 160)}, 16)
    # A sample: 20 attempts for a worker of 16 slots.
    few = kept_in_flight([_span("ask", 0.0, 1.0, 5.0, 20, workers=1)], {}, 16)
    assert fed[:2] == (pytest.approx(1.0), False) and few[:2] == (pytest.approx(5.0), False)
    # A run with a backlog among runs without: the runs with one say what a worker keeps.
    mixed = kept_in_flight([_span("ask", 0.0, 20.25, 40.0, 160), _span("ask", 0.0, 10.0, 80.0, 320, run_id="r2")],
                           {"r1": _span("read", 0.0, 20.0, 20.0, 160)}, 16)
    assert mixed[:2] == (pytest.approx(4.0), True)
    measured = StageHistory.of(StageCosts("ask", 160, 160, 0.0, 0.0, 0.0, 0.0, 40.0, 10.0, 0, 0), {}, kept=fed)
    f = forecast(_quick_pipe("fed"), History({"ask": measured}, ("r1",), "history", {}), {"ask": 320}, workers=2,
                 prices=[])
    # At its 32 slots, 2.5 s; at the 2 it kept, 40 s: both said, the slots the forecast.
    assert f["seconds"] == pytest.approx(320 * 0.25 / 32 + 0.25)
    assert f["seconds_range"] == [pytest.approx(f["seconds"]), pytest.approx(320 * 0.25 / 2 + 0.25)]
    assert "ask had too few attempts in the measure to fill its slots" in f["basis"]


def test_a_stage_measured_beside_one_that_will_not_run_is_forecast_between_both_paces() -> None:
    # In its measure, "ask" (320 attempts of 0.25 s over 10 s, 4 a worker) shared its 2 workers with "embed",
    # 12 calls in flight over its whole span (120 s of them): alone, 10 a worker.
    embed = _span("embed", 0.0, 20.0, 240.0, 100)
    kept = kept_in_flight([_span("ask", 0.0, 10.0, 80.0, 320)], {}, 16, others={"r1": [embed]})
    assert kept.beside == {"embed"} and kept.alone == pytest.approx((80.0 + 120.0) / 20.0)
    assert kept[:2] == (pytest.approx(4.0), True), "what it kept is still what it kept"
    measured = StageHistory.of(StageCosts("ask", 320, 320, 0.0, 0.0, 0.0, 0.0, 80.0, 20.0, 0, 0), {}, kept=kept)
    past = History({"ask": measured}, ("r1",), "history", {})
    # A run without embed (a prompt bump): 20 alone as forecast, at worst the 8 it kept at 2 workers.
    bump = forecast(_quick_pipe("beside"), past, {"ask": 320}, workers=2, prices=[])
    assert bump["seconds_range"] == [pytest.approx(320 * 0.25 / 20 + 0.25), pytest.approx(320 * 0.25 / 8 + 0.25)]
    assert bump["seconds"] == bump["seconds_range"][0] and bump["stages"]["ask"]["concurrency"] == 20
    assert "ask shared its workers with stages that will not run" in bump["basis"]
    # A run with embed again: what it kept beside it.
    again = forecast(_quick_pipe("beside"), past, {"ask": 320, "embed": 100}, workers=2, prices=[])
    assert again["seconds"] == pytest.approx(320 * 0.25 / 8 + 0.25) and "shared its workers" not in again["basis"]
    # A stage beside it that had little in flight (under a tenth of its own) did not share its workers.
    light = kept_in_flight([_span("ask", 0.0, 10.0, 80.0, 320)], {}, 16,
                           others={"r1": [_span("read", 0.0, 10.0, 5.0, 320)]})
    assert not light.beside and light.alone == pytest.approx(4.0)


def test_a_stage_lasts_at_least_its_longest_attempt_in_a_run_as_large_as_the_one_that_met_it() -> None:
    # 320 attempts of 0.25 s on average, one of which hung 10 s until its timeout: 320 of them on 4 workers take
    # 10 s, not 5 s; a run of 40 would likely not meet such a call.
    spans = [StageSpan("r1", "ask", 0.0, 10.5, 80.0, 320, 2, longest=10.0)]
    kept = kept_in_flight(spans, {}, 16)
    assert (kept.longest, kept.measured) == (10.0, 320)
    measured = StageHistory.of(StageCosts("ask", 320, 320, 0.0, 0.0, 0.0, 0.0, 80.0, 20.0, 0, 0), {}, kept=kept)
    past = History({"ask": measured}, ("r1",), "history", {})
    many = forecast(_quick_pipe("hung"), past, {"ask": 320}, workers=4, prices=[])
    assert 320 * 0.25 / (4 * kept.per_worker) < 10.0 and many["seconds"] == pytest.approx(10.0 + 0.25)
    few = forecast(_quick_pipe("hung"), past, {"ask": 40}, workers=2, prices=[])
    assert few["seconds"] == pytest.approx(40 * 0.25 / (2 * kept.per_worker) + 0.25)


def test_a_run_its_quota_held_does_not_measure_the_pace_of_its_calls() -> None:
    # r2's calls waited for a model's quota for 170 of its 180 s: its attempts took 10 s each, 16 in flight a
    # worker. r1, free of it, measures the stage: 4 a worker, 0.25 s an attempt.
    runs = [_span("ask", 0.0, 10.0, 80.0, 320), _span("ask", 0.0, 180.0, 3200.0, 320, run_id="r2")]
    kept = kept_in_flight(runs, {}, 16, paced={"r1": 0.0, "r2": 170.0})
    assert kept[:3] == (pytest.approx(4.0), True, pytest.approx(0.25))
    measured = StageHistory.of(StageCosts("ask", 640, 640, 0.0, 0.0, 0.0, 0.0, 3280.0, 0.0, 0, 0), {}, kept=kept)
    assert measured.seconds == pytest.approx(5.125) and measured.pace == pytest.approx(0.25)
    f = forecast(_quick_pipe("paced"), History({"ask": measured}, ("r1", "r2"), "history", {}), {"ask": 320},
                 workers=2, prices=[])
    assert f["seconds"] == pytest.approx(320 * 0.25 / 8 + 0.25) and f["stages"]["ask"]["attempt_seconds"] == 0.25
    # Held by its quota alone, the measure is all there is: what it kept, not what a worker can keep.
    assert kept_in_flight(runs[1:], {}, 16, paced={"r2": 170.0})[:2] == (pytest.approx(8.9, abs=0.1), False)


def test_a_dry_run_counts_a_task_equal_to_an_earlier_one_as_a_memo_answer(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    target = write_pipeline(tmp_path, FAKE)
    docs = make_docs(tmp_path / "docs", 6, "a question with six words {i}")
    for i in range(3):  # three more pages, each the same as one of the first
        (docs / f"copy{i}.txt").write_bytes((docs / sorted(p.name for p in docs.iterdir())[i]).read_bytes())
    submit_and_work(target, make_docs(tmp_path / "other", 4, "some other words {i}"), store_url, tmp_path / "blobs")
    plan = _plan(target, docs, store_url, tmp_path / "blobs")
    assert plan["stages"]["read"] == {"tasks": 9, "memo": 3, "run": 6, "estimated": 0}
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    assert reconciled(store_url, run_id)["usage"]["provider_calls"] == 6


SLOW = """
    import asyncio
    from conveyor import Pipeline

    pipe = Pipeline("slow")

    @pipe.stage(version="1", concurrency=8)
    async def one(ctx, source: bytes) -> str:
        await asyncio.sleep(0.3)
        return source.decode()

    @pipe.stage(after=one, version="1", concurrency=8)
    async def two(ctx, text: str) -> str:
        await asyncio.sleep(0.3)
        return text

    @pipe.stage(after=two, version="1", concurrency=8)
    async def three(ctx, text: str) -> str:
        await asyncio.sleep(0.3)
        return text
"""


def test_a_first_run_forecast_from_a_sample_gives_the_time_an_item_takes_through_its_stages(
        tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, SLOW, name="slow.py")
    plan = _plan(target, make_docs(tmp_path / "docs", 4), store_url, tmp_path / "blobs", sample=2)
    assert plan["sampled"]["items"] == 2
    # Each item passes through three stages of 0.3 s one after the other: no run of it takes less than 0.9 s,
    # however many calls run at once.
    assert plan["forecast"]["seconds"] >= 0.9


def test_the_history_measures_each_stages_span_attempts_and_workers(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, SLOW, name="slow.py")
    run_id = submit_and_work(target, make_docs(tmp_path / "docs", 4), store_url, tmp_path / "blobs").run_id
    store = open_store(store_url)
    try:
        spans = {s.stage: s for s in store.stage_spans([run_id])}
        past = history(store, load_target(target))
    finally:
        store.close()
    assert sorted(spans) == ["one", "three", "two"]
    for s in spans.values():
        assert (s.run_id, s.attempts, s.workers) == (run_id, 4, 1)
        assert s.seconds >= 4 * 0.3 and s.end - s.start >= 0.3
    assert spans["one"].start <= spans["two"].start <= spans["three"].start
    # 4 attempts cannot fill a worker's 8 slots twice: what it kept is measured, not taken for what it can keep.
    assert all(0 < h.per_worker <= 8 and not h.filled for h in past.stages.values())


def test_a_workers_start_is_measured_by_starting_one_that_loads_the_target(tmp_path: Path) -> None:
    from conveyor.service.dryrun import worker_start

    assert worker_start(write_pipeline(tmp_path, SLOW, name="slow.py")) > 0.0
    assert worker_start(write_pipeline(tmp_path, "raise SystemExit(2)\n", name="broken.py")) == 0.0


def test_a_sample_is_drawn_over_the_whole_input_not_its_first_items() -> None:
    from conveyor.service.dryrun import Reservoir
    from conveyor.service.inputs import SourceItem

    def items(n: int) -> list[SourceItem]:
        return [SourceItem(key=f"k{i:04d}", path=Path(f"/k{i}")) for i in range(n)]

    drawn = Reservoir(10)
    for start in range(0, 1000, 100):  # offered in batches, as the dry run reads the input
        drawn.offer(items(1000)[start:start + 100])
    keys = sorted(int(i.key[1:]) for i in drawn.items)
    assert len(keys) == 10 and keys[-1] >= 500, "a sorted input's later half is sampled too"
    again = Reservoir(10)
    again.offer(items(1000))
    assert [i.key for i in again.items] == [i.key for i in drawn.items], "the same input gives the same sample"


def test_an_escalation_the_sample_never_saw_widens_the_cost_margin() -> None:
    from conveyor.acceptance import Accept

    pipe = Pipeline("escalating")

    @pipe.stage(version="1", config={"model": "cheap"}, accept=Accept(escalate=[{"model": "dear"}]))
    async def ask(ctx: Any, text: str) -> str:
        return text

    prices = [PriceTable.from_dict({"cheap": [1.0, 4.0], "dear": [20.0, 80.0]})]
    # Ten first tries, none escalated: 900 tokens in and 100 out each, $0.0013 at the cheap model's price.
    seen = StageHistory.of(StageCosts("ask", 10, 10, 10_000, 10 * 1000.0**2, 0.013, 10 * 0.0013**2, 1.0, 0.1, 10, 0),
                           {}, [ModelUse("ask", 0, "cheap", 10, 9_000, 1_000, 0.013, 10, 0)])
    plan = forecast(pipe, History({"ask": seen}, ("sample",), "sample", {}), {"ask": 100}, workers=1, prices=prices)
    assert plan["cost"] == pytest.approx(100 * 0.0013)
    # Had one in ten escalated, each at $0.026 more: 100 x 0.1 x 0.026 = $0.26 more. A margin of the cheap calls'
    # spread alone ($0.0000) would hide that; it must reach a good part of it.
    assert plan["cost_margin"] >= 0.1, plan["cost_margin"]


def test_a_workers_first_wave_that_loads_a_model_is_a_warm_up_paid_once_not_a_slower_pace() -> None:
    # A sample in one worker of 4 slots: 60 attempts, the first 4 held their slots 4.3 s each while the worker
    # loaded a model, the other 56 took 0.25 s. The mean (0.52 s) would forecast every attempt of a run twice
    # as slow; a run's workers load the model once each, side by side.
    sample = _span("embed", 0.0, 7.8, 4 * 4.3 + 56 * 0.25, 60, workers=1)  # 4 in flight
    kept = kept_in_flight([sample], {}, 4, firsts={"r1": [(4, 4 * 4.3)]})
    assert kept.seconds == pytest.approx(0.25) and kept.warmup == pytest.approx(4.05)
    measured = StageHistory.of(StageCosts("embed", 60, 60, 0.0, 0.0, 0.0, 0.0, sample.seconds, 0.0, 0, 0), {},
                               kept=kept)
    assert measured.seconds == pytest.approx(0.52) and measured.pace == pytest.approx(0.25)
    f = forecast(_quick_pipe("warm", 4, "embed"), History({"embed": measured}, ("r1",), "sample", {}),
                 {"embed": 720}, workers=2, prices=[])
    # 720 attempts at 0.25 s on 8 slots, after one load: 26.55 s (at the mean, 46.8 s).
    assert f["seconds"] == pytest.approx(4.05 + 720 * 0.25 / 8 + 0.25)
    assert f["stages"]["embed"]["warmup_seconds"] == pytest.approx(4.05)
    assert "embed's first calls in each worker took 4.0 s more than the rest" in f["basis"]
    # Ten times slower first attempts in each of two workers do not make a run of hundreds slower per attempt.
    two = kept_in_flight([_span("embed", 0.0, 8.0, 2 * (4 * 2.5 + 56 * 0.25), 120)], {}, 4,
                         firsts={"r1": [(4, 4 * 2.5), (4, 4 * 2.5)]})
    assert two.seconds == pytest.approx(0.25) and two.warmup == pytest.approx(2.25)


def test_first_attempts_like_the_rest_are_no_warm_up_and_few_attempts_after_them_tell_no_steady_pace() -> None:
    # Calls whose first wave took about what the rest did (a chat stage's first calls): the mean of all.
    even = kept_in_flight([_span("ask", 0.0, 10.0, 80.0, 320)], {}, 16, firsts={"r1": [(16, 16 * 0.3)] * 2})
    assert even.seconds == pytest.approx(0.25) and even.warmup == 0.0
    # No more attempts after the first waves than in them: nothing says what the steady pace is.
    few = kept_in_flight([_span("ask", 0.0, 10.0, 4 * 4.0 + 4 * 0.25, 8, workers=1)], {}, 4,
                         firsts={"r1": [(4, 16.0)]})
    assert few.seconds == pytest.approx(17.0 / 8) and few.warmup == 0.0


LOADS = """
    import asyncio
    from conveyor import Pipeline

    pipe = Pipeline("loads")
    loading = None

    async def load():
        global loading
        if loading is None:  # the first call in this process loads the model; the calls beside it wait for it
            loading = asyncio.ensure_future(asyncio.sleep(1.0))
        await loading

    @pipe.stage(version="1", concurrency=2)
    async def embed(ctx, source: bytes) -> str:
        await load()
        await asyncio.sleep(0.05)
        return source.decode()
"""


def test_the_history_takes_a_model_load_in_each_workers_first_calls_apart_from_its_pace(
        tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, LOADS, name="loads.py")
    submit_and_work(target, make_docs(tmp_path / "docs", 16), store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        firsts = store.first_attempts(store.recent_runs("loads", 1), 2)
        past = history(store, load_target(target))
    finally:
        store.close()
    assert [f.rank for f in firsts] == [1, 2] and all(f.seconds >= 1.0 for f in firsts)
    embed = past.stages["embed"]
    assert embed.seconds > 0.15, "the mean of its 16 attempts carries the load of the first two"
    assert 0.05 <= embed.pace < 0.1 and 0.9 <= embed.warmup < 1.1
    f = forecast(load_target(target), past, {"embed": 400}, workers=2, prices=[])
    steady = 400 * embed.pace / 4
    assert f["seconds"] == pytest.approx(past.startup + embed.warmup + steady + embed.pace)


PIDS = """
    import os
    from conveyor import Pipeline

    with open(os.environ["PIDS"], "a") as pids:
        pids.write(f"load {os.getpid()}\\n")

    pipe = Pipeline("pids")

    @pipe.stage(version="1")
    def read(ctx, source: bytes) -> str:
        with open(os.environ["PIDS"], "a") as pids:
            pids.write(f"call {os.getpid()}\\n")
        print("stage output goes to stderr")
        return source.decode()
"""


def test_a_sample_runs_in_as_many_worker_processes_as_the_run_will_have(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    # Side by side on the machine's cores, as the run's workers will be: a CPU-bound stage's pace is theirs.
    monkeypatch.setenv("PIDS", str(tmp_path / "pids.log"))
    target = write_pipeline(tmp_path, PIDS, name="pids.py")
    plan = _plan(target, make_docs(tmp_path / "docs", 12), store_url, tmp_path / "blobs", sample=6)
    assert plan["sampled"]["items"] == 6
    lines = [line.split() for line in (tmp_path / "pids.log").read_text().splitlines()]
    loads = {pid for what, pid in lines if what == "load"} - {str(os.getpid())}
    calls = [pid for what, pid in lines if what == "call"]
    assert len(loads) == 2, "two worker processes loaded the target"
    assert len(calls) == 6 and set(calls) <= loads, "the sample's items ran in them, not in this process"
    # Their start-up is measured as it is (a process that loads the target), not added again.
    assert plan["forecast"]["startup_seconds"] > 0
    out = capfd.readouterr()
    assert "stage output goes to stderr" not in out.out and "stage output goes to stderr" in out.err


GROUPS = """
    from conveyor import Pipeline

    pipe = Pipeline("groups")

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        text = source.decode()
        return {"text": text, "shelf": int(text.split()[-1]) % 3}

    @pipe.stage(after=parse, kind="group", by=lambda doc: doc["shelf"], version="1")
    def shelves(ctx, key, members):
        return {"shelf": key, "count": len(members)}
"""


def test_a_group_stage_is_forecast_at_the_groups_its_key_makes_not_as_many_per_member(
        tmp_path: Path, store_url: str) -> None:
    # A key with few values (a manual's section: 9 seen among a sample's 24 pages) makes about as many groups in a
    # run of 284 as in the sample, not 284 * 9 / 24 = 106.
    assert groups_of(284, (9, 24)) == 10 and groups_of(24, (9, 24)) == 9
    assert groups_of(284, (9, 284)) == 9, "a past run of as many members: as many groups"
    assert groups_of(284, (24, 24)) == 284, "a group per member: one per member"
    assert groups_of(284, None) == 1 and groups_of(0, (9, 24)) == 0
    # A sample of 6 items of 30, on 3 shelves: about 3 groups, from the sample and from the run's history.
    target = write_pipeline(tmp_path, GROUPS, name="groups.py")
    docs = make_docs(tmp_path / "docs", 30, "a book on shelf {i}")
    plan = _plan(target, docs, store_url, tmp_path / "blobs", sample=6)
    assert plan["sampled"]["items"] == 6 and 3 <= plan["stages"]["shelves"]["tasks"] <= 4
    submit_and_work(target, docs, store_url, tmp_path / "blobs")
    more = make_docs(tmp_path / "more", 30, "another book on shelf {i}")
    assert _plan(target, more, store_url, tmp_path / "blobs")["stages"]["shelves"]["tasks"] == 3
