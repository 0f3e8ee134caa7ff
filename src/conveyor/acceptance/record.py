"""What a publish stage hands to the built-in target: one item's record and its representations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Record:
    """One item's publication: ``fields`` (the record row, JSON-like), ``text`` (its full-text entry;
    by default its string fields joined) and ``vectors`` (its embeddings, any number of any dimension).
    All three become visible together, in one transaction, or not at all. ``embedding_model`` names the
    model that made the vectors, as ``ctx.embed(..., model=...)`` was asked: ``conveyor search --semantic``
    embeds its query with that model, so a collection searched by meaning needs it::

        @pipe.stage(after=embed, kind="publish", into="manuals")
        def publish(ctx, page: dict) -> Record:
            return Record(fields=page["record"], text=page["text"], vectors=page["vectors"],
                          embedding_model="all-MiniLM-L6-v2")
    """

    fields: Mapping[str, Any]
    text: str | None = None
    vectors: Sequence[Sequence[float]] = field(default_factory=tuple)
    embedding_model: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The staged form (a stage output): plain JSON (``embedding_model`` only when named, so a record
        without one stages as it did before there was one)."""
        staged = {"fields": dict(self.fields), "text": self.full_text,
                  "vectors": [[float(x) for x in v] for v in self.vectors]}
        if self.embedding_model:
            staged["embedding_model"] = self.embedding_model
        return staged

    @property
    def full_text(self) -> str:
        if self.text is not None:
            return self.text
        return " ".join(_strings(self.fields))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def staged(value: Any, stage: str) -> dict[str, Any]:
    """A publish stage's return value in its staged form; a wrong type is the stage's error."""
    from conveyor.errors import TerminalError

    if isinstance(value, Record):
        return value.as_json()
    if isinstance(value, Mapping) and isinstance(value.get("fields"), Mapping):
        return Record(value["fields"], value.get("text"), value.get("vectors") or (),
                      _model(value.get("embedding_model"), stage)).as_json()
    raise TerminalError(f"publish stage {stage!r} publishes into the built-in target: return "
                        f"conveyor.acceptance.Record(fields=..., text=..., vectors=...), not a {type(value).__name__}",
                        error_class="bad_publication")


def _model(value: Any, stage: str) -> str | None:
    from conveyor.errors import TerminalError

    if value is None or isinstance(value, str):
        return value
    raise TerminalError(f"publish stage {stage!r}: embedding_model names a model (a string), not a "
                        f"{type(value).__name__}", error_class="bad_publication")


@runtime_checkable
class Target(Protocol):
    """An external publication target with the built-in one's contract: a record is published once per
    idempotency key. ``into=`` a Target on a publish stage, whose function returns the record: conveyor
    asks ``published(key)`` first (a worker may have died after publishing and before committing) and
    calls ``publish(key, record)`` only when the answer is no::

        class Catalogue:  # any system that can look a key up
            def published(self, key: str) -> bool:
                return api.get(f"/docs/{key}").status_code == 200

            def publish(self, key: str, record: dict) -> None:
                api.put(f"/docs/{key}", json=record).raise_for_status()

        @pipe.stage(after=extract, kind="publish", into=Catalogue())
        def publish(ctx, record: dict) -> dict:
            return record
    """

    def published(self, key: str) -> bool: ...

    def publish(self, key: str, record: Any) -> None: ...


def publish_once(target: Target, key: str, record: Any) -> bool:
    """Publish ``record`` under ``key`` unless the target has it already; True when this call published."""
    if target.published(key):
        return False
    target.publish(key, record)
    return True
