"""Budgets and the circuit breaker: a run stops granting model calls at its ceiling across a fleet, pauses
with what it spent, loses nothing, and carries on with `conveyor resume RUN --budget-usd MORE`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline
from conveyor.blobs import FilesystemBlobs
from conveyor.errors import UserError
from conveyor.runtime.budget import BudgetKeeper, RunPaused
from conveyor.runtime.transitions import Transitions
from conveyor.service.inputs import SourceItem
from conveyor.service.runs import carry_on
from conveyor.service.submit import SubmitOptions, submit
from conveyor.store import Lease, SqlStore, open_store
from conveyor.store.budget import EXHAUSTED, GRANTED, WAIT
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


# --- reservations belong to leases (store and keeper, both backends) -------------------------------------------

LEASED = Pipeline("leased", lease_seconds=5)


@LEASED.stage
async def call(ctx: Any, source: bytes) -> str:
    return source.decode()


T0 = 1_700_000_000.0


def _leased_run(store_url: str, tmp_path: Path, budget: float, items: int = 3) -> tuple[SqlStore, str, list[Lease]]:
    """A run of ``items`` with a ``budget``, every task claimed by worker A under a 5 s lease from T0."""
    store = open_store(store_url)
    sources = [SourceItem(f"doc{i}", text=b"hello") for i in range(items)]
    run_id = submit(LEASED, "leased", "inline", store, FilesystemBlobs(tmp_path / "blobs"), clock=lambda: T0,
                    items=sources, options=SubmitOptions(budget_usd=budget)).run_id
    claimed = store.claim("leased", ["call"], 10, "A", T0, 5, run_id)
    return store, run_id, [Lease(t.id, t.lease_token) for t in claimed]


def test_a_reservation_whose_lease_expired_is_freed_and_counted_at_its_estimate(tmp_path: Path,
                                                                               store_url: str) -> None:
    store, run_id, (a, b, c) = _leased_run(store_url, tmp_path, 1.0)
    try:
        answer, held = store.reserve_budget(run_id, 0.6, "a", a)
        assert answer == GRANTED and held is not None
        assert store.reserve_budget(run_id, 0.3, "b", b)[0] == GRANTED
        assert store.reserve_budget(run_id, 0.3, "c", c)[0] == WAIT, "fits only once the calls in flight settle"
        # A's worker dies mid-call; whoever notices reclaims its leases. Its calls were probably paid.
        assert Transitions(LEASED, store, "reaper").reclaim_expired(T0 + 10)["requeued"] == 3
        assert store.spent(run_id) == pytest.approx((0.9, 0.0)), "counted at their estimate, not reserved for ever"
        report = reconciled(store_url, run_id)
        assert report["usage"]["cost"] == pytest.approx(0.9) and report["usage"]["provider_calls"] == 2
        [message] = [m for (m,) in store.db.execute(
            "SELECT message FROM attempts WHERE task_id = ? AND outcome = 'lease_expired'", (a.task_id,))]
        assert "counted at their estimate, $0.6000" in message
        assert store.reserve_budget(run_id, 0.3, "c", c)[0] == EXHAUSTED, "0.9 + 0.3 does not fit: no wait"
        store.resume_paused(run_id, 2.0, keep_budget=False)
        store.settle_budget([(held, 0.2)])  # a stalled worker comes back: what the call cost is known now
        assert store.spent(run_id) == pytest.approx((0.5, 0.0))
        # The reclaim's attempt gives the estimate back (the stalled worker's own attempt counts the call).
        assert reconciled(store_url, run_id)["usage"]["cost"] == pytest.approx(0.3)
    finally:
        store.close()


def test_a_released_lease_frees_its_reservation(tmp_path: Path, store_url: str) -> None:
    store, run_id, (a, b, _) = _leased_run(store_url, tmp_path, 1.0)
    try:
        assert store.reserve_budget(run_id, 0.5, "a", a)[0] == GRANTED
        Transitions(LEASED, store, "A").release([a])  # given back without the call settling
        assert store.reserve_budget(run_id, 0.6, "b", b)[0] == EXHAUSTED, "no wait for a call nobody holds"
        assert store.spent(run_id) == pytest.approx((0.5, 0.0)), "counted at its estimate"
    finally:
        store.close()


class _Ticks:
    """A clock that moves a second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.timeout(60)
def test_a_wait_for_calls_in_flight_ends_within_its_bound_and_pauses_the_run(tmp_path: Path,
                                                                             store_url: str) -> None:
    store, run_id, (a, b, _) = _leased_run(store_url, tmp_path, 1.0)
    try:
        assert store.reserve_budget(run_id, 0.6, "a", a)[0] == GRANTED  # a call that never settles, lease held
        waits: list[float] = []

        async def db(fn: Any) -> Any:
            return fn(store)

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        keeper = BudgetKeeper(db, clock=_Ticks(), patience=10.0, sleep=sleep)
        with pytest.raises(RunPaused):
            asyncio.run(keeper.reserve(run_id, 0.5, "sim-1", b))
        assert 0 < len(waits) <= 10, "it waited, and not for ever"
        run = store.get_run(run_id)
        assert run is not None and run.paused == "budget"
        assert run.note is not None and "did not settle within 10s" in run.note and "$0.6000" in run.note
        assert store.spent(run_id) == pytest.approx((0.0, 0.6)), "the call in flight keeps its reservation"
    finally:
        store.close()


def test_resume_with_a_higher_budget_keeps_the_reservations_of_calls_in_flight(tmp_path: Path,
                                                                               store_url: str) -> None:
    store, run_id, (a, b, c) = _leased_run(store_url, tmp_path, 1.0)
    try:
        answer, first = store.reserve_budget(run_id, 0.6, "a", a)
        assert answer == GRANTED and first is not None
        assert store.reserve_budget(run_id, 0.6, "b", b, waited=1.0, patience=1.0)[0] == EXHAUSTED
        run = store.get_run(run_id)
        assert run is not None and run.paused == "budget"
        with pytest.raises(UserError, match="not more than"):  # 0.6 is still reserved by the call in flight
            carry_on(store, FilesystemBlobs(tmp_path / "blobs"), run, LEASED, 0.5)
        carry_on(store, FilesystemBlobs(tmp_path / "blobs"), run, LEASED, 1.5)
        assert store.spent(run_id) == pytest.approx((0.0, 0.6)), "resume only raises the ceiling"
        answer, second = store.reserve_budget(run_id, 0.6, "b", b)
        assert answer == GRANTED and second is not None
        assert store.reserve_budget(run_id, 0.6, "c", c)[0] != GRANTED, "0.6 + 0.6 in flight: no room for 0.6"
        store.settle_budget([(first, 0.6), (second, 0.6)])
        spent, reserved = store.spent(run_id)
        assert spent + reserved <= 1.5 + 1e-9
    finally:
        store.close()


@pytest.mark.timeout(240)
def test_two_of_four_workers_killed_mid_call_neither_wedge_nor_overspend_the_budget(tmp_path: Path,
                                                                                   store_url: str) -> None:
    from bench.budget_kill import kill_scenario

    figures = kill_scenario(store_url, tmp_path, items=24, budget=1.5, latency_ms=400, exit_s=60)
    assert figures.exit_s is not None, "the survivors paused the run and exited: no call waited for ever"
    assert figures.status == "paused budget" and "budget would pass" in figures.note
    assert figures.lost_calls >= 1, "the killed workers' calls in flight are counted, at their estimate"
    ceiling = figures.budget + figures.largest_estimate
    assert figures.spent <= ceiling and figures.paid <= ceiling, figures
    assert figures.paid <= figures.spent + 1e-9, "what the provider charged is counted, the killed calls too"
    assert figures.completed, f"resume --budget-usd completes every item: {figures.resumed}"
    assert figures.final_spent == pytest.approx(figures.final_usage_cost), "usage counts what the budget counts"
