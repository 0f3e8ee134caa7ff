"""Status, reconciliation and the dead-letter list, as plain dicts for CLI and API.

``tenant`` (the API's tenant callers) narrows a call to the runs of that tenant's jobs: another's is NotFound,
told the same way as one that does not exist.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.errors import NotFound, StateConflict, UserError
from conveyor.runtime.heartbeat import stopped
from conveyor.runtime.lanes import LANE_RANKS
from conveyor.service.records import RunGraph, SampleOptions, quality_sample
from conveyor.service.tenancy import tenant_runs, visible
from conveyor.store import UNFINISHED_RUNS, DeadLetter, RunRecord, SqlStore

if TYPE_CHECKING:
    from conveyor.blobs import Blobs

TaskCounts = Sequence[tuple[str, str, int, int]]  # store.task_counts: (stage, status, cached, count)
USAGE_FIELDS = ("provider_calls", "prompt_tokens", "completion_tokens", "cost", "unpriced_calls")

# Every expected item is in exactly one of these (precedence: this order); an item in none (it has no task
# yet) is unaccounted.
KNOWN_OUTCOMES = ("in_progress", "accepted", "awaiting_review", "dead_lettered", "failed", "rejected",
                  "published", "completed", "superseded")  # superseded: a group item a replay made vanish
NOT_ENDED = ("in_progress", "accepted")  # "accepted": past its acceptance stage, not yet published
REFUSED = ("failed", "dead_lettered", "rejected")
ACCEPTED = ("published", "completed", "accepted")  # items that made it: the denominator of costs per item


def find_run(store: SqlStore, run_id: str | None, tenant: str | None = None) -> RunRecord:
    if run_id is None:
        runs = store.list_runs(1)
        if not runs:
            raise NotFound("there are no runs in this store yet; start one with `conveyor run TARGET --input PATH`")
        return runs[0]
    run = store.get_run(run_id)
    if run is None or not visible(store, tenant, run.run_id):
        raise NotFound(f"no run {run_id!r} in this store; `conveyor status` lists the runs")
    return run


def publish_stages(run: RunRecord) -> list[str]:
    return list(RunGraph.of(run).stages.publish)


def run_status(store: SqlStore, run: RunRecord, attempts: dict[str, Any] | None = None,
               counts: TaskCounts | None = None) -> dict[str, Any]:
    """Per-stage task counts of a run, and its totals (``attempts``: its ``attempt_counts``, ``counts``: its
    ``task_counts``, when read)."""
    stages: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    cached = 0
    for stage, status, is_cached, count in store.task_counts(run.run_id) if counts is None else counts:
        stages[stage][status] += count
        cached += count if is_cached else 0
    order = [s["name"] for s in json.loads(run.stages)]
    attempts = attempts if attempts is not None else store.attempt_counts(run.run_id)
    open_tasks = sum(c.get("queued", 0) + c.get("running", 0) for c in stages.values())
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "status": run_state(store, run, open_tasks),
        "expected": expected_items(store, run), "created_at": run.created_at,
        "stages": {name: dict(stages.get(name, {})) for name in order},
        "open_tasks": open_tasks, "cached": cached, "stage_calls": attempts.get("stage_calls", 0),
        "retries": attempts.get("retry", 0), "lease_lost": attempts.get("lease_lost", 0),
        "usage": {k: attempts.get(k, 0) for k in USAGE_FIELDS},
        "attempt_errors": store.attempt_errors(run.run_id),
        "stale_code": stale_code(store, run.run_id), "note": run.note, "budget": budget_of(store, run),
    }


def stage_activity(store: SqlStore, run: RunRecord, counts: TaskCounts) -> dict[str, dict[str, Any]]:
    """Per stage: ``calls`` (stage functions invoked), ``cached`` (tasks answered from the memo) and
    ``oldest_queued_age_s`` (how long its oldest task ready to run has waited; None: none waits)."""
    cached: dict[str, int] = defaultdict(int)
    for stage, _, is_cached, count in counts:
        cached[stage] += count if is_cached else 0
    calls = store.stage_calls(run.run_id)
    now, order = store.clock(), [s["name"] for s in json.loads(run.stages)]
    oldest = store.oldest_queued(run.pipeline, run.run_id, order, sorted(LANE_RANKS.values()), now)
    return {name: {"calls": calls.get(name, 0), "cached": cached.get(name, 0),
                   "oldest_queued_age_s": round(max(0.0, now - oldest[name]), 3) if name in oldest else None}
            for name in order}


def run_progress(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    """What a progress display needs, read without touching finished task rows: per stage, its tasks
    and how many are done (``{"run_id", "expected", "open_tasks", "stages": {stage: {"done", "total"}}}``)."""
    counts = store.stage_progress(run.pipeline, run.run_id)
    order = [s["name"] for s in json.loads(run.stages)]
    stages = {name: {"done": counts[name][0] - counts[name][1], "total": counts[name][0]}
              for name in order if name in counts}
    return {"run_id": run.run_id, "expected": expected_items(store, run), "stages": stages,
            "open_tasks": sum(open_ for _, open_ in counts.values())}


def run_state(store: SqlStore, run: RunRecord, open_tasks: int) -> str:
    """submitting | abandoned (the submission stopped; resumable) | paused_budget | paused_breaker (tasks open,
    none claimed: `conveyor resume`) | submitted (tasks open) | finished."""
    if run.status == "submitting":
        return "abandoned" if stopped(run.submitter, run.heartbeat_at or run.created_at, store.clock()) \
            else "submitting"
    if run.status == "abandoned":
        return "abandoned"
    if run.paused and open_tasks:
        return f"paused_{run.paused.split(':')[0]}"
    return run.status if open_tasks else "finished"


def budget_of(store: SqlStore, run: RunRecord) -> dict[str, Any] | None:
    """``{"usd", "spent", "reserved"}`` of a run with a budget, else None."""
    if run.budget_usd is None:
        return None
    spent, reserved = store.spent(run.run_id)
    return {"usd": run.budget_usd, "spent": round(spent, 9), "reserved": round(reserved, 9)}


def expected_items(store: SqlStore, run: RunRecord) -> int:
    """The run's root items: fixed when its submission finished (and the group items its group stages made, each
    an item with an outcome of its own), counted while it is unfinished."""
    if run.status in UNFINISHED_RUNS:
        return store.item_count(run.run_id)
    return run.expected + (store.group_item_count(run.run_id) if has_groups(run) else 0)


def has_groups(run: RunRecord) -> bool:
    """Whether the run's graph has group stages (whose items are ``group:KEY``)."""
    return any(s.get("kind") in ("group", "reduce") for s in json.loads(run.stages))


def groups_of(store: SqlStore, run: RunRecord) -> dict[str, dict[str, Any]]:
    """Per group stage of the run: its groups, its members (items that succeeded at its parent and were given a
    group) and the items of the run left out of every group: those that did not succeed at the parent
    (``not_done`` says why) and those its ``by=`` function raised on (``key_failed`` and the first one's error,
    ``key_error``: given when there are any)."""
    if not has_groups(run):
        return {}
    graph = json.loads(run.stages)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for k1, k2, _, v in store.run_totals(run.run_id, "tasks"):  # cached and not: two rows, both counted
        counts[k1, k2] += int(v)
    failures = store.key_failures(run.run_id)
    found: dict[str, dict[str, Any]] = {}
    for stage in (s for s in graph if s.get("kind") in ("group", "reduce")):
        parent = stage["after"]
        failed, error = failures.get(stage["name"], (0, ""))
        members = sum(v for (k1, k2), v in counts.items() if k1 == parent and k2 == "succeeded") - failed
        made = sum(v for (k1, _), v in counts.items() if k1 == stage["name"])
        found[stage["name"]] = {"groups": made, "members": max(0, members), "left_out": max(0, run.expected - members)}
        if failed:
            found[stage["name"]] |= {"key_failed": failed, "key_error": error}
    return found


def stale_code(store: SqlStore, run_id: str) -> list[dict[str, Any]]:
    """Stages answered from outputs that other code made under the same version (not accepted)."""
    return [{"stage": stage, "version": version, "tasks": count} for stage, version, count in store.stale_code(run_id)]


def stale_code_warnings(stale: Sequence[dict[str, Any]]) -> list[str]:
    """One line per stage for stderr: what happened and the two ways out."""
    return [f"warning: stage {s['stage']!r} (version {s['version']}) answered {s['tasks']:,} task(s) from outputs "
            f"that other code made under the same version: its code changed. Bump version= on that stage to run "
            f"it again, or pass --accept-code-change {s['stage']} to keep those outputs" for s in stale]


def exit_code(summary: dict[str, Any]) -> int:
    """0: every item published or completed; 3: items unaccounted or not at an end yet (in progress, or
    accepted and not yet published), the submission unfinished, or the run paused; 4: items failed,
    dead-lettered or rejected; 5: none of those, but items await review."""
    outcomes = summary["outcomes"]
    if (summary["unaccounted"] or summary.get("status") in UNFINISHED_RUNS or _some(outcomes, NOT_ENDED)
            or str(summary.get("status", "")).startswith("paused")):
        return 3
    if _some(outcomes, REFUSED):
        return 4
    return 5 if outcomes.get("awaiting_review") else 0


def _some(outcomes: Mapping[str, int], names: Sequence[str]) -> bool:
    return any(outcomes.get(name) for name in names)


def list_status(store: SqlStore, limit: int = 20, tenant: str | None = None,
                before: float | None = None) -> dict[str, Any]:
    """The newest runs' ``run_status`` (those created before ``before``, when given: the next page)."""
    runs = store.list_runs(limit, before) if tenant is None else tenant_runs(store, tenant, limit, before)
    return {"runs": [run_status(store, run) for run in runs]}


def reconcile(store: SqlStore, run: RunRecord, limit: int = 10_000, blobs: Blobs | None = None,
              sample: SampleOptions = SampleOptions()) -> dict[str, Any]:
    """Every expected item in exactly one outcome; ``unaccounted`` (items with none) must be 0 for a finished
    run. With ``blobs``, a seeded quality ``sample`` of accepted records per slice (see ``quality_sample``)."""
    attempts = store.attempt_counts(run.run_id)
    status = run_status(store, run, attempts)
    graph = RunGraph.of(run)
    settled = _settled(run, status)
    outcomes = _outcomes(store, run, graph, status)
    missing = outcomes.pop("missing", 0)
    report = {
        "run_id": run.run_id, "pipeline": run.pipeline, "expected": status["expected"], "status": status["status"],
        "outcomes": outcomes, "unaccounted": status["expected"] - sum(outcomes.values()),
        "not_done": _not_done(store, run.run_id, limit, settled, missing),
        "stale_code": status["stale_code"], "note": status["note"], "budget": status["budget"],
        "stage_calls": status["stage_calls"], "cached": status["cached"], "retries": status["retries"],
        "usage": status["usage"] | _per_accepted_item(status["usage"], outcomes),
        "per_accepted_item": per_accepted_item(attempts, outcomes),
        "attempt_errors": status["attempt_errors"],
    }
    if has_groups(run):
        report["groups"] = groups_of(store, run)
    if graph.stages.skip_gathers:  # children a gather went on without (on_child_failure="skip"): their tasks say why
        ended = {(k1, k2): v for k1, k2, _, v in store.run_totals(run.run_id, "tasks")}
        report["lost_children"] = int(sum(ended.get((stage, status), 0) for stage in graph.stages.skipped
                                          for status in ("failed", "dead_lettered", "rejected")))
    if blobs is not None:
        report["sample"] = quality_sample(store, blobs, run, graph, sample)
    return report


def _not_done(store: SqlStore, run_id: str, limit: int, settled: bool, missing: int) -> list[dict[str, Any]]:
    """Each item that is not done, with its tasks that keep it so and their error classes; items without a
    task (``missing``) too."""
    not_done: dict[str, dict[str, Any]] = {}
    for task in [] if settled else store.unfinished_tasks(run_id, limit):
        entry = not_done.setdefault(task["item_key"], {"item_key": task["item_key"], "tasks": [], "missing": False})
        entry["tasks"].append({k: task[k] for k in ("child_key", "stage", "status", "attempts", "error_class")}
                              | {"error": (task["error"] or "").splitlines()[0] if task["error"] else None})
    for entry in not_done.values():
        entry["error_classes"] = sorted({t["error_class"] for t in entry["tasks"] if t["error_class"]})
    absent = store.missing_items(run_id, limit) if missing else []
    return [*not_done.values(),
            *({"item_key": key, "tasks": [], "missing": True, "error_classes": []} for key in absent)]


def settled(store: SqlStore, run: RunRecord) -> bool:
    """Every task of the run succeeded and its submission finished: each item's outcome is then its
    ``store.reports.settled_outcome``, with no look at its tasks' statuses (read from the run's totals)."""
    return _settled(run, {"stages": run_status(store, run, counts=store.task_counts(run.run_id))["stages"]})


def _settled(run: RunRecord, status: dict[str, Any]) -> bool:
    """Every task of the run succeeded (the common end of a run)."""
    return run.status not in UNFINISHED_RUNS and all(
        set(counts) <= {"succeeded"} for counts in status["stages"].values())


# Stage kinds that make one task per (root item, stage) and no item of their own.
ONE_TASK_PER_ITEM = frozenset({"map", "join", "publish"})


def _outcomes(store: SqlStore, run: RunRecord, graph: RunGraph, status: dict[str, Any]) -> dict[str, int]:
    """Items by outcome, in sorted order (``missing``: items without a task), from ``status`` (the run's
    ``run_status``). An ended run of a simple graph needs a look at its troubled items only; a settled run at
    none; any other run, at each item."""
    entry = _ended_entry(store, run, graph, status)
    if entry is not None:
        counts = store.ended_outcomes(run.run_id, graph.stages, entry, status["expected"])
    elif _settled(run, status):
        counts = store.settled_outcomes(run.run_id, graph.stages.publish)
    else:
        counts = store.item_outcomes(run.run_id, graph.stages)
    return dict(sorted(counts.items()))


def _ended_entry(store: SqlStore, run: RunRecord, graph: RunGraph, status: dict[str, Any]) -> str | None:
    """The stage every root item of ``run`` starts at, when its outcomes can be counted by
    ``store.ended_outcomes``: its submission finished, no task is open, no replay superseded a task, each stage
    makes one task per item (map, join, publish: no fan-out, no group) and at most one publishes; else None."""
    stages = json.loads(run.stages)
    if run.status in UNFINISHED_RUNS or status["open_tasks"] or len(graph.stages.publish) > 1:
        return None
    if any(s.get("kind") not in ONE_TASK_PER_ITEM for s in stages):
        return None
    entries = [s["name"] for s in stages if s.get("after") is None and not s.get("parents")]
    if not entries or store.replays_of(run.run_id):
        return None
    return str(entries[0])


def status_report(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    """``run_status`` plus items by outcome (as ``reconcile`` counts them, with ``unaccounted``) and tokens and
    cost per accepted item (`conveyor status RUN`)."""
    counts = store.task_counts(run.run_id)
    status = run_status(store, run, counts=counts)
    status["stage_activity"] = stage_activity(store, run, counts)
    status["provider_batch_waiting"] = store.waiting_tasks(run.run_id)  # parked on the provider batch lane
    status["waiting_for_workers"] = waiting_for_workers(store, run, status)
    if has_groups(run):  # group stages whose groups are not made yet: they wait for every item to settle
        status["groups_waiting"] = [stage for _, stage in store.group_waits(run.pipeline, run.run_id)]
    outcomes = outcomes_of(store, run, status)
    status["outcomes"] = outcomes
    status["unaccounted"] = status["expected"] - sum(outcomes.values())
    status["usage"] = status["usage"] | _per_accepted_item(status["usage"], outcomes)
    status["replays"] = [{"id": i, "reason": reason, "note": note, "at": at, "by": by, "reopened": reopened,
                          "superseded": superseded}
                         for i, reason, note, at, by, reopened, superseded in store.replays_of(run.run_id)]
    return status


def waiting_for_workers(store: SqlStore, run: RunRecord, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages whose queued tasks no live worker can take (service/declarations.py ``waiting``)."""
    from conveyor.service.declarations import waiting

    return waiting(store, run, {stage: counts.get("queued", 0) for stage, counts in status["stages"].items()})


def quota_report(store: SqlStore) -> dict[str, Any]:
    """The fleet's use of each limited provider model over the current window (``conveyor quota``)."""
    from conveyor.runtime.quota import window_seconds

    window = window_seconds()
    return {"window_s": window, "models": store.quota_usage(window)}


def outcomes_of(store: SqlStore, run: RunRecord, status: dict[str, Any]) -> dict[str, int]:
    """Items by outcome as ``reconcile`` counts them (``status``: the run's ``run_status``); reads every item
    of an unsettled run."""
    outcomes = _outcomes(store, run, RunGraph.of(run), status)
    outcomes.pop("missing", None)
    return outcomes


def per_accepted_item_usage(usage: dict[str, Any], accepted: int) -> dict[str, Any]:
    """``usage`` per accepted item (``_per_accepted_item``) for a count of accepted items known otherwise."""
    return _per_accepted_item(usage, {"accepted": accepted})


def _per_accepted_item(usage: dict[str, Any], outcomes: dict[str, int]) -> dict[str, Any]:
    """Tokens and cost of the whole run, retries and failures included, per item that made it; no
    cost (None) when every provider call was to a model without a price: unknown, not free."""
    accepted = sum(outcomes.get(k, 0) for k in ACCEPTED)
    if not accepted:
        return {"tokens_per_accepted_item": None, "cost_per_accepted_item": None}
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    cost = None if all_unpriced(usage) else usage["cost"] / accepted
    return {"tokens_per_accepted_item": tokens / accepted, "cost_per_accepted_item": cost}


def per_accepted_item(attempts: dict[str, Any], outcomes: dict[str, int]) -> dict[str, Any]:
    """What one item that made it (published, completed, accepted) cost: every attempt of the run (retries,
    escalations, review decisions and the items that did not make it included) over those items."""
    items = sum(outcomes.get(k, 0) for k in ACCEPTED)
    if not items:
        return {"items": 0, "seconds": None, "tokens": None, "cost": None}
    tokens = attempts.get("prompt_tokens", 0) + attempts.get("completion_tokens", 0)
    cost = None if all_unpriced(attempts) else attempts.get("cost", 0.0) / items
    return {"items": items, "seconds": attempts.get("seconds", 0.0) / items, "tokens": tokens / items, "cost": cost}


def all_unpriced(usage: dict[str, Any]) -> bool:
    """Every provider call of the run was to a model without a price."""
    calls = usage.get("provider_calls", 0)
    return bool(calls) and usage.get("unpriced_calls", 0) >= calls


def dlq_list(
    store: SqlStore, run_id: str | None = None, stage: str | None = None, error_class: str | None = None,
    include_replayed: bool = False, limit: int = 1000, tenant: str | None = None, after: int | None = None,
) -> dict[str, Any]:
    """Dead letters by id (``after``: those after that id, the next page)."""
    if tenant is None:
        entries = store.dead_letters(run_id, stage, error_class, include_replayed, limit, after)
    else:
        entries = store.tenant_dead_letters(tenant, run_id, stage, error_class, include_replayed, limit, after)
    return {"entries": [e.as_json() for e in entries]}


def dlq_classes(store: SqlStore, run_id: str, tenant: str | None = None) -> dict[str, int]:
    """A run's dead letters not replayed yet, by error class."""
    return store.dead_letter_classes(find_run(store, run_id, tenant).run_id)


def dlq_show(store: SqlStore, dead_letter_id: int, tenant: str | None = None) -> dict[str, Any]:
    entry = _dead_letter(store, dead_letter_id, tenant)
    return entry.as_json() | {"attempt_history": store.task_attempts(entry.task_id, entry.run_id)}


def _dead_letter(store: SqlStore, dead_letter_id: int, tenant: str | None) -> DeadLetter:
    entry = store.dead_letter(dead_letter_id)
    if entry is None or not visible(store, tenant, entry.run_id):
        raise NotFound(f"no dead letter {dead_letter_id}; `conveyor dlq list` shows their ids")
    return entry


def dlq_replay(
    store: SqlStore, ids: list[int], reason: str, run_id: str | None = None, stage: str | None = None,
    error_class: str | None = None, everything: bool = False,
) -> dict[str, Any]:
    """Queue dead-lettered tasks again, by id or by filter; every replay records its reason."""
    if not reason.strip():
        raise UserError("a replay needs --reason \"why\"; it is recorded with the dead letter")
    if not ids:
        if run_id is None and stage is None and error_class is None and not everything:
            raise UserError("name dead-letter ids, or select them with --run/--stage/--error-class (or --all)")
        ids = [e.id for e in store.dead_letters(run_id, stage, error_class, False, 1_000_000)]
    from conveyor.runtime import transitions  # here: a write; the reports that only read do not load it

    replayed = transitions.replay_dead_letters(store, ids, reason, store.clock())
    return {"replayed": len(replayed), "ids": ids, "reason": reason,
            "skipped": _not_replayed(store, sorted(set(ids) - set(replayed)))}


def _not_replayed(store: SqlStore, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Why each of these dead letters was not queued again: ``superseded`` (a `conveyor replay` re-opened or
    superseded its task since it was dead-lettered; ``replay`` its id), ``replayed_already`` (a dlq replay
    queued it before), ``not_dead_lettered`` (its task has a newer outcome) or ``not_found``."""
    fates = store.dead_letter_fates(ids)
    skipped = []
    for dead_letter_id in ids:
        fate = fates.get(dead_letter_id)
        if fate is None:
            skipped.append({"id": dead_letter_id, "why": "not_found", "replay": None})
            continue
        created_at, replayed_at, replay_id, replay_at = fate
        if replay_id is not None and replay_at is not None and replay_at >= created_at:
            skipped.append({"id": dead_letter_id, "why": "superseded", "replay": int(replay_id)})
        else:
            why = "replayed_already" if replayed_at is not None else "not_dead_lettered"
            skipped.append({"id": dead_letter_id, "why": why, "replay": None})
    return skipped


def dlq_replay_entry(store: SqlStore, dead_letter_id: int, reason: str, tenant: str | None = None) -> dict[str, Any]:
    """Queue one dead letter's task again (``dlq_replay``); StateConflict saying why when it was not."""
    entry = _dead_letter(store, dead_letter_id, tenant)
    done = dlq_replay(store, [entry.id], reason)
    if not done["replayed"]:
        raise StateConflict(not_replayed_line(done["skipped"][0]))
    return done


def not_replayed_line(skipped: Mapping[str, Any]) -> str:
    """One line on a dead letter that was not queued again (``dlq_replay``'s ``skipped``)."""
    name = f"dead letter {skipped['id']}"
    return {
        "superseded": f"{name} was superseded: replay {skipped['replay']} queued its task again (or replaced it) "
                      "since; `conveyor show RUN ITEM` says what became of it",
        "replayed_already": f"{name} was replayed already; its task has a newer outcome",
        "not_dead_lettered": f"{name}'s task is no longer dead-lettered; it has a newer outcome",
        "not_found": f"no dead letter {skipped['id']}; `conveyor dlq list` shows their ids",
    }[skipped["why"]]
