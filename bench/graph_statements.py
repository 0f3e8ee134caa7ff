"""What joins and gathers cost in round trips and CPU (issue 28, point 6): figures that the host's load blurs little.

    PYTHONPATH=src .venv/bin/python bench/graph_statements.py [--items 5000] [--backend sqlite|postgres]
                                                             [--rounds 1] [--pipelines chain,chain4,...]
                                                             [--tree PATH (default: this checkout)]
                                                             [--before PATH (another checkout, alternated)]

bench/graph_pipelines.py's chain, chain4, join, fanout and gather, each run whole through `conveyor run --workers 2`
in a fresh store (PostgreSQL: CONVEYOR_TEST_PG, or 127.0.0.1:5432), with bench/statement_count/sitecustomize.py
counting the statements every process sends its store and the seconds spent in them, the processes' CPU (user +
sys) and, on PostgreSQL, the CPU of the server backends that served them. Per item: statements, CPU of the
`conveyor run` processes, CPU of the server; per run, the joins and gathers left to the writing transaction
(in_transaction: their parents or children settled in different commits) and its readiness reads (lock_items,
stage_states for joins, children_states for gathers). What one
transition costs is chain4 - chain; what a join adds is join - chain, a gather gather - fanout. ``--tree``: another
checkout's code (the same pipelines); ``--before``: a second checkout run alternately with ``--tree``, round by
round, to compare before and after. Medians over the rounds. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from graph import manifest, run_instrumented  # noqa: E402

PIPELINES = ("chain", "chain4", "join", "fanout", "gather")
READS = ("in_transaction", "lock_items", "stage_states", "children_states")


def measure(tree: Path, backend: str, name: str, items: Path, count: int, work: Path) -> dict[str, float]:
    counts = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench' / 'statement_count'}:{tree / 'src'}",
           "CONVEYOR_BENCH_STATEMENTS": str(counts)}

    wall = run_instrumented(name, items, backend, counts, env, tree, "statements")
    total: dict[str, float] = {"wall": wall}
    for path in counts.glob("*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + value
    return {key: value / count for key, value in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--before", type=Path, help="a checkout to alternate with --tree, round by round")
    args = parser.parse_args()
    names = args.pipelines.split(",")
    trees = {"after": args.tree.resolve()}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-statements-") as scratch:
        work = Path(scratch)
        items = manifest(work / "items.jsonl", args.items)
        for r in range(args.rounds):
            for name in names:
                for label, tree in trees.items():
                    figures = measure(tree, args.backend, name, items, args.items, work)
                    runs.setdefault((label, name), []).append(figures)
                    print(f"round {r + 1} {label:6} {args.backend:8} {name:7} "
                          f"{figures.get('statements', 0):.4f} st/item  cpu {figures.get('cpu', 0) * 1e6:5.0f} µs "
                          f"server {figures.get('server_cpu', 0) * 1e6:5.0f} µs  wall {figures['wall'] * 1e6:6.0f} µs "
                          f"reads " + " ".join(f"{k} {figures.get(k, 0) * args.items:.0f}" for k in READS),
                          flush=True)
    print(f"medians of {args.rounds} round(s), {args.items:,} items, {args.backend}, load {os.getloadavg()[0]:.1f}:")
    for label in trees:
        med = {name: {key: statistics.median(f.get(key, 0) for f in runs[label, name])
                      for key in ("statements", "cpu", "server_cpu", "wall", *READS)} for name in names}
        for name in names:
            m = med[name]
            print(f"  {label:6} {name:7} {m['statements']:.4f} st/item  cpu {m['cpu'] * 1e6:5.0f} µs  server "
                  f"{m['server_cpu'] * 1e6:5.0f} µs  wall {m['wall'] * 1e6:6.0f} µs  "
                  + " ".join(f"{k} {m[k] * args.items:.0f}" for k in READS))
        if "chain" not in med or "chain4" not in med:
            continue
        # CPU time on a shared host only grows with the others' load: the least of the rounds is the nearest to
        # what the work costs, beside the median.
        least = {name: {key: min(f.get(key, 0) for f in runs[label, name]) for key in ("cpu", "server_cpu")}
                 for name in names}
        for measure_, of in (("statements", med), ("cpu", med), ("server_cpu", med), ("cpu", least),
                             ("server_cpu", least)):
            step = of["chain4"][measure_] - of["chain"][measure_]
            how = "median" if of is med else "least"
            line = (f"  {label:6} {measure_:10} {how:6} one transition "
                    f"{step * (1 if measure_ == 'statements' else 1e6):8.4f}")
            for what, base in (("join", "chain"), ("gather", "fanout")):
                if what in of and base in of:
                    added = of[what][measure_] - of[base][measure_]
                    line += (f"  {what} adds {added * (1 if measure_ == 'statements' else 1e6):8.4f}"
                             + (f" ({added / step:.2f} transitions)" if step > 0 else " (transition unresolved)"))
            print(line)
        print(f"  {label:6} least cpu + server per item: " + "  ".join(
            f"{name} {(least[name]['cpu'] + least[name]['server_cpu']) * 1e6:.0f} µs" for name in names))


if __name__ == "__main__":
    main()
