"""Waiting is never paid twice (issue 27 point 3): a re-run meeting an answer that waits for review waits on it
(no call, no second entry) and one decision settles every run waiting on it; a call answered within a task is
answered from the task's call journal on its next attempt (both backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.transitions import Transitions
from conveyor.service import review
from conveyor.service.report import find_run, run_status
from conveyor.store import open_store
from tests.helpers import cli, query, reconciled, submit_and_work, submit_run, work, write_pipeline

UNSURE = """
    import json, os
    from conveyor import Pipeline
    from conveyor.acceptance import Accept, Review

    pipe = Pipeline("unsure")

    @pipe.stage(version="1", accept=Accept(confidence="confidence", threshold=0.8, review=Review(deadline="1h")))
    def guess(ctx, source: bytes) -> str:
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(source.decode() + "\\n")
        return json.dumps({"answer": source.decode(), "confidence": 0.5})

    @pipe.stage(after=guess, version="1")
    def keep(ctx, record: dict) -> dict:
        return record
"""


@pytest.fixture
def unsure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.log"))
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps({"key": f"k{i}", "text": f"item {i}"}) + "\n" for i in range(6)))
    return {"target": write_pipeline(tmp_path, UNSURE), "input": manifest, "blobs": tmp_path / "blobs",
            "calls": tmp_path / "calls.log"}


def _calls(p: dict[str, Any]) -> int:
    return len(p["calls"].read_text().splitlines()) if p["calls"].exists() else 0


def _status_counts(store_url: str, run_id: str) -> dict[str, dict[str, int]]:
    """``conveyor status``'s per-stage counts (from the run's running totals), checked against the task rows."""
    store = open_store(store_url)
    try:
        stages = run_status(store, find_run(store, run_id))["stages"]
    finally:
        store.close()
    rows = query(store_url, "SELECT stage, status, COUNT(*) FROM tasks WHERE run_id = ? GROUP BY stage, status",
                 run_id)
    counted: dict[str, dict[str, int]] = {}
    for stage, status, count in rows:
        counted.setdefault(str(stage), {})[str(status)] = int(count)
    assert {k: v for k, v in stages.items() if v} == counted
    return counted


def _statuses(store_url: str, run_id: str, stage: str) -> dict[str, str]:
    rows = query(store_url, "SELECT item_key, status FROM tasks WHERE run_id = ? AND stage = ?", run_id, stage)
    return {str(r[0]): str(r[1]) for r in rows}


def test_a_rerun_waits_on_the_answer_under_review(unsure: dict[str, Any], store_url: str) -> None:
    runs = [submit_and_work(unsure["target"], unsure["input"], store_url, unsure["blobs"]) for _ in range(3)]
    assert _calls(unsure) == 6, "each unsure answer is paid for once, however many runs meet it"
    store = open_store(store_url)
    try:
        entries = review.review_list(store)["reviews"]
        # `review list --run` of a later run lists the entries its tasks wait on (the first run's).
        waited_on = [review.review_list(store, run_id=run.run_id)["reviews"] for run in runs]
    finally:
        store.close()
    assert len(entries) == 6 and {e["run_id"] for e in entries} == {runs[0].run_id}
    assert all(sorted(e["id"] for e in listed) == sorted(e["id"] for e in entries) for listed in waited_on)
    for run in runs:
        assert _statuses(store_url, run.run_id, "guess") == {f"k{i}": "awaiting_review" for i in range(6)}
        assert reconciled(store_url, run.run_id)["outcomes"] == {"awaiting_review": 6}
        assert _status_counts(store_url, run.run_id) == {"guess": {"awaiting_review": 6}}

    # one decision settles the item in every run waiting on it, successors and all
    store = open_store(store_url)
    try:
        by_item = {e["item_key"]: e["id"] for e in entries}
        decided = review.approve(store, FilesystemBlobs(unsure["blobs"]), [by_item["k0"]], by="ann")
        assert decided["decided"][0]["queued"] == 3
        review.reject(store, [by_item["k1"]], why="not it", by="ann")
        assert len(review.review_list(store)["reviews"]) == 4
    finally:
        store.close()
    for run in runs:
        work(unsure["target"], store_url, unsure["blobs"], run_id=run.run_id)
        assert _statuses(store_url, run.run_id, "guess")["k0"] == "succeeded"
        assert _statuses(store_url, run.run_id, "keep")["k0"] == "succeeded"
        assert _statuses(store_url, run.run_id, "guess")["k1"] == "rejected"
        outcomes = reconciled(store_url, run.run_id)["outcomes"]
        assert outcomes["completed"] == 1 and outcomes["rejected"] == 1 and outcomes["awaiting_review"] == 4
        assert _status_counts(store_url, run.run_id) == {
            "guess": {"awaiting_review": 4, "succeeded": 1, "rejected": 1}, "keep": {"succeeded": 1}}
    assert _calls(unsure) == 6


def test_items_of_one_run_with_the_same_answer_share_one_entry(unsure: dict[str, Any], store_url: str) -> None:
    unsure["input"].write_text("".join(json.dumps({"key": k, "text": "same"}) + "\n" for k in ("x", "y", "z")))
    run = submit_and_work(unsure["target"], unsure["input"], store_url, unsure["blobs"])
    assert _calls(unsure) == 1
    store = open_store(store_url)
    try:
        [entry] = review.review_list(store)["reviews"]
        review.approve(store, FilesystemBlobs(unsure["blobs"]), [entry["id"]], by="ann")
    finally:
        store.close()
    work(unsure["target"], store_url, unsure["blobs"], run_id=run.run_id)
    assert _statuses(store_url, run.run_id, "keep") == {"x": "succeeded", "y": "succeeded", "z": "succeeded"}


def test_a_replayed_entry_is_asked_again_and_its_new_entry_settles_the_waits(
        unsure: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    """A replay closes the entry of the task it re-opens: that task asks the model again (nobody else's entry is
    left to wait on), and the new entry's decision settles the runs that waited on the old one."""
    first = submit_and_work(unsure["target"], unsure["input"], store_url, unsure["blobs"])
    second = submit_and_work(unsure["target"], unsure["input"], store_url, unsure["blobs"])
    assert _calls(unsure) == 6
    common = ("--db", store_url, "--blobs", str(unsure["blobs"]))
    replayed = cli("replay", "--run", first.run_id, "--stage", "guess", "--item", "k0", "--reason", "reprocess",
                   "--process", "--workers", "0", *common, cwd=tmp_path)
    assert replayed.returncode == 5, replayed.stderr  # ended, some awaiting review
    assert _calls(unsure) == 7
    store = open_store(store_url)
    try:
        [entry] = [e for e in review.review_list(store)["reviews"] if e["item_key"] == "k0"]
        review.approve(store, FilesystemBlobs(unsure["blobs"]), [entry["id"]], by="ann")
    finally:
        store.close()
    for run_id in (first.run_id, second.run_id):
        work(unsure["target"], store_url, unsure["blobs"], run_id=run_id)
        assert _statuses(store_url, run_id, "keep") == {"k0": "succeeded"}


def test_a_decision_taken_while_a_rerun_joins_the_wait_is_not_lost(unsure: dict[str, Any], store_url: str) -> None:
    first = submit_and_work(unsure["target"], unsure["input"], store_url, unsure["blobs"])
    second = submit_run(unsure["target"], unsure["input"], store_url, unsure["blobs"])
    store = open_store(store_url)
    try:
        transitions = Transitions(load_target(unsure["target"]), store, "w")
        now = store.clock()
        claimed = transitions.claim(["guess"], 10, now, 60, second)
        waiting, to_run = transitions.answers(claimed, [], now)
        assert len(waiting) == 6 and to_run == [] and all(o.waits is not None for o in waiting)
        # the entry is decided after the re-run's tasks were found waiting on it, before they commit
        entry = next(e for e in review.review_list(store)["reviews"] if e["item_key"] == "k0")
        review.approve(store, FilesystemBlobs(unsure["blobs"]), [entry["id"]], by="ann")
        counts = transitions.commit(waiting, store.clock())
        assert counts["awaiting_review"] == 5 and counts["paused"] == 1, "k0 is given back, not left waiting"
    finally:
        store.close()
    for run_id in (first.run_id, second):
        work(unsure["target"], store_url, unsure["blobs"], run_id=run_id)
        assert _statuses(store_url, run_id, "keep") == {"k0": "succeeded"}
    assert _calls(unsure) == 6


def test_a_tenant_waits_only_on_its_own_review(unsure: dict[str, Any], store_url: str) -> None:
    """The review entry is its tenant's to see and decide: another tenant's job with the same document asks
    the model and gets its own entry; the same tenant's second job waits on the first one's."""
    import hashlib

    from conveyor.service.jobs import JobRequest, create_job, source_ref
    from conveyor.service.tenancy import TenantView
    from conveyor.service.tokens import Caller

    data = b"item 0"
    source = source_ref(data, hashlib.sha256(data).hexdigest(), len(data))
    pipeline = load_target(unsure["target"])
    store = open_store(store_url)
    try:
        jobs = {}
        for name, tenant in (("a1", "acme"), ("a2", "acme"), ("b1", "globex")):
            view = TenantView(store, Caller(tenant))
            jobs[name] = create_job(view, pipeline, unsure["target"], source, JobRequest("unsure")).job_id
            work(unsure["target"], store_url, unsure["blobs"])
        assert _calls(unsure) == 2, "acme's second job waits on its first; globex asks for itself"
        entries = {e["run_id"]: e["id"] for e in review.review_list(store)["reviews"]}
        assert set(entries) == {jobs["a1"], jobs["b1"]}
        review.approve(store, FilesystemBlobs(unsure["blobs"]), [entries[jobs["a1"]]], by="ann", tenant="acme")
    finally:
        store.close()
    work(unsure["target"], store_url, unsure["blobs"])
    # A job's one item is its tenant's (stored as @TENANT/KEY): the run's only task at the stage.
    status = {name: next(iter(_statuses(store_url, job, "guess").values())) for name, job in jobs.items()}
    assert status == {"a1": "succeeded", "a2": "succeeded", "b1": "awaiting_review"}


# --- the call journal ------------------------------------------------------------------------------------

TWO_CALLS = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.base import ProviderError
    from conveyor.providers.openai_provider import OpenAIProvider

    class SecondCallFailsOnce(OpenAIProvider):
        calls = 0

        async def chat(self, messages, **options):
            SecondCallFailsOnce.calls += 1
            if SecondCallFailsOnce.calls == 2:
                raise ProviderError("server_error", "503: try again", provider="sim", retryable=True)
            return await super().chat(messages, **options)

    def provider():
        return SecondCallFailsOnce(os.environ["SIM_URL"], "sim", timeout=10)

    pipe = Pipeline("two_calls", provider=provider, retry=Retry(max_attempts=3, base=0.01, cap=0.01))

    @pipe.stage(version="1")
    async def ask(ctx, source: bytes) -> str:
        first = await ctx.chat([{"role": "user", "content": "summarise: " + source.decode()}], model="sim-1",
                               max_tokens=20)
        second = await ctx.chat([{"role": "user", "content": "check: " + first.text}], model="sim-1", max_tokens=20)
        return first.text + " / " + second.text
"""


def _requests(log: Path, endpoint: str) -> int:
    return sum(1 for line in log.read_text().splitlines() if endpoint in json.loads(line)["endpoint"])


def test_a_retry_is_answered_from_the_tasks_journal(tmp_path: Path, store_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    from conveyor.providers.simulator import SimConfig, run_simulator

    target = write_pipeline(tmp_path, TWO_CALLS)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("the number one")
    log = tmp_path / "sim.jsonl"
    with run_simulator(SimConfig(seed=3, log_path=log)) as url:
        monkeypatch.setenv("SIM_URL", url)
        run = submit_and_work(target, tmp_path / "docs", store_url, tmp_path / "blobs")
    assert reconciled(store_url, run.run_id)["outcomes"] == {"completed": 1}
    assert _requests(log, "chat") == 2, "the first call was answered once; the retry took it from the journal"
    attempts = query(store_url, "SELECT outcome, provider_calls FROM attempts WHERE run_id = ? ORDER BY id",
                     run.run_id)
    assert [(r[0], r[1]) for r in attempts] == [("retry", 2), ("succeeded", 1)], "each call counted once"
    assert query(store_url, "SELECT COUNT(*) FROM call_answers")[0][0] == 0, "the journal goes with the task's end"


BUDGETED = """
    from conveyor import Pipeline
    from conveyor.providers.openai_provider import OpenAIProvider
    import os

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=10,
                              prices={"sim-1": [1000.0, 4000.0], "sim-embed-1": [1000.0, 0.0]})

    pipe = Pipeline("budgeted_two", provider=provider)

    @pipe.stage(version="1")
    async def ask(ctx, source: bytes) -> str:
        vectors = await ctx.embed([source.decode()], model="sim-embed-1")
        # a long answer's reservation passes the run's budget: the run pauses here, after the first call
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1", max_tokens=2000)
        return f"{len(vectors.vectors[0])} {answer.text[:20]}"
"""


def test_a_budget_pause_keeps_the_answers_already_paid_for(tmp_path: Path, store_url: str) -> None:
    pytest.importorskip("openai")
    from conveyor.providers.simulator import SimConfig, run_simulator

    target = write_pipeline(tmp_path, BUDGETED)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("the number one")
    common = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    log = tmp_path / "sim.jsonl"
    with run_simulator(SimConfig(seed=4, log_path=log)) as url:
        env = {"SIM_URL": url}
        first = cli("run", target, "--input", str(tmp_path / "docs"), "--workers", "0", "--budget-usd", "1",
                    "--json", *common, cwd=tmp_path, env=env, timeout=120)
        summary = json.loads(first.stdout)
        assert summary["status"] == "paused_budget", first.stderr
        assert _requests(log, "embeddings") == 1 and _requests(log, "chat") == 0
        spent = summary["budget"]["spent"]
        done = cli("resume", summary["run_id"], "--budget-usd", "1000", "--workers", "0", "--json", *common,
                   cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["outcomes"] == {"completed": 1}
    assert _requests(log, "embeddings") == 1, "the resumed attempt took the first answer from the journal"
    assert _requests(log, "chat") == 1
    chat_cost = final["budget"]["spent"] - spent
    assert chat_cost == pytest.approx(reconciled(store_url, summary["run_id"])["usage"]["cost"] - spent), \
        "the first call was charged once"
