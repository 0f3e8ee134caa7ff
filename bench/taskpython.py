"""The workers' Python per task on the fleet path, in one process, without the store's own work (issue 32 point 2).

    PYTHONPATH=src .venv/bin/python bench/taskpython.py [--tasks 500] [--repeat 15]

Runs the two per-task halves of a worker's Python on a batch of ``--tasks`` claimed tasks of bench/noop_pipeline.py's
stage ``b``, as the worker does, and prints the best of ``--repeat`` rounds in microseconds per task:

- the stage side: ``Executor.run_inline`` (read the input, make the ``ctx``, call the stage, encode, digest and
  store its output, the outcome);
- a commit's preparation: ``Transitions.prepare`` (the rows of every success, the plan of the next stage with
  its memo lookup, the attempts, the metric totals) with the fresh tasks' claim and the run totals and queue
  counts the commit adds (``_take_fresh``, ``_tallies``), everything ``commit_and_claim`` does before its
  transaction.

The store is a fresh SQLite file; the plan's memo lookup is the only statement. Rounds are timed in the thread's CPU
seconds (time.thread_time), the best kept: that moves far less with the host's load than a fleet run's CPU seconds.
To compare two trees, run this with each on ``PYTHONPATH``, alternated.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    from conveyor.runtime.execute import Executor
    from conveyor.runtime.target import load_target
    from conveyor.runtime.transitions import Transitions
    from conveyor.store import ClaimedTask, open_store

    target = str(ROOT / "bench" / "noop_pipeline.py") + ":pipe"
    pipeline = load_target(target)
    with tempfile.TemporaryDirectory() as work:
        store = open_store(f"sqlite:///{work}/bench.db")
        transitions = Transitions(pipeline, store, "bench-worker")
        transitions.expander.set_lane("run", "bulk")
        executor = Executor(pipeline, target, None, 1, time.time)  # type: ignore[arg-type]  # no blob is read
        stage = pipeline["b"]
        tasks = [ClaimedTask(i, "run", "b", f"item{i:08d}", f"item{i:08d}", f"{i:064x}", f"{i:064x}", "bytes",
                             b"document %d: nothing to see here" % i, 32, 1, 3, 1, 1, 0, 1_000.0 + i / 100, 0)
                 for i in range(args.tasks)]
        batch = [(task, stage) for task in tasks]
        outcomes = executor.run_inline(batch)

        def commit_side() -> None:
            writes = transitions.prepare(outcomes, 2_000.0)
            where = {o.task.id: (o.task.run_id, o.task.stage) for o in outcomes}
            since = {o.task.id: o.task.available_at for o in outcomes}
            transitions._take_fresh(writes, None, 2_000.0)
            transitions._tallies(writes, where, since)

        for name, run in (("stage side (Executor.run_inline)", lambda: executor.run_inline(batch)),
                          ("commit preparation (prepare, _take_fresh, _tallies)", commit_side)):
            best = min(timeit.repeat(run, timer=time.thread_time, number=5, repeat=args.repeat)) / 5 / args.tasks
            print(f"{name}: {best * 1e6:.2f} us per task")
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
