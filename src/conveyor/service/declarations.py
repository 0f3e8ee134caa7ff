"""Whose declaration a run's tasks need: the tasks no live worker can take, and resumes under another one.

A task is claimed only by a worker whose declaration of its stage (version and config hash) made it
(store: claim). Here that rule is made visible: ``status`` and the dashboard name the stages of a run whose
queued tasks wait for a worker of their declaration, with the difference to the live workers' ones; and a
``resume`` under another declaration is a one-line error that names the difference.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from conveyor.errors import UserError
from conveyor.pipeline.declarations import difference
from conveyor.runtime.fleet import worker_state
from conveyor.service.workers import LIMIT, SHOW_LOST_S
from conveyor.store import RunRecord, SqlStore, WorkerRow

if TYPE_CHECKING:
    from conveyor.pipeline import Pipeline


def recorded(run: RunRecord) -> dict[str, tuple[str, str]]:
    """Each stage's (version, config hash) as the run was submitted."""
    return {s["name"]: (str(s["version"]), str(s["config_hash"])) for s in json.loads(run.stages)}


def check_same(store: SqlStore, run: RunRecord, pipeline: Pipeline) -> None:
    """UserError, naming the difference, unless ``pipeline`` declares every stage as ``run``'s open tasks were
    made under: they could not be claimed here, and an output under another declaration would answer for theirs.
    (A replay under a fixed pipeline makes its tasks under the new declaration: those are the ones that count.)"""
    mine = pipeline.declared()
    foreign = [(stage, version, config_hash, n) for stage, version, config_hash, n in
               store.open_task_declarations(run.run_id) if mine.get(stage) != (version, config_hash)]
    if not foreign:
        return
    stage, version, config_hash, count = foreign[0]
    if stage not in mine:
        said = f"stage {stage}: {count:,} open task(s) of it, a stage {pipeline.name!r} does not declare here"
    else:
        text = _texts(store, run.pipeline, stage)
        said = difference(stage, (version, text.get((version, config_hash))),
                          (mine[stage][0], pipeline[stage].config_text), "here")
    more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
    raise UserError(f"run {run.run_id}'s open tasks were made under another declaration than this process has: "
                    f"{said}{more}; resume it with the code and config they were made with (its run parameters "
                    "are recorded), or start a new run")


def waiting(store: SqlStore, run: RunRecord, queued: dict[str, int]) -> list[dict[str, Any]]:
    """The stages of ``run`` whose queued tasks (``queued``: counts by stage) no live worker can take:
    ``[{"stage", "queued", "version", "config_hash", "workers", "differences", "message"}]`` (``workers``:
    the live workers of the pipeline; ``differences``: how their declarations of the stage differ)."""
    wanted = recorded(run)
    stages = [s for s, n in queued.items() if n and s in wanted]
    if not stages:
        return []
    live = [_serves(w) for w in _live(store, run)]  # what each live worker serves
    found = []
    for stage in stages:
        version, config_hash = wanted[stage]
        if any(serves.get(stage) == [version, config_hash] for serves in live):
            continue
        others = sorted({tuple(serves[stage]) for serves in live if stage in serves})
        text = _texts(store, run.pipeline, stage)
        differences = [difference(stage, (version, text.get((version, config_hash))), (v, text.get((v, h))))
                       for v, h in others]
        if differences:
            message = (f"{queued[stage]:,} task(s) of stage {stage} wait for a worker of the declaration run "
                       f"{run.run_id} was made under; live workers differ: {'; '.join(differences)}")
        else:
            message = (f"{queued[stage]:,} task(s) of stage {stage} wait: no live worker of pipeline "
                       f"{run.pipeline!r} serves it (`conveyor worker TARGET` or `conveyor resume {run.run_id}`)")
        found.append({"stage": stage, "queued": queued[stage], "version": version, "config_hash": config_hash,
                      "workers": len(live), "differences": differences, "message": message})
    return found


def _live(store: SqlStore, run: RunRecord) -> list[WorkerRow]:
    now = store.clock()
    return [w for w in store.list_workers(now - SHOW_LOST_S, False, LIMIT)
            if w.pipeline == run.pipeline and w.run_id in (None, run.run_id)
            and worker_state(w.stopped_at, w.heartbeat_at, w.beat_s, now) == "live"]


def _serves(worker: WorkerRow) -> dict[str, list[str]]:
    return dict(json.loads(worker.serves)) if worker.serves else {}


def _texts(store: SqlStore, pipeline: str, stage: str) -> dict[tuple[str, str], str]:
    """The config texts recorded for ``stage``'s declarations, by (version, config hash)."""
    return {(d.version, d.config_hash): d.config for d in store.declarations(pipeline, stage)}
