"""What a stage function sees as ``ctx``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

_log = logging.getLogger("conveyor.stage")


@dataclass(frozen=True)
class Context:
    """Per-call facts for a stage.

    ``idempotency_key`` is stable for this item, stage and input across every
    redelivery and restart: hand it to the external system a publish stage
    writes to, so a second delivery is recognised there.
    """

    run_id: str
    item_key: str
    stage: str
    attempt: int
    idempotency_key: str
    task_key: str
    pipeline: str
    log: logging.LoggerAdapter[logging.Logger] = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.log is None:
            extra: dict[str, Any] = {
                "run": self.run_id, "stage": self.stage, "item": self.item_key, "attempt": self.attempt,
            }
            object.__setattr__(self, "log", logging.LoggerAdapter(_log, extra))

    def fields(self) -> dict[str, Any]:
        """The picklable part, to rebuild the context in a child process."""
        return {
            "run_id": self.run_id, "item_key": self.item_key, "stage": self.stage,
            "attempt": self.attempt, "idempotency_key": self.idempotency_key,
            "task_key": self.task_key, "pipeline": self.pipeline,
        }
