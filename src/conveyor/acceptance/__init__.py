"""The acceptance boundary: a stage's answer is checked (shape and meaning), repaired when only its
format is wrong, escalated or sent to review when it is not good enough, and published by version.

This package holds the declarations and the pure judgement; the state changes they cause live in
runtime/transitions.py, the rows in store/, the commands in service/ and cli/.
"""

from __future__ import annotations

from conveyor.acceptance.declare import (
    UNKNOWN,
    Accept,
    Check,
    Review,
    check,
    found_in,
    matches,
    meta_equals,
)
from conveyor.acceptance.judge import Answer
from conveyor.acceptance.record import Record, Target

__all__ = ["UNKNOWN", "Accept", "Answer", "Check", "Record", "Review", "Target", "check", "found_in", "matches",
           "meta_equals"]
