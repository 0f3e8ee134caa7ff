"""Forecast error: what `--dry-run` said a run or a replay would cost, against what it then cost, on the demo.

    .venv/bin/python bench/forecast.py [--pages 60] [--no-write]

The man-page pipeline of `make demo` (examples/manpages/, the provider simulator with the demo's faults and
limits, local embeddings) in a scratch store:

1. a first run over a sample A of the pages: the history the forecasts are made from;
2. `conveyor run --dry-run` over a disjoint sample B, then the real run of B;
3. `conveyor replay --run B --stage extract --reason reprocess --dry-run` under a bumped prompt version (part of
   extract's config: new task keys, new model calls), then the same replay with `--process`.

For each: the forecast tokens, cost and wall time with their 95% margins, what the run really used (its
attempts' tokens and cost, its wall time), and the relative error. Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
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


def conveyor(*args: str, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "conveyor", *args, "--json"], text=True, stdout=subprocess.PIPE,
                          env=env, check=False)
    if done.returncode not in (0, 3, 4, 5):
        raise SystemExit(f"conveyor {' '.join(args)} exited {done.returncode}")
    return json.loads(done.stdout), time.monotonic() - started


def samples(pages: int, work: Path) -> tuple[Path, Path]:
    """Two disjoint manifests of ``pages`` pages each, from the demo's deterministic sample."""
    demo.STATE = work
    demo.MANIFEST = work / "all.jsonl"
    demo.write_sample(demo.corpus(), 2 * pages)
    lines = demo.MANIFEST.read_text().splitlines()
    a, b = work / "a.jsonl", work / "b.jsonl"
    a.write_text("\n".join(lines[0::2][:pages]) + "\n")
    b.write_text("\n".join(lines[1::2][:pages]) + "\n")
    return a, b


def usage(report: dict[str, Any]) -> tuple[float, float]:
    u = report["usage"]
    return float(u["prompt_tokens"] + u["completion_tokens"]), float(u["cost"] or 0.0)


def row(what: str, forecast: dict[str, Any], tokens: float, cost: float, seconds: float) -> str:
    def err(f: float, real: float) -> str:
        return f"{(f - real) / real:+.1%}" if real else "n/a"

    within = abs(forecast["cost"] - cost) <= forecast["cost_margin"]
    return (f"| {what} | {forecast['tokens']:,.0f} ± {forecast['tokens_margin']:,.0f} | {tokens:,.0f} | "
            f"{err(forecast['tokens'], tokens)} | ${forecast['cost']:.4f} ± {forecast['cost_margin']:.4f} | "
            f"${cost:.4f} | {err(forecast['cost'], cost)} | {'yes' if within else 'no'} | "
            f"{forecast['seconds']:.0f} | {seconds:.0f} | {err(forecast['seconds'], seconds)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-forecast-") as scratch:
        work = Path(scratch)
        a, b = samples(args.pages, work)
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   CONVEYOR_DB=f"sqlite:///{work / 'store.db'}", CONVEYOR_BLOBS=str(work / "blobs"),
                   MANPAGES_PROMPT_VERSION=demo.PROMPTS[0], CONVEYOR_PROGRESS_S="0")
        demo.SIM_LOG = work / "sim.jsonl"
        with demo.endpoint(env):
            conveyor("run", demo.TARGET, "--input", str(a), "--workers", "2", env=env)
            plan, _ = conveyor("run", demo.TARGET, "--input", str(b), "--workers", "2", "--dry-run", env=env)
            real, seconds = conveyor("run", demo.TARGET, "--input", str(b), "--workers", "2", env=env)
            rows.append(row(f"`run --dry-run`, {args.pages} new pages", plan["forecast"], *usage(real), seconds))
            bumped = dict(env, MANPAGES_PROMPT_VERSION=demo.PROMPTS[1])
            selection = ("--run", real["run_id"], "--stage", "extract", "--reason", "reprocess", "--downstream",
                         "--workers", "2")
            before = usage(real)
            replayed, _ = conveyor("replay", *selection, "--dry-run", env=bumped)
            done, seconds = conveyor("replay", *selection, "--process", env=bumped)
            after = usage(done["processed"][0])
            rows.append(row("`replay --dry-run`, a bumped prompt", replayed["forecast"], after[0] - before[0],
                            after[1] - before[1], seconds))
    for line in rows:
        print(line)
    section = "\n".join([
        BEGIN, "## Forecast error (bench/forecast.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    .venv/bin/python bench/forecast.py --pages {args.pages}", "",
        "The demo's pipeline and simulator; the history is one earlier run over other pages of the same corpus. "
        "Margins are the forecast's 95% ones; wall time is in seconds (the real one includes starting workers and "
        "loading the embedding model).", "",
        "| forecast | tokens (forecast) | tokens (real) | error | cost (forecast) | cost (real) | error | real cost "
        "within the margin | seconds (forecast) | seconds (real) | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |", *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
