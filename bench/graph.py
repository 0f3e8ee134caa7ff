"""Joins, gathers and groups beside the no-op chain (issue 28, point 6).

    PYTHONPATH=src .venv/bin/python bench/graph.py [--items 20000] [--rounds 3] [--group-items 100000] [--no-write]
                                                  [--backend sqlite|postgres (default: both)]

The pipelines of bench/graph_pipelines.py, each run whole through `conveyor run --workers 2` in a fresh store,
on SQLite and on PostgreSQL (CONVEYOR_TEST_PG, or 127.0.0.1:5432), alternated for ``--rounds`` rounds:

- chain a → b → c (3 transitions an item) and chain4 a → b → c → d (4): what one transition costs an item is
  the difference of their times; join a → {b, c} → d (the chain's stages with d a join of b and c); fanout a
  (2 children) → b, and gather, the same with g gathering b's outputs. What a join adds is join − chain, what a
  gather adds is gather − fanout: each, divided by one transition, is the figure (target <= 1.0: a join or
  gather adds no more than one transition's cost an item). Each run's wall time includes the command's
  start-up, the same for every pipeline, so it cancels in the differences. The verdict is given only when one
  transition stands above the noise (the largest spread of a pipeline's rounds); otherwise it says so. The same
  figures and verdict follow in CPU an item (the command's and its workers', plus the PostgreSQL backends' that
  served them, counted by bench/statement_count/sitecustomize.py; the least of the rounds), which a shared host's
  load moves far less than wall times;
- with ``--backend``, that backend alone (the table has its row only);
- a reduce of ``--group-items`` members (batches of 1,000 folded up a tree; 0: none) on SQLite: the peak resident
  memory of the command and its worker processes (target <= 200 MB each), and the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sqlite3
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
TASKS_PER_ITEM = {"chain": 3, "chain4": 4, "join": 4, "fanout": 3, "gather": 4}
ADMIN = os.environ.get("CONVEYOR_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/postgres"


def manifest(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"key": f"item-{i:07d}", "text": f"document {i}"}) + "\n")
    return path


def run(pipeline: str, items: Path, db: str, blobs: Path, cpu: dict[str, float] | None = None) -> tuple[float, dict]:
    """One `conveyor run` of ``pipeline``: its wall time and its JSON. With ``cpu``, the CPU seconds of the command
    and its workers (``cpu``) and of the PostgreSQL backends that served them (``server_cpu``) are added to it, as
    bench/statement_count/sitecustomize.py counts them in each process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    counts = Path(tempfile.mkdtemp(dir=blobs.parent)) if cpu is not None else None
    if counts is not None:
        env.update(PYTHONPATH=f"{ROOT / 'bench' / 'statement_count'}:{ROOT / 'src'}",
                   CONVEYOR_BENCH_STATEMENTS=str(counts))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conveyor", "run", f"bench/graph_pipelines.py:{pipeline}",
                           "--input", str(items), "--workers", "2", "--db", db, "--blobs", str(blobs), "--json"],
                          cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{pipeline} on {db} exited {done.returncode}: {done.stderr[-2000:]}")
    if counts is not None and cpu is not None:
        for path in counts.glob("*.json"):
            figures = json.loads(path.read_text())
            for key in ("cpu", "server_cpu"):
                cpu[key] = cpu.get(key, 0.0) + float(figures.get(key, 0.0))
    return wall, json.loads(done.stdout)


def run_instrumented(name: str, items: Path, backend: str, out: Path, env: dict[str, str], tree: Path = ROOT,
                     label: str = "graph") -> float:
    """One `conveyor run --workers 2` of bench/graph_pipelines.py's ``name`` by ``tree``'s code (the same pipelines),
    with ``env`` (a bench's sitecustomize on its PYTHONPATH, say), in a fresh store: SQLite in ``out``, or a fresh
    PostgreSQL database named after ``label``. Its wall seconds; a failed run stops the bench with its error."""

    def run(db: str) -> float:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "conveyor", "run", f"{ROOT}/bench/graph_pipelines.py:{name}",
                               "--input", str(items), "--workers", "2", "--db", db, "--blobs", str(out / "blobs"),
                               "--json"], cwd=tree, env=env, text=True, capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name} on {db} exited {done.returncode}: {done.stderr[-2000:]}")
        return time.perf_counter() - started

    if backend == "sqlite":
        return run(f"sqlite:///{out / 'store.db'}")
    with pg_database(ADMIN, label) as url:
        return run(url)


def side_by_side(work: Path, n: int, rounds: int, backends: tuple[str, ...]
                 ) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """Each pipeline on each backend, alternated ``rounds`` times: (tasks/s, CPU µs an item) by backend, by pipeline.
    The CPU is the command's and its workers' plus the PostgreSQL backends' that served them."""
    items = manifest(work / f"items-{n}.jsonl", n)
    rates: dict[str, dict[str, list[float]]] = {backend: {} for backend in backends}
    cpus: dict[str, dict[str, list[float]]] = {backend: {} for backend in backends}
    for r in range(rounds):
        for name in TASKS_PER_ITEM:
            for backend in backends:
                scratch = Path(tempfile.mkdtemp(dir=work))
                cpu: dict[str, float] = {}
                if backend == "sqlite":
                    wall, out = run(name, items, f"sqlite:///{scratch / 'store.db'}", scratch / "blobs", cpu)
                else:
                    with pg_database(ADMIN, "graph") as url:
                        wall, out = run(name, items, url, scratch / "blobs", cpu)
                assert out["unaccounted"] == 0, out
                rate = TASKS_PER_ITEM[name] * n / wall
                rates[backend].setdefault(name, []).append(rate)
                per_item = (cpu.get("cpu", 0.0) + cpu.get("server_cpu", 0.0)) / n * 1e6
                cpus[backend].setdefault(name, []).append(per_item)
                print(f"round {r + 1} {backend:8} {name:7} {wall:6.2f} s  {rate:9,.0f} tasks/s  CPU {per_item:5.0f} "
                      "µs an item", flush=True)
    return rates, cpus


def cpu_figures(by_name: dict[str, list[float]]) -> tuple[dict[str, float], float, float, float, float]:
    """CPU µs an item, the least of each pipeline's rounds (a shared host's load only adds to CPU time): the per-item
    figures, one transition, the noise (the largest spread of a pipeline's rounds), what a join and a gather add in
    transitions."""
    least = {name: min(values) for name, values in by_name.items()}
    step = least["chain4"] - least["chain"]
    noise = max(max(values) - min(values) for values in by_name.values())
    return (least, step, noise, (least["join"] - least["chain"]) / step if step else math.inf,
            (least["gather"] - least["fanout"]) / step if step else math.inf)


def spread(rates: list[float], name: str) -> float:
    """How far apart a pipeline's rounds came out, per item (µs): the largest minus the smallest."""
    per_item = [TASKS_PER_ITEM[name] / rate * 1e6 for rate in rates]
    return max(per_item) - min(per_item)


def verdict(step: float, noise: float, rounds: int, worst: float) -> str:
    """Met or not, only when one transition (chain4 - chain, the yardstick of both ratios) stands above the noise:
    the rounds of every pipeline (the yardstick's and the ratios' terms) each spread less than it. A yardstick at or
    below zero, or within the spread, says nothing of the ratios (a negative one would make any join look free)."""
    if rounds < 2:
        return "not judged (one round: its noise is not known)"
    if step <= 0 or step <= noise:
        return (f"not resolved (one transition, {step:.0f} µs, is not above the rounds' spread of {noise:.0f} µs: "
                "the host's noise hides it)")
    return "yes" if worst <= 1.0 else "no"


def group_memory(work: Path, n: int) -> tuple[float, float, dict, int, float]:
    """The reduce of ``n`` members: its wall time, the peak RSS of the command and its workers, its outcome; then
    one member added: the batch and fold steps that ran again, and that run's wall time."""
    items = manifest(work / f"group-{n}.jsonl", n)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    db = work / "group.db"
    wall, out = run("reduce", items, f"sqlite:///{db}", work / "group-blobs")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert out["unaccounted"] == 0, out
    steps = _steps(db)
    with items.open("a") as more:
        more.write(json.dumps({"key": f"item-{n:07d}", "text": f"document {n}"}) + "\n")
    again, _ = run("reduce", items, f"sqlite:///{db}", work / "group-blobs")
    return wall, max(peak, before) / 1024, out, _steps(db) - steps, again


def _steps(db: Path) -> int:
    """Memo rows of the reduce stage: its batch and fold steps and its answers."""
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM outputs WHERE stage = 'total'").fetchone()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--group-items", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), help="this backend alone (default: both)")
    args = parser.parse_args()
    backends = (args.backend,) if args.backend else ("sqlite", "postgres")
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-graph-") as scratch:
        work = Path(scratch)
        rates, cpus = side_by_side(work, args.items, args.rounds, backends)
        group = group_memory(work, args.group_items) if args.group_items else None
    lines = [BEGIN, "## Joins, gathers and groups beside the chain (bench/graph.py)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
             f"    PYTHONPATH=src .venv/bin/python bench/graph.py --items {args.items} --rounds {args.rounds} "
             f"--group-items {args.group_items}" + (f" --backend {args.backend}" if args.backend else ""), "",
             f"{args.items:,} items through `conveyor run --workers 2` in a fresh store each, pipelines alternated "
             f"over {args.rounds} rounds (medians; the command's start-up is in every figure). A join or gather "
             "adds at most one transition's cost an item when (join - chain) / (chain4 - chain) and "
             "(gather - fanout) / (chain4 - chain) are at most 1.0 (per-item seconds, medians), judged only when "
             "one transition (chain4 - chain) is above the noise (the largest spread of a pipeline's rounds).", "",
             "| backend | chain | chain4 | join | fanout | gather | one transition | noise | join adds | gather adds "
             "| met |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for backend, by_name in rates.items():
        per_item = {name: TASKS_PER_ITEM[name] / statistics.median(values) * 1e6 for name, values in by_name.items()}
        step = per_item["chain4"] - per_item["chain"]
        noise = max(spread(values, name) for name, values in by_name.items())
        join, gather = (per_item["join"] - per_item["chain"]) / step, (per_item["gather"] - per_item["fanout"]) / step
        cells = " | ".join(f"{per_item[n]:.0f} µs" for n in ("chain", "chain4", "join", "fanout", "gather"))
        lines.append(f"| {backend} | {cells} | {step:.0f} µs | {noise:.0f} µs | {join:.2f} | {gather:.2f} | "
                     f"{verdict(step, noise, args.rounds, max(join, gather))} |")
    lines += ["", "The same runs' CPU an item: the `conveyor run` command's and its workers' (user + system) plus, on "
              "PostgreSQL, the server backends' that served them (bench/statement_count/sitecustomize.py reads them "
              "in each process), the least of the rounds (other work on the host only adds to a CPU time), judged the "
              "same way. The load moves these far less than the wall times; on a 2-core host running two workers "
              "and the server, CPU is what a transition costs.", "",
              "| backend | chain | chain4 | join | fanout | gather | one transition | noise | join adds | gather adds "
              "| met |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for backend, by_name in cpus.items():
        least, step, noise, join, gather = cpu_figures(by_name)
        cells = " | ".join(f"{least[n]:.0f} µs" for n in ("chain", "chain4", "join", "fanout", "gather"))
        lines.append(f"| {backend} | {cells} | {step:.0f} µs | {noise:.0f} µs | {join:.2f} | {gather:.2f} | "
                     f"{verdict(step, noise, args.rounds, max(join, gather))} |")
    lines.append("")
    if group is not None:
        wall, peak_mb, out, added_steps, again = group
        lines += [f"A reduce of {args.group_items:,} members (batches of 1,000, folded) on SQLite: the run took "
                  f"{wall:.1f} s; peak resident memory of the command and its workers {peak_mb:.0f} MB (target <= 200 "
                  f"MB: {'met' if peak_mb <= 200 else 'not met'}); outcomes {out['outcomes']}. One member added, the "
                  f"run again took {again:.1f} s and ran {added_steps} step(s) (its batch, the folds above it and the "
                  f"group's own answer; log_1000({args.group_items:,}) is about "
                  f"{math.log(max(args.group_items, 2), 1000):.1f}).", ""]
    lines.append(END)
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
