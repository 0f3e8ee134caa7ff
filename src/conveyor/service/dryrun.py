"""`conveyor run --dry-run`: what a run of an input would do and cost, before anything is created.

The input is read and hashed as a submission would (nothing is stored), each item's first tasks are looked up in
the memo and followed through its answers as the planner does, so the counts of what the memo answers are exact (a
task equal to one before it in the same input, e.g. a page given twice, counts as answered by the memo, as it will
be); what lies after a task that would run is estimated (one task per stage, a fan-out's children at the ratio its
past runs had, a group stage the groups its measured key makes). Costs come from the pipeline's past attempts
(service/forecast.py) or, for a stage with none, from a sample of ``sample`` items (drawn evenly over the input)
run for real in a scratch store that is thrown away (those calls are paid for, and say so; publish stages are left
out of the sample: nothing is published). The sample runs in as many worker processes as the run will have (at most
one per sampled item), each loading the target as a run's worker does, so it measures the pace the run's workers
will have side by side on this machine (CPU-bound stages share its cores) and their start-up; when they cannot
start, it runs in this process, and the run's start-up adds a worker process's own, measured by starting an
interpreter that loads the target.
"""

from __future__ import annotations

import array
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from conveyor.blobs import Blobs, FilesystemBlobs
from conveyor.pipeline import Pipeline
from conveyor.runtime.expand import Expander
from conveyor.runtime.values import Ref
from conveyor.service.diff import batched
from conveyor.service.forecast import History, forecast, groups_of, history, limits_of
from conveyor.service.inputs import SourceItem, check_input, iter_items
from conveyor.service.replay import _digest_only
from conveyor.service.submit import SubmitOptions, _own, run_params
from conveyor.store import SqlStore, open_store

BATCH = 1000
DRY_RUN_ID = "dry-run"


def dry_run(pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs, workers: int,
            sample: int = 3, skip_bad_lines: bool = False, sets: Sequence[str] = ()) -> dict[str, Any]:
    """What ``conveyor run TARGET --input INPUT`` would run, what the memo would answer, and the forecast."""
    check_input(input_path, skip_bad_lines)
    expander = Expander(pipeline, store)
    expander.set_params(DRY_RUN_ID, run_params(pipeline, sets))
    stages: dict[str, Counter[str]] = {s.name: Counter() for s in pipeline}
    items = bad = 0
    samples = Reservoir(sample)
    planned = Repeats()  # the keys of the tasks that would run: an equal task later in the run is a memo hit
    for batch in batched(iter_items(input_path, skip_bad_lines=skip_bad_lines, own=_own(store, blobs)), BATCH):
        good: list[tuple[SourceItem, Ref]] = []
        for item in batch:
            items += 1
            ref = _ref(item)
            if isinstance(ref, str):
                bad += 1
                continue
            good.append((item, ref))
        seeds = [seed for item, ref in good for seed in expander.roots(DRY_RUN_ID, item.key, ref)]
        tasks, _, _ = expander.plan(seeds, store.clock())
        expander.take_pending()
        for row in tasks.cached:
            stages[row[2]]["memo"] += 1
        for row in tasks.failed:
            stages[row[2]]["memo"] += 1
        for row in tasks.queued:
            stages[row[2]]["run"] += 1
            planned.add(row[2], row[5])
        starts = {row[3] for row in tasks.queued if row[2] in {s.name for s in pipeline.roots}}
        samples.offer(item for item, _ in good if item.key in starts)
    for stage, repeats in planned.counts().items():
        # Two items whose task at a stage is the same (the same input, version and config) make one call: the
        # second waits for the first's answer and is a memo hit, as in a run.
        stages[stage]["run"] -= repeats
        stages[stage]["memo"] += repeats
    past = history(store, pipeline)
    _estimate_below(pipeline, stages, past)
    to_run = {name: float(c["run"] + c["estimated"]) for name, c in stages.items()}
    sampled = None
    missing = [name for name, count in to_run.items() if count and name not in past.stages
               and pipeline[name].kind != "publish"]
    if missing and sample > 0 and samples.items:
        measured, sampled = _sample(pipeline, target, samples.items, sets, workers)
        past = _merged(past, measured)
        _estimate_below(pipeline, stages, past)
        to_run = {name: float(c["run"] + c["estimated"]) for name, c in stages.items()}
    return {
        "dry_run": True, "pipeline": pipeline.name, "input": input_path, "items": items, "bad_input": bad,
        "stages": {name: {"tasks": c["memo"] + c["run"] + c["estimated"], "memo": c["memo"],
                          "run": c["run"] + c["estimated"], "estimated": c["estimated"]}
                   for name, c in stages.items()},
        "forecast": forecast(pipeline, past, to_run, workers, limits_of(pipeline)),
        "sampled": sampled,
    }


class Repeats:
    """How many task keys per stage were seen before: 8 bytes a key, in 256 buckets (a dry run of ten million
    items holds 80 MB here, not a set of strings)."""

    def __init__(self) -> None:
        self._buckets: dict[str, list[array.array[int]]] = {}

    def add(self, stage: str, key: str) -> None:
        value = int(key[:16], 16) - (1 << 63)  # a sha256 hex digest: its first 64 bits, as a signed 8-byte int
        buckets = self._buckets.get(stage)
        if buckets is None:
            buckets = self._buckets[stage] = [array.array("q") for _ in range(256)]
        buckets[value & 255].append(value)

    def counts(self) -> dict[str, int]:
        return {stage: sum(len(b) - len(set(b)) for b in buckets) for stage, buckets in self._buckets.items()}


class Reservoir:
    """``size`` items drawn evenly from a stream of unknown length (reservoir sampling, seeded: the same input
    gives the same sample). The first items of an input are often not like the rest (sorted by section, size or
    date), so a sample of them measures a run badly."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = max(0, size)
        self.items: list[SourceItem] = []
        self._seen = 0
        self._rng = random.Random(seed)

    def offer(self, items: Iterable[SourceItem]) -> None:
        for item in items:
            self._seen += 1
            if len(self.items) < self.size:
                self.items.append(item)
                continue
            slot = self._rng.randrange(self._seen)
            if slot < self.size:
                self.items[slot] = item


def _ref(item: SourceItem) -> Ref | str:
    if item.problem is not None:
        return item.problem
    try:
        return _digest_only(item)
    except OSError as exc:
        return f"{item.where} could not be read: {exc.strerror or exc}"


def _estimate_below(pipeline: Pipeline, stages: dict[str, Counter[str]], past: History) -> None:
    """Tasks after the ones that would run: one per stage after a map (a join: one per item of its parents), a
    fan-out's children at its past ratio (one each when it has no past), a gather one per fanned-out item, a group
    stage as many groups as its measure's key makes of that many members (``groups_of``), a reduce one."""
    graph = pipeline.graph
    for name in graph.order:
        stages[name]["estimated"] = 0
    for name in graph.order:
        stage = pipeline[name]
        if stage.after is None:
            continue
        if name in graph.gathers:  # once per item of the fan-out's own level
            fanout = stages[graph.gathers[name].fanout]
            stages[name]["estimated"] = fanout["run"] + fanout["estimated"]
            continue
        if stage.kind in ("group", "reduce"):  # once per group: one, or the groups its measure's key makes
            members = stages[stage.after]["run"] + stages[stage.after]["estimated"]
            seen = None if stage.kind == "reduce" else past.groups.get(name)
            stages[name]["estimated"] = groups_of(members, seen) if members else 0
            continue
        parent = stages[stage.after]
        upstream = parent["run"] + parent["estimated"]
        ratio = past.fanout.get(stage.name, 1.0) if pipeline[stage.after].kind == "fanout" else 1.0
        stages[stage.name]["estimated"] = round(upstream * ratio)


def _sample(pipeline: Pipeline, target: str, items: Sequence[SourceItem],
            sets: Sequence[str] = (), workers: int = 1) -> tuple[History, dict[str, Any]]:
    """Run ``items`` for real in a scratch store (publish stages left out), in ``workers`` worker processes (at
    most one per item), and measure them."""
    from conveyor.runtime.worker import Worker, WorkerOptions
    from conveyor.service.report import find_run, reconcile
    from conveyor.service.submit import submit

    scratch_pipeline = pipeline.without_publish()
    with tempfile.TemporaryDirectory(prefix="conveyor-sample-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'sample.db'}"
        blobs = FilesystemBlobs(Path(scratch) / "blobs")
        store = open_store(url)
        try:
            done = submit(scratch_pipeline, target, "sample", store, blobs, items=list(items),
                          options=SubmitOptions(sets=tuple(sets)))
            spawned = _sample_workers(target, url, blobs.root, done.run_id, min(max(1, workers), len(items)))
            # What the worker processes left (none when they all ran; all when they could not start), and a stage's
            # error said here as in a run.
            Worker(scratch_pipeline, target, url, blobs, WorkerOptions(run_id=done.run_id, until_idle=True)).run()
            measured = history(store, scratch_pipeline, 1, basis="sample")
            if not spawned:
                # The sample's worker ran in this process: a run's start-up also has its workers' own (an
                # interpreter that imports conveyor and loads the target), measured here as one of them would.
                measured = replace(measured, startup=measured.startup + worker_start(target))
            usage = reconcile(store, find_run(store, done.run_id))["usage"]
        finally:
            store.close()
    return measured, {"items": len(items), "provider_calls": usage["provider_calls"],
                      "tokens": usage["prompt_tokens"] + usage["completion_tokens"], "cost": usage["cost"]}


def _sample_workers(target: str, url: str, blobs: Path, run_id: str, count: int) -> bool:
    """Work the sample's run in ``count`` worker processes until it is idle; whether they all ran."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter that loads the target, as a run's worker
    procs = [context.Process(target=_sample_worker, args=(target, url, str(blobs), run_id))
             for _ in range(count)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            if proc.is_alive():  # interrupted: stop them, they hold scratch work only
                proc.terminate()
                proc.join()
    return all(proc.exitcode == 0 for proc in procs)


def _sample_worker(target: str, url: str, blobs: str, run_id: str) -> None:
    """One of the sample's worker processes: the target's pipeline without its publish stages, until idle."""
    os.dup2(2, 1)  # what stage code prints goes to stderr: the dry run's stdout carries only its report
    sys.stdout = sys.stderr
    from conveyor.runtime.target import load_target
    from conveyor.runtime.worker import Worker, WorkerOptions

    pipeline = load_target(target).without_publish()
    Worker(pipeline, target, url, FilesystemBlobs(Path(blobs)),
           WorkerOptions(run_id=run_id, until_idle=True, warn_stale_code=False)).run()


def worker_start(target: str) -> float:
    """Seconds a fresh interpreter takes to import conveyor and load ``target``, as a worker process does before
    its first claim (0 when it fails: the stage code's own errors are the sample's to report)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom conveyor.runtime.target import load_target\n"
                           "load_target(sys.argv[1])", target], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - started if done.returncode == 0 else 0.0


def _merged(past: History, measured: History) -> History:
    """The history, with the sample's measures for the stages it has none for."""
    stages = {**measured.stages, **past.stages}
    fanout = {**measured.fanout, **past.fanout}
    basis = "sample" if not past.stages else "history"
    return History(stages, past.runs or measured.runs, basis, fanout, past.startup if past.runs else measured.startup,
                   {**measured.groups, **past.groups})
