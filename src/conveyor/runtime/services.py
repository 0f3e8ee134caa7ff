"""What a worker process shares with its stages: the model provider, made once, on first use,
and the quota gate every provider call passes."""

from __future__ import annotations

import dis
import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ProviderUnavailable, UserError
from conveyor.pipeline import Pipeline, find_limit, parse_limits
from conveyor.pipeline.limits import ENV_VAR as LIMITS_ENV
from conveyor.providers.estimate import chat_tokens, embed_tokens
from conveyor.runtime.budget import PATIENCE_LEASES, BreakerWatch, BudgetKeeper, RunPaused
from conveyor.runtime.quota import QuotaGate
from conveyor.store import Lease
from conveyor.store.budget import Reservation

LOCAL = "local"
DEFAULT_MAX_TOKENS = 512
MODEL_CALLS = frozenset({"chat", "embed"})


class Services:
    """The provider, made once per process on first use, behind the fleet's quota gate.

    Limits come from the pipeline (``Pipeline(limits=...)``) and, overriding them key by key,
    from ``CONVEYOR_LIMITS``; a bad ``CONVEYOR_LIMITS`` fails when the worker starts.
    """

    def __init__(self, pipeline: Pipeline, store_url: str | None = None, worker: str = "",
                 lease_seconds: float | None = None) -> None:
        self._factory: Callable[[], Any] | None = pipeline.provider_factory
        self._provider: Any = None
        self.limits = {**pipeline.limits, **parse_limits(os.environ.get(LIMITS_ENV))}
        self.gate = QuotaGate(store_url, self.limits, worker) if store_url else None
        patience = PATIENCE_LEASES * (lease_seconds or pipeline.lease_seconds)  # the worker's leases
        self.budgets = BudgetKeeper(self.gate.on_store, patience=patience) if self.gate is not None else None
        self.breaker = BreakerWatch(pipeline.breaker)
        self._tripped: dict[str, str] = {}  # run -> why its breaker tripped here
        self._batch_api: Any = None  # made on first use; False: the provider has none

    def provider(self) -> Any:
        """The provider, made on first use; ProviderUnavailable when it is not configured."""
        if self._provider is None:
            if self._factory is None:
                from conveyor.providers.factory import provider_from_env

                self._factory = provider_from_env
            try:
                self._provider = self._factory()
            except UserError as exc:
                raise ProviderUnavailable(str(exc)) from None
        return self._provider

    async def charge(self, run_id: str, usage: Usage, lease: Lease | None = None) -> None:
        """Count answers from the provider batch lane against the run's budget (they were paid for in a
        batch, not through ``call``): RunPaused when they would pass it."""
        if self.budgets is None or usage.cost <= 0:
            return
        model = ",".join(sorted(usage.models)) or "batch"
        held = await self.budgets.reserve(run_id, usage.cost, model, lease)
        await self.budgets.settle(held, usage.cost)

    def batch_api(self) -> Any:
        """The chat provider's Batch API (the provider batch lane), or None when it has none."""
        if self._batch_api is None:
            make = getattr(_backend(self.provider(), "chat"), "batch_api", None)
            self._batch_api = make() if make is not None else False
        return self._batch_api or None

    def check(self, pipeline: Pipeline) -> None:
        """Before any work: a pipeline whose stages call ``ctx.chat``/``ctx.embed`` needs its provider,
        and one that is not configured stops the worker now, with what to set, instead of failing every
        item that reaches a model call."""
        if pipeline.provider_factory is not None or uses_models(pipeline):
            self.provider()

    async def call(self, method: str, payload: Any, options: dict[str, Any], lane: str, usage: Usage,
                   run_id: str | None = None, lease: Lease | None = None) -> Any:
        """One provider call: within the run's budget (reserved first, under the ``lease`` of the task that
        makes it, settled after), admitted by the quota gate and settled with what it used, and watched by
        the run's breaker. RunPaused when the run is paused, or this call would pass its budget, or its
        breaker trips."""
        provider = self.provider()
        backend = _backend(provider, method)
        name = str(getattr(backend, "name", type(backend).__name__))
        if self.gate is None or name == LOCAL:  # a local model has no quota to keep, and costs nothing
            return await self._counted(provider, method, payload, options, usage)
        if run_id is not None and run_id in self._tripped:
            raise RunPaused(run_id, self._tripped[run_id])
        model = str(options.get("model") or getattr(backend, "model_name", None) or "default")
        max_tokens = int(options.get("max_tokens", DEFAULT_MAX_TOKENS))
        estimate = chat_tokens(payload, max_tokens) if method == "chat" else embed_tokens(payload)
        held = None
        if run_id is not None and self.budgets is not None:
            completion = max_tokens if method == "chat" else 0
            held = await self.budgets.reserve(run_id, _price(backend, model, estimate - completion, completion),
                                              model, lease)
        ticket = await self.gate.acquire(f"{name}/{model}", find_limit(self.limits, name, model), estimate, lane)
        try:
            result = await self._counted(provider, method, payload, options, usage)
        except BaseException as exc:
            await self.gate.release(ticket, _charged(exc), exc)
            await self._after(run_id, held, exc)
            raise
        await self.gate.release(ticket, _charged(result))
        await self._after(run_id, held, result)
        return result

    async def _after(self, run_id: str | None, held: Reservation | None, outcome: Any) -> None:
        """Settle the call's reservation and tell the breaker; trip it when the run's calls fail systemically."""
        if run_id is None:
            return
        if self.budgets is not None:
            await self.budgets.settle(held, float(getattr(outcome, "cost", 0.0) or 0.0))
        if isinstance(outcome, BaseException) and getattr(outcome, "error_class", None) is None:
            return  # cancelled, or not the provider's answer: nothing the breaker counts
        why = self.breaker.record(run_id, getattr(outcome, "error_class", None))
        if why is not None and self.gate is not None:
            self._tripped[run_id] = why
            error_class = getattr(outcome, "error_class", "")
            await self.gate.on_store(lambda s: s.pause_run(run_id, f"breaker:{error_class}", why))
            raise RunPaused(run_id, why) from (outcome if isinstance(outcome, BaseException) else None)

    def unpaused(self, paused: tuple[str, ...]) -> None:
        """Runs resumed since their breaker tripped here are called for again."""
        for run_id in [r for r in self._tripped if r not in paused]:
            del self._tripped[run_id]

    @staticmethod
    async def _counted(provider: Any, method: str, payload: Any, options: dict[str, Any], usage: Usage) -> Any:
        asked = options.get("model")
        try:
            result = await getattr(provider, method)(payload, **options)
        except Exception as exc:
            if getattr(exc, "error_class", None) is not None:
                # A rejected answer still cost tokens (and a malformed one is an answer: its revision counts).
                usage.add(getattr(exc, "answer", None) or exc, options.get("prompt_version"), asked)
            raise
        usage.add(result, options.get("prompt_version"), asked)
        return result

    async def close(self) -> None:
        if self.gate is not None:
            await self.gate.close()


def require_provider(pipeline: Pipeline) -> None:
    """ProviderUnavailable, saying what to set, when the stages call a model and none is configured."""
    Services(pipeline).check(pipeline)


def model_stages(pipeline: Pipeline) -> list[str]:
    """The stages that call ``ctx.chat`` or ``ctx.embed`` (as ``uses_models`` finds them)."""
    return [stage.name for stage in pipeline if _calls_models(stage.fn)]


def uses_models(pipeline: Pipeline) -> bool:
    """Whether a stage calls ``ctx.chat`` or ``ctx.embed`` on its first argument (directly, or from a
    function nested in it). A call made through a helper function is found only when it happens."""
    return any(_calls_models(stage.fn) for stage in pipeline)


def _calls_models(fn: Callable[..., Any]) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None or not code.co_varnames:
        return False
    return _names_models(code, code.co_varnames[0])


def _names_models(code: types.CodeType, ctx: str) -> bool:
    previous = None
    for ins in dis.get_instructions(code):
        if (ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in MODEL_CALLS and previous is not None
                and previous.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE") and previous.argval == ctx):
            return True
        previous = ins
    return any(_names_models(const, ctx) for const in code.co_consts if isinstance(const, types.CodeType))


def _price(backend: Any, model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What a call is estimated to cost at the model's price; None when the provider has no price for it."""
    prices = getattr(backend, "prices", None)
    if prices is None:
        return None
    cost, priced = prices.cost_for(model, model, prompt_tokens, completion_tokens)
    return float(cost) if priced else None


def _backend(provider: Any, method: str) -> Any:
    """The provider that serves ``method`` (a CompositeProvider delegates)."""
    return getattr(provider, f"{method}_provider", None) or provider


def _charged(outcome: Any) -> int | None:
    """Tokens the provider counted for an answer (a rejected one too); None when unknown."""
    prompt = int(getattr(outcome, "prompt_tokens", 0) or 0)
    completion = int(getattr(outcome, "completion_tokens", 0) or 0)
    if prompt or completion or not isinstance(outcome, BaseException):
        return prompt + completion
    status = getattr(outcome, "status_code", None) or 0
    refused = getattr(outcome, "error_class", "") == "rate_limited" or status >= 500
    return 0 if refused else None  # a timeout or a dropped connection may have been charged


@dataclass
class Usage:
    """Tokens and cost of every provider call one attempt made, failed calls included.

    ``unpriced_calls`` counts the calls whose model had no price (a result, or a rejected answer,
    with ``priced`` False): ``cost`` leaves them out, so a report can say "unpriced", not "$0".
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    models: set[str] = field(default_factory=set)
    prompt_versions: set[str] = field(default_factory=set)
    unpriced_calls: int = 0
    requested: set[str] = field(default_factory=set)  # the models the stage asked for (their names in its code)
    recalled: int = 0  # calls answered from the task's call journal (runtime/journal.py): paid by an earlier attempt
    revisions: set[str] = field(default_factory=set)  # what the provider said answered: model, and fingerprint

    def merge(self, other: Usage) -> None:
        """Add what ``other`` counted."""
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost += other.cost
        self.unpriced_calls += other.unpriced_calls
        self.recalled += other.recalled
        for name in ("models", "prompt_versions", "requested", "revisions"):
            getattr(self, name).update(getattr(other, name))

    def add(self, result: Any, prompt_version: str | None = None, requested: Any = None) -> None:
        self.calls += 1
        self.prompt_tokens += int(getattr(result, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(getattr(result, "completion_tokens", 0) or 0)
        self.cost += float(getattr(result, "cost", 0.0) or 0.0)
        if not getattr(result, "priced", True):
            self.unpriced_calls += 1
        self._made_by(result, prompt_version, requested)

    def recall(self, result: Any, prompt_version: str | None = None, requested: Any = None) -> None:
        """An answer from the task's call journal: what made it counts for the output's provenance; its tokens and
        cost were counted by the attempt that paid for it."""
        self.recalled += 1
        self._made_by(result, prompt_version, requested)

    def _made_by(self, result: Any, prompt_version: str | None, requested: Any) -> None:
        model = getattr(result, "model", None)
        if model:
            self.models.add(str(model))
            fingerprint = getattr(result, "revision", None)
            self.revisions.add(f"{model}/{fingerprint}" if fingerprint else str(model))
        if requested:
            self.requested.add(str(requested))
        if prompt_version:
            self.prompt_versions.add(prompt_version)
