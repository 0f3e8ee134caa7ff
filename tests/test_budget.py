"""Budgets and the circuit breaker: a run stops granting model calls at its ceiling across a fleet, pauses
with what it spent, loses nothing, and carries on with `conveyor resume RUN --budget-usd MORE`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli, query, reconciled, submit_and_work, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

PRICED = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=10, prices={"sim-1": [1000.0, 4000.0]})

    pipe = Pipeline("budgeted", provider=provider, retry=Retry(max_attempts=3, base=0.05, cap=0.2))

    @pipe.stage(version="1", concurrency=4)
    async def ask(ctx, source: bytes) -> str:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1", max_tokens=40)
        return answer.text[:40]
"""


def _docs(folder: Path, count: int) -> Path:
    folder.mkdir()
    for i in range(count):
        (folder / f"doc{i:03d}.txt").write_text(f"Say something short about the number {i}.")
    return folder


def test_a_budget_holds_across_four_workers_and_resume_carries_on(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PRICED)
    docs = _docs(tmp_path / "docs", 24)
    common = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    budget = 1.5
    with run_simulator(SimConfig(seed=7, latency_ms=30)) as url:
        env = {"SIM_URL": url}
        first = cli("run", target, "--input", str(docs), "--workers", "4", "--budget-usd", str(budget), "--json",
                    *common, cwd=tmp_path, env=env, timeout=180)
        assert first.returncode == 3, first.stderr
        summary = json.loads(first.stdout)
        run_id = summary["run_id"]
        assert summary["status"] == "paused_budget" and "budget" in summary["note"]
        [said] = [line for line in first.stderr.splitlines() if line.startswith("paused:")]
        assert f"run {run_id} is not finished (its budget would pass" in said, said
        assert said.endswith(f"resume it with: conveyor resume {run_id} --db {store_url} --blobs "
                             f"{tmp_path / 'blobs'} --budget-usd MORE"), said
        costs = [float(r[0]) for r in query(store_url, "SELECT cost FROM attempts WHERE run_id = ? AND provider_calls "
                                            "> 0", run_id)]
        spent = sum(costs)
        assert 0 < spent <= budget + max(costs), f"spent ${spent:.4f} of a ${budget} budget"
        assert summary["budget"]["usd"] == budget and summary["budget"]["spent"] == pytest.approx(spent)
        outcomes = summary["outcomes"]
        assert set(outcomes) <= {"completed", "in_progress"} and outcomes.get("in_progress"), \
            "nothing failed, nothing was lost: what did not fit waits"
        assert sum(outcomes.values()) == 24

        again = cli("resume", run_id, "--workers", "1", *common, cwd=tmp_path, env=env)
        assert again.returncode == 2 and again.stderr.count("\n") == 1 and "--budget-usd" in again.stderr
        low = cli("resume", run_id, "--budget-usd", "0.5", *common, cwd=tmp_path, env=env)
        assert low.returncode == 2 and "not more than" in low.stderr
        done = cli("resume", run_id, "--budget-usd", "1000", "--workers", "0", "--json", *common, cwd=tmp_path,
                   env=env, timeout=180)
        assert done.returncode == 0, done.stderr
        final = json.loads(done.stdout)
        assert final["outcomes"] == {"completed": 24} and final["status"] == "finished"
        assert final["budget"]["spent"] == pytest.approx(reconciled(store_url, run_id)["usage"]["cost"])


BROKEN = """
    import os
    from conveyor import Breaker, Pipeline, Retry
    from conveyor.providers.base import Completion, ProviderError

    class Provider:
        name = "fake"

        async def chat(self, messages, *, model, **options):
            if os.environ.get("KEY_FIXED") != "1":
                raise ProviderError("auth", "401: the API key was revoked", provider="fake", status_code=401)
            return Completion("ok", None, model, 5, 5, 0.0, None, None, 0.01)

    pipe = Pipeline("broken", provider=Provider, retry=Retry(max_attempts=2, base=0.01, cap=0.02),
                    breaker=Breaker(window_s=60, min_calls=4))

    @pipe.stage(version="1", concurrency=1)
    async def ask(ctx, source: bytes) -> str:
        return (await ctx.chat([{"role": "user", "content": source.decode()}], model="m")).text
"""


def test_the_breaker_pauses_a_run_whose_calls_all_fail_and_resume_retries_them(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_pipeline(tmp_path, BROKEN)
    docs = _docs(tmp_path / "docs", 30)
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    report = reconciled(store_url, run_id)
    assert report["status"] == "paused_breaker" and "auth" in report["note"]
    calls = report["usage"]["provider_calls"]
    assert calls <= 5, f"{calls} calls: the breaker stops the run at its 4th failed call, not after 30"
    assert report["outcomes"].get("failed", 0) <= 3 and report["outcomes"]["in_progress"] >= 27

    monkeypatch.setenv("KEY_FIXED", "1")
    done = cli("resume", run_id, "--workers", "1", "--json", "--db", store_url, "--blobs", str(tmp_path / "blobs"),
               cwd=tmp_path, env={"KEY_FIXED": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcomes"] == {"completed": 30}, "the calls that failed before it tripped too"
