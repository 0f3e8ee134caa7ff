"""A/B of source trees on the fleet path: conveyor's two workers through N items of bench/noop_pipeline.py.

    .venv/bin/python bench/fleet_ab.py BACKEND ROUNDS NAME=SRC [NAME=SRC ...] [--items 20000]

For each round, each tree in turn (``conveyor submit`` and two ``conveyor worker --until-idle`` processes run with
``PYTHONPATH=SRC``, on a fresh store): the rate on the side by side's clock (first task start to last task end,
by the store's stamps: bench/engine.py ``job_span``) and the workers' CPU microseconds per task. Prints each
round, the medians, and with two trees the second's rate over the first's round by round and its median. To
compare a commit with its parent: ``git archive COMMIT src | tar -x -C /tmp/base`` and pass ``base=/tmp/base/src
new=$PWD/src``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", choices=("sqlite", "postgres"))
    parser.add_argument("rounds", type=int)
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC")
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", engine.DEFAULT_PG))
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.trees)
    n, work = args.items, Path(tempfile.mkdtemp(prefix="conveyor-ab-"))
    rates: dict[str, list[float]] = {name: [] for name in trees}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    try:
        manifest = engine.write_manifest(work / "manifest.jsonl", n)
        with contextlib.ExitStack() as stack:
            stores = (engine.sqlite_stores(work, "ab") if args.backend == "sqlite"
                      else stack.enter_context(engine.pg_stores(args.pg)))
            for round_ in range(args.rounds):
                for name, src in trees.items():
                    os.environ["PYTHONPATH"] = src
                    db = next(stores)
                    run_id = engine.submit_noop(manifest, db, work / "blobs")
                    timing = engine.drain_noop(run_id, db, work / "blobs", 3 * n, name)
                    rates[name].append(3 * n / engine.job_span(db, run_id))
                    cpu[name].append(timing.cpu / (3 * n) * 1e6)
                    print(f"round {round_} {name}: {rates[name][-1]:,.0f} item-stages/s, workers' CPU "
                          f"{cpu[name][-1]:.0f} us/task, load {timing.load:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in trees:
        print(f"{name}: median {statistics.median(rates[name]):,.0f} item-stages/s "
              f"({', '.join(f'{r:,.0f}' for r in rates[name])}); workers' CPU median "
              f"{statistics.median(cpu[name]):.0f} us/task ({', '.join(f'{c:.0f}' for c in cpu[name])})")
    if len(trees) == 2:
        first, second = trees
        ratios = [b / a for a, b in zip(rates[first], rates[second], strict=True)]
        print(f"{second} / {first}, round by round: {', '.join(f'{r:.2f}' for r in ratios)}; median "
              f"{statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
