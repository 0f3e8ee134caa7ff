"""Start-up: what a command costs as a whole process, next to the bare interpreter (issue 32 point 1).

    .venv/bin/python bench/startup.py [--runs 9] [--items 10000] [--baseline SRC [--label TEXT]] [--no-write]

Times ``conveyor --version``, ``conveyor --help``, ``conveyor status --help`` and ``conveyor status RUN`` (the
table, and ``--json``) on a SQLite store of N items (a run of bench/noop_pipeline.py, made here with ``conveyor
run``), each started as a user starts it: the ``conveyor`` script of this interpreter's environment, reading this
checkout's src/ (PYTHONPATH). Each run of a command is alternated with one of ``python -c pass`` (the same
interpreter), so both meet the same machine; the figures are the medians of ``--runs`` (at least 7) of each: wall
time, the CPU time (user + system) the process spent, and the ratio of the command's wall time to the bare
interpreter's. ``--baseline SRC`` times the same commands with another src/ folder as well (e.g. main's before
the change, extracted with ``git archive`` and compiled; ``--label`` names it in the table), alternated in the
same way. Writes its section of
bench/RESULTS.md. Measure with compiled bytecode, as users get it (``make setup``; this environment sets
PYTHONDONTWRITEBYTECODE): the section says whether every module of src/conveyor had its bytecode.

Targets: ``--version`` and ``--help`` at most 100 ms wall, ``status RUN`` at most 200 ms on 10,000 items.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
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

SCRIPT = "startup"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"
TARGETS_MS = {"--version": 100.0, "--help": 100.0, "status RUN": 200.0}


def conveyor() -> list[str]:
    """The command a user types: the environment's ``conveyor`` script, else ``python -m conveyor``."""
    script = Path(sys.executable).parent / "conveyor"
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]


def environment(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one process; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_store(folder: Path, items: int, src: Path) -> tuple[str, str]:
    """A SQLite store holding one finished run of ``items`` items; its URL and the run's id."""
    manifest = folder / "items.jsonl"
    with manifest.open("w") as out:
        for i in range(items):
            out.write(json.dumps({"key": f"item{i:08d}", "text": f"document {i}: nothing to see here"}) + "\n")
    db = f"sqlite:///{folder / 'conveyor.db'}"
    proc = subprocess.run([*conveyor(), "run", TARGET, "--input", str(manifest), "--workers", "2", "--db", db,
                           "--blobs", str(folder / "blobs"), "--json"], env=environment(src), cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"conveyor run exited {proc.returncode}: {proc.stderr[-2000:]}")
    return db, json.loads(proc.stdout)["run_id"]


def commands(db: str, run_id: str) -> dict[str, list[str]]:
    return {"--version": ["--version"], "--help": ["--help"], "status --help": ["status", "--help"],
            "status RUN": ["status", run_id, "--db", db], "status RUN --json": ["status", run_id, "--db", db, "--json"]}


def measure(name: str, args: list[str], src: Path, runs: int) -> dict[str, Any]:
    """``runs`` pairs (bare interpreter, command), alternated; the medians."""
    bare, walls, cpus = [], [], []
    env = environment(src)
    timed([*conveyor(), *args], env)  # the first run reads the files into the page cache: not counted
    for _ in range(runs):
        bare.append(timed([sys.executable, "-c", "pass"], env)[0])
        wall, cpu = timed([*conveyor(), *args], env)
        walls.append(wall)
        cpus.append(cpu)
    wall_ms, bare_ms = statistics.median(walls) * 1000, statistics.median(bare) * 1000
    return {"command": name, "wall_ms": wall_ms, "best_ms": min(walls) * 1000, "cpu_ms": statistics.median(cpus) * 1000,
            "bare_ms": bare_ms, "ratio": wall_ms / bare_ms, "target_ms": TARGETS_MS.get(name)}


def bytecode(src: Path) -> tuple[int, int]:
    """(modules of src/conveyor whose bytecode is there and current, modules)."""
    sources = list((src / "conveyor").rglob("*.py"))
    current = 0
    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        current += cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime
    return current, len(sources)


def section(rows: list[dict[str, Any]], args: argparse.Namespace, compiled: dict[str, tuple[int, int]],
            load: float) -> str:
    call = "    .venv/bin/python bench/startup.py" + (f" --runs {args.runs}" if args.runs != 9 else "") + (
        f" --items {args.items}" if args.items != 10_000 else "") + (
        f" --baseline SRC --label '{args.label}'" if args.baseline else "")
    lines = [BEGIN, "## Start-up (bench/startup.py)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "", call, "",
             f"Whole processes, started as a user starts them (the environment's `conveyor` script); `status RUN` "
             f"reads a finished run of {args.items:,} items in a SQLite store. Each run of a command is alternated "
             f"with one of `python -c pass`; medians of {args.runs} runs of each. *ratio*: the command's wall time "
             f"over the bare interpreter's; *fastest*: the quickest run of the command (nearest what it costs when "
             f"nothing else runs on the host). 1-minute load average at the start: {load:.1f} (2 cores).", "",
             "| src | command | wall ms | fastest ms | CPU ms | bare python ms | ratio | target ms | |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        verdict = "" if r["target_ms"] is None else ("PASS" if r["wall_ms"] <= r["target_ms"] else "FAIL")
        target = "" if r["target_ms"] is None else f"{r['target_ms']:.0f}"
        lines.append(f"| {r['src']} | `conveyor {r['command']}` | {r['wall_ms']:.1f} | {r['best_ms']:.1f} | "
                     f"{r['cpu_ms']:.1f} | "
                     f"{r['bare_ms']:.1f} | {r['ratio']:.1f} | {target} | {verdict} |")
    if args.baseline:
        lines += ["", f"*{args.label}*: the same commands with another src/ folder (`--baseline`), on the same store, "
                  "each run alternated with this checkout's and the bare interpreter's; the host's speed drifts "
                  "from session to session, so compare rows of one run."]
    lines += ["", "- Bytecode: " + "; ".join(f"{name}: {done} of {total} modules of src/conveyor compiled"
                                             for name, (done, total) in compiled.items()) + ".", END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--baseline", type=Path, help="another src/ folder to time the same commands with")
    parser.add_argument("--label", default="baseline", help="the baseline's name in the table")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.runs < 7:
        parser.error("--runs: at least 7")
    sources = {"this checkout": ROOT / "src"} | ({args.label: args.baseline.resolve()} if args.baseline else {})
    compiled = {name: bytecode(src) for name, src in sources.items()}
    for name, (done, total) in compiled.items():
        if done < total:
            print(f"warning: {name}: {total - done} of {total} modules have no current bytecode (make setup)",
                  file=sys.stderr)
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        db, run_id = make_store(Path(folder), args.items, ROOT / "src")
        for name, argv in commands(db, run_id).items():
            for label, src in sources.items():
                rows.append({"src": label, **measure(name, argv, src, args.runs)})
                r = rows[-1]
                print(f"{label:>13}  conveyor {name:<18} {r['wall_ms']:7.1f} ms wall  {r['cpu_ms']:7.1f} ms CPU  "
                      f"bare {r['bare_ms']:5.1f} ms  ratio {r['ratio']:5.1f}", flush=True)
    text = section(rows, args, compiled, load)
    print(text)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", text)


if __name__ == "__main__":
    main()
