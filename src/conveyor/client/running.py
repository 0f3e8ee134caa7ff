"""Running a pipeline from Python: ``Pipeline.run`` and ``Pipeline.submit``, through service/runs.py as ``conveyor
run`` does (its fleet of worker processes, its reconciliation, its resumable interruption).

Where the work happens: in the calling thread, as on the command line; in a thread of its own when the caller's
thread runs an event loop (a Jupyter cell: the in-process worker runs its own loop with ``asyncio.run``, which
cannot nest), and always for ``submit``, which returns once the run exists. Ctrl-C while the caller waits for
such a thread sets the run's stop event (service/runs.py ``RunOptions.stop``), so it stops the way the command
line stops: the submission between items, the workers finishing or releasing their tasks (nothing paid for is
lost), and the run is left resumable (``Interrupted``, with the run id and how to resume). A second Ctrl-C stops
waiting for that.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from conveyor.client.inputs import Columns, Inputs, _items_of, resume_items
from conveyor.client.run import Run
from conveyor.client.workspace import Workspace
from conveyor.client.workspace import open as open_workspace
from conveyor.errors import Interrupted, UserError
from conveyor.pipeline import Pipeline, parse_limits
from conveyor.pipeline.budget import budget
from conveyor.pipeline.limits import ENV_VAR as LIMITS_ENV
from conveyor.runtime.target import loading_target, target_of
from conveyor.service.fleet import default_workers
from conveyor.service.report import find_run
from conveyor.service.runs import Progress, RunOptions, resume_run, run_pipeline
from conveyor.service.submit import SubmitOptions

INTERACTIVE = "<interactive>"  # the target a run records for a pipeline no other process can import
# The work on a run, given a callback told the run's id and the event that stops it; returns the run's summary.
Work = Callable[[Callable[[str], None], threading.Event], dict[str, Any]]


def run(pipeline: Pipeline, inputs: Inputs, *, store: Workspace | str | None = None, workers: int | None = None,
        budget_usd: float | None = None, params: Mapping[str, Any] | None = None, progress: bool = True,
        columns: Columns | None = None) -> Run:
    """``Pipeline.run``: submit ``inputs`` and process them to the end; the finished ``Run``."""
    workspace = _workspace(store)
    work = _new_run(pipeline, inputs, workspace, workers, budget_usd, params, progress, columns)
    job = _Job(workspace, work, loadable=target_of(pipeline) is not None)
    job.to_the_end()
    assert job.run_id is not None
    return Run(workspace, job.run_id, pipeline, job)


def submit(pipeline: Pipeline, inputs: Inputs, *, store: Workspace | str | None = None, workers: int | None = None,
           budget_usd: float | None = None, params: Mapping[str, Any] | None = None, progress: bool = False,
           columns: Columns | None = None) -> Run:
    """``Pipeline.submit``: the ``Run`` as soon as it exists, processed in the background (``Run.wait()``)."""
    workspace = _workspace(store)
    job = _Job(workspace, _new_run(pipeline, inputs, workspace, workers, budget_usd, params, progress, columns),
               loadable=target_of(pipeline) is not None)
    job.start()
    assert job.run_id is not None
    return Run(workspace, job.run_id, pipeline, job)


def resume(handle: Run, inputs: Inputs | None, workers: int | None, budget_usd: float | None,
           progress: bool, columns: Columns | None = None) -> None:
    """``Run.resume``: finish the run's submission (from ``inputs`` again, for one made from Python objects)
    and its tasks, as ``conveyor resume`` does."""
    workspace = handle.workspace
    items = resume_items(inputs, columns)
    with workspace.opened(create=False) as store:
        recorded = find_run(store, handle.id).target
    target = None if recorded.startswith(INTERACTIVE) else recorded
    if target is None and handle.pipeline is None:
        raise UserError(f"run {handle.id}'s pipeline was declared where it cannot be loaded again (a notebook cell): "
                        f"resume it with its Pipeline, conveyor.open(...).run({handle.id!r}, pipeline=pipe).resume()")

    def work(on_run: Callable[[str], None], stop: threading.Event) -> dict[str, Any]:
        on_run(handle.id)
        options = _options(_worker_count(workers, target, handle.pipeline_name), budget_usd, None, True, None, stop)
        with workspace.opened() as store, _progress(progress) as bar:
            return resume_run(handle.id, store, workspace.blob_store(writable=True), options, bar,
                              pipeline=handle.pipeline, items=items)

    job = _Job(workspace, work, loadable=target is not None)
    job.to_the_end()


def _new_run(pipeline: Pipeline, inputs: Inputs, workspace: Workspace, workers: int | None,
             budget_usd: float | None, params: Mapping[str, Any] | None, progress: bool,
             columns: Columns | None = None) -> Work:
    """The work of a new run, its input read and checked here (a bad one raises before anything exists)."""
    loading = loading_target()
    if loading is not None:
        raise UserError(f"{loading} starts a run when it is imported (a worker imports it to load the pipeline): "
                        'put pipe.run(...) under `if __name__ == "__main__":`')
    pipeline.validate()
    parse_limits(os.environ.get(LIMITS_ENV))  # before any worker starts: a bad CONVEYOR_LIMITS stops every one
    source = _items_of(inputs, columns)
    target = target_of(pipeline)
    count = _worker_count(workers, target, pipeline.name)
    blobs = workspace.blob_store(writable=True)

    def work(on_run: Callable[[str], None], stop: threading.Event) -> dict[str, Any]:
        options = _options(count, budget_usd, params, source.items is None, on_run, stop)
        with workspace.opened() as store, _progress(progress) as bar:
            return run_pipeline(pipeline, target or f"{INTERACTIVE}:{pipeline.name}", source.path, store, blobs,
                                options, bar, items=source.items)

    return work


def _options(workers: int, budget_usd: float | None, params: Mapping[str, Any] | None, same_input: bool,
             on_run: Callable[[str], None] | None, stop: threading.Event) -> RunOptions:
    """``same_input``: a run of a path finishes an unfinished run of the same input, as ``conveyor run`` again
    does; Python objects have no such identity (their label is their type), so they always make a new run."""
    submit = SubmitOptions(budget_usd=budget(budget_usd, "budget_usd"), params=params, resume_same=same_input,
                           stop=stop)
    return RunOptions(workers=workers, submit=submit, on_run=on_run, stop=stop)


def _worker_count(workers: int | None, target: str | None, name: str) -> int:
    """``workers``, by default one per CPU core as ``conveyor run``; 0 (this process) for a pipeline that worker
    processes cannot import."""
    if workers is None:
        return default_workers() if target is not None else 0
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UserError(f"workers={workers!r}: give a number of worker processes, or 0 to work in this process")
    if workers and target is None:
        raise UserError(f"pipeline {name!r} is declared where worker processes cannot import it (a notebook cell, "
                        "the interactive prompt): pass workers=0 to run it in this process, or declare it in a "
                        ".py file")
    return workers


def _workspace(store: Workspace | str | None) -> Workspace:
    if isinstance(store, Workspace):
        return store
    if store is None or isinstance(store, str):
        return open_workspace(store)
    raise UserError(f"store={store!r}: pass conveyor.open(...) or a database URL")


@contextmanager
def _progress(show: bool) -> Iterator[Progress | None]:
    """``conveyor run``'s progress (cli/render.py): bars on a terminal and in a notebook, else a line every few
    seconds; nothing when not ``show``."""
    if not show:
        yield None
        return
    from conveyor.cli.render import progress

    with progress(bars=True) as bar:
        yield bar


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Job:
    """The work on one run, in the calling thread (``here``) or a thread of its own (``start``), and its end: the
    run's summary, or the error it stopped on (``Interrupted`` told how to resume from here)."""

    def __init__(self, workspace: Workspace, work: Work, loadable: bool) -> None:
        self.workspace, self.work, self.loadable = workspace, work, loadable
        self.run_id: str | None = None
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.known = threading.Event()  # the run exists, or the work ended before it did
        self.ended = threading.Event()  # waited on rather than Thread.join, which Ctrl-C can leave confused
        self.stop = threading.Event()  # set on Ctrl-C: the work stops as the command line's does
        self.thread: threading.Thread | None = None

    def to_the_end(self) -> None:
        """Do the work here, or in its thread when this one runs an event loop; raise what it stopped on."""
        if _loop_running():
            self.start()
        else:
            self._main()
        self.wait()

    def start(self) -> None:
        """Start the work in its thread; return once the run exists (its error, when it failed before)."""
        self.thread = threading.Thread(target=self._main, name="conveyor-run", daemon=True)
        self.thread.start()
        self._until(self.known.wait)
        if self.run_id is None:
            self._raise()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end (at most ``timeout`` seconds: False when it has not come); raise what it stopped on."""
        if self.thread is not None and not self._until(lambda: self.ended.wait(timeout)):
            return False
        self._raise()
        return True

    def _main(self) -> None:
        try:
            self.summary = self.work(self._note, self.stop)
        except BaseException as exc:  # kept for the waiting thread, which raises it
            self.error = exc
        finally:
            self.known.set()
            self.ended.set()

    def _note(self, run_id: str) -> None:
        self.run_id = run_id
        self.known.set()

    def _until(self, wait: Callable[[], bool]) -> bool:
        """``wait()``, passing Ctrl-C on to the work's thread (which then stops as the command line does)."""
        try:
            return wait()
        except KeyboardInterrupt:
            if self.thread is None or self.ended.is_set():
                raise
            self.stop.set()
            self.ended.wait()  # the workers drain; a second Ctrl-C stops waiting (the thread goes on, a daemon)
            self._raise()
            raise

    def _raise(self) -> None:
        error = self.error
        if error is None:
            return
        self.error = None  # raised once; a later wait() returns
        if isinstance(error, Interrupted) and error.hint is None:
            raise Interrupted(error.run_id, self._resume_hint(error.run_id)) from None
        raise error

    def _resume_hint(self, run_id: str) -> str:
        again = f"{self.workspace.python_open()}.run({run_id!r}"
        if not self.loadable:  # declared in a notebook cell: only this process has its pipeline
            return f"{again}, pipeline=pipe).resume() (pipe: its Pipeline)"
        return f"{again}).resume(), or from a shell: {self.workspace.resume_command(run_id)}"
