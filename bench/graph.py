"""Joins, gathers and groups beside the no-op chain (issue 28, point 6).

    PYTHONPATH=src .venv/bin/python bench/graph.py [--items 20000] [--rounds 3] [--group-items 100000] [--no-write]

The pipelines of bench/graph_pipelines.py, each run whole through `conveyor run --workers 2` in a fresh store,
on SQLite and on PostgreSQL (CONVEYOR_TEST_PG, or 127.0.0.1:5432), alternated for ``--rounds`` rounds:

- chain a → b → c: 3 transitions an item; join a → {b, c} → d: 4; gather (2 children each) a → b → g: 4.
  A join or gather costs no more than one transition an item when its tasks/s are at least the chain's: the
  ratio printed is (join or gather tasks/s) / (chain tasks/s), target >= 1.0 (each run's wall time includes
  the command's start-up, the same for every pipeline).
- a reduce of ``--group-items`` members (batches of 1,000 folded up a tree) on SQLite: the peak resident memory
  of the command and its worker processes (target <= 200 MB each), and the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import markers, pg_database, write_section  # noqa: E402

SCRIPT = "graph"
BEGIN, END = markers(f"{SCRIPT}.py")
TASKS_PER_ITEM = {"chain": 3, "join": 4, "gather": 4}
ADMIN = os.environ.get("CONVEYOR_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/postgres"


def manifest(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"key": f"item-{i:07d}", "text": f"document {i}"}) + "\n")
    return path


def run(pipeline: str, items: Path, db: str, blobs: Path) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conveyor", "run", f"bench/graph_pipelines.py:{pipeline}",
                           "--input", str(items), "--workers", "2", "--db", db, "--blobs", str(blobs), "--json"],
                          cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{pipeline} on {db} exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def side_by_side(work: Path, n: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    items = manifest(work / f"items-{n}.jsonl", n)
    rates: dict[str, dict[str, list[float]]] = {"sqlite": {}, "postgres": {}}
    for r in range(rounds):
        for name in TASKS_PER_ITEM:
            for backend in ("sqlite", "postgres"):
                scratch = Path(tempfile.mkdtemp(dir=work))
                if backend == "sqlite":
                    wall, out = run(name, items, f"sqlite:///{scratch / 'store.db'}", scratch / "blobs")
                else:
                    with pg_database(ADMIN, "graph") as url:
                        wall, out = run(name, items, url, scratch / "blobs")
                assert out["unaccounted"] == 0, out
                rate = TASKS_PER_ITEM[name] * n / wall
                rates[backend].setdefault(name, []).append(rate)
                print(f"round {r + 1} {backend:8} {name:7} {wall:6.2f} s  {rate:9,.0f} tasks/s", flush=True)
    return rates


def group_memory(work: Path, n: int) -> tuple[float, float, dict]:
    items = manifest(work / f"group-{n}.jsonl", n)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    wall, out = run("reduce", items, f"sqlite:///{work / 'group.db'}", work / "group-blobs")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert out["unaccounted"] == 0, out
    return wall, max(peak, before) / 1024, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--group-items", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-graph-") as scratch:
        work = Path(scratch)
        rates = side_by_side(work, args.items, args.rounds)
        wall, peak_mb, out = group_memory(work, args.group_items)
    lines = [BEGIN, "## Joins, gathers and groups beside the chain (bench/graph.py)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
             f"    PYTHONPATH=src .venv/bin/python bench/graph.py --items {args.items} --rounds {args.rounds} "
             f"--group-items {args.group_items}", "",
             f"{args.items:,} items through `conveyor run --workers 2` in a fresh store each, pipelines alternated "
             f"over {args.rounds} rounds (medians; the command's start-up is in every figure). A join or gather "
             "costs at most one transition an item when its tasks/s reach the chain's (ratio >= 1.0).", "",
             "| backend | chain tasks/s | join tasks/s | join / chain | gather tasks/s | gather / chain | met |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for backend, by_name in rates.items():
        med = {name: statistics.median(values) for name, values in by_name.items()}
        j, g = med["join"] / med["chain"], med["gather"] / med["chain"]
        lines.append(f"| {backend} | {med['chain']:,.0f} | {med['join']:,.0f} | {j:.2f} | {med['gather']:,.0f} | "
                     f"{g:.2f} | {'yes' if min(j, g) >= 1.0 else 'no'} |")
    lines += ["", f"A reduce of {args.group_items:,} members (batches of 1,000, folded) on SQLite: the run took "
              f"{wall:.1f} s; peak resident memory of the command and its workers {peak_mb:.0f} MB (target <= 200 "
              f"MB: {'met' if peak_mb <= 200 else 'not met'}); outcomes {out['outcomes']}.", "", END]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
