"""What a publish stage hands to the built-in target: one item's record and its representations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Record:
    """One item's publication: ``fields`` (the record row, JSON-like), ``text`` (its full-text entry;
    by default its string fields joined) and ``vectors`` (its embeddings, any number of any dimension).
    All three become visible together, in one transaction, or not at all::

        @pipe.stage(after=embed, kind="publish", into="manuals")
        def publish(ctx, page: dict) -> Record:
            return Record(fields=page["record"], text=page["text"], vectors=page["vectors"])
    """

    fields: Mapping[str, Any]
    text: str | None = None
    vectors: Sequence[Sequence[float]] = field(default_factory=tuple)

    def as_json(self) -> dict[str, Any]:
        """The staged form (a stage output): plain JSON."""
        return {"fields": dict(self.fields), "text": self.full_text,
                "vectors": [[float(x) for x in v] for v in self.vectors]}

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
        return Record(value["fields"], value.get("text"), value.get("vectors") or ()).as_json()
    raise TerminalError(f"publish stage {stage!r} publishes into the built-in target: return "
                        f"conveyor.acceptance.Record(fields=..., text=..., vectors=...), not a {type(value).__name__}",
                        error_class="bad_publication")
