"""What deciding a join or gather ready costs, apart from its own task (issue 28, point 6).

    PYTHONPATH=src .venv/bin/python bench/graph_readiness.py [--items 20000] [--backend sqlite|postgres]
                                                            [--plan-items 20000]

A join or gather is a task like any other stage's (one transition), plus the work of deciding it ready: each parent's
or child's success arrives at it, the plan groups the arrivals by the item they wait on and, once all are there,
formats the `parts` input and hashes it for the task key; the stage then decodes the parts. Two measures of that
work, in CPU a host's load moves little:

- in this process, the plan of ``--plan-items`` items' last successes in batches of 500 (no store writes: the memo
  read of an empty SQLite store): chain4's c -> d (one plain successor) beside the join's b, c -> d and the
  gather's two children -> g, in µs an item, and the parts' decoding beside a plain input's;
- whole runs of bench/graph_pipelines.py's chain, chain4, join, fanout and gather through `conveyor run --workers
  2` (a fresh store each), with bench/thread_cpu/sitecustomize.py timing, in thread CPU, the functions of the
  readiness path (`Expander._decide`, `Expander.follow`, `values.load_parts`) and of a commit and a stage call: per
  item, and what the join (join - chain4) and the gather (gather - fanout - (chain4 - chain)) add beyond one
  transition's share of each. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from graph import manifest, run_instrumented  # noqa: E402

MEASURED = {
    "decide": "conveyor.runtime.expand:Expander._decide",
    "follow": "conveyor.runtime.expand:Expander.follow",
    "plan": "conveyor.runtime.expand:Expander.plan",
    "prepare": "conveyor.runtime.transitions.commits:Commits.prepare",
    "commit": "conveyor.runtime.transitions.commits:Commits.commit_and_claim",
    "load": "conveyor.runtime.execute:Executor.load",
    "call": "conveyor.runtime.execute:Executor._execute_sync",
}
PIPELINES = ("chain", "chain4", "join", "fanout", "gather")
BATCH = 500


def plan_costs(count: int) -> dict[str, float]:
    """µs an item of the plan of the last successes before a plain successor, a join and a gather (see above)."""
    from conveyor.runtime.expand import Expander
    from conveyor.runtime.values import encode, load_parts, parts_ref, store_value
    from conveyor.store import CHILD_MARK, open_store

    spec = importlib.util.spec_from_file_location("graph_pipelines", ROOT / "bench" / "graph_pipelines.py")
    assert spec is not None and spec.loader is not None
    pipelines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipelines)
    outputs = [store_value(*encode(f"document {i}".encode()), None) for i in range(count)]  # type: ignore[arg-type]

    def successes(i: int, shape: str) -> list[tuple[str, str, str, int]]:  # (item, root, stage, siblings)
        key = f"item-{i:07d}"
        if shape == "chain4":
            return [(key, key, "c", 0)]
        if shape == "join":
            return [(key, key, "b", 0), (key, key, "c", 0)]
        return [(f"{key}{CHILD_MARK}{child}", key, "b", 2) for child in range(2)]

    with tempfile.TemporaryDirectory(prefix="conveyor-bench-readiness-") as scratch:
        store = open_store(f"sqlite:///{scratch}/store.db")
        try:
            figures: dict[str, float] = {}
            for shape, pipeline in (("chain4", pipelines.chain4), ("join", pipelines.join),
                                    ("gather", pipelines.gather)) * 2:
                expander = Expander(pipeline, store)
                expander.set_lane("run", "bulk")
                started = time.thread_time()
                for low in range(0, count, BATCH):
                    seeds: list[Any] = []
                    for i in range(low, min(low + BATCH, count)):
                        for item, root, stage, siblings in successes(i, shape):
                            seeds += expander.follow("run", item, root, stage, outputs[i], siblings)
                    tasks, _, _ = expander.plan(seeds, 0.0)
                    assert len(tasks.queued) == min(BATCH, count - low), (shape, len(tasks.queued))
                took = (time.thread_time() - started) / count * 1e6
                figures[shape] = min(figures.get(shape, took), took)  # the least of two passes
        finally:
            store.close()
    _, data = parts_ref([outputs[0], outputs[0]])
    started = time.thread_time()
    for _ in range(count):
        load_parts(data, None)  # type: ignore[arg-type]
    figures["load_parts"] = (time.thread_time() - started) / count * 1e6
    return figures


def run_costs(name: str, items: Path, count: int, backend: str, work: Path) -> dict[str, float]:
    """Thread CPU µs an item of each measured function over a whole `conveyor run` of ``name``."""
    out = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench' / 'thread_cpu'}:{ROOT / 'src'}",
           "CONVEYOR_BENCH_THREAD_CPU_OUT": str(out), "CONVEYOR_BENCH_THREAD_CPU": ",".join(MEASURED.values())}

    run_instrumented(name, items, backend, out, env, label="readiness")
    totals: dict[str, float] = {}
    for path in out.glob("*.json"):
        for function, (_, seconds) in json.loads(path.read_text()).items():
            totals[function] = totals.get(function, 0.0) + seconds
    return {label: totals.get(spec.partition(":")[2], 0.0) / count * 1e6 for label, spec in MEASURED.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--plan-items", type=int, default=20_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    plan = plan_costs(args.plan_items)
    print(f"plan of the last successes, {args.plan_items:,} items, µs an item: plain successor (chain4 c -> d) "
          f"{plan['chain4']:.2f}, join (b, c -> d) {plan['join']:.2f} (+{plan['join'] - plan['chain4']:.2f}), "
          f"gather (2 children -> g) {plan['gather']:.2f} (+{plan['gather'] - plan['chain4']:.2f}); "
          f"load_parts of 2 parts {plan['load_parts']:.2f}")
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-readiness-") as scratch:
        work = Path(scratch)
        items = manifest(work / "items.jsonl", args.items)
        per = {name: run_costs(name, items, args.items, args.backend, work) for name in PIPELINES}
    print(f"\nthread CPU µs an item in `conveyor run --workers 2`, {args.items:,} items, {args.backend}:")
    print(f"{'':8}" + "".join(f"{label:>9}" for label in MEASURED))
    for name, figures in per.items():
        print(f"{name:8}" + "".join(f"{figures[label]:9.1f}" for label in MEASURED))
    step = {label: per["chain4"][label] - per["chain"][label] for label in MEASURED}
    join = {label: per["join"][label] - per["chain4"][label] for label in MEASURED}
    gather = {label: per["gather"][label] - per["fanout"][label] - step[label] for label in MEASURED}
    for what, extra in (("one transition (chain4 - chain)", step), ("a join beyond it (join - chain4)", join),
                        ("a gather beyond it (gather - fanout - transition)", gather)):
        print(f"{what:52}" + "  ".join(f"{label} {value:+.1f}" for label, value in extra.items()))


if __name__ == "__main__":
    main()
