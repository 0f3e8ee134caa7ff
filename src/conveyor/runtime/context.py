"""What a stage function sees as ``ctx``."""

from __future__ import annotations

import hashlib
import logging
from functools import cached_property
from typing import Any

_log = logging.getLogger("conveyor.stage")


class Context:
    """Per-call facts for a stage.

    ``idempotency_key`` is stable for this item, stage and input across every
    redelivery and restart: hand it to the external system a publish stage
    writes to, so a second delivery is recognised there.
    """

    __slots__ = ("__dict__", "attempt", "input_digest", "item_key", "pipeline", "run_id", "stage", "task_key")

    def __init__(self, run_id: str, item_key: str, stage: str, attempt: int, task_key: str, pipeline: str,
                 input_digest: str, idempotency_key: str | None = None) -> None:
        self.run_id = run_id
        self.item_key = item_key
        self.stage = stage
        self.attempt = attempt
        self.task_key = task_key
        self.pipeline = pipeline
        self.input_digest = input_digest
        if idempotency_key is not None:
            self.__dict__["idempotency_key"] = idempotency_key

    @cached_property
    def idempotency_key(self) -> str:
        return idempotency_key(self.pipeline, self.item_key, self.stage, self.input_digest)

    @cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry run, stage, item and attempt."""
        extra = {"run": self.run_id, "stage": self.stage, "item": self.item_key, "attempt": self.attempt}
        return logging.LoggerAdapter(_log, extra)

    def fields(self) -> dict[str, Any]:
        """The picklable part, to rebuild the context in a child process."""
        return {
            "run_id": self.run_id, "item_key": self.item_key, "stage": self.stage, "attempt": self.attempt,
            "task_key": self.task_key, "pipeline": self.pipeline, "input_digest": self.input_digest,
            "idempotency_key": self.idempotency_key,
        }

    def __repr__(self) -> str:
        return f"Context(run={self.run_id!r}, item={self.item_key!r}, stage={self.stage!r}, attempt={self.attempt})"


def idempotency_key(pipeline: str, item_key: str, stage: str, input_digest: str) -> str:
    """Stable for this item, stage and input across every redelivery and restart."""
    return hashlib.sha256(f"{pipeline}\0{item_key}\0{stage}\0{input_digest}".encode()).hexdigest()[:32]
