"""Re-runs at any size (issue 32 point 3): a cached re-run through the CLI, and a run of ten items, as whole processes.

    .venv/bin/python bench/rerun.py [--items 50000] [--large] [--rounds 3] [--small-rounds 5]
                                    [--baseline SRC [--label TEXT]] [--no-write]

1. *Cached re-run*: ``conveyor run bench/noop_pipeline.py:pipe`` over N items (50,000; ``--large`` adds
   200,000) once, on a SQLite store; then, each round, the same command again on a fresh copy of that store, timed
   as a whole process (start to exit, as a user waits for it). Every task is answered from the memo: tasks/s =
   3 N cached tasks / the process's wall time. Target: at least 100,000 tasks/s at 50,000 items and above.
2. *Small run*: ``conveyor run bench/sleep_pipeline.py:pipe`` over 10 new items (none answered by the memo) on a
   store that exists, with the default workers; its one stage waits 1.0 s per item, ten at once, so the stage
   time is 1.0 s. The figure: the process's wall time minus the stage time. Target: at most 0.5 s.

Each round alternates the commands with ``python -c pass`` (the bare interpreter, a yardstick) and, with
``--baseline SRC``, with the same command reading another src/ folder (e.g. main's before a change, extracted with
``git archive`` and compiled; ``--label`` names it), so every figure of a table met the same machine; the rows
are the medians of the rounds, each round's figures in the notes. Measure with compiled bytecode, as users get it
(``make setup``); the section says whether every module had its bytecode. Writes its section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import markers, write_section  # noqa: E402
from sleep_pipeline import STAGE_S  # noqa: E402
from startup import bytecode, conveyor, environment  # noqa: E402

SCRIPT = "rerun"
BEGIN, END = markers(f"{SCRIPT}.py")
NOOP = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"
SLEEP = f"{ROOT / 'bench' / 'sleep_pipeline.py'}:pipe"
CACHED_TARGET = 100_000.0  # tasks/s
SMALL_ITEMS = 10
SMALL_TARGET_S = 0.5  # beyond the stage time


def run_cli(args: list[str], src: Path) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds of one whole ``conveyor ... --json`` process, the CPU seconds (user + system) of it and its
    workers, and its JSON; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([*conveyor(), *args, "--json"], env=environment(src), cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"conveyor {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(proc.stdout)


def bare(src: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=environment(src), check=True)
    return time.perf_counter() - start


def write_manifest(path: Path, items: int, tag: str) -> Path:
    with path.open("w") as out:
        for i in range(items):
            out.write(json.dumps({"key": f"item{i:08d}", "text": f"document {i} {tag}: nothing to see here"}) + "\n")
    return path


def copy_store(db: Path, to: Path) -> None:
    for suffix in ("", "-wal"):
        if Path(f"{db}{suffix}").exists():
            shutil.copyfile(f"{db}{suffix}", f"{to}{suffix}")


def drop_store(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def cached(folder: Path, items: int, sources: dict[str, Path], rounds: int) -> list[dict[str, Any]]:
    """Rows of the cached re-run at ``items`` items, one per src (and the bare interpreter's)."""
    manifest = write_manifest(folder / f"cached-{items}.jsonl", items, "cached")
    base, blobs = folder / f"cached-{items}.db", folder / "blobs"
    args = ["run", NOOP, "--input", str(manifest), "--blobs", str(blobs)]
    run_cli([*args, "--db", f"sqlite:///{base}"], ROOT / "src")  # the cold run the re-runs repeat
    walls: dict[str, list[float]] = {name: [] for name in sources}
    cpus: dict[str, list[float]] = {name: [] for name in sources}
    yardstick: list[float] = []
    for _ in range(rounds):
        for name, src in sources.items():
            copy = folder / "copy.db"
            copy_store(base, copy)
            os.sync()  # the copy's pages reach the disk now, not while the re-run is timed
            yardstick.append(bare(src))
            wall, cpu, out = run_cli([*args, "--db", f"sqlite:///{copy}"], src)
            if out["cached"] != 3 * items or out["stage_calls"] != 0 or out["unaccounted"] != 0:
                raise RuntimeError(f"{name}: a cached re-run of {items} items made {out['stage_calls']} stage calls "
                                   f"and {out['cached']} cached tasks (expected 0 and {3 * items})")
            walls[name].append(wall)
            cpus[name].append(cpu)
            drop_store(copy)
            print(f"{name:>24}  cached re-run, {items:,} items: {wall:6.2f} s  {3 * items / wall:9,.0f} tasks/s",
                  flush=True)
    drop_store(base)
    rows = []
    for name, times in walls.items():
        wall, cpu = statistics.median(times), statistics.median(cpus[name])
        rate = 3 * items / wall
        rows.append({"src": name, "figure": f"cached re-run, {items:,} items (conveyor run)", "wall": wall,
                     "cpu": cpu, "value": rate, "unit": "tasks/s", "target": CACHED_TARGET,
                     "pass": rate >= CACHED_TARGET, "rounds": ", ".join(f"{3 * items / t:,.0f}" for t in times)})
    for name in walls:  # what the wall rate would be on a host with nothing else to run (no waiting either)
        cpu = statistics.median(cpus[name])
        rows.append({"src": name, "figure": f"cached re-run, {items:,} items, per CPU second", "wall": None,
                     "cpu": cpu, "value": 3 * items / cpu, "unit": "tasks/CPU-s", "target": None, "pass": None,
                     "rounds": ", ".join(f"{3 * items / c:,.0f}" for c in cpus[name])})
    rows.append(_bare_row(yardstick))
    return rows


def small(folder: Path, sources: dict[str, Path], rounds: int) -> list[dict[str, Any]]:
    """Rows of the run of SMALL_ITEMS items: wall time beyond the stage time, one per src."""
    db, blobs = folder / "small.db", folder / "blobs"
    common = ["--db", f"sqlite:///{db}", "--blobs", str(blobs)]
    warm = write_manifest(folder / "small-warm.jsonl", SMALL_ITEMS, "warm-up")
    run_cli(["run", SLEEP, "--input", str(warm), *common], ROOT / "src")  # the store exists, its files are read
    over: dict[str, list[float]] = {name: [] for name in sources}
    cpus: dict[str, list[float]] = {name: [] for name in sources}
    yardstick: list[float] = []
    for index in range(rounds):
        for name, src in sources.items():
            manifest = write_manifest(folder / "small.jsonl", SMALL_ITEMS, f"round {index} {name}")
            yardstick.append(bare(src))
            wall, cpu, out = run_cli(["run", SLEEP, "--input", str(manifest), *common], src)
            if out["stage_calls"] != SMALL_ITEMS or out["outcomes"] != {"completed": SMALL_ITEMS}:
                raise RuntimeError(f"{name}: a run of {SMALL_ITEMS} new items made {out['stage_calls']} stage calls, "
                                   f"outcomes {out['outcomes']}")
            over[name].append(wall - STAGE_S)
            cpus[name].append(cpu)
            print(f"{name:>24}  {SMALL_ITEMS} items, {STAGE_S:.1f} s stage: {wall:6.2f} s, "
                  f"{wall - STAGE_S:5.2f} s beyond it", flush=True)
    rows = []
    for name, times in over.items():
        extra = statistics.median(times)
        rows.append({"src": name, "figure": f"{SMALL_ITEMS} items, wall beyond a {STAGE_S:.1f} s stage (conveyor run)",
                     "wall": extra + STAGE_S, "cpu": statistics.median(cpus[name]), "value": extra, "unit": "s",
                     "target": SMALL_TARGET_S, "pass": extra <= SMALL_TARGET_S,
                     "rounds": ", ".join(f"{t:.2f}" for t in times)})
    rows.append(_bare_row(yardstick))
    return rows


def _bare_row(times: list[float]) -> dict[str, Any]:
    wall = statistics.median(times)
    return {"src": "", "figure": "`python -c pass` (yardstick, alternated with the above)", "wall": wall,
            "cpu": None, "value": wall, "unit": "s", "target": None, "pass": None,
            "rounds": ", ".join(f"{t:.3f}" for t in times)}


def section(rows: list[dict[str, Any]], args: argparse.Namespace, compiled: dict[str, tuple[int, int]],
            load: float) -> str:
    call = "    .venv/bin/python bench/rerun.py" + (f" --items {args.items}" if args.items != 50_000 else "") + (
        " --large" if args.large else "") + (f" --rounds {args.rounds}" if args.rounds != 3 else "") + (
        f" --small-rounds {args.small_rounds}" if args.small_rounds != 5 else "") + (
        f" --baseline SRC --label '{args.label}'" if args.baseline else "")
    lines = [BEGIN, "## Re-runs at any size (bench/rerun.py)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "", call, "",
             "Whole `conveyor run` processes on SQLite, started as a user starts them (the environment's `conveyor` "
             "script), timed from start to exit. *Cached re-run*: bench/noop_pipeline.py (three stages) over N "
             "items once, then the same command on a fresh copy of that store each round (written to disk before the "
             "clock starts); every task is answered "
             "from the memo (checked), and the figure is 3 N tasks / the process's wall time. *10 items*: "
             "bench/sleep_pipeline.py, one async stage waiting 1.0 s per item, ten at once, over ten new items on an "
             "existing store with the default workers (one per core); the figure is the wall time minus the 1.0 s "
             "stage time. *cpu s*: user + system time of the command and its workers (the median; less moved by "
             "other work on the host than the wall time); *per CPU second*: the cached tasks over it, the rate "
             "a host with nothing else to run would give if the command never waited on the disk. Each command "
             "is alternated, round by round, with `python -c pass` and with the other "
             f"src/ folder when there is one; medians of {args.rounds} rounds (cached) and {args.small_rounds} "
             f"(10 items), each round's figures in the last column. 1-minute load average at the start: {load:.1f} "
             f"({os.cpu_count()} cores).", "",
             "| src | figure | wall s | cpu s | value | unit | target | | rounds |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    for r in rows:
        target = "" if r["target"] is None else (f"≥ {r['target']:,.0f}" if r["unit"] == "tasks/s"
                                                 else f"≤ {r['target']:.2f}")
        verdict = "" if r["pass"] is None else ("PASS" if r["pass"] else "FAIL")
        value = f"{r['value']:,.0f}" if r["unit"].startswith("tasks") else f"{r['value']:.3f}"
        cpu = "" if r["cpu"] is None else f"{r['cpu']:.2f}"
        wall = "" if r["wall"] is None else f"{r['wall']:.3f}"
        lines.append(f"| {r['src']} | {r['figure']} | {wall} | {cpu} | {value} | {r['unit']} | {target} | "
                     f"{verdict} | {r['rounds']} |")
    if args.baseline:
        lines += ["", f"*{args.label}*: the same commands with another src/ folder (`--baseline`), alternated "
                  "round by round with this checkout's; the host's speed drifts from session to session, so compare "
                  "rows of one run."]
    lines += ["", "- Bytecode: " + "; ".join(f"{name}: {done} of {total} modules of src/conveyor compiled"
                                             for name, (done, total) in compiled.items()) + ".", END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=50_000, help="items of the cached re-run")
    parser.add_argument("--large", action="store_true", help="also a cached re-run of 200,000 items")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each cached re-run (at least 3)")
    parser.add_argument("--small-rounds", type=int, default=5, help="rounds of the 10-item run (at least 3)")
    parser.add_argument("--baseline", type=Path, help="another src/ folder to time the same commands with")
    parser.add_argument("--label", default="baseline", help="the baseline's name in the table")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.rounds < 3 or args.small_rounds < 3:
        parser.error("--rounds and --small-rounds: at least 3")
    if args.items < 1:
        parser.error("--items: at least 1")
    sources = {"this checkout": ROOT / "src"} | ({args.label: args.baseline.resolve()} if args.baseline else {})
    compiled = {name: bytecode(src) for name, src in sources.items()}
    for name, (done, total) in compiled.items():
        if done < total:
            print(f"warning: {name}: {total - done} of {total} modules have no current bytecode (make setup)",
                  file=sys.stderr)
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rows += small(folder, sources, args.small_rounds)
        for items in [args.items] + ([200_000] if args.large else []):
            rows += cached(folder, items, sources, args.rounds)
    text = section(rows, args, compiled, load)
    print(text)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", text)


if __name__ == "__main__":
    main()
