"""What joins and gathers cost in Python calls (issue 28, point 6): a count that the host's load does not move.

    PYTHONPATH=src .venv/bin/python bench/graph_profile.py [--items 5000] [--backend sqlite|postgres]
                                                          [--tree PATH (default: this checkout)]

bench/graph_pipelines.py's chain, chain4, join, fanout and gather, each run whole through `conveyor run --workers 2`
in a fresh store, every thread of every process under cProfile (bench/profile_calls/sitecustomize.py). Per item:
the calls of Python functions (the interpreter's work beyond the C of builtins and drivers) and all calls. What one
transition costs is chain4 - chain; a join adds join - chain and a gather gather - fanout, each printed in
transitions (target <= 1.0). The counts move a little with how the claims batch the tasks, never with the host's
load; a profiled run is several times slower, so the times are not printed. ``--tree``: another checkout's code
(the same pipelines), for before and after. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from graph import manifest, run_instrumented  # noqa: E402

PIPELINES = ("chain", "chain4", "join", "fanout", "gather")


def calls(tree: Path, backend: str, name: str, items: Path, count: int, work: Path) -> tuple[float, float]:
    """(Python function calls, all calls) an item of ``name`` run by ``tree``'s code."""
    out = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench' / 'profile_calls'}:{tree / 'src'}",
           "CONVEYOR_BENCH_PROFILE": str(out)}

    run_instrumented(name, items, backend, out, env, tree, "profile")
    stats = pstats.Stats(*map(str, out.glob("*.prof")))
    entries = stats.stats.items()  # type: ignore[attr-defined]
    python = sum(nc for (path, _, _), (_, nc, _, _, _) in entries if path != "~")
    every = sum(nc for _, (_, nc, _, _, _) in entries)
    return python / count, every / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-profile-") as scratch:
        work = Path(scratch)
        items = manifest(work / "items.jsonl", args.items)
        per = {name: calls(args.tree.resolve(), args.backend, name, items, args.items, work) for name in PIPELINES}
    for name, (python, every) in per.items():
        print(f"{args.backend:8} {name:7} {python:7.1f} Python calls/item  {every:7.1f} calls/item", flush=True)
    for index, what in enumerate(("Python calls", "all calls")):
        step = per["chain4"][index] - per["chain"][index]
        join = (per["join"][index] - per["chain"][index]) / step
        gather = (per["gather"][index] - per["fanout"][index]) / step
        print(f"{what}: one transition {step:.1f} an item; a join adds {join:.2f} transitions, a gather {gather:.2f}")


if __name__ == "__main__":
    main()
