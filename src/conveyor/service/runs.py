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
    lane: str = "bulk"
    worker_args: list[str] = field(default_factory=list)


def run_pipeline(
    pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs,
    options: RunOptions, progress: Progress | None = None,
) -> dict[str, Any]:
    """Submit ``input_path`` and process the run to completion; return its summary.

    Worker processes start as soon as the run exists, so processing overlaps the
    rest of the submission.
    """
    if options.workers <= 0:
        run_id = submit(pipeline, target, input_path, store, blobs, lane=options.lane).run_id
        Worker(pipeline, target, store.url, blobs, WorkerOptions(run_id=run_id, until_idle=True)).run()
    else:
        fleet = Fleet(pipeline.name, target, store, blobs, options)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            run_id = submit(pipeline, target, input_path, store, blobs, on_work=fleet.start,
                            lane=options.lane).run_id
            if fleet.procs:
                fleet.watch(progress)
        finally:
            signal.signal(signal.SIGTERM, previous)
            fleet.stop()  # workers finish or release their in-flight tasks
    summary = reconcile(store, find_run(store, run_id))
    summary["workers"] = options.workers
    return summary


class Fleet:
    """Worker processes for one run, restarted when a stage kills them, until the run is done."""

    def __init__(self, pipeline: str, target: str, store: SqlStore, blobs: Blobs, options: RunOptions) -> None:
        self.pipeline, self.target, self.store, self.blobs, self.options = pipeline, target, store, blobs, options
        self.run_id = ""
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts = 0

    def start(self, run_id: str) -> None:
        self.run_id = run_id
        self.procs = [self._spawn() for _ in range(self.options.workers)]

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "conveyor", "worker", self.target, "--until-idle", "--run", self.run_id,
               "--db", self.store.url, "--blobs", self.blobs.url, "--quiet", *self.options.worker_args]
        # Whatever stage code prints goes to stderr: stdout carries only the run's summary (--json).
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), env=os.environ.copy())

    def watch(self, progress: Progress | None) -> None:
        """Return when every worker has exited and the run has no open task.

        Workers leave on their own once the run is done (``--until-idle``); the
        store is asked only when one died or all are gone, or to draw progress.
        """
        while True:
            time.sleep(self.options.poll)
            if progress is not None:
                progress(run_status(self.store, find_run(self.store, self.run_id)))
            exited = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            crashed = [i for i in exited if self.procs[i].returncode != 0]
            if len(exited) < len(self.procs) and not crashed:
                continue
            open_tasks = self.store.open_tasks(self.pipeline, self.run_id)
            for index in exited if open_tasks else []:
                if self.restarts < self.options.max_restarts:
                    # A stage that kills its process must not stop the run: start a new worker.
                    self.restarts += 1
                    self.procs[index] = self._spawn()
            if all(p.poll() is not None for p in self.procs):
                if progress is not None:
                    progress(run_status(self.store, find_run(self.store, self.run_id)))
                return

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


