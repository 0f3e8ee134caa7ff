"""Forecasts: what running some tasks will cost in tokens, dollars and wall time, before it starts.

Each stage is forecast from the measured averages of its past attempts (the pipeline's latest runs, every
invoked attempt: retries and escalation tiers included, so a stage whose answers are often refused costs what
it really costs), or, before a first run, from a small sample of items run for real in a scratch store. The
uncertainty is stated: a 95% margin from the spread of the attempts and from how many there were.

Tokens come from the measure; dollars are priced for the model each escalation tier of the stage will call
(its declared ``config["model"]``, else what its past tasks under the same version and config asked for) from
the provider's price table, or from what that same model's past calls cost. A stage whose model cannot be known
is not priced as another model: the forecast says so (``unpriced_stages``), since a switch to a dearer model
would otherwise be forecast at the cheaper one's price.

Wall time: the measured start-up (run created to first attempt), plus the slowest stage or model quota (stages
overlap), plus one attempt of each stage (the last item still has to pass through them). A stage's own time is
its attempts, each taking the measured mean, over the calls it keeps in flight: as many per worker as its past
runs kept (its attempts' seconds over their span, per worker that ran them: a worker's claims, commits and quota
grants hold a stage of quick calls well below its slots), times ``workers``, at most its slots (``workers`` x
``concurrency``), in runs where it had a backlog and no model's quota held it (``kept_in_flight``). A measure
without such a run (a small sample, a stage only fed by a slower one) cannot tell how many they keep busy: the
forecast then takes the slots and gives the measured pace as the slower end of ``seconds_range``. A stage
measured beside others in its workers (a CPU-bound stage, a busy one) kept fewer in flight than alone: when they
will not run, the forecast gives it their share back, and what it kept is the slower end. A stage lasts at least
its longest measured attempt (a call that hung until its timeout), in a run as large as the one that met it.
The mean is the steady pace: a warm-up in each worker's first calls of a stage (a model it loads; see
``steady_pace``) is taken apart and added once, since a run's workers pay it side by side.
A model's quota is a sliding minute: a minute's limit goes through at once and the next only when those grants
age out, so a run of T tokens against L a minute waits floor(T / L) minutes for its last grants (a ``spread``
limit: T / L minutes). T counts what calls in flight hold beyond their use (their answer's unused room), for as
many calls as the stage had in flight on average, not as many as it may have. Near a multiple of L a small error
in the tokens moves that by a minute: where the tokens' 95% margin straddles one, the forecast takes the likelier
side, gives both (``seconds_range``) and says so (``quota_cliff``, with the chance of the wait).

A task equal to another of the same run (the same input, version and config) is one call: the dry run counts
the second as a memo answer (service/dryrun.py).
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from conveyor.pipeline import Pipeline, RateLimit, Stage, find_limit, parse_limits
from conveyor.pipeline.limits import ENV_VAR as LIMITS_ENV
from conveyor.providers.base import PriceTable
from conveyor.store import SqlStore
from conveyor.store.forecast import ModelUse, StageCosts, StageSpan

Z95 = 1.96
WINDOW_S = 60.0  # providers count per minute
DEFAULT_MAX_TOKENS = 512  # what a chat call reserves for its answer when the stage does not say (runtime/services)
FILLED = 2  # a worker's attempts of a stage, in slots, from which its measured concurrency is what it can keep
FED = 2  # a stage that ended within this many of its attempts after the one before it was only fed by it
BESIDE = 0.1  # a stage whose calls in flight over another's span reach this share of its own shared its workers
WARM = 2.0  # a worker's first wave of a stage whose attempts took this many times the rest's carried a warm-up


@dataclass(frozen=True)
class TierUse:
    """One escalation tier of a stage, as measured: its share of the stage's attempts and their mean tokens."""

    share: float
    prompt: float
    completion: float
    calls: float


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
    tiers: Mapping[int, TierUse] = field(default_factory=dict)
    paid: tuple[ModelUse, ...] = ()  # what each model's calls cost: a price for a model the table lacks
    asked: Mapping[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)  # (version, config) -> models
    per_worker: float = 0.0  # attempts a worker kept in flight, on average over their span (0: not measured)
    filled: bool = False  # measured where its workers had a backlog: per_worker is what a worker keeps busy
    own_seconds: float = 0.0  # an attempt's mean in the runs per_worker was measured on (no quota's wait in it)
    alone: float = 0.0  # per_worker, with what the stages beside it had in flight in its workers given back to it
    beside: frozenset[str] = frozenset()  # the stages that shared its workers in the measure
    longest: float = 0.0  # its longest attempt in those runs (a call that hung until its timeout)
    measured: int = 0  # its attempts in those runs, a run's worth
    warmup: float = 0.0  # seconds a worker's first wave of it took beyond the steady pace (a model's load), once

    @classmethod
    def of(cls, c: StageCosts, models: Mapping[str, int], uses: Sequence[ModelUse] = (),
           asked: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
           kept: Kept | None = None) -> StageHistory:
        n = max(c.attempts, 1)
        return cls(c.attempts, c.attempts / max(c.tasks, 1), c.tokens / n, _sd(c.tokens, c.tokens_sq, n), c.cost / n,
                   _sd(c.cost, c.cost_sq, n), c.seconds / n, _sd(c.seconds, c.seconds_sq, n), c.calls / n,
                   bool(c.calls) and c.unpriced >= c.calls, tuple(sorted(models, key=lambda m: -models[m])),
                   _tiers(uses, n), tuple(u for u in uses if u.calls), dict(asked or {}),
                   *(kept or Kept(0.0, False, c.seconds / n, 0.0, frozenset(), 0.0, 0)))

    @property
    def pace(self) -> float:
        """The seconds of an attempt the stage's own time is forecast with."""
        return self.own_seconds or self.seconds


class Kept(NamedTuple):
    """How many attempts of a stage a worker kept in flight, whether that is what it can keep, the mean seconds
    of an attempt in the runs that measured it, how many it would have kept alone in its workers (the stages
    beside it gave it back what they had in flight there), and those stages."""

    per_worker: float
    filled: bool
    seconds: float
    alone: float = 0.0
    beside: frozenset[str] = frozenset()
    longest: float = 0.0  # the longest attempt in those runs
    measured: int = 0  # the attempts of a run of those, on average
    warmup: float = 0.0  # what a worker's first wave took beyond the steady pace ``seconds``, once per worker


def kept_in_flight(spans: Sequence[StageSpan], parents: Mapping[str, StageSpan], slots: int,
                   paced: Mapping[str, float] | None = None,
                   others: Mapping[str, Sequence[StageSpan]] | None = None,
                   firsts: Mapping[str, Sequence[tuple[int, float]]] | None = None) -> Kept:
    """How many attempts of a stage a worker kept in flight (its attempts' seconds over their span, per worker
    that ran them), and whether that is what a worker can keep: measured in runs where each of its workers had
    attempts enough to fill its ``slots`` FILLED times, the stage outlasted the one it comes after by more than
    its own last attempts (it had a backlog, not only what that one fed it), and no model's quota held it for
    half its span or more (its attempts then waited for grants). ``parents``: run -> the span of the stage it
    comes after, where that one ran; ``paced``: run -> the seconds a model's quota held its calls there;
    ``others``: run -> the spans of the other stages there. Stages beside it in its workers (a CPU-bound one, a
    busy one) kept it below what it keeps alone: what they had in flight over its span (their calls in flight on
    average, over the time the spans share) is given back to it in ``alone``, an estimate: the measure says how
    many it kept beside them, not alone. ``firsts``: run -> each worker's first wave of the stage there (its
    first ``slots`` attempts: their count and seconds); see ``steady_pace``."""
    def backlogged(s: StageSpan) -> bool:
        parent = parents.get(s.run_id)
        mean = s.seconds / max(1, s.attempts)
        return (s.attempts / s.workers >= FILLED * slots and (parent is None or s.end - parent.end > FED * mean)
                and (paced or {}).get(s.run_id, 0.0) < (s.end - s.start) / 2)

    measured = [s for s in spans if s.end > s.start]
    reliable = [s for s in measured if backlogged(s)]
    use = reliable or measured
    worker_span = sum((s.end - s.start) * s.workers for s in use)
    busy = sum(s.seconds for s in use)
    mean, warmup = steady_pace(busy, sum(s.attempts for s in use),
                               [wave for s in use for wave in (firsts or {}).get(s.run_id, ())])
    if not worker_span:
        return Kept(0.0, False, mean, warmup=warmup)
    shared: dict[str, float] = {}  # stage beside it -> the seconds it had in flight over its span
    for s in use:
        for other in (others or {}).get(s.run_id, ()):
            if other.stage != s.stage and other.end > other.start:
                overlap = min(s.end, other.end) - max(s.start, other.start)
                if overlap > 0:
                    shared[other.stage] = shared.get(other.stage, 0.0) + other.seconds / (other.end - other.start) \
                        * overlap
    beside = frozenset(name for name, seconds in shared.items() if seconds > BESIDE * busy)
    kept = max(1.0, busy / worker_span)
    alone = max(kept, (busy + sum(shared[name] for name in beside)) / worker_span)
    return Kept(kept, bool(reliable), mean, alone, beside, max(s.longest for s in use),
                round(sum(s.attempts for s in use) / len(use)), warmup)


def steady_pace(seconds: float, attempts: int, waves: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """The mean seconds of an attempt at the steady pace, and the warm-up: what each worker's first wave of
    attempts (``waves``: their count and seconds, a worker's first ``slots`` of them) took beyond that pace, on
    average over the workers. A stage that loads a model on its first call (local embeddings) holds its first
    wave's slots for the load: spread over a sample's few dozen attempts, it would weigh on each of a run's
    hundreds; a worker pays it once. Taken apart only when the first waves took WARM times the rest's pace or
    more, with more attempts after them than in them (otherwise the mean of all is the pace, and no warm-up)."""
    mean = seconds / max(1, attempts)
    first = sum(n for n, _ in waves)
    first_seconds = sum(s for _, s in waves)
    rest = attempts - first
    if not first or rest <= first:
        return mean, 0.0
    steady = max(0.0, seconds - first_seconds) / rest
    if first_seconds / first < WARM * steady or first_seconds / first <= steady:
        return mean, 0.0
    extra = [max(0.0, s / n - steady) for n, s in waves if n]
    return steady, sum(extra) / len(extra)


def _tiers(uses: Sequence[ModelUse], attempts: int) -> dict[int, TierUse]:
    """Each tier's share of the attempts and mean tokens per attempt at it."""
    tiers: dict[int, list[float]] = {}
    for u in uses:
        t = tiers.setdefault(u.tier, [0.0, 0.0, 0.0, 0.0])
        t[0] += u.attempts
        t[1] += u.prompt
        t[2] += u.completion
        t[3] += u.calls
    return {tier: TierUse(n / attempts, p / max(n, 1), c / max(n, 1), k / max(n, 1))
            for tier, (n, p, c, k) in tiers.items()}


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
    startup: float = 0.0  # seconds from a run's creation to its first attempt (submission, workers starting)
    groups: dict[str, tuple[int, int]] = field(default_factory=dict)  # group stage -> (groups, members), one run


def history(store: SqlStore, pipeline: Pipeline, runs: int = 5, basis: str = "history") -> History:
    """The measured averages of ``pipeline``'s stages over its latest ``runs`` runs."""
    run_ids = store.recent_runs(pipeline.name, runs)
    models = store.stage_models(run_ids)
    uses: dict[str, list[ModelUse]] = {}
    for use in store.model_use(run_ids):
        uses.setdefault(use.stage, []).append(use)
    asked: dict[str, dict[tuple[str, str], dict[str, int]]] = {}
    for (stage, version, config), by_model in store.declared_models(run_ids).items():
        asked.setdefault(stage, {})[(version, config)] = by_model
    spans: dict[str, dict[str, StageSpan]] = {}
    by_run: dict[str, list[StageSpan]] = {}
    for span in store.stage_spans(run_ids):
        spans.setdefault(span.stage, {})[span.run_id] = span
        by_run.setdefault(span.run_id, []).append(span)
    limits = limits_of(pipeline)
    paced: dict[str, dict[str, float]] = {}  # stage -> run -> the seconds a model's quota held its calls there
    for run_id, name, model, tokens, calls in store.run_model_use(run_ids):
        held = paced.setdefault(name, {})
        held[run_id] = max(held.get(run_id, 0.0), _quota_seconds(limits, model, tokens, calls))
    per_worker = {s.name: _slots(s, 1) for s in pipeline}
    firsts: dict[str, dict[str, dict[str, list[float]]]] = {}  # stage -> run -> worker -> its first wave's seconds
    for first in store.first_attempts(run_ids, max(per_worker.values(), default=1)):
        if first.rank <= per_worker.get(first.stage, 1):
            firsts.setdefault(first.stage, {}).setdefault(first.run_id, {}).setdefault(first.worker, []).append(
                first.seconds)
    stages = {}
    for c in store.stage_costs(run_ids):
        declared = _stage(pipeline, c.stage)
        after = declared.after if declared is not None else None
        waves = {run: [(len(wave), sum(wave)) for wave in workers.values()]
                 for run, workers in firsts.get(c.stage, {}).items()}
        kept = kept_in_flight(list(spans.get(c.stage, {}).values()), spans.get(after, {}) if after else {},
                              _slots(declared, 1), paced.get(c.stage), by_run, waves)
        stages[c.stage] = StageHistory.of(c, models.get(c.stage, {}), uses.get(c.stage, ()), asked.get(c.stage),
                                          kept)
    by_run_counts = [store.stage_task_counts([run_id]) for run_id in run_ids]  # newest first
    counts: dict[str, int] = {}
    for one in by_run_counts:
        for name, count in one.items():
            counts[name] = counts.get(name, 0) + count
    # Tasks a stage has per task of its parent: a fan-out's children, a group stage's groups per member.
    fanout = {s.name: counts[s.name] / counts[s.after] for s in pipeline
              if s.after is not None and counts.get(s.after) and s.name in counts}
    # A group stage's groups and members in the latest run that grouped (runs share their keys: not added up).
    groups: dict[str, tuple[int, int]] = {}
    for s in pipeline:
        if s.kind == "group" and s.after is not None:
            latest = next(((one[s.name], one[s.after]) for one in by_run_counts
                           if one.get(s.name) and one.get(s.after)), None)
            if latest is not None:
                groups[s.name] = latest
    startups = store.run_startups(run_ids)
    return History(stages, tuple(run_ids), basis, fanout, statistics.median(startups) if startups else 0.0,
                   groups)


def groups_of(members: float, seen: tuple[int, int] | None) -> int:
    """How many groups ``members`` members make, from a measure that saw ``seen`` = (groups, members): one when
    nothing was measured; as many per member when each member had a group of its own; else those of a key with G
    values equally likely, G solved from the measure (G(1 - (1 - 1/G)^members) groups: a key with few values,
    such as a manual's section, makes about as many groups in a run of hundreds as in a sample of two dozen,
    not as many per member)."""
    if members <= 0:
        return 0
    if seen is None or seen[0] <= 1 or seen[1] <= 0:
        return 1
    groups, measured = seen
    if groups >= measured:
        return max(1, round(members * groups / measured))

    def drawn(values: float, draws: float) -> float:  # the distinct values expected in ``draws`` draws
        return values * -math.expm1(draws * math.log1p(-1.0 / values))

    low, high = float(groups), float(groups)
    while drawn(high, measured) < groups and high < 1e12:
        low, high = high, high * 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if drawn(middle, measured) < groups else (low, middle)
    return max(1, round(drawn(high, members)))


def limits_of(pipeline: Pipeline) -> dict[str, RateLimit]:
    """The pipeline's declared limits, with CONVEYOR_LIMITS over them key by key (as a worker sees them)."""
    return {**pipeline.limits, **parse_limits(os.environ.get(LIMITS_ENV))}


def price_tables(pipeline: Pipeline) -> list[PriceTable]:
    """The price tables of the provider the pipeline's workers would make (its chat side, then its embeddings
    side); none when it cannot be made here (not configured): the forecast then prices from past calls."""
    try:
        if pipeline.provider_factory is not None:
            provider = pipeline.provider_factory()
        else:
            from conveyor.providers.factory import provider_from_env

            provider = provider_from_env()
    except Exception:  # any failure only means no table: say "unpriced", never fail a dry run
        return []
    tables: list[PriceTable] = []
    for backend in (getattr(provider, "chat_provider", provider), getattr(provider, "embed_provider", provider)):
        table = getattr(backend, "prices", None)
        if isinstance(table, PriceTable) and all(table is not t for t in tables):
            tables.append(table)
    _close(provider)
    return tables


def _close(provider: Any) -> None:
    close = getattr(provider, "aclose", None)
    if close is None:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here: close it in one of its own
        try:
            asyncio.run(close())
        except Exception:  # a provider that fails to close holds nothing the forecast needs
            pass


@dataclass(frozen=True)
class _Priced:
    """One stage's forecast price per attempt, the models it will call by tier, and its tokens by model."""

    cost: float | None  # USD per attempt; None when a model it calls is not known or has no price
    models: dict[int, str | None]
    tokens: dict[str, float]  # model -> tokens per attempt (for the model's quota)
    calls: dict[str, float]  # model -> calls per attempt
    reserve: dict[str, float]  # model -> tokens a call in flight holds beyond what it will use, until settled
    mix_var: float = 0.0  # the variance of the price per attempt from how few attempts measured each tier's share


def forecast(pipeline: Pipeline, past: History, to_run: Mapping[str, float], workers: int,
             limits: Mapping[str, RateLimit] | None = None,
             prices: Sequence[PriceTable] | None = None) -> dict[str, Any]:
    """Tokens, cost and wall time of running ``to_run`` tasks per stage, with 95% margins."""
    limits = pipeline.limits if limits is None else limits
    prices = price_tables(pipeline) if prices is None else prices
    stages: dict[str, Any] = {}
    tokens = cost = 0.0
    tokens_var = cost_var = 0.0
    unknown: list[str] = []
    unpriced: list[str] = []
    # by_slots: the slowest stage as forecast; slowest: the same, each stage at the calls its measure kept
    fill = by_slots = slowest = 0.0
    unfilled: list[str] = []  # stages whose measure had too few attempts to show how many a worker keeps busy
    alone: list[str] = []  # stages measured beside others that will not run with them
    warm: list[tuple[str, float]] = []  # stages whose workers' first calls carried a warm-up, and its seconds
    by_model: dict[str, list[float]] = {}  # model -> [tokens, calls, tokens held in flight, variance of tokens]
    for name, count in to_run.items():
        if count <= 0:
            continue
        h = past.stages.get(name)
        if h is None:
            unknown.append(name)
            stages[name] = {"tasks": count, "basis": "none"}
            continue
        stage = _stage(pipeline, name)
        attempts = count * h.per_task
        priced = _price(stage, h, prices)
        t_var = _variance(h.tokens_sd, attempts, h.attempts, h.tokens)
        per_token = (priced.cost or 0.0) / h.tokens if h.tokens else 0.0
        slots = _slots(stage, workers)
        kept = point = _kept(h, h.per_worker, slots, workers)  # in flight as measured, and as forecast
        if not h.filled:  # the measure could not fill its slots: they are the forecast, what it kept the slow end
            point = float(slots)
            if kept < slots and attempts > kept:
                unfilled.append(name)
        elif h.beside and not any(to_run.get(other, 0) > 0 for other in h.beside):
            # The stages that shared its workers in the measure will not run: alone it keeps more in flight (their
            # share given back), at worst what it kept beside them.
            point = _kept(h, h.alone, slots, workers)
            if point > kept:
                alone.append(name)
        # However many run at once, a stage lasts as long as its longest attempt (a call that hangs until its
        # timeout), in a run of as many attempts as the one that met it, or more.
        longest = h.longest if 2 * attempts >= h.measured else 0.0
        # A warm-up (a model's load in each worker's first calls) is paid once: the workers pay it side by side.
        seconds = max(h.warmup + attempts * h.pace / point, longest)
        by_slots = max(by_slots, seconds)
        slowest = max(slowest, h.warmup + attempts * h.pace / kept, longest)
        if h.warmup >= 0.05:  # one that shows in tenths of a second
            warm.append((name, h.warmup))
        # Calls in flight hold their answer's unused room until settled: as many as the stage had in flight on
        # average (a stage fed by a slower one fills few of its slots), at most its slots.
        holding = kept
        for model, per_attempt in priced.tokens.items():
            own = (attempts * per_attempt, attempts * priced.calls[model], holding * priced.reserve[model])
            share = per_attempt / h.tokens if h.tokens else 0.0
            use = by_model.setdefault(model, [0.0, 0.0, 0.0, 0.0])
            use[0], use[1], use[2] = use[0] + own[0], use[1] + own[1], max(use[2], own[2])
            use[3] += t_var * share * share
            seconds = max(seconds, _quota_pace(limits, model, *own, t_var * share * share).seconds)
        stage_cost = None if priced.cost is None else attempts * priced.cost
        stages[name] = {"tasks": count, "attempts": round(attempts, 1), "tokens": attempts * h.tokens,
                        "cost": stage_cost, "seconds": seconds, "attempts_seen": h.attempts, "basis": past.basis,
                        "models": {str(t): m for t, m in sorted(priced.models.items())},
                        "attempt_seconds": h.pace, "warmup_seconds": h.warmup, "slots": slots,
                        "concurrency": round(point, 1), "concurrency_measured": round(kept, 1)}
        if priced.cost is None and h.calls:
            unpriced.append(name)
        tokens += attempts * h.tokens
        cost += stage_cost or 0.0
        tokens_var += t_var
        cost_var += t_var * per_token * per_token + attempts * attempts * priced.mix_var
        fill += h.pace
    paces = {m: _quota_pace(limits, m, *use) for m, use in by_model.items()}
    quota, pacer = max(((p.seconds, m) for m, p in paces.items()), default=(0.0, ""))
    # A model's quota over every stage that calls it holds at least as long as over any one of them.
    busy = max(by_slots, quota)
    seconds = past.startup + busy + fill if busy else 0.0
    low = max((p.low for p in paces.values()), default=0.0)
    high = max((p.high for p in paces.values()), default=0.0)
    span = [past.startup + max(by_slots, low) + fill if busy else 0.0,
            past.startup + max(by_slots, slowest, high) + fill if busy else 0.0]
    cliff = max((p for p in paces.values() if p.cliff is not None and p.high > by_slots), default=None,
                key=lambda p: p.high)
    basis = _basis(past, unknown, unpriced, pacer if quota > by_slots else None, cliff,
                   unfilled if slowest > max(by_slots, high) else (), alone if span[0] < span[1] else (), warm)
    return {"basis": basis, "tokens": tokens, "tokens_margin": Z95 * math.sqrt(tokens_var),
            "cost": None if unpriced and not cost else cost, "cost_margin": Z95 * math.sqrt(cost_var),
            "seconds": seconds, "seconds_range": span, "quota_cliff": None if cliff is None else cliff.cliff,
            "confidence": 0.95, "workers": workers, "unknown_stages": unknown,
            "unpriced_stages": unpriced, "startup_seconds": past.startup if busy else 0.0, "stages": stages}


def _basis(past: History, unknown: Sequence[str], unpriced: Sequence[str], pacer: str | None,
           cliff: QuotaPace | None = None, unfilled: Sequence[str] = (), alone: Sequence[str] = (),
           warm: Sequence[tuple[str, float]] = ()) -> str:
    """What the forecast was measured on, and what it could not say."""
    seen = sum(h.attempts for h in past.stages.values())
    basis = (f"{'a sample' if past.basis == 'sample' else 'the history'} of {len(past.runs)} run(s), "
             f"{seen:,} attempt(s)" if past.stages else "no history")
    if unknown:
        basis += f"; no measure for {', '.join(unknown)}"
    if unpriced:
        basis += (f"; cost leaves out {', '.join(unpriced)}: the model it will call is not known or has no price "
                  "(declare it: config={'model': ...}; price it: CONVEYOR_PRICES)")
    if cliff is not None and cliff.cliff is not None:
        c = cliff.cliff
        basis += (f"; {c['model']}'s quota may pace it: its {c['used']:,.0f} {c['unit']} (± {c['margin']:,.0f}) sit "
                  f"at its limit of {c['limit']:,.0f} a minute, a {c['chance_paced']:.0%} chance of waiting "
                  f"{WINDOW_S:.0f} s more (seconds_range)")
    elif pacer:
        basis += f"; {pacer}'s quota paces it"
    if unfilled:
        basis += (f"; {', '.join(unfilled)} had too few attempts in the measure to fill its slots: forecast at "
                  "its slots, at the calls it kept in flight the slower end of seconds_range")
    if alone:
        basis += (f"; {', '.join(alone)} shared its workers with stages that will not run: forecast with their "
                  "share given back, at the calls it kept in flight beside them the slower end of seconds_range")
    if warm:
        basis += ("; " + ", ".join(f"{name}'s first calls in each worker took {seconds:.1f} s more than the rest"
                                   for name, seconds in warm) + " (a warm-up, such as a model's load): counted "
                  "once, not per attempt")
    return basis


def _stage(pipeline: Pipeline, name: str) -> Stage | None:
    try:
        return pipeline[name]
    except Exception:  # a stage of the history the declaration no longer has
        return None


def _slots(stage: Stage | None, workers: int) -> int:
    if stage is None:
        return max(1, workers)
    return max(1, workers) * (stage.concurrency if stage.is_async else 1)


def _kept(h: StageHistory, per_worker: float, slots: int, workers: int) -> float:
    """How many attempts of a stage ``workers`` workers keep in flight at ``per_worker`` each (a worker's claims,
    commits and quota grants pace it below its slots), at most its slots; its slots when not measured."""
    if not h.per_worker:
        return float(slots)
    return max(1.0, min(float(slots), per_worker * max(1, workers)))


def stage_model(stage: Stage | None, tier: int, h: StageHistory) -> str | None:
    """The model ``stage`` will call at escalation ``tier``: the one its config declares there, else the one its
    past tasks asked for under the same version and config; None when neither says."""
    config: Mapping[str, Any] = {}
    if stage is not None:
        config = stage.accept.config_at(stage.config, tier) if stage.accept is not None else stage.config
        model = config.get("model")
        if isinstance(model, str) and model:
            return model
        asked = h.asked.get((stage.version, stage.config_hash))
        if asked:
            return max(sorted(asked), key=lambda m: asked[m])
    return None


def _price(stage: Stage | None, h: StageHistory, prices: Sequence[PriceTable]) -> _Priced:
    """The cost of one attempt of ``stage`` at the prices of the models it will call, tier by tier."""
    cost: float | None = 0.0
    models: dict[int, str | None] = {}
    tokens: dict[str, float] = {}
    calls: dict[str, float] = {}
    reserve: dict[str, float] = {}
    by_tier: dict[int, float] = {}
    for tier, use in sorted(h.tiers.items()):
        if not use.calls:
            continue
        model = models[tier] = stage_model(stage, tier, h)
        price = None if model is None else _model_price(model, use.prompt, use.completion, prices, h.paid)
        cost = None if cost is None or price is None else cost + use.share * price
        if price is not None:
            by_tier[tier] = price
        if model is None:
            continue
        tokens[model] = tokens.get(model, 0.0) + use.share * (use.prompt + use.completion)
        calls[model] = calls.get(model, 0.0) + use.share * use.calls
        # A call holds prompt + max_tokens until it is settled to what it used: the answer's unused room.
        reserve[model] = max(reserve.get(model, 0.0), max(0.0, _max_tokens(stage, tier) - use.completion / use.calls))
    if not h.tiers and h.calls and stage is not None:  # history from before tiers were recorded
        cost = h.cost if not h.unpriced else None
    _unseen_tiers(stage, h, prices, by_tier)
    return _Priced(cost, models, tokens, calls, reserve, _mix_variance(h, by_tier))


def _unseen_tiers(stage: Stage | None, h: StageHistory, prices: Sequence[PriceTable],
                  by_tier: dict[int, float]) -> None:
    """Declared escalation tiers the measure never saw (a small sample): their price, for the margin only."""
    first = h.tiers.get(0)
    if stage is None or stage.accept is None or first is None or not first.calls:
        return
    for tier in range(1, len(stage.accept.tiers) + 1):
        model = stage_model(stage, tier, h)
        if tier not in by_tier and model is not None:
            price = _model_price(model, first.prompt, first.completion, prices, h.paid)
            if price is not None:
                by_tier[tier] = price


def _mix_variance(h: StageHistory, by_tier: Mapping[int, float]) -> float:
    """How uncertain the price per attempt is because each tier's share was measured on ``h.attempts``
    attempts: an escalation to a model many times dearer, seen in a few of them, moves the cost the most."""
    first = by_tier.get(min(by_tier)) if by_tier else None
    if first is None or h.attempts <= 0:
        return 0.0
    variance = 0.0
    for tier, price in by_tier.items():
        share = h.tiers[tier].share if tier in h.tiers else 0.0
        variance += (price - first) ** 2 * max(share * (1 - share), 1 / (h.attempts + 1)) / h.attempts
    return variance


def _max_tokens(stage: Stage | None, tier: int) -> float:
    if stage is None:
        return DEFAULT_MAX_TOKENS
    config = stage.accept.config_at(stage.config, tier) if stage.accept is not None else stage.config
    value = config.get("max_tokens", DEFAULT_MAX_TOKENS)
    return float(value) if isinstance(value, (int, float)) else DEFAULT_MAX_TOKENS


def _model_price(model: str, prompt: float, completion: float, prices: Sequence[PriceTable],
                 paid: Sequence[ModelUse]) -> float | None:
    """USD for ``prompt`` + ``completion`` tokens of ``model``: from a price table that knows it, else at what its
    past calls cost per token; None when neither."""
    for table in prices:
        found = table.find(model)
        if found is not None:
            return (prompt * found.input + completion * found.output) / 1_000_000
    same = [u for u in paid if same_model(model, u.model) and u.unpriced < u.calls]
    spent = sum(u.prompt + u.completion for u in same)
    if not same:
        return None
    return sum(u.cost for u in same) / spent * (prompt + completion) if spent else 0.0


def same_model(asked: str, reported: str) -> bool:
    """Whether a provider's reported model is the one asked for: ``sim-1@2026-11-01`` and
    ``gpt-4o-mini-2024-07-18`` are ``sim-1`` and ``gpt-4o-mini``."""
    base = reported.split("@", 1)[0]
    return asked in (reported, base) or (base.startswith(asked + "-") and not base[len(asked) + 1:][:1].isalpha())


@dataclass(frozen=True)
class QuotaPace:
    """How long a model's quota holds a run: ``seconds`` as forecast, between ``low`` and ``high``; ``cliff``
    says why they differ (the run's tokens or calls sit within their margin of a whole minute's limit)."""

    seconds: float
    low: float
    high: float
    cliff: dict[str, Any] | None = None


def _quota_pace(limits: Mapping[str, RateLimit], model: str, tokens: float, calls: float, held: float,
                tokens_var: float) -> QuotaPace:
    """``_quota_seconds``, and its range when the tokens' 95% margin crosses a multiple of the limit.

    A sliding minute is a cliff: a run just under a minute's limit never waits, one just over it waits a whole
    minute for its last grants. Where the margin straddles it, the forecast takes the likelier side (the chance
    from the tokens' spread, a normal) and gives both."""
    seconds = _quota_seconds(limits, model, tokens, calls, held)
    limit = _limit(limits, model)
    if limit is None or limit.spread or not tokens:
        return QuotaPace(seconds, seconds, seconds)
    rel = math.sqrt(tokens_var) / tokens
    for used, per_minute, unit in ((tokens + held, limit.tpm, "tokens"), (calls, limit.rpm, "calls")):
        if not per_minute or used <= 0:
            continue
        margin = Z95 * rel * used
        edge = max(1, round(used / per_minute)) * per_minute
        if not used - margin < edge <= used + margin:
            continue
        chance = 0.5 * (1.0 + math.erf((used - edge) / (margin / Z95) / math.sqrt(2.0)))
        below = _quota_seconds(limits, model, *_scaled(tokens, calls, held, (edge - 1) / used))
        above = max(below + WINDOW_S, seconds)
        cliff = {"model": model, "unit": unit, "used": used, "margin": margin, "limit": per_minute,
                 "chance_paced": chance}
        return QuotaPace(above if chance >= 0.5 else below, below, above, cliff)
    return QuotaPace(seconds, seconds, seconds)


def _scaled(tokens: float, calls: float, held: float, by: float) -> tuple[float, float, float]:
    return tokens * by, calls * by, held * by


def _limit(limits: Mapping[str, RateLimit], model: str) -> RateLimit | None:
    """The quota of ``model``, asked for or as a provider reported it (``sim-1@2026-11-01``,
    ``gpt-4o-mini-2024-07-18``)."""
    found = find_limit(limits, "", model) or find_limit(limits, "", model.split("@", 1)[0])
    return found or next((limit for key, limit in sorted(limits.items()) if same_model(key, model)), None)


def _quota_seconds(limits: Mapping[str, RateLimit], model: str, tokens: float, calls: float,
                   held: float = 0.0) -> float:
    """How long ``model``'s quota holds ``tokens`` over ``calls`` (and ``held``, what calls in flight reserve
    beyond their use): a sliding minute lets a minute's limit through at once, then the next when those grants
    age out, so the last grant waits a whole minute for each limit's worth before it; a ``spread`` limit paces
    them evenly instead."""
    limit = _limit(limits, model)
    if limit is None:
        return 0.0
    seconds = 0.0
    for used, per_minute in ((tokens + held, limit.tpm), (calls, limit.rpm)):
        if per_minute:
            minutes = used / per_minute if limit.spread else math.floor(used / per_minute)
            seconds = max(seconds, minutes * WINDOW_S)
    return seconds


def _variance(sd: float, attempts: float, seen: int, mean: float) -> float:
    """The variance of a sum of ``attempts`` draws, plus the uncertainty of a mean measured on ``seen``."""
    if seen <= 0:
        return 0.0
    spread = sd * sd * attempts
    of_mean = (attempts * sd / math.sqrt(seen)) ** 2
    few = (attempts * mean) ** 2 / seen if seen < 5 else 0.0  # a handful of measures: say so in the margin
    return spread + of_mean + few
