"""The call journal: a model call answered within a task is not paid for again by the task's next attempt.

A stage that makes several calls and fails on a later one (or whose run's budget pauses it on a later one, or
whose worker loses its lease) has paid for the earlier answers. ``ctx.chat``/``ctx.embed`` keep each answer
with the attempt (``CallJournal.keep``); the commit that ends the attempt writes them to the task's journal
whatever the attempt came to (store/journal.py), and the task's next attempt making the same request is
answered from there: no provider call, no quota, no second charge to the run's budget. A call is keyed by its
request (method, messages or texts, options and model) and by how many times the attempt made that same
request before, so a stage that samples one prompt twice gets its two answers back in order. An answer the
acceptance boundary refused (the latest call's, when the attempt's answer is judged and refused) is not kept: its
retry asks again. The journal of a task goes when the task ends (succeeds, fails, waits for review). The provider
batch lane keeps its own answers (runtime/provider_batch.py) and is not journaled here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.providers.base import Completion, Embeddings
from conveyor.store.journal import CallAnswer

KINDS: dict[str, type[Any]] = {"chat": Completion, "embed": Embeddings}


class CallJournal:
    """One attempt's view of its task's journal: the answers earlier attempts kept, and those it adds."""

    def __init__(self, task_id: int, kept: Mapping[str, str], clock: Callable[[], float]) -> None:
        self.task_id, self.kept, self.clock = task_id, kept, clock
        self.new: list[CallAnswer] = []
        self.last: str | None = None  # the key of the attempt's latest call (whose answer a judge may refuse)
        self._asked: Counter[str] = Counter()

    def key(self, method: str, payload: Any, options: Mapping[str, Any]) -> str:
        """The call's key: its request, and how many times this attempt made the same request before."""
        text = json.dumps([method, payload, dict(options)], sort_keys=True, default=str, ensure_ascii=False)
        request = hashlib.sha256(text.encode()).hexdigest()
        self._asked[request] += 1
        self.last = f"{request}:{self._asked[request]}"
        return self.last

    def answer(self, key: str) -> Any:
        """The answer an earlier attempt got for this call, or None."""
        text = self.kept.get(key)
        if text is None:
            return None
        (kind, fields), = json.loads(text).items()
        return KINDS[kind](**fields)

    def kept_for_next(self, refused: bool) -> list[CallAnswer]:
        """The answers to keep for the next attempt: all of them, but the latest call's when the acceptance boundary
        refused what the attempt returned (a retry of a refused answer is there to ask again)."""
        return [a for a in self.new if a.call_key != self.last] if refused else self.new

    def keep(self, key: str, method: str, result: Any) -> None:
        """Keep an answer for the task's next attempt (answers of a kind the journal cannot rebuild are not kept)."""
        kind = KINDS.get(method)
        if kind is not None and isinstance(result, kind):
            text = json.dumps({method: dataclasses.asdict(result)}, ensure_ascii=False)
            self.new.append(CallAnswer(self.task_id, key, text, self.clock()))
