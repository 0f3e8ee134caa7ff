"""Forecast error: what `conveyor run --dry-run` said a run would cost and take, against what it then did.

    PYTHONPATH=src .venv/bin/python bench/forecast.py [--pages 300] [--sample 25] [--workers 2] [--no-write]

The man-page pipeline of `make demo` (examples/manpages/, the provider simulator with the demo's faults and
limits, local embeddings) in a scratch store, three forecasts each followed by the run it forecast:

1. a first run: `--dry-run --sample 25` before anything ran (the sample is run for real in a scratch store);
2. a prompt bump (MANPAGES_PROMPT_VERSION): extract runs again, parse and embed are answered by the memo;
3. a model switch to the dearer model (MANPAGES_MODEL=sim-2, priced like gpt-4o; sim-1 is priced like
   gpt-4o-mini): extract runs again with a model none of its past first tries called.

For each: the forecast cost and wall time, what the run then cost (its attempts) and took (from its creation to
the end of its last attempt; the `conveyor run` command's time too), the ratio forecast / real, and whether both
are within ±30%.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from examples.manpages import demo  # noqa: E402
from results import markers, write_section  # noqa: E402

SCRIPT = "forecast"
BEGIN, END = markers(f"{SCRIPT}.py")
TOLERANCE = 0.30
QUIET_S = 61.0


def conveyor(*args: str, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "conveyor", *args, "--json"], text=True, stdout=subprocess.PIPE,
                          env=env, check=False)
    if done.returncode not in (0, 3, 4, 5):
        raise SystemExit(f"conveyor {' '.join(args)} exited {done.returncode}")
    return json.loads(done.stdout), time.monotonic() - started


def run_seconds(db: Path, run_id: str) -> float:
    """The run's own wall time: from its creation to the end of its last attempt."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT MAX(a.started_at + a.duration) - r.created_at FROM attempts a JOIN runs r "
                           "ON r.run_id = a.run_id WHERE a.run_id = ?", (run_id,)).fetchone()
    return float(row[0] or 0.0)


def manifest(pages: int, work: Path) -> Path:
    """A manifest of ``pages`` pages from the demo's deterministic sample."""
    demo.STATE = work
    demo.MANIFEST = work / "pages.jsonl"
    demo.write_sample(demo.corpus(), pages)
    return demo.MANIFEST


def ratio(forecast: float | None, real: float) -> float | None:
    return None if forecast is None or not real else forecast / real


def within(r: float | None) -> bool:
    return r is not None and abs(r - 1.0) <= TOLERANCE


def measure(what: str, target_input: str, workers: int, env: dict[str, str], db: Path, *dry: str) -> dict[str, Any]:
    """The forecast of a run (``run --dry-run``), then the run; the figures side by side."""
    plan, _ = conveyor("run", demo.TARGET, "--input", target_input, "--workers", str(workers), "--dry-run", *dry,
                       env=env)
    real, command = conveyor("run", demo.TARGET, "--input", target_input, "--workers", str(workers), env=env)
    (db.parent / f"plan-{what.split('.')[0]}.json").write_text(json.dumps(plan, indent=1))
    forecast = plan["forecast"]
    cost = float(real["usage"]["cost"] or 0.0)
    seconds = run_seconds(db, real["run_id"])
    return {"what": what, "cost": forecast["cost"], "margin": forecast["cost_margin"], "real_cost": cost,
            "cost_ratio": ratio(forecast["cost"], cost),
            "seconds": forecast["seconds"], "real_seconds": seconds, "command_seconds": command,
            "range": forecast.get("seconds_range") or [forecast["seconds"]] * 2,
            "seconds_ratio": ratio(forecast["seconds"], seconds), "basis": forecast["basis"],
            "models": {s: f.get("models") for s, f in forecast["stages"].items() if f.get("models")},
            "concurrency": {s: f"{f['concurrency']:g} of {f['slots']}" for s, f in forecast["stages"].items()
                            if f.get("slots") and f.get("tokens")}}


def line(m: dict[str, Any]) -> str:
    def r(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    met = within(m["cost_ratio"]) and within(m["seconds_ratio"])
    cost = "n/a" if m["cost"] is None else f"${m['cost']:.4f} ± {m['margin']:.4f}"
    low, high = m["range"]
    span = f"{low:.0f}–{high:.0f}" if high > low else "–"
    inside = low * (1 - TOLERANCE) <= m["real_seconds"] <= high * (1 + TOLERANCE)
    return (f"| {m['what']} | {cost} | ${m['real_cost']:.4f} | {r(m['cost_ratio'])} | {m['seconds']:.0f} | "
            f"{span} | {m['real_seconds']:.0f} | {r(m['seconds_ratio'])} | {m['command_seconds']:.0f} | "
            f"{'met' if met else 'not met'}{'' if met or not inside or high == low else ' (within the range)'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)  # the demo's own size (DEMO_LIMIT)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sample", type=int, default=25, help="items the first run's forecast is measured on")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep", metavar="DIR", help="keep the store in DIR (empty or new) to look at afterwards")
    args = parser.parse_args()
    measured = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-forecast-") as scratch:
        work = Path(args.keep or scratch)
        work.mkdir(parents=True, exist_ok=True)
        pages = str(manifest(args.pages, work))
        db = work / "store.db"
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   CONVEYOR_DB=f"sqlite:///{db}", CONVEYOR_BLOBS=str(work / "blobs"),
                   MANPAGES_PROMPT_VERSION=demo.PROMPTS[0], CONVEYOR_PROGRESS_S="0")
        demo.SIM_LOG = work / "sim.jsonl"
        with demo.endpoint(env):
            measured.append(measure(f"1. first run, from a sample of {args.sample}", pages, args.workers, env, db,
                                    "--sample", str(args.sample)))
            # A minute apart: no run starts inside the last one's quota window (a forecast is of the run alone).
            time.sleep(QUIET_S)
            bumped = dict(env, MANPAGES_PROMPT_VERSION=demo.PROMPTS[1])
            measured.append(measure("2. prompt bump", pages, args.workers, bumped, db))
            time.sleep(QUIET_S)
            dearer = dict(bumped, MANPAGES_MODEL="sim-2")
            measured.append(measure("3. model switch sim-1 → sim-2", pages, args.workers, dearer, db))
    rows = [line(m) for m in measured]
    header = ["| forecast | cost (forecast) | cost (real) | ratio | seconds (forecast) | range | "
              "seconds (real) | ratio | seconds (command) | ±30% |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    print("\n".join(header + rows))
    for m in measured:
        print(f"  {m['what']}: {m['basis']}; models {m['models']}; calls in flight {m['concurrency']}")
    section = "\n".join([
        BEGIN, "## Issue 27 point 12: forecast error (bench/forecast.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    PYTHONPATH=src .venv/bin/python bench/forecast.py --pages {args.pages} --workers {args.workers} "
        f"--sample {args.sample}", "",
        "The demo's pipeline and simulator in a scratch store: `run --dry-run` then the run it forecast, three "
        f"times, a minute apart (a first run forecast from a sample of {args.sample}, a prompt bump, a switch of "
        "extract's model to the dearer sim-2). Real seconds are the run's, from its creation to the end of its "
        "last attempt (workers started, the embedding model loaded); the command's, start to exit, add the "
        "interpreter's start and the imports; "
        "ratio is forecast / real; met: both ratios within ±30%; the cost's margin is the forecast's 95% one; the "
        "range is the forecast's `seconds_range`, given when the run's tokens sit within their margin of a whole "
        "minute of a model's quota (the likelier side is the forecast), a stage's measure had too few attempts "
        "to fill its slots (the slots are the forecast, the calls it kept in flight the slower end) or it was "
        "measured beside stages that will not run (the forecast gives it their share of its workers back, what "
        "it kept is the slower end).", "",
        *header, *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
