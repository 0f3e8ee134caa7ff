"""Stages reach the model provider through ctx, against the local simulator, on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.service.report import dlq_list, find_run, reconcile
from conveyor.store import open_store
from tests.helpers import make_docs, submit_and_work, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

PIPE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5,
                              prices={"sim-1": [2.0, 8.0], "sim-embed-1": [0.1, 0.0]})

    pipe = Pipeline("llm", provider=provider, retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    async def extract(ctx, source: bytes) -> dict:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1",
                                json_mode=True, prompt_version="extract-v1")
        vectors = await ctx.embed([source.decode()], model="sim-embed-1")
        return {"fields": answer.data, "model": answer.model, "dims": len(vectors.vectors[0]),
                "calls": ctx.usage.calls, "tokens": ctx.usage.prompt_tokens + ctx.usage.completion_tokens}
"""


def _report(store_url: str, run_id: str) -> dict:
    store = open_store(store_url)
    try:
        return reconcile(store, find_run(store, run_id)) | {"dlq": dlq_list(store, run_id=run_id)["entries"]}
    finally:
        store.close()


def test_async_stage_calls_the_provider_through_ctx(tmp_path: Path, store_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 4, "invoice number {i} total 12 EUR")
    with run_simulator(SimConfig(seed=1)) as url:
        monkeypatch.setenv("SIM_URL", url)
        done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = _report(store_url, done.run_id)
    assert report["outcomes"] == {"completed": 4} and report["stage_calls"] == 4
    store = open_store(store_url)
    try:
        (row,) = store.db.execute("SELECT inline FROM outputs WHERE stage = 'extract' LIMIT 1")
    finally:
        store.close()
    import json

    output = json.loads(row[0])
    assert output["model"].startswith("sim-1@") and output["dims"] == 384
    assert output["calls"] == 2 and output["tokens"] > 0 and isinstance(output["fields"], dict)

    usage = report["usage"]
    assert usage["provider_calls"] == 8 and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["cost"] > 0 and usage["cost_per_accepted_item"] == pytest.approx(usage["cost"] / 4)
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT model, prompt_version, provider_calls FROM attempts WHERE run_id = ?",
                                (done.run_id,))
    finally:
        store.close()
    assert {(r[1], r[2]) for r in rows} == {("extract-v1", 2)}
    assert all("sim-1@" in r[0] and "sim-embed-1" in r[0] for r in rows), "models recorded as reported"


def test_malformed_completions_are_retried_then_dead_lettered_never_published(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 2)
    with run_simulator(SimConfig(seed=2, malformed_rate=1.0)) as url:
        monkeypatch.setenv("SIM_URL", url)
        done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = _report(store_url, done.run_id)
    assert report["outcomes"] == {"dead_lettered": 2}
    assert {e["error_class"] for e in report["dlq"]} == {"malformed_output"}
    assert all(e["attempts"] == 2 for e in report["dlq"])
    # Rejected answers still cost tokens: every attempt is accounted, none accepted.
    assert report["usage"]["provider_calls"] == 4 and report["usage"]["prompt_tokens"] > 0
    assert report["usage"]["cost_per_accepted_item"] is None


def test_worker_reports_what_the_quota_gate_did(tmp_path: Path, store_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.blobs import FilesystemBlobs
    from conveyor.runtime.target import load_target
    from conveyor.service.submit import submit
    from tests.helpers import work

    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 3, "order {i}")
    monkeypatch.setenv("CONVEYOR_LIMITS", '{"sim-1": {"tpm": 100000}}')
    with run_simulator(SimConfig(seed=2)) as url:
        monkeypatch.setenv("SIM_URL", url)
        store = open_store(store_url)
        try:
            run_id = submit(load_target(target), target, str(docs), store, FilesystemBlobs(tmp_path / "blobs")).run_id
        finally:
            store.close()
        stats = work(target, store_url, tmp_path / "blobs", run_id=run_id)
    # 3 chats under the declared limit and 3 embeddings under AIMD, all admitted by the gate
    assert stats["quota_granted"] == 6 and stats["quota_rate_limited"] == 0 and stats["quota_waited_s"] >= 0
