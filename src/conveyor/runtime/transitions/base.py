"""What every part of Transitions shares: the pipeline, the store, the worker's name, the memo."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from conveyor.pipeline import Pipeline
from conveyor.runtime import tracing
from conveyor.runtime.classify import Failure
from conveyor.runtime.expand import Expander
from conveyor.runtime.memo import refusal_ref
from conveyor.runtime.provenance import encode
from conveyor.store import ClaimedTask, NewOutput, Notice, SqlStore

if TYPE_CHECKING:
    from conveyor.runtime.spans import ItemTracer

log = logging.getLogger("conveyor.transitions")


class Base:
    def __init__(self, pipeline: Pipeline, store: SqlStore, worker: str, rng: random.Random | None = None) -> None:
        self.pipeline = pipeline
        self.store = store
        self.expander = Expander(pipeline, store)
        # The tasks this process may claim: those made under its own declaration of their stage (a task key
        # means one thing in every process).
        self.declared = pipeline.declared()
        self.memos = self.expander.memos
        # stage -> (version, code fingerprint, config hash): what every attempt row of the stage carries
        self.made_by = {s.name: (s.version, self.memos[s.name].code, s.config_hash) for s in pipeline}
        self.input_limits = {s.name: s.max_input_bytes for s in pipeline}  # stage -> its max_input_bytes guard
        self.stale_stages: set[str] = set()  # stages whose memo answers came from other code (committed)
        # Stages on the provider batch lane: a task of theirs that ends forgets its settled batch requests.
        self.batch_stages: frozenset[str] = frozenset()
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

    def trace(self, what: str, record: Callable[[ItemTracer], int]) -> None:
        """With tracing on, ``record`` the spans of what was just committed (runtime/spans.py). Tracing never
        fails a transition, which is done already: spans that cannot be made are logged and left out."""
        tracer = tracing.active()
        if tracer is None:
            return
        try:
            record(tracer)
        except Exception:
            log.warning("could not record the spans of %s", what, exc_info=True, extra={"event": "trace_failed"})
