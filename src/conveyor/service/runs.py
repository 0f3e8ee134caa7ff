"""Run a pipeline to completion: submit, start worker processes, watch, reconcile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.blobs import Blobs
from conveyor.pipeline import Pipeline
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.report import find_run, reconcile, run_status
from conveyor.service.submit import submit
from conveyor.store import SqlStore

Progress = Callable[[dict[str, Any]], None]


@dataclass
class RunOptions:
    workers: int = 1
    poll: float = 0.25
    max_restarts: int = 1000
    worker_args: list[str] = field(default_factory=list)


def run_pipeline(
    pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs,
    options: RunOptions, progress: Progress | None = None,
) -> dict[str, Any]:
    """Submit ``input_path`` and process the run to completion; return its summary."""
    submitted = submit(pipeline, target, input_path, store, blobs)
    if options.workers <= 0:
        Worker(pipeline, target, store.url, blobs, WorkerOptions(run_id=submitted.run_id, until_idle=True)).run()
    else:
        _supervise(target, submitted.run_id, store, blobs, options, progress)
    run = find_run(store, submitted.run_id)
    summary = reconcile(store, run)
    summary["workers"] = options.workers
    return summary


def _supervise(
    target: str, run_id: str, store: SqlStore, blobs: Blobs, options: RunOptions, progress: Progress | None,
) -> None:
    """Keep ``workers`` processes running until the run has no open task left."""
    procs = [_start_worker(target, run_id, store.url, blobs.url, options) for _ in range(options.workers)]
    restarts = 0
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while True:
            time.sleep(options.poll)
            if progress is not None:
                progress(run_status(store, find_run(store, run_id)))
            open_tasks = store.open_tasks(run_id)
            for index, proc in enumerate(procs):
                code = proc.poll()
                if code is None:
                    continue
                if open_tasks and restarts < options.max_restarts:
                    # A stage that kills its process must not stop the run: start a new worker.
                    restarts += 1
                    procs[index] = _start_worker(target, run_id, store.url, blobs.url, options)
            if open_tasks == 0 and all(p.poll() is not None for p in procs):
                return
            if restarts >= options.max_restarts and all(p.poll() is not None for p in procs):
                return
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_all(procs)  # workers finish or release their in-flight tasks
        if progress is not None:
            progress(run_status(store, find_run(store, run_id)))


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _start_worker(target: str, run_id: str, db: str, blobs: str, options: RunOptions) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id,
           "--db", db, "--blobs", blobs, "--quiet", *options.worker_args]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=os.environ.copy())


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 30
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
