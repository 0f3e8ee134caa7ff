"""Selections: which tasks a filter names (`conveyor select`), streamed, with each task's provenance.

Filters combine (all must hold): runs, stages, statuses (any by default, ``succeeded`` included), error
classes, items (a glob, or a file of keys), provenance comparisons (``--where "parser < 1.24.10 and schema =
3"``, versions compared as versions), models, a time window, and reconciliation outcomes of the item. The
same selection is what `conveyor replay` re-opens.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conveyor.acceptance.declare import seconds
from conveyor.errors import NotFound, PipelineError, UserError
from conveyor.service.records import RunGraph
from conveyor.store import CHILD_MARK, RunRecord, SqlStore, TaskStatus
from conveyor.store.provenance import sort_key
from conveyor.store.selection import (
    COLUMN_NAMES,
    REVIEW_STATES,
    UNSETTLED,
    ProvenanceTerm,
    SelectedTask,
    TaskFilter,
)
from conveyor.store.tasks import chunks

PAGE = 1000
__all__ = ["OUTCOMES", "REVIEW_STATES", "STATUSES", "Selection", "select", "select_report", "selection_of"]
STATUSES = tuple(s.value for s in TaskStatus)
OUTCOMES = ("in_progress", "accepted", "awaiting_review", "dead_lettered", "failed", "rejected", "published",
            "completed", "superseded")
# Without --status, an outcome selects the tasks that make it: an item is failed because a task failed.
OUTCOME_STATUSES: dict[str, tuple[str, ...]] = {
    "failed": ("failed",), "dead_lettered": ("dead_lettered",), "rejected": ("rejected",),
    "awaiting_review": ("awaiting_review",), "in_progress": ("queued", "running"), "accepted": ("succeeded",),
    "published": ("succeeded",), "completed": ("succeeded",), "superseded": ("superseded",)}
# Names --where compares that are not provenance rows: task columns, the item's source, the stage's code.
BUILTIN = ("stage_version", "version", "config_hash", "source", "code")
_CONDITION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(<=|>=|!=|==|=|<|>)\s*(.*?)\s*")


@dataclass(frozen=True)
class Condition:
    name: str
    op: str
    value: str

    def holds(self, actual: str | None) -> bool:
        """For a built-in name evaluated here (values compare as versions)."""
        if actual is None:
            return self.op == "!="
        a, b = sort_key(actual), sort_key(self.value)
        return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[self.op]


@dataclass(frozen=True)
class Selection:
    """A filter over tasks; every field optional (see the module's docstring)."""

    runs: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    error_classes: tuple[str, ...] = ()
    item_glob: str | None = None
    items: tuple[str, ...] = ()
    where: tuple[Condition, ...] = ()
    models: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    outcomes: tuple[str, ...] = ()
    key_prefix: str | None = None  # root items whose key starts so
    error_text: str | None = None  # words found in the task's error message (store/errortext.py)
    review_states: tuple[str, ...] = ()  # the task has a review entry in one of these states

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in {
            "runs": list(self.runs), "stages": list(self.stages), "statuses": list(self.statuses),
            "error_classes": list(self.error_classes), "item": self.item_glob, "items": len(self.items) or None,
            "where": " and ".join(f"{c.name} {c.op} {c.value}" for c in self.where) or None,
            "models": list(self.models), "since": self.since, "until": self.until, "outcomes": list(self.outcomes),
            "key_prefix": self.key_prefix, "error_text": self.error_text, "review_states": list(self.review_states),
        }.items() if v not in (None, [], ())}


@dataclass
class Selected:
    """A selection's tasks, streamed a page at a time, and the runs it looked at."""

    pages: Iterator[list[SelectedTask]]
    runs: dict[str, RunRecord] = field(default_factory=dict)

    @property
    def tasks(self) -> Iterator[SelectedTask]:
        for page in self.pages:
            yield from page


# --- parsing what a user typed --------------------------------------------------------------------------------

def parse_where(text: str | None) -> tuple[Condition, ...]:
    """``"parser < 1.24.10 and schema = 3"`` as conditions; a value may be quoted."""
    if not text or not text.strip():
        return ()
    conditions = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        found = _CONDITION.fullmatch(part)
        if found is None or not found.group(3) or found.group(3)[0] in "<>=!":
            raise UserError(f"--where {part!r}: write NAME OP VALUE with OP one of = != < <= > >=, joined by "
                            "'and' (e.g. --where \"parser < 1.24.10 and schema = 3\")")
        name, op, value = found.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        conditions.append(Condition(name, "=" if op == "==" else op, value))
    return tuple(conditions)


def parse_time(text: str | None, flag: str, now: float) -> float | None:
    """An instant: epoch seconds, an ISO date or date-time (UTC unless it says), or a duration ago (``90m``)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return now - seconds(text, flag)
    except PipelineError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{flag} {text!r}: give an ISO date or time (2026-12-01, 2026-12-01T09:30Z), epoch "
                        "seconds, or a duration ago (90m, 48h, 2d)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def read_items(path: str | None) -> tuple[str, ...]:
    """Item keys from a file: one per line, or JSON lines with a "key" (a manifest); blank lines skipped."""
    if path is None:
        return ()
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--items {path}: cannot read it ({exc.__class__.__name__}: {exc}); give a file of item "
                        "keys, one per line") from None
    keys = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                key = json.loads(line).get("key")
            except (ValueError, AttributeError):
                key = None
            if not isinstance(key, str) or not key:
                raise UserError(f"--items {path}:{number}: a JSON line needs a \"key\" string")
            line = key
        keys.append(line)
    if not keys:
        raise UserError(f"--items {path} holds no item keys; give one key per line")
    return tuple(dict.fromkeys(keys))


def selection_of(runs: Sequence[str] = (), stages: Sequence[str] = (), statuses: Sequence[str] = (),
                 error_classes: Sequence[str] = (), item: str | None = None, items: str | None = None,
                 where: str | None = None, models: Sequence[str] = (), since: str | None = None,
                 until: str | None = None, outcomes: Sequence[str] = (), now: float = 0.0,
                 key_prefix: str | None = None, error_text: str | None = None,
                 review_states: Sequence[str] = ()) -> Selection:
    """The selection a user's options name (`conveyor select|replay`, the API's replays, the console's items
    page): status ``any`` is every status; ``items`` is a file of keys; ``since``/``until`` may be durations
    before ``now``."""
    return Selection(runs=tuple(runs), stages=tuple(stages), statuses=tuple(s for s in statuses if s != "any"),
                     error_classes=tuple(error_classes), item_glob=item, items=read_items(items),
                     where=parse_where(where), models=tuple(models), since=parse_time(since, "--since", now),
                     until=parse_time(until, "--until", now), outcomes=tuple(outcomes),
                     key_prefix=key_prefix or None, error_text=_words(error_text), review_states=tuple(review_states))


def _words(text: str | None) -> str | None:
    """A search's words, or None for none (blank)."""
    return " ".join(text.split()) or None if text else None


def check(selection: Selection) -> Selection:
    """One-line errors for what cannot be selected (an unknown status or outcome)."""
    for status in selection.statuses:
        if status not in STATUSES:
            raise UserError(f"--status {status!r}: use one of {', '.join(STATUSES)} (or any)")
    for outcome in selection.outcomes:
        if outcome not in OUTCOMES:
            raise UserError(f"--outcome {outcome!r}: use one of {', '.join(OUTCOMES)}")
    for state in selection.review_states:
        if state not in REVIEW_STATES:
            raise UserError(f"review state {state!r}: use one of {', '.join(REVIEW_STATES)}")
    return selection


# --- running it ----------------------------------------------------------------------------------------------

def runs_of(store: SqlStore, selection: Selection) -> dict[str, RunRecord]:
    """The runs a selection looks at: the named ones (each must exist), else every run."""
    runs: dict[str, RunRecord] = {}
    for run_id in selection.runs or tuple(store.run_ids()):
        run = store.get_run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r} in this store; `conveyor status` lists the runs")
        runs[run_id] = run
    return runs


def select(store: SqlStore, selection: Selection) -> Selected:
    """The tasks ``selection`` names, streamed in (run, task id) order."""
    selection = check(selection)
    runs = runs_of(store, selection)
    check_stages(selection, runs)
    return Selected(_task_pages(store, selection, runs), runs)


def check_stages(selection: Selection, runs: dict[str, RunRecord]) -> None:
    """A one-line error for a stage that no selected run has."""
    for name in selection.stages:
        if not any(name in _stage_names(run) for run in runs.values()):
            raise UserError(f"--stage {name!r}: no selected run has that stage "
                            f"({', '.join(sorted({s for r in runs.values() for s in _stage_names(r)})) or 'no runs'})")


def _stage_names(run: RunRecord) -> list[str]:
    return [s["name"] for s in json.loads(run.stages)]


def task_filter(selection: Selection, run_id: str) -> tuple[TaskFilter, list[Condition]]:
    """The part of the selection the store answers, and the conditions checked here (built-in names)."""
    terms, columns, here = [], [], []
    for c in selection.where:
        name = "stage_version" if c.name == "version" else c.name
        if name in COLUMN_NAMES and c.op == "=":
            columns.append((name, c.value))
        elif name in BUILTIN or name in COLUMN_NAMES:
            here.append(replace(c, name=name))
        else:
            terms.append(ProvenanceTerm(name, c.op, sort_key(c.value)))
    statuses = selection.statuses
    if not statuses and selection.outcomes and not selection.stages:
        statuses = tuple(dict.fromkeys(s for o in selection.outcomes for s in OUTCOME_STATUSES[o]))
    f = TaskFilter((run_id,), selection.stages, statuses, selection.error_classes, selection.item_glob,
                   tuple(columns), tuple(terms), selection.models, selection.since, selection.until,
                   selection.key_prefix, selection.error_text, selection.review_states)
    return f, here


def _task_pages(store: SqlStore, selection: Selection, runs: dict[str, RunRecord]) -> Iterator[list[SelectedTask]]:
    items = set(selection.items)
    item_roots = {key.split(CHILD_MARK, 1)[0] for key in items} if items else None
    for run_id, run in runs.items():
        f, here = task_filter(selection, run_id)
        roots = item_roots
        if selection.outcomes:
            judged = set(outcome_roots(store, run, selection.outcomes))
            roots = judged if roots is None else roots & judged
        for page in _pages(store, f, None if roots is None else sorted(roots)):
            if items:  # an item named in the file, or a fan-out child of one
                page = [t for t in page if t.item_key in items or t.root_key in items]
            page = checked_here(store, page, here)
            if page:
                yield page


def _pages(store: SqlStore, f: TaskFilter, roots: Sequence[str] | None) -> Iterator[list[SelectedTask]]:
    """Pages of tasks matching ``f`` (of ``roots`` only, when given: walked a part at a time)."""
    parts: list[Sequence[str]] = [()] if roots is None else list(chunks(list(roots), 400))
    for part in parts:
        after = 0
        while True:
            page = store.select_tasks(f, after, PAGE, part)
            if page:
                yield page
            if len(page) < PAGE:
                break
            after = page[-1].id


def checked_here(store: SqlStore, page: list[SelectedTask], here: Sequence[Condition]) -> list[SelectedTask]:
    """Conditions on built-in names: the task's own columns, its item's source digest, its stage's code."""
    if not here or not page:
        return page
    sources = _sources(store, page) if any(c.name == "source" for c in here) else {}
    codes = _codes(store, page) if any(c.name == "code" for c in here) else {}
    kept = []
    for task in page:
        values = {"stage_version": task.stage_version, "config_hash": task.config_hash,
                  "source": sources.get((task.run_id, task.root_key)), "code": codes.get(task.task_key)}
        if all(c.holds(values[c.name]) for c in here):
            kept.append(task)
    return kept


def _sources(store: SqlStore, tasks: Sequence[SelectedTask]) -> dict[tuple[str, str], str | None]:
    by_run: dict[str, set[str]] = {}
    for t in tasks:
        by_run.setdefault(t.run_id, set()).add(t.root_key)
    found: dict[tuple[str, str], str | None] = {}
    for run_id, roots in by_run.items():
        found.update(((run_id, k), d) for k, d in store.source_digests(run_id, sorted(roots)).items())
    return found


def _codes(store: SqlStore, tasks: Sequence[SelectedTask]) -> dict[str, str | None]:
    """The fingerprint of the code that made each task's output (or refusal), from the memo."""
    return {key: out.code for key, out in store.lookup_outputs({t.task_key for t in tasks}).items()}


def outcome_roots(store: SqlStore, run: RunRecord, outcomes: Sequence[str]) -> list[str]:
    """The root items of ``run`` whose reconciliation outcome is one of ``outcomes``. Outcomes that need a
    task of their own status (failed, dead_lettered, rejected, awaiting_review) start from those tasks (an
    index range); the others judge every item of the run, a page at a time."""
    graph = RunGraph.of(run)
    wanted = set(outcomes)
    if wanted <= set(UNSETTLED):
        candidates: set[str] = set()
        for page in _pages(store, TaskFilter((run.run_id,), statuses=tuple(wanted)), None):
            candidates.update(t.root_key for t in page)
        judged = store.outcomes_of(run.run_id, graph.stages, sorted(candidates))
        return sorted(k for k, o in judged.items() if o in wanted)
    roots: list[str] = []
    after: str | None = None
    while True:
        judged_page = store.outcomes_after(run.run_id, graph.stages, after, PAGE * 5)
        roots += [k for k, o in judged_page if o in wanted]
        if len(judged_page) < PAGE * 5:
            return roots
        after = judged_page[-1][0]


# --- what select prints ----------------------------------------------------------------------------------------

def provenance(store: SqlStore, tasks: Sequence[SelectedTask]) -> dict[int, dict[str, Any]]:
    """Each task's provenance by task id: stage version, config hash, its stage's code, its item's source
    digest and its provenance rows (a name with one value as a string, with several as a list)."""
    rows = store.provenance_of([(t.run_id, t.root_key, t.item_key, t.stage) for t in tasks])
    sources, codes = _sources(store, tasks), _codes(store, tasks)
    shown: dict[int, dict[str, Any]] = {}
    for t in tasks:
        doc: dict[str, Any] = {"stage_version": t.stage_version, "config_hash": t.config_hash,
                               "code": codes.get(t.task_key), "source": sources.get((t.run_id, t.root_key))}
        for name, values in rows.get((t.run_id, t.item_key, t.stage), {}).items():
            doc[name] = values[0] if len(values) == 1 else values
        shown[t.id] = doc
    return shown


def select_report(store: SqlStore, selection: Selection, limit: int = 1000, count: bool = False) -> dict[str, Any]:
    """``conveyor select``: ``{"count", "items": [...]}`` (the first ``limit``), and with ``count`` the tasks
    per stage and the items per outcome (``counts``)."""
    chosen = select(store, selection)
    listed: list[SelectedTask] = []
    total = 0
    by_stage: Counter[str] = Counter()
    roots: dict[str, set[str]] = {}
    for task in chosen.tasks:
        total += 1
        if len(listed) < limit:
            listed.append(task)
        if count:
            by_stage[task.stage] += 1
            roots.setdefault(task.run_id, set()).add(task.root_key)
    shown = provenance(store, listed)
    report: dict[str, Any] = {
        "count": total, "selection": selection.as_json(),
        "items": [{"run_id": t.run_id, "item_key": t.item_key, "stage": t.stage, "status": t.status,
                   "error_class": t.error_class, "provenance": shown[t.id], "task_id": t.id,
                   "attempts": t.attempts, "finished_at": t.finished_at} for t in listed],
        "truncated": total > len(listed),
    }
    if count:
        outcomes: Counter[str] = Counter()
        for run_id, keys in roots.items():
            judged = store.outcomes_of(run_id, RunGraph.of(chosen.runs[run_id]).stages, sorted(keys))
            outcomes.update(judged.values())
        report["counts"] = {"stages": dict(sorted(by_stage.items())), "outcomes": dict(sorted(outcomes.items())),
                            "items": sum(len(keys) for keys in roots.values())}
    return report
