"""What every part of Transitions shares: the pipeline, the store, the worker's name, the memo."""

from __future__ import annotations

import random
from collections import Counter

from conveyor.pipeline import Pipeline
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Expander
from conveyor.runtime.memo import refusal_ref
from conveyor.store import ClaimedTask, NewOutput, Notice, SqlStore


class Base:
    def __init__(self, pipeline: Pipeline, store: SqlStore, worker: str, rng: random.Random | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.expander = Expander(pipeline, store)
        self.memos = self.expander.memos
        self.stale_stages: set[str] = set()  # stages whose memo answers came from other code (committed)
        self.worker = worker
        self.rng = rng or random.Random()

    def stale_notices(self, stale: Counter[tuple[str, str]], now: float) -> list[Notice]:
        """Notice rows for memo answers made by other code under the same stage version (stale_code)."""
        return [Notice(run_id, "stale_code", stage, self.pipeline[stage].version, self.memos[stage].code, count, now)
                for (run_id, stage), count in stale.items()]

    def refusal(self, task: ClaimedTask, failure: Failure, now: float) -> NewOutput:
        """The memo row of a settled refusal of ``task`` (requeue forgets it)."""
        ref = refusal_ref(failure)
        return NewOutput(task.task_key, task.stage, ref.kind, ref.digest, ref.inline, ref.size, task.run_id, now,
                         self.memos[task.stage].code)
