"""Forecasts: what running some tasks will cost in tokens, dollars and wall time, before it starts.

Each stage is forecast from the measured averages of its past attempts (the pipeline's latest runs, every
invoked attempt: retries and escalation tiers included, so a stage whose answers are often refused costs what
it really costs), or, before a first run, from a small sample of items run for real in a scratch store. The
uncertainty is stated: a 95% margin from the spread of the attempts and from how many there were.

Wall time is paced by the slowest stage (stages overlap): the larger of what its model's declared quota allows
(tokens and requests per minute) and what its concurrency allows (``workers`` x ``concurrency`` calls at once,
each taking the measured mean).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.pipeline import Pipeline, RateLimit, find_limit, parse_limits
from conveyor.pipeline.limits import ENV_VAR as LIMITS_ENV
from conveyor.store import SqlStore
from conveyor.store.forecast import StageCosts

Z95 = 1.96


@dataclass(frozen=True)
class StageHistory:
    """The measured averages of one stage's attempts."""

    attempts: int
    per_task: float  # attempts per task that ran (retries, escalation tiers)
    tokens: float
    tokens_sd: float
    cost: float
    cost_sd: float
    seconds: float
    seconds_sd: float
    calls: float  # provider calls per attempt
    unpriced: bool  # every call of it was to a model without a price
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, c: StageCosts, models: Mapping[str, int]) -> StageHistory:
        n = max(c.attempts, 1)
        return cls(c.attempts, c.attempts / max(c.tasks, 1), c.tokens / n, _sd(c.tokens, c.tokens_sq, n), c.cost / n,
                   _sd(c.cost, c.cost_sq, n), c.seconds / n, _sd(c.seconds, c.seconds_sq, n), c.calls / n,
                   bool(c.calls) and c.unpriced >= c.calls, tuple(sorted(models, key=lambda m: -models[m])))


def _sd(total: float, squares: float, n: int) -> float:
    if n < 2:
        return 0.0
    mean = total / n
    return math.sqrt(max(0.0, squares / n - mean * mean) * n / (n - 1))


@dataclass(frozen=True)
class History:
    stages: dict[str, StageHistory]
    runs: tuple[str, ...]
    basis: str  # "history" or "sample"
    fanout: dict[str, float]  # stage -> its tasks per task of the stage it comes after (fan-outs: children)


def history(store: SqlStore, pipeline: Pipeline, runs: int = 5, basis: str = "history") -> History:
    """The measured averages of ``pipeline``'s stages over its latest ``runs`` runs."""
    run_ids = store.recent_runs(pipeline.name, runs)
    models = store.stage_models(run_ids)
    stages = {c.stage: StageHistory.of(c, models.get(c.stage, {})) for c in store.stage_costs(run_ids)}
    counts = store.stage_task_counts(run_ids)
    fanout = {s.name: counts[s.name] / counts[s.after] for s in pipeline
              if s.after is not None and counts.get(s.after) and s.name in counts}
    return History(stages, tuple(run_ids), basis, fanout)


def limits_of(pipeline: Pipeline) -> dict[str, RateLimit]:
    """The pipeline's declared limits, with CONVEYOR_LIMITS over them key by key (as a worker sees them)."""
    return {**pipeline.limits, **parse_limits(os.environ.get(LIMITS_ENV))}


def forecast(pipeline: Pipeline, past: History, to_run: Mapping[str, float], workers: int,
             limits: Mapping[str, RateLimit] | None = None) -> dict[str, Any]:
    """Tokens, cost and wall time of running ``to_run`` tasks per stage, with 95% margins."""
    limits = pipeline.limits if limits is None else limits
    stages: dict[str, Any] = {}
    tokens = cost = 0.0
    tokens_var = cost_var = 0.0
    unknown: list[str] = []
    unpriced = False
    slowest = 0.0
    for name, count in to_run.items():
        if count <= 0:
            continue
        h = past.stages.get(name)
        if h is None:
            unknown.append(name)
            stages[name] = {"tasks": count, "basis": "none"}
            continue
        attempts = count * h.per_task
        t_var, c_var = _variance(h.tokens_sd, attempts, h.attempts, h.tokens), _variance(
            h.cost_sd, attempts, h.attempts, h.cost)
        seconds = _stage_seconds(pipeline, name, h, attempts, workers, limits)
        stages[name] = {"tasks": count, "attempts": round(attempts, 1), "tokens": attempts * h.tokens,
                        "cost": None if h.unpriced else attempts * h.cost, "seconds": seconds,
                        "attempts_seen": h.attempts, "basis": past.basis}
        tokens += attempts * h.tokens
        cost += attempts * h.cost
        tokens_var += t_var
        cost_var += c_var
        unpriced = unpriced or h.unpriced
        slowest = max(slowest, seconds)
    seen = sum(h.attempts for h in past.stages.values())
    basis = (f"{'a sample' if past.basis == 'sample' else 'the history'} of {len(past.runs)} run(s), "
             f"{seen:,} attempt(s)" if past.stages else "no history")
    if unknown:
        basis += f"; no measure for {', '.join(unknown)}"
    return {"basis": basis, "tokens": tokens, "tokens_margin": Z95 * math.sqrt(tokens_var),
            "cost": None if unpriced and not cost else cost, "cost_margin": Z95 * math.sqrt(cost_var),
            "seconds": slowest, "confidence": 0.95, "workers": workers, "unknown_stages": unknown,
            "stages": stages}


def _variance(sd: float, attempts: float, seen: int, mean: float) -> float:
    """The variance of a sum of ``attempts`` draws, plus the uncertainty of a mean measured on ``seen``."""
    if seen <= 0:
        return 0.0
    spread = sd * sd * attempts
    of_mean = (attempts * sd / math.sqrt(seen)) ** 2
    few = (attempts * mean) ** 2 / seen if seen < 5 else 0.0  # a handful of measures: say so in the margin
    return spread + of_mean + few


def _stage_seconds(pipeline: Pipeline, name: str, h: StageHistory, attempts: float, workers: int,
                   limits: Mapping[str, RateLimit]) -> float:
    """The wall time of one stage's attempts: its quota's pace or its concurrency's, whichever is slower."""
    try:
        stage = pipeline[name]
    except Exception:
        return 0.0
    slots = max(1, workers) * (stage.concurrency if stage.is_async else 1)
    by_concurrency = attempts * h.seconds / slots
    by_quota = 0.0
    for model in h.models[:1]:
        limit = find_limit(limits, "", model)
        if limit is None:
            continue
        if limit.tpm:
            by_quota = max(by_quota, attempts * h.tokens / limit.tpm * 60.0)
        if limit.rpm:
            by_quota = max(by_quota, attempts * h.calls / limit.rpm * 60.0)
    return max(by_concurrency, by_quota)
