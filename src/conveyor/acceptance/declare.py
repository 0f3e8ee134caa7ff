"""What a stage declares about its answers: their shape, checks of their meaning, how sure they must be,
who looks at them when they are not, and what happens when nobody does.

Pure declarations: nothing here reads a file, a database or the network.

Example::

    class Found(BaseModel):
        product_id: str | None          # absent, never guessed
        confidence: float

    @pipe.stage(after=parse, version="3", config={"model": "gpt-4o-mini"},
                accept=Accept(schema=Found, repair=True,
                              checks=[found_in("product_id"), matches("product_id", r"P-\\d{6}")],
                              confidence="confidence", threshold=0.8,
                              escalate=[{"model": "gpt-4o"}],
                              review=Review(deadline="48h", on_deadline="reject")))
    async def extract(ctx, doc: dict) -> str:
        answer = await ctx.chat(prompt(doc), model=ctx.config["model"], json_mode=True)
        return answer.text              # repaired when only its format is wrong, then checked
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import PipelineError

# The classes a refused answer carries (its task's error class).
INVALID_FORMAT = "invalid_format"  # not the declared shape (after any declared repair)
INVALID_CONTENT = "invalid_content"  # the right shape, a check of meaning failed
LOW_CONFIDENCE = "low_confidence"  # valid, but less sure than the threshold
REFUSALS = (INVALID_FORMAT, INVALID_CONTENT, LOW_CONFIDENCE)
# A field an answer could not determine says so with this value (or is absent / None): checks pass over it.
UNKNOWN = "unknown"
DEADLINE_OUTCOMES = ("reject", "accept", "escalate")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# A check looks at the answer (a dict), the stage's input and the item's manifest ``meta``; it returns
# what is wrong, or None.
CheckFn = Callable[[Mapping[str, Any], Any, Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Check:
    """A deterministic check of an answer's meaning. ``reviewable``: a failure goes to review (when the
    stage declares one) instead of failing the item."""

    name: str
    fn: CheckFn
    reviewable: bool = False

    def __call__(self, record: Mapping[str, Any], source: Any, meta: Mapping[str, Any]) -> str | None:
        return self.fn(record, source, meta)


def check(fn: CheckFn, *, name: str | None = None, reviewable: bool = False) -> Check:
    """Your own check: ``fn(record, source, meta)`` returns a problem (str) or None."""
    if not callable(fn):
        raise PipelineError(f"check({fn!r}): pass a function (record, source, meta) -> problem or None")
    return Check(str(name or getattr(fn, "__name__", None) or "check"), fn, reviewable)


def found_in(field_name: str, source: Callable[[Any], Any] | None = None, *, ignore_case: bool = True,
             reviewable: bool = False) -> Check:
    """Every value of ``field_name`` (a string or a list of strings) appears in the item's source: the
    stage's input, or what ``source(input)`` picks from it. Absent, None and ``"unknown"`` pass."""
    _field(field_name, "found_in")

    def found(record: Mapping[str, Any], given: Any, meta: Mapping[str, Any]) -> str | None:
        haystack = _text(source(given) if source is not None else given)
        if ignore_case:
            haystack = haystack.casefold()
        for value in _values(record.get(field_name)):
            if (value.casefold() if ignore_case else value) not in haystack:
                return f"{field_name} {value!r} is not found in the source"
        return None

    return Check(f"found_in:{field_name}", found, reviewable)


def matches(field_name: str, pattern: str, *, reviewable: bool = False) -> Check:
    """Every value of ``field_name`` matches ``pattern`` whole (an identifier format). Absent, None and
    ``"unknown"`` pass."""
    _field(field_name, "matches")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise PipelineError(f"matches({field_name!r}, {pattern!r}): not a regular expression ({exc})") from None

    def matching(record: Mapping[str, Any], given: Any, meta: Mapping[str, Any]) -> str | None:
        for value in _values(record.get(field_name)):
            if compiled.fullmatch(value) is None:
                return f"{field_name} {value!r} does not match {pattern}"
        return None

    return Check(f"matches:{field_name}", matching, reviewable)


def meta_equals(field_name: str, key: str | None = None, *, reviewable: bool = False) -> Check:
    """``field_name`` agrees with the item's manifest ``meta[key]`` (``key`` defaults to the field's name),
    when the manifest gives it. Absent, None and ``"unknown"`` pass."""
    _field(field_name, "meta_equals")
    wanted = key or field_name

    def agreeing(record: Mapping[str, Any], given: Any, meta: Mapping[str, Any]) -> str | None:
        value = record.get(field_name)
        if wanted not in meta or value is None or value == UNKNOWN:
            return None
        if _same(value, meta[wanted]):
            return None
        return f"{field_name} {value!r} disagrees with the manifest's meta {wanted}={meta[wanted]!r}"

    return Check(f"meta_equals:{field_name}", agreeing, reviewable)


@dataclass(frozen=True)
class Review:
    """People look at answers a stage is not sure of, without holding a worker while they wait.

    ``deadline`` (seconds, or "90m", "48h", "2d"): when it passes with no decision, ``on_deadline``
    happens: ``reject``, ``accept`` (as it is), or ``escalate`` (one more try at the strongest
    escalation tier, whose refusal then fails the item).
    """

    deadline: float | str = "48h"
    on_deadline: str = "reject"

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadline", seconds(self.deadline, "Review(deadline=...)"))
        if self.on_deadline not in DEADLINE_OUTCOMES:
            raise PipelineError(f"Review(on_deadline={self.on_deadline!r}): use one of {', '.join(DEADLINE_OUTCOMES)}")

    @property
    def deadline_s(self) -> float:
        return float(self.deadline)


@dataclass(frozen=True)
class Accept:
    """The acceptance boundary of a stage's answers (see the module's docstring for an example).

    - ``schema``: a pydantic model the answer must fit (its shape); a text answer is parsed as JSON.
    - ``repair``: a text answer whose JSON is broken only by a code fence around it or trailing commas is
      repaired (acceptance/repair.py); the attempt records that it was. A cut-off answer is refused, never
      completed.
    - ``checks``: checks of meaning (``found_in``, ``matches``, ``meta_equals``, ``check``).
    - ``confidence`` / ``threshold``: the answer's field holding its confidence (0..1), and the least
      accepted; an answer without one is below any threshold.
    - ``escalate``: config overrides tried in order (``ctx.config`` shows the tier's merged config,
      ``ctx.tier`` its number) when an answer is refused with a class in ``escalate_on``.
    - ``review``: where low-confidence answers (and failures of reviewable checks) wait for people once
      the tiers are spent; without it they fail with their class.
    """

    schema: Any = None
    repair: bool = False
    checks: Sequence[Check] = ()
    confidence: str | None = None
    threshold: float = 0.0
    escalate: Sequence[Mapping[str, Any]] = ()
    escalate_on: Sequence[str] = REFUSALS
    review: Review | None = None
    tiers: tuple[dict[str, Any], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.schema is not None and not callable(getattr(self.schema, "model_validate", None)):
            raise PipelineError(f"Accept(schema={self.schema!r}): pass a pydantic model class")
        bad = [c for c in self.checks if not isinstance(c, Check)]
        if bad:
            raise PipelineError(f"Accept(checks=...): {bad[0]!r} is not a check; build one with found_in, matches, "
                                "meta_equals or check(fn)")
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold <= 1.0):
            raise PipelineError(f"Accept(threshold={self.threshold!r}) must be a number from 0 to 1")
        if self.threshold and not self.confidence:
            raise PipelineError("Accept(threshold=...) needs confidence=\"FIELD\": the answer's field that holds it")
        wrong = sorted(set(self.escalate_on) - set(REFUSALS))
        if wrong:
            raise PipelineError(f"Accept(escalate_on=...): {wrong[0]!r} is not one of {', '.join(REFUSALS)}")
        tiers = tuple(dict(t) for t in self.escalate)
        if any(not isinstance(t, Mapping) for t in self.escalate):
            raise PipelineError("Accept(escalate=[...]): each tier is a dict of config overrides")
        if self.review is not None and self.review.on_deadline == "escalate" and not tiers:
            raise PipelineError("Review(on_deadline=\"escalate\") needs Accept(escalate=[...]) tiers to escalate to")
        object.__setattr__(self, "checks", tuple(self.checks))
        object.__setattr__(self, "escalate_on", tuple(self.escalate_on))
        object.__setattr__(self, "tiers", tiers)

    def config_at(self, base: Mapping[str, Any], tier: int) -> dict[str, Any]:
        """The stage config at escalation ``tier`` (0: as declared); tiers past the last use the last."""
        merged = dict(base)
        for overrides in self.tiers[:tier]:
            merged.update(overrides)
        return merged

    def identity(self) -> dict[str, Any]:
        """What about this declaration changes which answers are accepted: part of the stage's config hash."""
        schema = self.schema
        return {
            "schema": None if schema is None else json.dumps(schema.model_json_schema(), sort_keys=True),
            "repair": self.repair, "checks": [c.name for c in self.checks], "confidence": self.confidence,
            "threshold": self.threshold, "escalate": [dict(t) for t in self.tiers],
        }


def seconds(value: float | str, where: str) -> float:
    """A duration: a number of seconds, or "90s", "30m", "48h", "2d"."""
    if isinstance(value, str):
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)
        if found is None:
            raise PipelineError(f"{where}: {value!r} is not a duration; write seconds, or like 90m, 48h, 2d")
        number = float(found.group(1)) * _UNITS[found.group(2) or "s"]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise PipelineError(f"{where}: {value!r} is not a duration; write seconds, or like 90m, 48h, 2d")
    if not (math.isfinite(number) and number > 0):
        raise PipelineError(f"{where}: {value!r} must be more than 0 seconds")
    return number


def _field(name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise PipelineError(f"{what}(...) needs the answer's field name as its first argument")


def _values(value: Any) -> list[str]:
    """The strings to check in a field: a string, or the strings of a list; None and UNKNOWN are skipped."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in items if v is not None and v != UNKNOWN]


def _same(value: Any, expected: Any) -> bool:
    if isinstance(value, str) and isinstance(expected, str):
        return value.casefold() == expected.casefold()
    return bool(value == expected)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False, default=str)
