"""Budgets under killed workers: spent stays within budget + one call, nothing waits for ever, resume finishes.

    PYTHONPATH=src .venv/bin/python bench/budget_kill.py [--backend sqlite|postgres|both] [--items 24]
        [--budget 1.5] [--latency-ms 400] [--write]

The scenario (issue 27 point 4), once per backend: a run of ``--items`` documents with a ``--budget`` is
submitted; four ``conveyor worker --until-idle`` processes work it against one store and the provider
simulator (one ``ctx.chat`` per document, ``--latency-ms`` per answer, so calls are in flight most of the
time; leases of 2 s; the tasks become runnable 8 s after the submission, so that all four workers are up and
share them). As soon as two workers hold budget reservations of calls in flight, both are SIGKILLed.
The budget runs out; the two survivors must pause the run and exit (a dead worker's reservations are counted
at their estimate once its leases are reclaimed, instead of blocking every call that would fit without them).
Then ``conveyor resume RUN --budget-usd 1000`` must complete every item.

Printed per backend: *spent*, what the run counted when it paused (the killed calls at their estimate);
*paid*, what the simulator charged by its request log until then (the provider's view: the killed calls were
answered and charged too); the *budget*; the *largest estimate* of a single call (prompt tokens as the quota
estimates them plus ``max_tokens``, at the model's price); how many calls were counted at their estimate;
seconds from the kills until the survivors exited; and whether every item completed after the resume.
The promise: spent and paid ≤ budget + largest estimate. ``--write`` records the table in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")
PRICES = {"sim-1": [1000.0, 4000.0]}  # USD per million tokens: a call costs about $0.1, so budgets stay small
MAX_TOKENS = 40
HOLD_S = 8.0  # how long after the submission its tasks become runnable: the workers start meanwhile
EXIT_S = 60.0  # how long the survivors may take to pause the run and exit before they count as waiting for ever

PIPELINE = f"""
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=30, prices={PRICES!r})

    pipe = Pipeline("budget-kill", provider=provider, lease_seconds=2,
                    retry=Retry(max_attempts=10, base=0.05, cap=0.2))

    @pipe.stage(version="1", concurrency=2)
    async def ask(ctx, source: bytes) -> str:
        answer = await ctx.chat([{{"role": "user", "content": source.decode()}}], model="sim-1",
                                max_tokens={MAX_TOKENS})
        return answer.text[:40]
"""


@dataclass
class Figures:
    backend: str
    budget: float
    largest_estimate: float = 0.0
    spent: float = 0.0  # what the run counted when the survivors exited
    reserved: float = 0.0  # what was still reserved then
    paid: float = 0.0  # what the simulator charged until then
    lost_calls: int = 0  # calls of the killed workers counted at their estimate
    lost_usd: float = 0.0
    exit_s: float | None = None  # from the kills until both survivors exited (None: they did not, in EXIT_S)
    status: str = ""  # the run's status when the survivors exited
    note: str = ""
    resumed: dict[str, int] = field(default_factory=dict)  # outcomes after the resume
    resume_exit: int | None = None
    final_spent: float = 0.0
    final_usage_cost: float = 0.0

    @property
    def completed(self) -> bool:
        return self.resume_exit == 0 and set(self.resumed) == {"completed"}

    @property
    def within(self) -> bool:
        limit = self.budget + self.largest_estimate + 1e-9
        return self.spent <= limit and self.paid <= limit


def _env(sim_url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "SIM_URL": sim_url}


def _docs(folder: Path, count: int) -> list[str]:
    folder.mkdir(parents=True)
    texts = [f"Say something short about the number {i}." for i in range(count)]
    for i, text in enumerate(texts):
        (folder / f"doc{i:03d}.txt").write_text(text)
    return texts


def largest_estimate(texts: list[str]) -> float:
    """The largest reservation a call of this pipeline makes: the worker's estimate at the model's price."""
    from conveyor.providers.base import PriceTable
    from conveyor.providers.estimate import chat_tokens

    prices = PriceTable.from_dict(PRICES)
    return max(prices.cost_for("sim-1", "sim-1", chat_tokens([{"role": "user", "content": t}], MAX_TOKENS)
                               - MAX_TOKENS, MAX_TOKENS)[0] for t in texts)


def _query(store_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    from conveyor.store import open_store

    store = open_store(store_url)
    try:
        return store.db.execute(sql, params)
    finally:
        store.close()


def _submit(target: str, docs: Path, store_url: str, blobs: Path, budget: float, hold_s: float) -> str:
    """The run, its tasks runnable only ``hold_s`` from now: time for the four workers to start, so that they
    share the work (the first one up would otherwise spend the whole budget alone, on a loaded host)."""
    from conveyor.blobs import FilesystemBlobs
    from conveyor.runtime.target import load_target
    from conveyor.service.submit import SubmitOptions, submit
    from conveyor.store import open_store

    store = open_store(store_url)
    try:
        return submit(load_target(target), target, str(docs), store, FilesystemBlobs(blobs),
                      clock=lambda: store.clock() + hold_s, options=SubmitOptions(budget_usd=budget)).run_id
    finally:
        store.close()


def _holding(store_url: str, run_id: str) -> set[int]:
    """Pids of the workers holding a budget reservation of a call in flight."""
    owners = _query(store_url, "SELECT DISTINCT t.lease_owner FROM budget_reservations r JOIN tasks t ON t.id = "
                    "r.task_id AND t.lease_token = r.lease_token WHERE r.run_id = ? AND r.lost = 0 AND "
                    "t.status = 'running'", run_id)
    return {int(str(owner).split(":")[1]) for (owner,) in owners if owner}


def _paid(log: Path) -> float:
    from conveyor.providers.base import PriceTable

    prices = PriceTable.from_dict(PRICES)
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return sum(prices.cost("sim-1", int(r["prompt_tokens"] or 0), int(r["completion_tokens"] or 0))
               for r in lines if r.get("status") == 200)


def _kill_two(procs: list[subprocess.Popen[bytes]], store_url: str, run_id: str) -> list[int]:
    mine = {p.pid: p for p in procs}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        holders = sorted(_holding(store_url, run_id) & set(mine))
        if len(holders) >= 2:
            for pid in holders[:2]:
                mine[pid].send_signal(signal.SIGKILL)
                mine[pid].wait()
            return holders[:2]
        time.sleep(0.05)
    raise RuntimeError("no two workers held reservations of calls in flight within 60 s")


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def kill_scenario(store_url: str, folder: Path, backend: str = "", items: int = 24, budget: float = 1.5,
                  latency_ms: float = 400.0, exit_s: float = EXIT_S) -> Figures:
    """Run the scenario in ``folder`` against ``store_url`` (a fresh store); every process it starts is gone
    when it returns."""
    from conveyor.providers.simulator import SimConfig, run_simulator

    (folder / "pipe.py").write_text(textwrap.dedent(PIPELINE))
    target, blobs, log = f"{folder / 'pipe.py'}:pipe", folder / "blobs", folder / "sim.log"
    texts = _docs(folder / "docs", items)
    figures = Figures(backend, budget, largest_estimate(texts))
    run_id = _submit(target, folder / "docs", store_url, blobs, budget, HOLD_S)
    with run_simulator(SimConfig(seed=7, latency_ms=latency_ms, log_path=log)) as url:
        cmd = [sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id, "--db", store_url,
               "--blobs", str(blobs)]
        procs = [subprocess.Popen(cmd, env=_env(url), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=(folder / f"worker{i}.log").open("wb")) for i in range(4)]
        try:
            killed = _kill_two(procs, store_url, run_id)
            t0 = time.monotonic()
            survivors = [p for p in procs if p.pid not in killed]
            if _wait_all(survivors, exit_s):
                figures.exit_s = time.monotonic() - t0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        time.sleep(latency_ms / 1000 * 3)  # the killed calls' answers reach the simulator's log
        _read_pause(figures, store_url, run_id, log)
        _resume(figures, target, store_url, blobs, run_id, url, folder)
    return figures


def _read_pause(figures: Figures, store_url: str, run_id: str, log: Path) -> None:
    [(spent, reserved, paused, note)] = _query(
        store_url, "SELECT spent_usd, reserved_usd, paused, note FROM runs WHERE run_id = ?", run_id)
    [(calls, usd)] = _query(store_url, "SELECT COUNT(*), COALESCE(SUM(usd), 0) FROM budget_reservations WHERE "
                            "run_id = ? AND lost = 1", run_id)
    figures.spent, figures.reserved, figures.status = float(spent), float(reserved), f"paused {paused}"
    figures.note, figures.lost_calls, figures.lost_usd = str(note or ""), int(calls), float(usd)
    figures.paid = _paid(log)


def _resume(figures: Figures, target: str, store_url: str, blobs: Path, run_id: str, url: str,
            folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "conveyor", "resume", run_id, "--budget-usd", "1000", "--workers",
                           "1", "--json", "--db", store_url, "--blobs", str(blobs)], env=_env(url), cwd=folder,
                          text=True, capture_output=True, timeout=180)
    figures.resume_exit = done.returncode
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    figures.resumed = dict(summary.get("outcomes", {}))
    figures.final_spent = float(summary.get("budget", {}).get("spent", 0.0))
    figures.final_usage_cost = _usage_cost(store_url, run_id)


def _usage_cost(store_url: str, run_id: str) -> float:
    """What the run's attempts cost, as `conveyor reconcile` counts it."""
    from conveyor.service.report import find_run, reconcile
    from conveyor.store import open_store

    store = open_store(store_url)
    try:
        return float(reconcile(store, find_run(store, run_id))["usage"]["cost"])
    finally:
        store.close()


def _row(f: Figures) -> str:
    exited = "no (waited)" if f.exit_s is None else f"{f.exit_s:.1f}"
    return (f"| {f.backend} | {f.budget:.4f} | {f.spent:.4f} | {f.paid:.4f} | {f.largest_estimate:.4f} | "
            f"{'yes' if f.within else 'NO'} | {f.lost_calls} (${f.lost_usd:.4f}) | {exited} | "
            f"{'yes' if f.completed else 'NO'} {f.resumed} |")


HEADER = ("| backend | budget $ | spent $ | paid $ (simulator) | largest estimate $ | ≤ budget + largest | "
          "counted at estimate | survivors exit s | every item completed after resume |\n"
          "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--items", type=int, default=24)
    parser.add_argument("--budget", type=float, default=1.5)
    parser.add_argument("--latency-ms", type=float, default=400.0)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/"
                                                                          "postgres"))
    parser.add_argument("--write", action="store_true", help="record the table in bench/RESULTS.md")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from bench.results import markers, pg_database, write_section

    rows = []
    for backend in ("sqlite", "postgres") if args.backend == "both" else (args.backend,):
        with tempfile.TemporaryDirectory(prefix="budget-kill-") as tmp:
            folder = Path(tmp)
            if backend == "sqlite":
                f = kill_scenario(f"sqlite:///{folder / 'c.db'}", folder, backend, args.items, args.budget,
                                  args.latency_ms)
            else:
                with pg_database(args.pg, "budget_kill") as url:
                    f = kill_scenario(url, folder, backend, args.items, args.budget, args.latency_ms)
        print(json.dumps({**asdict(f), "within": f.within, "completed": f.completed}, indent=1))
        rows.append(_row(f))
    table = HEADER + "\n" + "\n".join(rows)
    print(table)
    if args.write:
        begin, end = markers("budget_kill.py")
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        write_section("budget_kill.py", f"{begin}\n## Issue 27 point 4: budgets under killed workers "
                      f"(bench/budget_kill.py)\n\nMeasured {when} with:\n\n    PYTHONPATH=src .venv/bin/python "
                      f"bench/budget_kill.py --items {args.items} --budget {args.budget} --latency-ms "
                      f"{args.latency_ms:g} --write\n\nFour `conveyor worker` processes, two SIGKILLed while they "
                      f"held reservations of calls in flight; leases of 2 s.\n\n{table}\n{end}")


if __name__ == "__main__":
    main()
