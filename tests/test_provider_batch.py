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
from tests.helpers import make_docs, submit_run, write_pipeline

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
        run_direct = submit_run(direct, docs, direct_url, tmp_path / "blobs-direct")
        _worker(direct, direct_url, tmp_path / "blobs-direct", run_direct).run()
        batched = _pipeline(tmp_path, batch=True, name="batched.py")
        run_batched = submit_run(batched, docs, store_url, tmp_path / "blobs")
        stats = _worker(batched, store_url, tmp_path / "blobs", run_batched).run()
        made = _sim_batches(url)
    a, b = _report(store_url, run_direct), _report(store_url, run_batched)
    assert a["outcomes"] == b["outcomes"] == {"completed": 6}
    assert b["usage"]["provider_calls"] == a["usage"]["provider_calls"] == 12
    assert b["usage"]["cost"] == pytest.approx(a["usage"]["cost"] / 2)
    # each request in exactly one batch (one per call of the stage, unless a slow machine splits them)
    assert sum(b.request_counts.total for b in made) == 12 and stats["provider_batches_created"] == len(made)
    answers = "SELECT o.inline FROM outputs o JOIN tasks t ON t.task_key = o.task_key WHERE t.run_id = ? ORDER BY 1"
    outputs = {run: _rows(store_url, answers, (run,)) for run in (run_direct, run_batched)}
    assert outputs[run_direct] == outputs[run_batched]  # the same answers, either way
    deferred = _rows(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND outcome = 'deferred'",
                     (run_batched,))
    assert deferred == [(12,)]
    left = [_rows(store_url, f"SELECT COUNT(*) FROM {table}")[0][0]
            for table in ("provider_batch_requests", "provider_batch_waiters")]
    assert left == [0, 0], "tasks that ended forgot their answered requests"


def _in_thread(worker: Worker) -> Any:
    import threading

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_no_lease_is_held_while_a_batch_runs(tmp_path: Path, store_url: str, fast: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    docs = make_docs(tmp_path / "docs", 5, "note {i}")
    with run_simulator(SimConfig(seed=4, batch_delay_s=3.0)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        thread = _in_thread(_worker(target, store_url, tmp_path / "blobs", run_id))
        deadline = time.monotonic() + 20
        while not _rows(store_url, "SELECT 1 FROM provider_batches WHERE state = 'submitted'"):
            assert time.monotonic() < deadline, "no batch was submitted"
            time.sleep(0.1)
        running = _rows(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND (status = 'running' OR "
                                   "lease_owner IS NOT NULL)", (run_id,))
        store = open_store(store_url)
        try:
            waiting = store.waiting_tasks(run_id)
        finally:
            store.close()
        thread.join(60)
    assert running == [(0,)] and waiting == {"summarise": 5}
    assert _report(store_url, run_id)["outcomes"] == {"completed": 5}


def test_a_batch_created_but_not_recorded_is_adopted_not_paid_twice(tmp_path: Path, store_url: str, fast: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    docs = make_docs(tmp_path / "docs", 4, "part {i}")
    with run_simulator(SimConfig(seed=5, batch_delay_s=0.3)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        first = _worker(target, store_url, tmp_path / "blobs", run_id)
        assert first.batch_keeper is not None

        def crash(_: Any) -> None:  # the worker dies between creating the batch and recording its id
            raise SystemExit("killed after create")

        first.batch_keeper.after_create = crash
        with pytest.raises(SystemExit):
            first.run()
        assert _rows(store_url, "SELECT state, provider_batch_id, create_tries FROM provider_batches") == [
            ("creating", None, 1)]
        second = _worker(target, store_url, tmp_path / "blobs", run_id)
        stats = second.run()
        made = _sim_batches(url)
    assert stats["provider_batches_adopted"] == 1
    assert sum(b.request_counts.total for b in made) == 8, "the crashed one adopted, not created again"
    assert _report(store_url, run_id)["outcomes"] == {"completed": 4}
    assert _rows(store_url, "SELECT COUNT(*), SUM(requests) FROM provider_batches WHERE state = 'ended'") == [
        (len(made), 8)]


def test_failed_entries_are_batched_again(tmp_path: Path, store_url: str, fast: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    docs = make_docs(tmp_path / "docs", 8, "order {i}")
    with run_simulator(SimConfig(seed=6, batch_delay_s=0.2, batch_failure_rate=0.4)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        stats = _worker(target, store_url, tmp_path / "blobs", run_id).run()
        made = _sim_batches(url)
    report = _report(store_url, run_id)
    assert report["outcomes"] == {"completed": 8}
    assert stats["provider_requests_pending"] > 0, "some entries failed and went into a later batch"
    assert sum(b.request_counts.total for b in made) > 16
    retried, answered, direct = _rows(store_url, "SELECT SUM(retried), SUM(answered), SUM(direct) "
                                                 "FROM provider_batches")[0]
    assert retried > 0 and answered + direct == 16, "each call answered by a batch, or past its tries directly"


def test_expired_entries_and_deadlines_fall_back_to_direct_calls(tmp_path: Path, store_url: str, fast: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    docs = make_docs(tmp_path / "docs", 6, "memo {i}")
    with run_simulator(SimConfig(seed=7, batch_delay_s=0.2, batch_expired_rate=0.5)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        stats = _worker(target, store_url, tmp_path / "blobs", run_id).run()
    assert _report(store_url, run_id)["outcomes"] == {"completed": 6}
    assert stats["provider_requests_direct"] > 0 and stats["provider_requests_answered"] > 0
    direct = _rows(store_url, "SELECT SUM(direct) FROM provider_batches")[0][0]
    calls = _report(store_url, run_id)["usage"]["provider_calls"]
    assert direct > 0 and calls == 12

    with run_simulator(SimConfig(seed=8, batch_delay_s=60.0)) as url:  # slower than the stage's deadline
        monkeypatch.setenv("SIM_URL", url)
        slow = _pipeline(tmp_path, deadline=1.0, name="slow.py")
        run_slow = submit_run(slow, docs, store_url, tmp_path / "blobs")
        _worker(slow, store_url, tmp_path / "blobs", run_slow).run()
    report = _report(store_url, run_slow)
    assert report["outcomes"] == {"completed": 6} and report["usage"]["provider_calls"] == 12
    priced = _rows(store_url, "SELECT SUM(cost) FROM attempts WHERE run_id = ?", (run_slow,))[0][0]
    assert priced == pytest.approx(report["usage"]["cost"]) and priced > 0


def test_limits_split_a_big_set_into_several_batch_files(tmp_path: Path, store_url: str, fast: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_PROVIDER_BATCH_MAX_REQUESTS", "3")
    docs = make_docs(tmp_path / "docs", 7, "line {i}")
    with run_simulator(SimConfig(seed=9, batch_delay_s=0.2)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        _worker(target, store_url, tmp_path / "blobs", run_id).run()
        made = _sim_batches(url)
    assert _report(store_url, run_id)["outcomes"] == {"completed": 7}
    sizes = sorted(b.request_counts.total for b in made)
    assert sum(sizes) == 14 and max(sizes) <= 3 and len(made) >= 6


CLI_PIPE = """
    from conveyor import Pipeline

    pipe = Pipeline("notes")

    @pipe.stage(version="1")
    async def tag(ctx, source: bytes) -> str:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1", max_tokens=64)
        return answer.text
"""


def test_run_provider_batch_flag_halves_the_cost(tmp_path: Path, store_url: str) -> None:
    """`conveyor run --provider-batch` against an OpenAI-compatible endpoint set by OPENAI_BASE_URL, the way an
    operator runs it; `conveyor provider-batches` shows the batches."""
    import json

    from tests.helpers import cli_json

    target = write_pipeline(tmp_path, CLI_PIPE)
    docs = make_docs(tmp_path / "docs", 5, "ticket {i}: printer on floor 3 is jammed")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-1": [2.0, 8.0]}))
    with run_simulator(SimConfig(seed=10, batch_delay_s=0.5)) as url:
        env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sim", "CONVEYOR_PRICES": str(prices),
               "CONVEYOR_PROVIDER_BATCH_GATHER_S": "0.3", "CONVEYOR_PROVIDER_BATCH_POLL_S": "0.5"}
        direct = cli_json("run", target, "--input", str(docs), "--db", store_url, "--workers", "1", cwd=tmp_path,
                          env=env)
        version_two = (tmp_path / "pipe.py").read_text().replace('version="1"', 'version="2"')
        (tmp_path / "pipe.py").write_text(version_two)  # not answered from the memo of the first run
        batched = cli_json("run", target, "--input", str(docs), "--db", store_url, "--workers", "2",
                           "--provider-batch", cwd=tmp_path, env=env)  # two keepers, one at a time
        made = _sim_batches(url)
        shown = cli_json("provider-batches", "--run", batched["run_id"], "--db", store_url, cwd=tmp_path, env=env)
    assert direct["outcomes"] == batched["outcomes"] == {"completed": 5}
    assert batched["usage"]["cost"] == pytest.approx(direct["usage"]["cost"] / 2)
    assert {b["state"] for b in shown["batches"]} == {"ended"}
    assert sum(b["answered"] for b in shown["batches"]) == 5 == sum(b.request_counts.total for b in made)
    assert shown["requests"] == {} and shown["waiting"] == {}, "ended tasks forget their answered requests"


def test_batch_answers_count_against_the_run_budget(tmp_path: Path, store_url: str, fast: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.service.submit import SubmitOptions

    docs = make_docs(tmp_path / "docs", 4, "claim {i}")
    with run_simulator(SimConfig(seed=12, batch_delay_s=0.2)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = _pipeline(tmp_path)
        store = open_store(store_url)
        try:
            run_id = submit(load_target(target), target, str(docs), store, FilesystemBlobs(tmp_path / "blobs"),
                            options=SubmitOptions(budget_usd=5.0)).run_id
        finally:
            store.close()
        _worker(target, store_url, tmp_path / "blobs", run_id).run()
    report = _report(store_url, run_id)
    assert report["outcomes"] == {"completed": 4}
    spent = _rows(store_url, "SELECT spent_usd, reserved_usd FROM runs WHERE run_id = ?", (run_id,))[0]
    assert spent[0] == pytest.approx(report["usage"]["cost"]) and spent[1] == pytest.approx(0.0)


FLAKY = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5, prices={"sim-1": [2.0, 8.0]})

    pipe = Pipeline("flaky", provider=provider, retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version="1", batch=True)
    async def answer(ctx, source: bytes) -> str:
        done = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1")
        if ctx.attempt == 1:
            raise RuntimeError("the stage failed after its model call")
        return done.text
"""


def test_a_retried_task_asks_its_batch_again(tmp_path: Path, store_url: str, fast: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    docs = make_docs(tmp_path / "docs", 3, "question {i}")
    with run_simulator(SimConfig(seed=13, batch_delay_s=0.2)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = write_pipeline(tmp_path, FLAKY)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        _worker(target, store_url, tmp_path / "blobs", run_id).run()
        made = _sim_batches(url)
    report = _report(store_url, run_id)
    assert report["outcomes"] == {"completed": 3}
    assert sum(b.request_counts.total for b in made) == 6, "the retry asked again, as a direct retry would"
    outcomes = _rows(store_url, "SELECT outcome, COUNT(*) FROM attempts WHERE run_id = ? GROUP BY outcome "
                                "ORDER BY outcome", (run_id,))
    assert outcomes == [("deferred", 6), ("retry", 3), ("succeeded", 3)]
    assert report["usage"]["provider_calls"] == 6  # both answers paid for, each counted once


KILLED = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=30, prices={"sim-1": [2.0, 8.0]})

    pipe = Pipeline("killed", provider=provider, lease_seconds=2, retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version="1", batch=True)
    async def answer(ctx, source: bytes) -> str:
        done = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1")
        return done.text
"""


def test_a_worker_killed_between_create_and_record_pays_once(tmp_path: Path, store_url: str, fast: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL a real worker process while the provider holds its answer to the batch's creation (the batch
    exists, the worker never records its id): the next worker adopts it by its tag."""
    import os
    import signal
    import subprocess
    import sys
    import time

    docs = make_docs(tmp_path / "docs", 4, "request {i}")
    with run_simulator(SimConfig(seed=14, batch_delay_s=0.5, batch_create_delay_s=30.0)) as url:
        monkeypatch.setenv("SIM_URL", url)
        target = write_pipeline(tmp_path, KILLED)
        run_id = submit_run(target, docs, store_url, tmp_path / "blobs")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        worker = subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id,
                                   "--db", store_url, "--blobs", str(tmp_path / "blobs"), "--quiet"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not _sim_batches(url):  # created on the provider; its creator still waits for the answer
                assert time.monotonic() < deadline and worker.poll() is None, "no batch was created"
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        assert _rows(store_url, "SELECT state, provider_batch_id FROM provider_batches") == [("creating", None)]
        _rows(store_url, "UPDATE provider_batch_keepers SET until = 0")  # as the dead keeper's lease runs out
        stats = _worker(target, store_url, tmp_path / "blobs", run_id).run()
        made = _sim_batches(url)
    assert stats["provider_batches_adopted"] == 1 and sum(b.request_counts.total for b in made) == 4
    assert _report(store_url, run_id)["outcomes"] == {"completed": 4}


def test_the_simulator_batch_api_answers_as_openai_does() -> None:
    """Uploads, creation, listing by metadata, cancellation and refusals, through the openai SDK."""
    import openai

    async def exercise(url: str) -> dict[str, Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="sim", max_retries=0)
        try:
            line = ('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "sim-1", '
                    '"messages": [{"role": "user", "content": "hi"}]}}\n')
            uploaded = await client.files.create(file=("in.jsonl", line.encode()), purpose="batch")
            made = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                               completion_window="24h", metadata={"conveyor_tag": "t1"})
            listed = [b.metadata for b in [b async for b in client.batches.list(limit=10)]]
            cancelled = await client.batches.cancel(made.id)
            refused = []
            for call in (client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                                               completion_window="24h"),
                         client.batches.retrieve("batch_missing")):
                try:
                    await call
                except openai.APIStatusError as exc:
                    refused.append(exc.status_code)
            content = await client.files.content(uploaded.id)
            return {"listed": listed, "cancelled": cancelled.status, "refused": refused, "content": content.text,
                    "status": made.status, "total": made.request_counts.total if made.request_counts else None}
        finally:
            await client.close()

    with run_simulator(SimConfig(seed=15, batch_delay_s=30.0)) as url:
        seen = asyncio.run(exercise(url))
    assert seen["status"] == "in_progress" and seen["total"] == 1
    assert seen["listed"] == [{"conveyor_tag": "t1"}] and seen["cancelled"] == "cancelled"
    assert seen["refused"] == [400, 404] and seen["content"].startswith('{"custom_id": "a"')


def test_a_price_table_says_what_a_batch_call_costs() -> None:
    from conveyor.providers.base import PriceTable

    assert PriceTable.from_dict({"sim-1": [2.0, 8.0]}).batch_discount == 0.5
    table = PriceTable.from_dict({"batch_discount": 0.4, "models": {"sim-1": [2.0, 8.0]}})
    assert table.batch_discount == 0.4 and set(table.prices) == {"sim-1"}
    with pytest.raises(ValueError, match="batch_discount"):
        PriceTable.from_dict({"batch_discount": 2, "sim-1": [2.0, 8.0]})
