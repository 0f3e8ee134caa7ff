"""Judging one answer against its stage's ``Accept``: parse (and repair the format), fit the shape, check
the meaning, weigh the confidence. Pure: the caller stores what comes out and routes the refusals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.acceptance.declare import INVALID_CONTENT, INVALID_FORMAT, LOW_CONFIDENCE, Accept
from conveyor.acceptance.repair import mend


@dataclass(frozen=True)
class Answer:
    """A model's text answer with fields the stage knows for sure (from the document, by rule): the text is
    parsed, repaired and checked against the schema; ``known`` fields are merged over it before the checks
    of meaning, so a model can never overwrite them::

        answer = await ctx.chat(prompt(page), model=ctx.config["model"], json_mode=True)
        return Answer(answer.text, known={"title": page["title"], "section": page["section"]})
    """

    text: str
    known: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """What an answer came to. ``record`` is the answer as it would be stored (a dict once it parsed),
    kept for a reviewer even when refused; ``refusal`` is None when accepted."""

    record: Any
    refusal: str | None = None
    message: str = ""
    repaired: bool = False
    confidence: float | None = None
    reviewable: bool = False

    @property
    def accepted(self) -> bool:
        return self.refusal is None


def judge(accept: Accept, answer: Any, source: Any, meta: Mapping[str, Any]) -> Verdict:
    """The verdict on ``answer`` (what the stage returned) given its input ``source`` and ``meta``."""
    known: Mapping[str, Any] = {}
    if isinstance(answer, Answer):
        answer, known = answer.text, answer.known
    parsed = _parse(accept, answer)
    if isinstance(parsed, Verdict):
        return parsed
    record, repaired = parsed
    if accept.schema is not None:
        shaped = _shape(accept, record, repaired)
        if isinstance(shaped, Verdict):
            return shaped
        record = shaped
    if known:
        if not isinstance(record, Mapping):
            return Verdict(record, INVALID_FORMAT, f"the answer is a {type(record).__name__}, not an object", repaired)
        record = {**record, **known}
    confidence = _confidence(accept, record)
    if isinstance(record, Mapping):
        problems = [(c, c(record, source, meta)) for c in accept.checks]
        failed = [(c, p) for c, p in problems if p]
        if failed:
            return Verdict(record, INVALID_CONTENT, "; ".join(p for _, p in failed), repaired, confidence,
                           reviewable=all(c.reviewable for c, _ in failed))
    elif accept.checks:
        return Verdict(record, INVALID_FORMAT, f"the answer is a {type(record).__name__}, not an object to check",
                       repaired)
    if accept.threshold and (confidence is None or confidence < accept.threshold):
        shown = "no confidence" if confidence is None else f"confidence {confidence:g}"
        return Verdict(record, LOW_CONFIDENCE, f"{shown} is below the threshold {accept.threshold:g}", repaired,
                       confidence, reviewable=True)
    return Verdict(record, None, "", repaired, confidence)


def _parse(accept: Accept, answer: Any) -> tuple[Any, bool] | Verdict:
    """The answer as data, and whether its text had to be repaired."""
    if hasattr(answer, "model_dump"):
        return answer.model_dump(mode="json"), False
    if isinstance(answer, (bytes, bytearray)):
        try:
            answer = bytes(answer).decode("utf-8")
        except UnicodeDecodeError:
            return Verdict(None, INVALID_FORMAT, "the answer is bytes that are not UTF-8 text")
    if not isinstance(answer, str) or (accept.schema is None and not accept.repair):
        return answer, False
    try:
        return json.loads(answer), False
    except ValueError as exc:
        problem = f"the answer is not JSON ({exc})"
    if not accept.repair:
        return Verdict(answer, INVALID_FORMAT, problem)
    return _repaired(answer, problem)


def _repaired(answer: str, problem: str) -> tuple[Any, bool] | Verdict:
    """The answer without its code fence and trailing commas, if that makes it a JSON object or array. A
    cut-off answer is refused: repair never completes a value (see acceptance/repair.py)."""
    mended = mend(answer)
    if mended.cut_off:
        return Verdict(answer, INVALID_FORMAT, mended.cut_off)
    try:
        value = json.loads(mended.text)
    except ValueError as exc:
        fixed = " once its code fence and trailing commas are removed" if mended.repaired else ""
        return Verdict(answer, INVALID_FORMAT, f"the answer is not JSON{fixed} ({exc})")
    if not isinstance(value, (dict, list)):
        return Verdict(answer, INVALID_FORMAT, f"{problem}, and its format cannot be repaired")
    return value, mended.repaired


def _shape(accept: Accept, record: Any, repaired: bool) -> Any:
    from pydantic import ValidationError

    try:
        return accept.schema.model_validate(record).model_dump(mode="json")
    except ValidationError as exc:
        return Verdict(record, INVALID_FORMAT, shape_problem(exc, "the answer"), repaired)


def shape_problem(exc: Any, what: str) -> str:
    """A pydantic ValidationError in one line: the first field, its problem, how many more."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or what
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def _confidence(accept: Accept, record: Any) -> float | None:
    if not accept.confidence or not isinstance(record, Mapping):
        return None
    value = record.get(accept.confidence)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
