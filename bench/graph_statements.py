"""What the gather's readiness costs in round trips (issue 28, point 6): a count that the host's load cannot blur.

    PYTHONPATH=src .venv/bin/python bench/graph_statements.py [--items 5000] [--backend sqlite|postgres]
                                                             [--tree PATH (default: this checkout)]

bench/graph_pipelines.py's chain, chain4, fanout and gather, each run whole through `conveyor run --workers 2` in a
fresh store (PostgreSQL: CONVEYOR_TEST_PG, or 127.0.0.1:5432), with bench/statement_count/sitecustomize.py
counting the statements every process sends its store and the seconds spent in them. Per item: statements,
seconds in them, and the commits' readiness reads in the writing transaction (lock_items, children_states, for
gathers whose children settled in different commits). What one transition costs is chain4 - chain; what a gather
adds is gather - fanout. ``--tree``: another checkout's code (the same pipelines), to compare before and after.
Prints; writes nothing.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import pg_database  # noqa: E402

ADMIN = os.environ.get("CONVEYOR_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/postgres"
PIPELINES = ("chain", "chain4", "fanout", "gather")


def measure(tree: Path, backend: str, name: str, items: Path, count: int, work: Path) -> dict[str, float]:
    counts = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench' / 'statement_count'}:{tree / 'src'}",
           "CONVEYOR_BENCH_STATEMENTS": str(counts)}

    def run(db: str) -> float:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "conveyor", "run", f"{ROOT}/bench/graph_pipelines.py:{name}",
                               "--input", str(items), "--workers", "2", "--db", db, "--blobs", str(counts / "blobs"),
                               "--json"], cwd=tree, env=env, text=True, capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name} on {db} exited {done.returncode}: {done.stderr[-2000:]}")
        return time.perf_counter() - started

    if backend == "sqlite":
        wall = run(f"sqlite:///{counts / 'store.db'}")
    else:
        with pg_database(ADMIN, "statements") as url:
            wall = run(url)
    total: dict[str, float] = {"wall": wall}
    for path in counts.glob("*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + value
    return {key: value / count for key, value in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=5_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-statements-") as scratch:
        work = Path(scratch)
        items = work / "items.jsonl"
        with items.open("w") as out:
            for i in range(args.items):
                out.write(json.dumps({"key": f"item-{i:07d}", "text": f"document {i}"}) + "\n")
        per = {name: measure(args.tree.resolve(), args.backend, name, items, args.items, work) for name in PIPELINES}
    for name, figures in per.items():
        print(f"{args.backend:8} {name:7} {figures.get('statements', 0):.4f} statements/item  "
              f"{figures.get('seconds', 0) * 1e6:6.0f} µs/item in them  wall {figures['wall'] * 1e6:6.0f} µs/item  "
              f"readiness reads {figures.get('lock_items', 0) * args.items:.0f} locks, "
              f"{figures.get('children_states', 0) * args.items:.0f} children's reads", flush=True)
    step = per["chain4"]["statements"] - per["chain"]["statements"]
    added = per["gather"]["statements"] - per["fanout"]["statements"]
    print(f"statements an item: one transition {step:.4f}, the gather adds {added:.4f}"
          + (f" ({added / step:.2f} transitions)" if step > 0 else ""))


if __name__ == "__main__":
    main()
