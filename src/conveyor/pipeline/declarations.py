"""Declarations of a stage, compared: what a task key's stage version and config hash stand for, named.

A task is made under one declaration of its stage (its version and the config its hash is taken of); only
a worker with that declaration may run it. When none can, the difference is said in words: which stage,
which version, which config values. Pure: the rows come from the store.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.pipeline.declare import Pipeline

SHOWN = 3  # config values named in one difference, at most ("and N more")


def rows(pipeline: Pipeline) -> list[tuple[str, str, str, str, str]]:
    """(pipeline, stage, version, config hash, config text) for each stage: what a worker or a submission
    records so that another process can name how its declaration differs."""
    return [(pipeline.name, s.name, s.version, s.config_hash, s.config_text) for s in pipeline]


def serves(pipeline: Pipeline) -> str:
    """What a worker of this declaration claims, as a worker row records it: {stage: [version, config hash]}."""
    return json.dumps({name: list(pair) for name, pair in pipeline.declared().items()}, sort_keys=True)


def difference(stage: str, wanted: tuple[str, str | None], have: tuple[str, str | None],
               whose: str = "worker") -> str:
    """How the declaration ``have`` (version, config text or None when unknown: ``whose``) differs from the
    run's ``wanted``: ``stage double: version 1 (run) / 2 (worker)`` or ``stage double: config mult=3 (run) /
    2 (worker)``."""
    parts = []
    if wanted[0] != have[0]:
        parts.append(f"version {wanted[0]} (run) / {have[0]} ({whose})")
    if wanted[1] is not None and have[1] is not None and wanted[1] != have[1]:
        parts.append("config " + _config_difference(json.loads(wanted[1]), json.loads(have[1]), whose))
    elif not parts:
        parts.append("config hash differs (one of the configs was not recorded)")
    return f"stage {stage}: " + "; ".join(parts)


def _config_difference(wanted: dict[str, Any], have: dict[str, Any], whose: str) -> str:
    names = sorted(k for k in {*wanted, *have} if wanted.get(k, _ABSENT) != have.get(k, _ABSENT))
    said = [f"{_label(k)}={_shown(wanted.get(k, _ABSENT))} (run) / {_shown(have.get(k, _ABSENT))} ({whose})"
            for k in names[:SHOWN]]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(said) + more


_ABSENT = object()


def _label(key: str) -> str:
    return {"\u00a7accept": "accept", "\u00a7into": "into", "\u00a7provenance": "provenance",
            "\u00a7params": "params"}.get(key, key)


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."
