"""What a stage function sees as ``ctx``."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from conveyor.pipeline.params import StageParams
from conveyor.runtime.attemptlog import AttemptLog, StageLogger
from conveyor.runtime.groups import Group
from conveyor.runtime.services import Usage
from conveyor.runtime.values import Parts

if TYPE_CHECKING:
    from conveyor.pipeline import Stage
    from conveyor.runtime.journal import CallJournal
    from conveyor.runtime.provider_batch import BatchCalls
    from conveyor.runtime.services import Services
    from conveyor.store import Lease


class Context:
    """Per-call facts for a stage.

    ``idempotency_key`` is stable for this item, stage and input across every
    redelivery and restart: hand it to the external system a publish stage
    writes to, so a second delivery is recognised there.
    """

    # ``usage`` and ``kept`` are made when first read (functools.cached_property, in ``__dict__``): a sync stage
    # that neither calls a model nor logs, the common one, costs neither (one Context is made per task).
    __slots__ = ("__dict__", "_services", "_started", "attempt", "batch", "config", "input_digest", "item_key",
                 "journal", "judged", "lane", "lease", "lost", "params", "pipeline", "provenance", "run_id", "stage",
                 "task_key", "tier")

    def __init__(self, run_id: str, item_key: str, stage: str, attempt: int, task_key: str, pipeline: str,
                 input_digest: str, idempotency_key: str | None = None, services: Services | None = None,
                 lane: str = "bulk", tier: int = 0, config: Mapping[str, Any] | None = None,
                 judged: bool = False, batch: BatchCalls | None = None, lease: Lease | None = None,
                 params: Mapping[str, Any] | None = None, journal: CallJournal | None = None,
                 lost: list[tuple[str, str]] | None = None) -> None:
        self.run_id = run_id
        # A gather with on_child_failure="skip": the children left out of its outputs, (item key, error class).
        self.lost: list[tuple[str, str]] = list(lost) if lost else []
        self.item_key = item_key
        self.stage = stage
        self.attempt = attempt
        self.task_key = task_key
        self.pipeline = pipeline
        self.input_digest = input_digest
        self._services = services
        self.lane = lane  # "interactive" or "bulk": provider calls of interactive runs use the reserved share
        # The escalation tier this attempt runs at (0: as declared) and the stage's config at that tier:
        # read the model and prompt from ``ctx.config`` so an escalated try uses the stronger ones.
        self.tier = tier
        self.config: dict[str, Any] = dict(config) if config else {}
        # The run's values of the parameters the stage declares (conveyor.pipeline.params), as the run recorded
        # them at submission: read them here, never from this process's environment.
        self.params: Mapping[str, Any] = params if params is not None else StageParams(stage, (), {})
        # The stage declares an acceptance boundary: a malformed JSON-mode answer is the judge's to repair or
        # refuse (invalid_format), so ctx.chat returns it (``data`` None) instead of raising malformed_output.
        self.judged = judged
        # Versions of what made this output that the stage learns as it runs (a parser library's, a schema's):
        # ``ctx.provenance["parser"] = pdfparser.__version__``. Recorded with the attempt and the output, and
        # selectable (`conveyor select --where "parser < 1.24.10"`); declare fixed ones with provenance= on the
        # stage instead, which also makes a new value run the stage again.
        self.provenance: dict[str, Any] = {}
        if idempotency_key is not None:
            self.__dict__["idempotency_key"] = idempotency_key
        self.batch = batch  # the stage is on the provider batch lane (runtime/provider_batch.py)
        self.lease = lease  # the task's lease: its model calls' budget reservations are held by it
        self.journal = journal  # the task's answered calls (runtime/journal.py): none is paid for twice
        self._started = time.monotonic()  # when the attempt started: the kept lines' times count from it

    @cached_property
    def usage(self) -> Usage:
        """Tokens and cost of the provider calls this attempt made (counted by ``ctx.chat`` and ``ctx.embed``)."""
        return Usage()

    @cached_property
    def kept(self) -> AttemptLog:
        """What the stage logged through ``ctx.log``, kept with the attempt."""
        return AttemptLog(self._started)

    def kept_lines(self) -> AttemptLog | None:
        """``kept`` if the stage logged anything through ``ctx.log`` (else None, without making it)."""
        return self.__dict__.get("kept")

    @cached_property
    def idempotency_key(self) -> str:
        return idempotency_key(self.pipeline, self.item_key, self.stage, self.input_digest)

    @cached_property
    def log(self) -> StageLogger:
        """A logger whose records carry run, stage, item and attempt, each line also kept with the attempt
        (bounded: runtime/attemptlog.py), for `conveyor show --logs` and the item page."""
        extra = {"run": self.run_id, "stage": self.stage, "item": self.item_key, "attempt": self.attempt}
        return StageLogger(extra, self.kept)

    async def chat(self, messages: Any, **options: Any) -> Any:
        """A chat (or JSON-mode) completion from the pipeline's provider, counted in ``ctx.usage``::

            answer = await ctx.chat([{"role": "user", "content": text}], model="gpt-4o-mini",
                                    json_mode=True, prompt_version="extract-v3")
            return answer.data

        Behind an acceptance boundary (``accept=`` on the stage), a JSON-mode answer that is not one JSON
        object (fenced, chatty, cut off) comes back as it is, with ``data`` None: return its ``text`` and
        the judge repairs its format or refuses it as ``invalid_format``.
        """
        try:
            return await self._call("chat", messages, options)
        except Exception as exc:
            answer = getattr(exc, "answer", None)
            if self.judged and answer is not None and getattr(exc, "error_class", None) == "malformed_output":
                return answer
            raise

    async def embed(self, texts: Any, **options: Any) -> Any:
        """Embeddings from the pipeline's provider, counted in ``ctx.usage``."""
        return await self._call("embed", texts, options)

    async def _call(self, method: str, payload: Any, options: dict[str, Any]) -> Any:
        services = self._services
        if services is None:
            raise RuntimeError("ctx.chat/ctx.embed are for async stages run by a conveyor worker")

        def direct() -> Any:
            return services.call(method, payload, options, self.lane, self.usage, self.run_id, self.lease)

        api = services.batch_api() if self.batch is not None and method == "chat" else None
        if api is not None and self.batch is not None:
            return await self.batch.chat(api, payload, options, direct)
        if self.journal is None:
            return await direct()
        key = self.journal.key(method, payload, options)
        kept = self.journal.answer(key)
        if kept is not None:  # an earlier attempt of this task was answered, and charged: not paid again
            self.usage.recall(kept, options.get("prompt_version"), options.get("model"))
            return kept
        result = await direct()
        self.journal.keep(key, method, result)
        return result

    def fields(self) -> dict[str, Any]:
        """The picklable part, to rebuild the context in a child process."""
        return {
            "run_id": self.run_id, "item_key": self.item_key, "stage": self.stage, "attempt": self.attempt,
            "task_key": self.task_key, "pipeline": self.pipeline, "input_digest": self.input_digest,
            "idempotency_key": self.idempotency_key, "tier": self.tier, "config": self.config,
            "judged": self.judged, "params": self.params, "lost": self.lost,
        }

    def __repr__(self) -> str:
        return f"Context(run={self.run_id!r}, item={self.item_key!r}, stage={self.stage!r}, attempt={self.attempt})"


def call_stage(stage: Stage, ctx: Context, value: Any) -> Any:
    """Call a stage's function on its loaded input: a join gets its parents' outputs as arguments in declared
    order, a gather the list of its children's outputs (``ctx.lost``: the children it goes without), a group its
    key and members (runtime/groups.py), any other stage its one input."""
    if isinstance(value, Group):
        return stage.fn(ctx, value.key, value.members)
    if isinstance(value, Parts):
        ctx.lost = list(value.lost)
        if stage.kind == "gather":
            return stage.fn(ctx, value.values)
        return stage.fn(ctx, *value.values)
    return stage.fn(ctx, value)


def idempotency_key(pipeline: str, item_key: str, stage: str, input_digest: str) -> str:
    """Stable for this item, stage and input across every redelivery and restart."""
    return hashlib.sha256(f"{pipeline}\0{item_key}\0{stage}\0{input_digest}".encode()).hexdigest()[:32]

