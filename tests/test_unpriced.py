"""A model without a price is reported as unpriced, never as $0, from the provider call to the CLI."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from conveyor.providers import Completion, ProviderError
from conveyor.runtime.services import Usage
from conveyor.service.money import usd
from conveyor.service.report import find_run, reconcile, status_report
from conveyor.store import open_store
from tests.helpers import cli, make_docs, submit_and_work, write_pipeline

# An in-process provider priced by a real PriceTable: "priced-1" has a price, any other model has none.
# With FAIL_FIRST set, a first attempt's answer is rejected (malformed) after it was paid for.
PIPE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers import Completion, PriceTable, ProviderError

    PRICES = PriceTable.from_dict({"priced-1": {"input": 1.0, "output": 2.0}})

    class FakeProvider:
        name = "fake"

        async def chat(self, messages, *, model, prompt_version=None, **options):
            cost, priced = PRICES.cost_for(model, model, 100, 20)
            if messages[0]["content"] == "fail":
                raise ProviderError("malformed_output", "not JSON", provider="fake", model=model,
                                    prompt_tokens=100, completion_tokens=20, cost=cost, priced=priced)
            return Completion(text="ok", data=None, model=model, prompt_tokens=100, completion_tokens=20,
                              cost=cost, request_id=None, prompt_version=prompt_version, latency=0.0,
                              priced=priced)

    pipe = Pipeline("unpriced", provider=FakeProvider, retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    async def extract(ctx, source: bytes) -> dict:
        fail = ctx.attempt == 1 and os.environ.get("FAIL_FIRST")
        for model in os.environ["FAKE_MODELS"].split(","):
            await ctx.chat([{"role": "user", "content": "fail" if fail else source.decode()}], model=model)
        return {"ok": True}
"""
ITEMS = 3
PER_CALL = (100 * 1.0 + 20 * 2.0) / 1_000_000


def _run(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, models: str,
         fail_first: bool = False) -> tuple[str, dict[str, Any], dict[str, Any]]:
    monkeypatch.setenv("FAKE_MODELS", models)
    if fail_first:
        monkeypatch.setenv("FAIL_FIRST", "1")
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, make_docs(tmp_path / "docs", ITEMS), store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        run = find_run(store, done.run_id)
        return done.run_id, reconcile(store, run), status_report(store, run)
    finally:
        store.close()


def _attempt_rows(store_url: str, run_id: str) -> list[tuple[Any, ...]]:
    store = open_store(store_url)
    try:
        return [tuple(r) for r in store.db.execute(
            "SELECT outcome, provider_calls, unpriced_calls FROM attempts WHERE run_id = ? ORDER BY id",
            (run_id,))]
    finally:
        store.close()


def _shown(store_url: str, run_id: str, cwd: Path) -> str:
    """What `conveyor status RUN` and `conveyor reconcile RUN` print for the run's model use."""
    status = cli("status", run_id, "--db", store_url, cwd=cwd, check=True).stdout
    summary = cli("reconcile", run_id, "--db", store_url, cwd=cwd, check=True).stdout
    (line,) = [x for x in status.splitlines() if x.startswith("model calls")]
    assert line in summary
    return line


def test_a_run_whose_every_call_was_unpriced_has_no_cost(tmp_path: Path, store_url: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, report, status = _run(tmp_path, store_url, monkeypatch, "local-llm", fail_first=True)
    assert report["outcomes"] == {"completed": ITEMS}
    usage = report["usage"]
    # a rejected answer counts too: ITEMS first attempts that failed, ITEMS retries that succeeded
    assert usage["provider_calls"] == 2 * ITEMS and usage["unpriced_calls"] == 2 * ITEMS
    assert usage["cost"] == 0 and usage["cost_per_accepted_item"] is None
    assert usage["tokens_per_accepted_item"] == pytest.approx(2 * 120)
    assert status["usage"]["unpriced_calls"] == 2 * ITEMS and status["usage"]["cost_per_accepted_item"] is None
    assert sorted(_attempt_rows(store_url, run_id)) == [("retry", 1, 1)] * ITEMS + [("succeeded", 1, 1)] * ITEMS

    line = _shown(store_url, run_id, tmp_path)
    assert "cost unpriced" in line and "$" not in line, line
    assert line.endswith(f"(per accepted item: {2 * 120:,} tokens)"), line


def test_a_run_with_some_unpriced_calls_says_how_many(tmp_path: Path, store_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, report, _ = _run(tmp_path, store_url, monkeypatch, "priced-1,local-llm")
    usage = report["usage"]
    assert usage["provider_calls"] == 2 * ITEMS and usage["unpriced_calls"] == ITEMS
    assert usage["cost"] == pytest.approx(ITEMS * PER_CALL)
    assert usage["cost_per_accepted_item"] == pytest.approx(PER_CALL)
    assert _attempt_rows(store_url, run_id) == [("succeeded", 2, 1)] * ITEMS

    line = _shown(store_url, run_id, tmp_path)
    assert f"cost {usd(ITEMS * PER_CALL)} (+{ITEMS} unpriced calls)" in line, line
    assert f"{usd(PER_CALL)})" in line, line


def test_a_priced_run_shows_no_unpriced_note(tmp_path: Path, store_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, report, _ = _run(tmp_path, store_url, monkeypatch, "priced-1-2026-01-01")  # priced by prefix
    assert report["usage"]["unpriced_calls"] == 0
    assert report["usage"]["cost_per_accepted_item"] == pytest.approx(PER_CALL)
    line = _shown(store_url, run_id, tmp_path)
    assert f"cost {usd(ITEMS * PER_CALL)} (per accepted item" in line and "unpriced" not in line, line
    assert "$0.00042" in line, "the cost of 3 calls at $0.00014, not $0.0004"


def test_usage_counts_unpriced_results_and_rejected_answers() -> None:
    usage = Usage()
    usage.add(Completion(text="", data=None, model="m", prompt_tokens=1, completion_tokens=1, cost=0.0,
                         request_id=None, prompt_version=None, latency=0.0, priced=False))
    usage.add(ProviderError("malformed_output", prompt_tokens=5, priced=False))
    usage.add(ProviderError("timeout"))  # no answer, nothing to price
    usage.add(Completion(text="", data=None, model="m", prompt_tokens=1, completion_tokens=1, cost=0.1,
                         request_id=None, prompt_version=None, latency=0.0))
    assert (usage.calls, usage.unpriced_calls) == (4, 2)


def test_a_provider_error_keeps_priced_across_processes() -> None:
    error = pickle.loads(pickle.dumps(ProviderError("malformed_output", "x", prompt_tokens=5, priced=False)))
    assert error.priced is False and error.prompt_tokens == 5
    assert ProviderError("timeout").priced is True
