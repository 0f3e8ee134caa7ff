"""The provider batch lane, as a stage's ``ctx.chat`` sees it.

A stage on the lane (``batch=True``, or every model-calling stage under ``conveyor run --provider-batch``)
runs until a model call. ``ctx.chat`` looks for the stored answer of that request (keyed by a hash of the
task key and the request body): answered, it returns it, costed at the batch price; failed for good, it
raises that error; sent back to the direct lane (the batch expired, the request's ``batch_deadline`` passed,
its batch retries ran out), it calls the model directly; otherwise it records the request and raises
``Deferred``, and the commit parks the task without a lease until the keeper (runtime/provider_batch_keeper.py)
wakes it with the answer. A stage making several calls is deferred once per call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import UserError
from conveyor.pipeline import Pipeline, Stage
from conveyor.providers.base import Completion, ProviderError
from conveyor.runtime.services import Usage
from conveyor.store.provider_batch import BatchRequest, RequestState

DIRECT = "conveyor_direct"  # an answer stored from a direct call (its Completion's fields)
ENV_LANE = "CONVEYOR_PROVIDER_BATCH"
ENV_POLL = "CONVEYOR_PROVIDER_BATCH_POLL_S"
ENV_GATHER = "CONVEYOR_PROVIDER_BATCH_GATHER_S"
ENV_MAX_REQUESTS = "CONVEYOR_PROVIDER_BATCH_MAX_REQUESTS"
ENV_MAX_BYTES = "CONVEYOR_PROVIDER_BATCH_MAX_BYTES"


class Deferred(BaseException):
    """A model call was left to the provider batch lane: the attempt ends here and the task waits."""


@dataclass(frozen=True)
class BatchSettings:
    """How the keeper packs and polls (environment: CONVEYOR_PROVIDER_BATCH_*)."""

    poll_s: float = 30.0  # the longest wait between two polls of a running batch (the first comes after 1 s)
    gather_s: float = 2.0  # a batch is packed once no request was added for this long (or it is full)
    max_requests: int | None = None  # None: the provider's limit (OpenAI: 50,000)
    max_bytes: int | None = None  # None: the provider's limit (OpenAI: 200 MB)

    @classmethod
    def from_env(cls, env: Any = os.environ) -> BatchSettings:
        def number(name: str, default: Any, kind: Callable[[str], Any]) -> Any:
            raw = env.get(name)
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                value = 0
            if value <= 0:
                raise UserError(f"{name}={raw!r}: expected a number > 0")
            return value

        return cls(number(ENV_POLL, cls.poll_s, float), number(ENV_GATHER, cls.gather_s, float),
                   number(ENV_MAX_REQUESTS, None, int), number(ENV_MAX_BYTES, None, int))


def lane_from_env(env: Any = os.environ) -> bool:
    """``CONVEYOR_PROVIDER_BATCH=1`` (what ``--provider-batch`` sets for the run's workers)."""
    return str(env.get(ENV_LANE, "")).lower() in ("1", "true", "yes", "on")


def batch_stages(pipeline: Pipeline, every_model_stage: bool) -> frozenset[str]:
    """The stages on the lane: declared ``batch=True``, and with ``every_model_stage`` each async stage (the
    ones that can call ``ctx.chat``: a call made through a helper function is not seen in the stage's code, so
    none is left out on that account; a stage that makes no call is not affected)."""
    return frozenset(s.name for s in pipeline if s.batch or (every_model_stage and s.is_async))


def custom_id(task_key: str, provider: str, body: dict[str, Any]) -> str:
    """The request's id in the batch file: the same request of the same task always gets the same one."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{task_key}\0{provider}\0{text}".encode()).hexdigest()[:40]


class BatchCalls:
    """One attempt's model calls on the lane: the stored states of its requests, what it left to the lane."""

    def __init__(self, stage: Stage, pipeline: str, task_key: str, states: Sequence[RequestState],
                 now: float) -> None:
        self.stage, self.pipeline, self.task_key, self.now = stage, pipeline, task_key, now
        self.states = {s.custom_id: s for s in states}
        self.deferred: list[BatchRequest] = []
        self.usage = Usage()  # of the batch answers: the attempt's, unless it is deferred (counted once)
        # Calls this attempt made directly (custom_id, answer): kept with the request if the attempt is deferred,
        # so the stage's next run reuses them instead of paying again (they are counted on this attempt).
        self.direct_answers: list[tuple[str, str]] = []

    async def chat(self, api: Any, messages: Any, options: dict[str, Any], direct: Any) -> Any:
        """The answer of a chat call on the lane (see the module's docstring); ``direct()`` makes the call
        directly, counted in the attempt's usage; batch answers are counted in ``self.usage``."""
        if "model" not in options:
            raise ProviderError("bad_request", "a batch-lane ctx.chat needs model=...", retryable=False)
        body = api.body(messages, options)
        key = custom_id(self.task_key, api.name, body)
        state = self.states.get(key)
        if state is not None and state.state == "answered" and state.answer is not None:
            answer = json.loads(state.answer)
            if DIRECT in answer:  # made directly by an earlier attempt, and counted there
                return Completion(**answer[DIRECT])
            return _counted(api, answer, options, self.usage)
        if state is not None and state.state == "failed":
            raise ProviderError(state.error_class or "bad_request", state.error or "", provider=api.name,
                                retryable=False)
        if state is not None and (state.state == "direct" or self.now >= state.deadline_at):
            result = await direct()
            if isinstance(result, Completion):
                self.direct_answers.append((key, json.dumps({DIRECT: dataclasses.asdict(result)})))
            return result
        if state is None:
            self.deferred.append(BatchRequest(
                key, self.pipeline, self.stage.name, str(options["model"]), json.dumps(body, sort_keys=True),
                self.stage.retry.attempts_for("server_error"), self.now, self.now + self.stage.batch_deadline))
        else:  # asked before, not answered yet (woken early): wait on
            self.deferred.append(BatchRequest(key, self.pipeline, self.stage.name, str(options["model"]), "", 0,
                                              self.now, state.deadline_at))
        raise Deferred(key)


def _counted(api: Any, body: dict[str, Any], options: dict[str, Any], usage: Any) -> Any:
    """A batch answer as a Completion at the batch price, counted like a direct call (a rejected one too)."""
    try:
        result = api.completion(body, options)
    except ProviderError as exc:
        usage.add(exc.answer or exc, options.get("prompt_version"), options.get("model"))
        raise
    usage.add(result, options.get("prompt_version"), options.get("model"))
    return result
