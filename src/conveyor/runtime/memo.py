"""What a memo hit means for one stage: an output to reuse, a refusal that still holds, or neither.

The memo holds outputs and settled refusals under task keys. A refusal decided
by a guard (``input_too_large`` under ``max_input_bytes``, ``memory_limit``
under ``max_memory_mb``) records that guard's value and answers only while the
stage declares the same value: raising the limit runs the item again. Every
output also records the fingerprint of the code that made it, so a hit made by
other code under the same stage version can be reported (``stale_code``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from conveyor.pipeline import Stage
from conveyor.runtime.classify import Failure
from conveyor.runtime.fingerprint import code_fingerprint
from conveyor.runtime.values import Ref, failure_ref


class Refusal(NamedTuple):
    """A settled failure as the memo holds it."""

    error_class: str
    message: str
    guard: tuple[str, Any] | None = None


def refusal_ref(failure: Failure) -> Ref:
    """The memo's copy of a refusal decided by the content (or by a guard, which it names)."""
    return failure_ref(orjson.dumps({"error_class": failure.error_class, "message": failure.message,
                                     "guard": list(failure.guard) if failure.guard else None}))


def read_refusal(data: bytes | None) -> Refusal:
    raw = orjson.loads(data or b"{}")
    guard = raw.get("guard")
    return Refusal(raw.get("error_class", "failed"), raw.get("message", ""), tuple(guard) if guard else None)


class StageMemo:
    """A stage's view of memo hits: its code fingerprint and the guards refusals may depend on."""

    __slots__ = ("code", "guards", "name", "version")

    def __init__(self, stage: Stage) -> None:
        self.name = stage.name
        self.version = stage.version
        self.code = code_fingerprint(stage.fn)
        self.guards = guards(stage)

    def holds(self, refusal: Refusal) -> bool:
        """A refusal answers only while the guard that decided it has the value it had."""
        if refusal.guard is None:
            return True
        name, value = refusal.guard
        return name in self.guards and self.guards[name] == value

    def stale(self, code: str | None) -> bool:
        """An output made by other code under this stage version (None: made before fingerprints)."""
        return code is not None and code != self.code

    def failure(self, data: bytes | None) -> Failure | None:
        """The refusal in ``data`` as a settled failure, or None when its guard no longer holds."""
        refusal = read_refusal(data)
        if not self.holds(refusal):
            return None
        return Failure(refusal.error_class, False, refusal.message, deterministic=True, guard=refusal.guard)


def guards(stage: Stage) -> dict[str, Any]:
    """The limits a refusal of this stage may depend on, by name."""
    return {"max_input_bytes": stage.max_input_bytes, "max_memory_bytes": stage.max_memory_bytes,
            "timeout": stage.timeout}
