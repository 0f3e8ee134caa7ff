"""What every part of Transitions shares: the pipeline, the store, the worker's name, the memo."""

from __future__ import annotations

import random
from collections import Counter

from conveyor.pipeline import Pipeline
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Expander
from conveyor.runtime.memo import refusal_ref
from conveyor.runtime.provenance import encode
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

    def _code(self, stage: str) -> str | None:
        """The fingerprint of a stage's code (an attempt's ``code_version``); None for a stage no longer declared."""
        memo = self.memos.get(stage)
        return memo.code if memo is not None else None

    def stale_notices(self, stale: Counter[tuple[str, str]], now: float) -> list[Notice]:
        """Notice rows for memo answers made by other code under the same stage version (stale_code)."""
        return [Notice(run_id, "stale_code", stage, self.pipeline[stage].version, self.memos[stage].code, count, now)
                for (run_id, stage), count in stale.items()]

    def refusal(self, task: ClaimedTask, failure: Failure, now: float,
                made_by: dict[str, list[str]] | None = None) -> NewOutput:
        """The memo row of a settled refusal of ``task`` (a replay forgets it), with its provenance."""
        ref = refusal_ref(failure)
        return NewOutput(task.task_key, task.stage, ref.kind, ref.digest, ref.inline, ref.size, task.run_id, now,
                         self.memos[task.stage].code, encode(made_by))
