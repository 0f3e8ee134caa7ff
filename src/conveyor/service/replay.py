"""Replay: re-open a selection of tasks, succeeded ones too, under their stages' current code, with a reason.

``retry`` (the work failed and should be tried again), ``reprocess`` (the code, a prompt or a model changed),
``source-corrected`` (the items' sources were fixed: they are read again from the run's input, and everything
after them runs on the new bytes) and ``manual``. Each re-opened task gets its stage's current version and
config, a fresh attempt budget and tier 0; its memoised refusal is forgotten, so a rejected or failed answer is
asked again, while an output the memo holds for the new key answers it for one lookup (to run a stage again on
the same input, change its version or config). ``downstream`` also supersedes what lies after each re-opened
task on its item, so it is made again from the new output. A dry run writes nothing and says what would run.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import UserError
from conveyor.pipeline import Pipeline
from conveyor.runtime import transitions
from conveyor.runtime.reopen import Plan, ReopenPlanner, Sources
from conveyor.runtime.target import load_target
from conveyor.runtime.values import INLINE_MAX, Ref
from conveyor.service.forecast import forecast, history, limits_of
from conveyor.service.inputs import iter_items
from conveyor.service.report import find_run
from conveyor.service.review import reviewer
from conveyor.service.selection import Condition, Selection, _pages, select
from conveyor.service.submit import _read_limit, source_ref
from conveyor.store import RunRecord, SqlStore
from conveyor.store.selection import SelectedTask, TaskFilter
from conveyor.store.tasks import chunks

REASONS = ("retry", "reprocess", "source-corrected", "manual")


@dataclass(frozen=True)
class ReplayOptions:
    reason: str
    note: str | None = None
    downstream: bool = False
    dry_run: bool = False
    by: str | None = None
    target: str | None = None  # the pipeline to load (default: the TARGET each run recorded)
    pipeline: Pipeline | None = None  # ... or the pipeline itself
    workers: int = 1  # worker processes the forecast of a dry run assumes
    tenant: str | None = None  # an API tenant replays only runs of its own jobs, named

    @property
    def corrected(self) -> bool:
        return self.reason == "source-corrected"

    def message(self) -> str:
        return f"{self.reason}: {self.note}" if self.note else self.reason


def replay(store: SqlStore, blobs: Blobs, selection: Selection, options: ReplayOptions) -> dict[str, Any]:
    """Re-open what ``selection`` names (see the module's docstring); the report says, per stage, the tasks
    re-opened, how many of them the memo answers, how many will run, and what was superseded."""
    if options.reason not in REASONS:
        raise UserError(f"--reason {options.reason!r}: use one of {', '.join(REASONS)} (say more with --note)")
    _check_tenant(store, selection, options.tenant)
    chosen = select(store, selection)
    pipelines = {run_id: _pipeline(run, options) for run_id, run in chosen.runs.items()}
    by = options.by or reviewer()
    now = store.clock()
    replay_id = 0 if options.dry_run else store.start_replay(
        options.reason, options.note, json.dumps(selection.as_json(), sort_keys=True), options.downstream,
        json.dumps(sorted(chosen.runs)), now, by)
    totals = _Totals()
    needs = _source_needs(store, selection, chosen.runs, pipelines, options)
    for run_id, run in chosen.runs.items():
        planner = ReopenPlanner(pipelines[run_id], store, run_id, replay_id, options.downstream or options.corrected,
                                options.corrected)
        sources = _read_sources(run, needs.get(run_id, set()), blobs, pipelines[run_id], options.dry_run)
        for page in _replay_pages(store, selection, run, pipelines[run_id], options):
            totals.selected += len(page)
            selected = _selected_on(store, selection, run_id, page) if options.downstream else None
            plan = planner.plan(page, selected, sources, store.clock())
            totals.add(plan, run.pipeline)
            if options.dry_run:
                downstream = store.downstream_counts(plan.downstream)
                totals.superseded.update(downstream)
                totals.to_run[run.pipeline].update(downstream)
                if plan.reopen:
                    totals.runs.add(run_id)
                continue
            done, superseded = transitions.reopen(store, plan, replay_id, run_id, options.message(), f"replay:{by}",
                                                  store.clock())
            totals.written(plan, done, superseded)
            if done:
                totals.runs.add(run_id)
    if not options.dry_run:
        store.finish_replay(replay_id)
    report = totals.report(replay_id, options, selection)
    firsts = {s.name for p in pipelines.values() for s in p.roots}
    report["hint"] = (f"first stages ({', '.join(sorted(firsts & set(totals.reopen)))}) run again on the source bytes "
                      "the run read; if you fixed the files, replay them with --reason source-corrected"
                      if not options.corrected and firsts & {s for s, n in totals.reopen.items() if n} else None)
    if options.dry_run:
        report["forecast"] = _forecast(store, pipelines, totals, options.workers)
    return report


def _check_tenant(store: SqlStore, selection: Selection, tenant: str | None) -> None:
    """A tenant names the runs it replays, each one of its jobs' (NotFound otherwise, as for a missing run)."""
    if tenant is None:
        return
    if not selection.runs:
        raise UserError("name the runs to replay (your jobs' ids); a tenant replays only its own jobs")
    for run_id in selection.runs:
        find_run(store, run_id, tenant)


def _forecast(store: SqlStore, pipelines: dict[str, Pipeline], totals: _Totals, workers: int) -> dict[str, Any]:
    """The forecast of what the dry run says would run (downstream tasks counted as if the memo answered none
    of them: an upper bound), from each pipeline's history."""
    by_name = {p.name: p for p in pipelines.values()}
    forecasts = {name: forecast(by_name[name], history(store, by_name[name]), to_run, workers, limits_of(by_name[name]))
                 for name, to_run in totals.to_run.items() if name in by_name}
    if len(forecasts) == 1:
        return next(iter(forecasts.values()))
    return {"pipelines": forecasts, "basis": "per pipeline"}


def _pipeline(run: RunRecord, options: ReplayOptions) -> Pipeline:
    try:
        pipeline = options.pipeline or load_target(options.target or run.target)
    except UserError as exc:
        if options.target or options.pipeline:
            raise
        raise UserError(f"{exc}; run {run.run_id} was made with {run.target}: if its pipeline file moved, give "
                        "--target FILE.py:NAME") from None
    if pipeline.name != run.pipeline:
        raise UserError(f"run {run.run_id} belongs to pipeline {run.pipeline!r}, not {pipeline.name!r}; give the "
                        "TARGET that declares it")
    return pipeline


def _replay_pages(store: SqlStore, selection: Selection, run: RunRecord, pipeline: Pipeline,
                  options: ReplayOptions) -> Iterator[list[SelectedTask]]:
    """The selected tasks of one run, a page at a time; for a corrected source, the first tasks of their root
    items instead (everything after them runs on the new bytes)."""
    one = Selection(**{**selection.__dict__, "runs": (run.run_id,)})
    if not options.corrected:
        for page in select(store, one).pages:
            yield page
        return
    firsts = tuple(s.name for s in pipeline.roots)
    seen: set[str] = set()
    for page in select(store, one).pages:
        roots = sorted({t.root_key for t in page} - seen)
        seen.update(roots)
        for first_page in _pages(store, TaskFilter((run.run_id,), firsts), roots):
            yield [t for t in first_page if t.item_key == t.root_key]


def _selected_on(store: SqlStore, selection: Selection, run_id: str, page: Sequence[SelectedTask]
                 ) -> set[tuple[str, str]]:
    """Every (item key, stage) the selection holds on these tasks' root items (across all its pages)."""
    roots = sorted({t.root_key for t in page})
    held: set[tuple[str, str]] = set()
    for part in chunks(roots, 400):
        narrowed = Selection(**{**selection.__dict__, "runs": (run_id,), "items": tuple(part)})
        for task in select(store, narrowed).tasks:
            held.add((task.item_key, task.stage))
    return held


def _source_needs(store: SqlStore, selection: Selection, runs: dict[str, RunRecord],
                  pipelines: dict[str, Pipeline], options: ReplayOptions) -> dict[str, set[str]]:
    """Per run, the root items whose sources must be read again (a first pass over the selection)."""
    needs: dict[str, set[str]] = {}
    for run_id, run in runs.items():
        planner = ReopenPlanner(pipelines[run_id], store, run_id, 0, options.downstream, options.corrected)
        for page in _replay_pages(store, selection, run, pipelines[run_id], options):
            wanted = planner.needs_sources(page)
            if wanted:
                needs.setdefault(run_id, set()).update(wanted)
    return needs


def _read_sources(run: RunRecord, keys: set[str], blobs: Blobs, pipeline: Pipeline, dry_run: bool) -> Sources:
    """The sources of ``keys`` as the run's input holds them now (one pass over the manifest or folder)."""
    found: dict[str, Ref | str] = {}
    if not keys:
        return Sources(found)
    try:
        items = iter_items(run.input, skip_bad_lines=True)
        for item in items:
            if item.key not in keys:
                continue
            if item.problem is not None:
                found[item.key] = item.problem
                continue
            try:
                found[item.key] = _digest_only(item) if dry_run else source_ref(item, blobs, _read_limit(pipeline))
            except OSError as exc:
                found[item.key] = f"{item.where} could not be read: {exc.strerror or exc}"
            if len(found) == len(keys):
                break
    except (OSError, UserError) as exc:
        raise UserError(f"run {run.run_id}'s input {run.input} cannot be read again ({exc}); the sources of "
                        f"{len(keys):,} item(s) are needed to run their first stage again") from None
    return Sources(found)


def _digest_only(item: Any) -> Ref:
    """A source's reference without storing it (a dry run writes nothing); streamed, so a large source is never
    held whole."""
    if item.text is not None:
        data = item.text
        return Ref("bytes", hashlib.sha256(data).hexdigest(), len(data), data if len(data) <= INLINE_MAX else None)
    if item.remote is not None:
        return _streamed_ref(item.remote.chunks())
    with item.path.open("rb") as source:
        return _streamed_ref(iter(lambda: source.read(1 << 20), b""))


def _streamed_ref(chunks: Iterator[bytes]) -> Ref:
    digest = hashlib.sha256()
    size = 0
    kept: list[bytes] = []
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        if size <= INLINE_MAX:
            kept.append(chunk)
    return Ref("bytes", digest.hexdigest(), size, b"".join(kept) if size <= INLINE_MAX else None)


class _Totals:
    def __init__(self) -> None:
        self.selected = 0
        self.reopen: Counter[str] = Counter()
        self.memo: Counter[str] = Counter()
        self.superseded: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.runs: set[str] = set()
        self.corrected = 0
        self.to_run: defaultdict[str, Counter[str]] = defaultdict(Counter)  # pipeline -> stage -> tasks to run

    def add(self, plan: Plan, pipeline: str) -> None:
        self.skipped.update(plan.skipped)
        for task_id, stage in plan.stage_of.items():
            answered = plan.answered.get(task_id, False)
            self.reopen[stage] += 1
            self.memo[stage] += int(answered)
            if not answered:
                self.to_run[pipeline][stage] += 1
        self.corrected += len(plan.corrected)

    def written(self, plan: Plan, done: Sequence[int], superseded: dict[str, int]) -> None:
        """A task no longer ended by the time its page was written was left as it is."""
        left = set(plan.stage_of) - set(done)
        for task_id in left:
            stage = plan.stage_of[task_id]
            self.reopen[stage] -= 1
            self.memo[stage] -= int(plan.answered.get(task_id, False))
            self.skipped["changed_meanwhile"] += 1
        self.superseded.update(superseded)

    def report(self, replay_id: int, options: ReplayOptions, selection: Selection) -> dict[str, Any]:
        stages = sorted(set(self.reopen) | set(self.superseded))
        return {
            "replay_id": replay_id or None, "dry_run": options.dry_run, "reason": options.reason,
            "note": options.note, "downstream": options.downstream or options.corrected,
            "selection": selection.as_json(), "selected": self.selected,
            "reopened": sum(self.reopen.values()), "superseded": sum(self.superseded.values()),
            "sources_corrected": self.corrected,
            "stages": {s: {"reopen": self.reopen[s], "memo": self.memo[s], "run": self.reopen[s] - self.memo[s],
                           "superseded": self.superseded[s]} for s in stages},
            "skipped": dict(sorted((k, v) for k, v in self.skipped.items() if v)),
            "runs": sorted(self.runs),
        }



REQUEUE_STATUSES = ("failed", "dead_lettered", "rejected")


def requeue(
    pipeline: Pipeline, store: SqlStore, blobs: Blobs, run_id: str, stage: str, reason: str,
    statuses: Sequence[str] = ("failed", "dead_lettered"), error_class: str | None = None,
    stage_version: str | None = None,
) -> dict[str, Any]:
    """A replay (reason ``retry``) of ended tasks of one stage that did not succeed, under its current version
    and config. "re-run extract where it failed with http_400 under version 3" is::

        requeue(pipe, store, blobs, run_id, "extract", "prompt fixed", ("failed",), "http_400", "3")

    Each task gets a fresh attempt budget, tier 0 and a task key for the current code; its memoised refusal
    (a rejection too) is forgotten; ``reason`` is recorded in its attempt history. An item whose source could
    not be read (``bad_input``) runs again once its source can be read."""
    if not reason.strip():
        raise UserError("a requeue needs --reason \"why\"; it is recorded with each task")
    run = find_run(store, run_id)
    spec = _pipeline(run, ReplayOptions("retry", pipeline=pipeline))[stage]
    wrong = sorted(set(statuses) - set(REQUEUE_STATUSES))
    if wrong:
        raise UserError(f"--status {wrong[0]!r}: requeue runs {', '.join(REQUEUE_STATUSES)} tasks again "
                        "(`conveyor replay` re-opens any)")
    where = (Condition("stage_version", "=", stage_version),) if stage_version else ()
    selection = Selection(runs=(run.run_id,), stages=(stage,), statuses=tuple(statuses),
                          error_classes=(error_class,) if error_class else (), where=where)
    done = replay(store, blobs, selection, ReplayOptions("retry", note=reason, pipeline=pipeline))
    unreadable = sum(done["skipped"].get(k, 0) for k in ("source_unreadable", "source_not_in_input", "bad_input"))
    return {"run_id": run.run_id, "stage": stage, "requeued": done["reopened"], "stage_version": spec.version,
            "reason": reason, "bad_input_skipped": unreadable, "replay_id": done["replay_id"]}


def process_replay(store: SqlStore, blobs: Blobs, run_ids: Sequence[str], workers: int,
                   progress: Any = None, budget_usd: float | None = None) -> list[dict[str, Any]]:
    """Process the runs a replay re-opened work in, to the end (as ``conveyor resume`` does, ``budget_usd``
    their new budget when given), in this one command; returns each run's reconciliation."""
    from conveyor.service.runs import RunOptions, resume_run
    from conveyor.service.submit import SubmitOptions

    options = RunOptions(workers=workers, submit=SubmitOptions(budget_usd=budget_usd))
    return [resume_run(run_id, store, blobs, options, progress) for run_id in run_ids]
