"""What an operator does: requeue a selection, replay dead letters."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.pipeline import Pipeline
from conveyor.runtime.expand import BAD_INPUT_KIND, task_key
from conveyor.runtime.values import Ref
from conveyor.store import (
    Requeued,
    SqlStore,
)


def requeue(store: SqlStore, pipeline: Pipeline, run_id: str, stage: str, reason: str, statuses: Sequence[str],
            error_class: str | None, stage_version: str | None, now: float) -> tuple[int, int]:
    """Queue ended tasks of ``stage`` again under its current version and config, with a fresh attempt
    budget; their memoised refusals are forgotten and ``reason`` is recorded in each one's history.
    Returns (requeued, skipped): a ``bad_input`` task has no source to run again."""
    spec = pipeline[stage]
    rows: list[Requeued] = []
    forget: list[str] = []
    skipped = 0
    for task_id, item_key, old_key, kind, digest, inline, size in store.tasks_to_requeue(
            run_id, stage, statuses, error_class, stage_version):
        if kind == BAD_INPUT_KIND:
            skipped += 1
            continue
        key = task_key(pipeline.name, spec, Ref(kind, digest, size, inline), item_key)
        rows.append(Requeued(key, spec.version, spec.config_hash, now, task_id))
        forget += [old_key, key]
    return store.requeue(rows, forget, reason, now, run_id), skipped


def replay_dead_letters(store: SqlStore, ids: Sequence[int], reason: str, now: float) -> int:
    """Queue dead-lettered tasks again with a fresh attempt budget; the reason is recorded with each entry."""
    return store.replay_dead_letters(ids, reason, now)
