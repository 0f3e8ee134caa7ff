"""An output's provenance document: what made it, beyond its stage version, config hash and input.

``{"model": ["gpt-4o-mini"], "revision": ["gpt-4o-mini-2024-07-18/fp_44709d6fcb"], "prompt_version":
["extract@3"], "parser": ["1.24.9"]}``: the models a stage asked for and what the provider said answered,
its prompt versions, the versions it declares (``provenance=`` on the stage) and the ones it set while it
ran (``ctx.provenance["parser"] = ...``). Stored with the attempt, the memoised output and, as indexed rows,
the task (store/provenance.py), so ``conveyor select --where "parser < 1.24.10"`` is a query.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from conveyor.pipeline import Stage
from conveyor.pipeline.declare import provenance_name_problem
from conveyor.runtime.services import Usage

Document = dict[str, list[str]]
log = logging.getLogger("conveyor.provenance")
MAX_VALUE = 200  # characters of one value: versions and names, not documents


def document(stage: Stage, runtime: Mapping[str, Any] | None, usage: Usage | None) -> Document | None:
    """The provenance of one attempt's output; None when there is nothing beyond the task's columns."""
    if not stage.provenance and not runtime and (usage is None or not (usage.calls or usage.recalled)):
        return None  # the common case, on the hot path
    doc: Document = {name: [value] for name, value in stage.provenance.items()}
    for name, value in (runtime or {}).items():
        problem = provenance_name_problem(name)
        if problem is not None:
            log.warning("stage %r set ctx.provenance[%r]: %s; not recorded", stage.name, name, problem)
            continue
        values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
        doc[name] = sorted({str(v)[:MAX_VALUE] for v in values if v is not None and str(v)})
    if usage is not None and (usage.calls or usage.recalled):
        for name, values in (("model", usage.requested), ("revision", usage.revisions),
                             ("prompt_version", usage.prompt_versions)):
            if values:
                doc[name] = sorted(str(v)[:MAX_VALUE] for v in values)
    return {name: values for name, values in doc.items() if values} or None


def encode(doc: Document | None) -> str | None:
    """The document as JSON text (one value as a string, several as a list), or None."""
    if not doc:
        return None
    return orjson.dumps({k: v[0] if len(v) == 1 else v for k, v in sorted(doc.items())}).decode()


def decode(text: str | None) -> Document | None:
    if not text:
        return None
    raw = orjson.loads(text)
    return {str(k): [str(x) for x in v] if isinstance(v, list) else [str(v)] for k, v in raw.items()}
