"""The provider batch lane against the simulator's Batch API (/v1/files + /v1/batches), on both backends: a
batch-lane run costs half of the direct one, holds no lease while its batches run, adopts a batch its keeper
created but did not record, retries failed entries, calls expired ones directly, and splits big sets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.report import find_run, reconcile
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import make_docs, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

PIPE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5, prices={"sim-1": [2.0, 8.0]})

    pipe = Pipeline("summaries", provider=provider, retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version=VERSION, batch=BATCH, batch_deadline=DEADLINE)
    async def summarise(ctx, source: bytes) -> dict:
        first = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1")
        second = await ctx.chat([{"role": "user", "content": "again: " + first.text[:40]}], model="sim-1")
        return {"first": first.text, "second": second.text}
"""


def _pipeline(tmp_path: Path, batch: bool = True, deadline: float = 600.0, name: str = "pipe.py") -> str:
    source = PIPE.replace("BATCH", str(batch)).replace("DEADLINE", repr(deadline))
    return write_pipeline(tmp_path, source.replace("VERSION", repr(name)), name)  # a memo of its own


def _submit(target: str, docs: Path, store_url: str, blobs: Path) -> str:
    store = open_store(store_url)
    try:
        return submit(load_target(target), target, str(docs), store, FilesystemBlobs(blobs)).run_id
    finally:
        store.close()


def _worker(target: str, store_url: str, blobs: Path, run_id: str, **opts: Any) -> Worker:
    return Worker(load_target(target), target, store_url, FilesystemBlobs(blobs),
                  WorkerOptions(run_id=run_id, until_idle=True, lease_seconds=5, **opts))


def _report(store_url: str, run_id: str) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return reconcile(store, find_run(store, run_id))
    finally:
        store.close()


def _rows(store_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    store = open_store(store_url)
    try:
        return store.db.execute(sql, params)
    finally:
        store.close()


def _sim_batches(url: str) -> list[Any]:
    import openai

    async def listed() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="sim")
        try:
            return [b async for b in client.batches.list(limit=100)]
        finally:
            await client.close()

    return asyncio.run(listed())


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_PROVIDER_BATCH_GATHER_S", "0.2")
    monkeypatch.setenv("CONVEYOR_PROVIDER_BATCH_POLL_S", "0.3")


def test_a_batch_lane_run_costs_half_of_the_direct_one(tmp_path: Path, store_url: str, fast: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    docs = make_docs(tmp_path / "docs", 6, "invoice {i}: 12 bolts, 3 nuts")
    direct_url = store_url
    with run_simulator(SimConfig(seed=3, batch_delay_s=0.5)) as url:
        monkeypatch.setenv("SIM_URL", url)
        direct = _pipeline(tmp_path, batch=False, name="direct.py")
        run_direct = _submit(direct, docs, direct_url, tmp_path / "blobs-direct")
        _worker(direct, direct_url, tmp_path / "blobs-direct", run_direct).run()
        batched = _pipeline(tmp_path, batch=True, name="batched.py")
        run_batched = _submit(batched, docs, store_url, tmp_path / "blobs")
        stats = _worker(batched, store_url, tmp_path / "blobs", run_batched).run()
        made = _sim_batches(url)
    a, b = _report(store_url, run_direct), _report(store_url, run_batched)
    assert a["outcomes"] == b["outcomes"] == {"completed": 6}
    assert b["usage"]["provider_calls"] == a["usage"]["provider_calls"] == 12
    assert b["usage"]["cost"] == pytest.approx(a["usage"]["cost"] / 2)
    assert len(made) == 2 and stats["provider_batches_created"] == 2  # one per call of the stage
    answers = "SELECT o.inline FROM outputs o JOIN tasks t ON t.task_key = o.task_key WHERE t.run_id = ? ORDER BY 1"
    outputs = {run: _rows(store_url, answers, (run,)) for run in (run_direct, run_batched)}
    assert outputs[run_direct] == outputs[run_batched]  # the same answers, either way
    deferred = _rows(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND outcome = 'deferred'",
                     (run_batched,))
    assert deferred == [(12,)]
