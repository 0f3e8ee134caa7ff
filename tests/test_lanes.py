"""Lanes and backpressure: an interactive run is not stuck behind a bulk backlog; an upstream
stage stops running ahead of a slow downstream one. Both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conveyor.store import open_store
from tests.helpers import SRC, cli_json, make_docs, work, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

WINDOW = 3.0

LLM = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=10)

    pipe = Pipeline("lanes", provider=provider, retry=Retry(max_attempts=5, base=0.05, cap=0.5))

    @pipe.stage(version="1", concurrency=4)
    async def ask(ctx, source: bytes) -> dict:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1", max_tokens=50)
        return {"text": answer.text[:20], "lane": ctx.lane}
"""


def test_interactive_run_overtakes_a_bulk_backlog(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, LLM)
    text = "a page of a long backfill " * 30  # ~200 tokens + 50: about 12 calls per window fit
    bulk = make_docs(tmp_path / "bulk", 60, text + "{i}")
    urgent = make_docs(tmp_path / "urgent", 2, "a user is waiting for this one {i}")
    limits = json.dumps({"sim-1": {"tpm": 3000, "interactive_share": 0.2}})
    common = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    with run_simulator(SimConfig(seed=9, log_path=tmp_path / "sim.jsonl", window_s=WINDOW)) as url:
        env = {"SIM_URL": url, "CONVEYOR_QUOTA_WINDOW_S": str(WINDOW), "CONVEYOR_LIMITS": limits,
               "PYTHONPATH": SRC}
        bulk_run = cli_json("submit", target, "--input", str(bulk), *common, cwd=tmp_path, env=env)["run_id"]
        workers = [subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--quiet",
                                     *common], cwd=tmp_path, env={**os.environ, **env})
                   for _ in range(2)]
        time.sleep(2 * WINDOW)  # the bulk backlog now fills the quota
        urgent_run = cli_json("submit", target, "--input", str(urgent), "--lane", "interactive", *common,
                              cwd=tmp_path, env=env)["run_id"]
        for proc in workers:
            proc.wait(timeout=180)
    store = open_store(store_url)
    try:
        def finished(run_id: str) -> tuple[float, float]:
            row = store.db.execute("SELECT MIN(created_at), MAX(finished_at) FROM tasks WHERE run_id = ?",
                                   (run_id,))[0]
            return float(row[0]), float(row[1])

        urgent_start, urgent_end = finished(urgent_run)
        _, bulk_end = finished(bulk_run)
        lanes = {r[0] for r in store.db.execute(
            "SELECT inline FROM outputs o JOIN tasks t ON t.task_key = o.task_key WHERE t.run_id = ?", (urgent_run,))}
    finally:
        store.close()
    assert all(json.loads(v)["lane"] == "interactive" for v in lanes)
    # The two urgent items ran within about a window, long before the backfill ended.
    assert urgent_end - urgent_start < 1.5 * WINDOW, urgent_end - urgent_start
    assert bulk_end - urgent_end > 2 * WINDOW


BACKED_UP = """
    import time
    from conveyor import Pipeline

    pipe = Pipeline("backpressure", max_backlog={backlog})

    @pipe.stage(version="1")
    def fast(ctx, source: bytes) -> str:
        time.sleep(0.01)
        return source.decode()

    @pipe.stage(after=fast, version="1", concurrency=1)
    async def slow(ctx, text: str) -> str:
        import asyncio
        await asyncio.sleep(0.04)
        return text.upper()
"""


def _max_backlog(store_url: str, run_id: str) -> int:
    """The most `slow` tasks ever queued at once, replayed from the tasks' own timestamps."""
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT stage, created_at, started_at FROM tasks WHERE run_id = ?", (run_id,))
    finally:
        store.close()
    events = sorted([(float(c), 1) for s, c, _ in rows if s == "slow"] +
                    [(float(st), -1) for s, _, st in rows if s == "slow" and st is not None])
    depth = most = 0
    for _, step in events:
        depth += step
        most = max(most, depth)
    return most


@pytest.mark.parametrize("backlog", [20])
def test_upstream_slows_down_when_downstream_falls_behind(tmp_path: Path, store_url: str, backlog: int) -> None:
    results = {}
    for name, limit in (("held", backlog), ("free", 100_000)):
        docs = make_docs(tmp_path / name, 200, name + " document {i}")
        target = write_pipeline(tmp_path, BACKED_UP.format(backlog=limit), name=f"{name}.py")
        done = cli_json("submit", target, "--input", str(docs), "--db", store_url, "--blobs",
                        str(tmp_path / "blobs"), cwd=tmp_path)
        # Small claims and a small hold, as a worker's share of a large run would be: the backlog lives in the
        # queue. (A commit leases the tasks it makes as it makes them, up to what their stage's pace finishes in a
        # quarter of a lease: with a 2 s lease, 12 of `slow`; the rest are queued.)
        work(target, store_url, tmp_path / "blobs", run_id=done["run_id"], batch_size=10, max_inflight=20,
             lease_seconds=2.0)
        results[name] = _max_backlog(store_url, done["run_id"])
    # Depths are read every quarter second, so `fast` may run ahead that long past the mark.
    assert results["held"] < results["free"] / 2, results
