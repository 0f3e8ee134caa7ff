"""Run a pipeline to completion: submit, start worker processes, watch, reconcile; or resume a run."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import ConveyorError, UserError
from conveyor.errors import Interrupted as Interrupted  # where the commands have always found it
from conveyor.pipeline import Pipeline
from conveyor.runtime.alerts import evaluate as evaluate_alerts
from conveyor.runtime.services import require_provider
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.declarations import check_same
from conveyor.service.fleet import USER_ERROR_EXIT, Process, default_workers, stop_processes
from conveyor.service.forks import WorkerForks, WorkOrder
from conveyor.service.inputs import SourceItem, memory_input
from conveyor.service.report import find_run, reconcile, run_progress
from conveyor.service.submit import SubmitOptions, Submitted, submit
from conveyor.store import UNFINISHED_RUNS, RunRecord, SqlStore

# Called every poll with a function that reads the run's status: the status is read (a count over the
# run's tasks) only when the caller is about to show it.
Progress = Callable[[Callable[[], dict[str, Any]]], None]

log = logging.getLogger("conveyor.run")


@dataclass
class RunOptions:
    workers: int = field(default_factory=default_workers)
    poll: float = 0.25
    max_restarts: int = 1000
    lane: str = "bulk"
    worker_args: list[str] = field(default_factory=list)
    provider_batch: bool = False  # every model-calling stage on the provider batch lane (--provider-batch)
    submit: SubmitOptions = field(default_factory=SubmitOptions)
    on_run: Callable[[str], None] | None = None  # told the run's id once it exists (the Python API's Run)
    # Set from another thread (the Python API's, on Ctrl-C): the run stops as on Ctrl-C, its workers finishing or
    # releasing their tasks, and becomes Interrupted. Give the same event to ``submit.stop``.
    stop: threading.Event | None = None
    # Workers forked by the caller before it opened the store (service/forks.py), taken as the run's first
    # workers; the ones not taken are told to exit once the submission is done. None: new processes.
    forks: WorkerForks | None = None


def run_pipeline(
    pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs,
    options: RunOptions, progress: Progress | None = None, items: Iterable[SourceItem] | None = None,
) -> dict[str, Any]:
    """Submit ``input_path`` (or ``items``, with ``input_path`` as the run's input label) and process the run to
    completion; return its summary.

    Worker processes start as soon as the run exists, so processing overlaps the
    rest of the submission. Stages that call a model stop the run before anything is
    submitted when no provider is configured (ProviderUnavailable).
    """
    require_provider(pipeline)
    fleet = Fleet(pipeline.name, target, store, blobs, options)

    def submission(on_work: Callable[[str], None] | None) -> Submitted:
        return submit(pipeline, target, input_path, store, blobs, items=items, on_work=on_work, lane=options.lane,
                      options=options.submit, on_run=fleet.note_run)

    return _process(pipeline, fleet, progress, submission)


def resume_run(run_id: str, store: SqlStore, blobs: Blobs, options: RunOptions,
               progress: Progress | None = None, pipeline: Pipeline | None = None,
               items: Iterable[SourceItem] | None = None) -> dict[str, Any]:
    """Finish a run: its submission, when that stopped part way, and then its tasks. A paused run carries on
    (with ``options.submit.budget_usd`` as its new budget, when given): one paused by its breaker first
    re-opens the tasks that failed the way that tripped it. ``pipeline``: the run's pipeline as this process
    holds it (default: loaded from the run's target); ``items``: the input again, for a run submitted from
    Python objects (its recorded input is only a label), needed when its submission stopped part way."""
    run = find_run(store, run_id)
    pipeline = load_target(run.target) if pipeline is None else pipeline
    check_same(store, run, pipeline)
    require_provider(pipeline)
    unfinished = run.status in UNFINISHED_RUNS
    if unfinished and items is None and memory_input(run.input):
        raise UserError(f"run {run.run_id} was submitted from Python objects and its submission stopped part way; "
                        "give them again from Python: run.resume(inputs=...) (items already submitted are kept, "
                        "none twice)")
    carry_on(store, blobs, run, pipeline, options.submit.budget_usd)

    def submission(on_work: Callable[[str], None] | None) -> Submitted:
        if not unfinished:
            if on_work is not None:
                on_work(run.run_id)
            return Submitted(run.run_id, run.expected, 0)
        again = replace(options.submit, resume=run.run_id)
        return submit(pipeline, run.target, run.input, store, blobs, items=items, on_work=on_work, lane=run.lane,
                      options=again, on_run=fleet.note_run)

    fleet = Fleet(pipeline.name, run.target, store, blobs, options)
    return _process(pipeline, fleet, progress, submission)


def carry_on(store: SqlStore, blobs: Blobs, run: RunRecord, pipeline: Pipeline, budget: float | None) -> None:
    """Unpause ``run`` (setting ``budget`` when given); a run paused on its budget needs a larger one."""
    if run.paused is None:
        if budget is not None:
            store.resume_paused(run.run_id, budget, keep_budget=False)
        return
    spent, reserved = store.spent(run.run_id)
    if run.paused == "budget" and budget is None and run.budget_usd is not None:
        raise UserError(f"run {run.run_id} is paused: it spent ${spent:.4f} of its ${run.budget_usd:.4f} budget; "
                        f"carry on with `conveyor resume {run.run_id} --budget-usd MORE`")
    if budget is not None and budget <= spent + reserved:  # calls still in flight keep their reservations
        raise UserError(f"--budget-usd {budget:g} is not more than the ${spent + reserved:.4f} run {run.run_id} has "
                        "spent and reserved for calls in flight; give a larger budget")
    store.resume_paused(run.run_id, budget, keep_budget=budget is None)
    if run.paused.startswith("breaker:"):
        from conveyor.service.replay import ReplayOptions, replay
        from conveyor.service.selection import Selection

        tripped = run.paused.split(":", 1)[1]
        again = Selection(runs=(run.run_id,), statuses=("failed", "dead_lettered"), error_classes=(tripped,))
        replay(store, blobs, again, ReplayOptions("retry", note=f"the run's breaker had tripped on {tripped}",
                                                   pipeline=pipeline))


def _process(pipeline: Pipeline, fleet: Fleet, progress: Progress | None,
             submission: Callable[[Callable[[str], None] | None], Submitted]) -> dict[str, Any]:
    store, options, target, blobs = fleet.store, fleet.options, fleet.target, fleet.blobs
    with _interruptible(fleet):
        if options.workers <= 0:
            done = submission(None)
            fleet.release_forks()
            fleet.run_id = done.run_id
            worker = Worker(pipeline, target, store.url, blobs, WorkerOptions(
                run_id=done.run_id, until_idle=True, provider_batch=options.provider_batch))
            with _shown(fleet, progress), _stopping(options.stop, worker.request_stop):
                worker.run()
            if options.stop is not None and options.stop.is_set():
                raise KeyboardInterrupt("stopped")  # the worker drained: the run is left as Ctrl-C leaves it
        else:
            done = submission(fleet.start)
            fleet.release_forks()  # none needed, or more than were taken: they exit now
            fleet.run_id = done.run_id
            if fleet.procs:
                fleet.watch(progress)
    last_alerts(store, pipeline)
    summary = reconcile(store, find_run(store, done.run_id))
    summary["workers"] = options.workers
    summary["resumed"] = done.resumed
    return summary


@contextmanager
def _shown(fleet: Fleet, progress: Progress | None) -> Iterator[None]:
    """Progress while this process works the run itself (no fleet to watch): drawn from a thread every poll,
    with the caller's store, which nothing else uses meanwhile (the worker has its own)."""
    if progress is None:
        yield
        return

    def draw(ended: threading.Event) -> None:
        while not ended.wait(fleet.options.poll):
            progress(fleet.status)

    with _beside("conveyor-progress", draw):
        yield
    progress(fleet.status)


@contextmanager
def _stopping(stop: threading.Event | None, request_stop: Callable[[], None]) -> Iterator[None]:
    """While this process works the run, ``stop`` set asks the worker to stop (as its Ctrl-C handler would, which
    only the main thread has); asked again every poll until it ends, since it cannot stop before it started."""
    if stop is None:
        yield
        return

    def watch(ended: threading.Event) -> None:
        while not ended.is_set():
            if stop.wait(0.1):
                try:
                    request_stop()
                except RuntimeError:  # its loop is closed: the worker has ended already
                    return
                ended.wait(0.1)

    with _beside("conveyor-stop", watch):
        yield


@contextmanager
def _beside(name: str, loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """``loop(ended)`` in a daemon thread while the block runs; ``ended`` is set, and the thread joined, after."""
    ended = threading.Event()
    thread = threading.Thread(target=loop, args=(ended,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        ended.set()
        thread.join()


def last_alerts(store: SqlStore, pipeline: Pipeline) -> None:
    """Evaluate the pipeline's alerts once more as a run ends: a run shorter than its workers' first keeper round
    (a small corpus) still raises what it caused. Logged, never raised: the run's summary comes first."""
    if pipeline.alerts is None:
        return
    try:
        evaluate_alerts(store, pipeline, store.clock(), 0.0)
    except ConveyorError as exc:
        log.warning("could not evaluate the alerts of %s at the end of the run: %s", pipeline.name, exc,
                    extra={"event": "alerts_failed"})


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so both stop the same way. Off the main thread
    (a run of the Python API under a running event loop) signals cannot be handled: the caller sets RunOptions.stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _interruptible(fleet: Fleet) -> Iterator[None]:
    """SIGTERM or Ctrl-C stops the workers (they finish or release their tasks) and, once the run
    exists, becomes Interrupted(run_id) so the caller can say how to resume it."""
    try:
        with sigterm_as_interrupt():
            yield
    except KeyboardInterrupt:
        if fleet.run_id and fleet.store.get_run(fleet.run_id) is not None:
            raise Interrupted(fleet.run_id) from None
        raise
    finally:
        fleet.stop()


class Fleet:
    """Worker processes for one run, restarted when a stage kills them, until the run is done."""

    def __init__(self, pipeline: str, target: str, store: SqlStore, blobs: Blobs, options: RunOptions) -> None:
        self.pipeline, self.target, self.store, self.blobs, self.options = pipeline, target, store, blobs, options
        self.run_id = ""
        self.procs: list[Process] = []
        self.restarts = 0

    def note_run(self, run_id: str) -> None:
        self.run_id = run_id
        if self.options.on_run is not None:
            self.options.on_run(run_id)

    def start(self, run_id: str) -> None:
        self.run_id = run_id
        self.procs = [self._forked() or self._spawn() for _ in range(self.options.workers)]

    def _forked(self) -> Process | None:
        """A worker forked before the store was opened, now told to work the run; None when there is none."""
        if self.options.forks is None:
            return None
        folder = getattr(self.blobs, "root", None)  # a folder by its path: a file: URL would import urllib.request
        return self.options.forks.take(WorkOrder(self.run_id, self.store.url, self.blobs.url if folder is None
                                                 else str(folder), self.options.provider_batch))

    def release_forks(self) -> None:
        if self.options.forks is not None:
            self.options.forks.close()

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "conveyor", "worker", self.target, "--until-idle", "--run", self.run_id,
               "--db", self.store.url, "--blobs", self.blobs.url, "--quiet", *self.options.worker_args]
        if self.options.provider_batch:
            cmd.append("--provider-batch")
        # Whatever stage code prints goes to stderr: stdout carries only the run's summary (--json).
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=_stderr_fd(), env=os.environ.copy())

    def watch(self, progress: Progress | None) -> None:
        """Return when every worker has exited and the run has no open task.

        Workers leave on their own once the run is done (``--until-idle``); the
        store is asked only when one died or all are gone, or to draw progress.
        A worker that stops on a user error (exit 2: it printed why) stops the run.
        """
        while True:
            self._pause()
            if self.options.stop is not None and self.options.stop.is_set():
                raise KeyboardInterrupt("stopped")  # as Ctrl-C: the caller stops the workers, gently
            if progress is not None:
                progress(self.status)
            exited = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            if any(self.procs[i].returncode == USER_ERROR_EXIT for i in exited):
                raise UserError(f"a worker of run {self.run_id} stopped on the error above; fix it, then "
                                f"`conveyor resume {self.run_id}`")
            crashed = [i for i in exited if self.procs[i].returncode != 0]
            if len(exited) < len(self.procs) and not crashed:
                continue
            run = self.store.get_run(self.run_id)
            paused = run is not None and run.paused is not None  # its tasks wait for `conveyor resume`
            open_tasks = not paused and self.store.any_open_tasks(self.pipeline, self.run_id)
            for index in exited if open_tasks else []:
                if self.restarts < self.options.max_restarts:
                    # A stage that kills its process must not stop the run: start a new worker.
                    self.restarts += 1
                    self.procs[index] = self._spawn()
            if all(p.poll() is not None for p in self.procs):
                if progress is not None:
                    progress(self.status)
                return

    def _pause(self) -> None:
        """One poll's wait, cut short when a worker that was running exits: the run's end is seen at once."""
        running = [p for p in self.procs if p.poll() is None]
        deadline, delay = time.monotonic() + self.options.poll, 0.002
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or any(p.poll() is not None for p in running):
                return
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.025)

    def status(self) -> dict[str, Any]:
        return run_progress(self.store, find_run(self.store, self.run_id))

    def stop(self) -> None:
        stop_processes(self.procs, grace_s=30)


def _stderr_fd() -> int:
    """The descriptor of this process's stderr, for a worker's output: in a Jupyter kernel ``sys.stderr`` is a
    stream of the notebook's with no descriptor, and the kernel's own stderr (its terminal or log) takes it."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                return stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
            continue
    return 2


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
