"""Run parameters: values a run is submitted with, recorded with it, read by stages as ``ctx.params``.

A pipeline declares them with their defaults; a submission sets them (``--set NAME=VALUE``, or the
environment variable a parameter names); the run records the values, and every process that works on the
run afterwards (workers, ``resume``, ``replay``) reads them from the run, never from its own environment.
A stage names the parameters it reads (``@pipe.stage(params=["prompt_version"])``): their values are part
of its task key, so a run with another value runs that stage again and no other::

    pipe = Pipeline("invoices", params={"model": "gpt-4o-mini", "prompt": Param("v3", env="PROMPT_VERSION")})

    @pipe.stage(params=["model", "prompt"])
    async def extract(ctx, text: str) -> dict:
        answer = await ctx.chat(prompt(ctx.params["prompt"], text), model=ctx.params["model"])
        ...

Pure: the environment is passed in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.errors import PipelineError, UserError

PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
ENV_PREFIX = "CONVEYOR_PARAM_"
_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """A run parameter: its default (none: it must be set at submission), the environment variable that
    sets it at submission (default ``CONVEYOR_PARAM_<NAME>``), and a line of help."""

    default: Any = _REQUIRED
    env: str | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def declared_params(params: Mapping[str, Any] | None, pipeline: str) -> dict[str, Param]:
    """``Pipeline(params=...)`` as Params: a plain value is a default."""
    declared: dict[str, Param] = {}
    for name, value in (params or {}).items():
        if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
            raise PipelineError(f"Pipeline({pipeline!r}, params=...): {name!r} is not a parameter name (a letter "
                                "or _, then letters, digits or _)")
        param = value if isinstance(value, Param) else Param(value)
        if not param.required:
            _check_value(param.default, f"Pipeline({pipeline!r}, params=...): the default of {name!r}")
        declared[name] = param
    return declared


def stage_params(names: Iterable[str] | None, declared: Mapping[str, Param], stage: str,
                 pipeline: str) -> tuple[str, ...]:
    """The parameters a stage declares it reads, each one the pipeline declares."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = [names]
    chosen = tuple(sorted(set(names)))
    for name in chosen:
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise PipelineError(f"stage {stage!r}: params=[{name!r}] is not a parameter of pipeline {pipeline!r} "
                                f"(it declares: {known}); add it to Pipeline({pipeline!r}, params=...)")
    return chosen


def resolve(declared: Mapping[str, Param], sets: Iterable[str], environ: Mapping[str, str],
            pipeline: str, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A submission's values: ``values`` given from Python first, then ``--set NAME=VALUE``, then the
    parameter's environment variable, then its default. A value set from text takes the type of the default
    (a number, true/false, JSON for a list or a dict); a parameter without a default must be set."""
    chosen: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise UserError(f"params={{{name!r}: ...}}: pipeline {pipeline!r} has no parameter {name!r} "
                            f"(it declares: {known})")
        try:
            _check_value(value, f"the value of parameter {name!r}")
        except PipelineError as exc:
            raise UserError(str(exc)) from None
        chosen[name] = value
    given: dict[str, str] = {}
    for item in sets:
        name, eq, text = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise UserError(f"--set {item!r}: write --set NAME=VALUE")
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise UserError(f"--set {item!r}: pipeline {pipeline!r} has no parameter {name!r} (it declares: {known})")
        given[name] = text
    resolved: dict[str, Any] = {}
    for name, param in declared.items():
        env = param.env or ENV_PREFIX + name.upper()
        if name in chosen:
            resolved[name] = chosen[name]
        elif name in given:
            resolved[name] = _coerce(given[name], param, f"--set {name}={given[name]}")
        elif env in environ:
            resolved[name] = _coerce(environ[env], param, f"${env}={environ[env]}")
        elif param.required:
            raise UserError(f"parameter {name!r} of pipeline {pipeline!r} has no default: set it with "
                            f"--set {name}=VALUE (or ${env})")
        else:
            resolved[name] = param.default
    return resolved


def encode(values: Mapping[str, Any]) -> str:
    """The canonical text of parameter values (sorted keys, no spaces): what a run records and a key hashes."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)


def decode(text: str | None) -> dict[str, Any]:
    return dict(json.loads(text)) if text else {}


def key_part(names: tuple[str, ...], values: Mapping[str, Any]) -> bytes:
    """What a stage's task key adds for the parameters it reads (nothing for a stage that reads none, so its
    keys are what they were before parameters existed)."""
    if not names:
        return b""
    return b"\x01params\0" + encode({n: values.get(n) for n in names}).encode() + b"\0"


class StageParams(Mapping[str, Any]):
    """``ctx.params``: the run's values of the parameters the stage declares; reading another one is an error
    that says how to declare it (an undeclared value would not be part of the task key)."""

    __slots__ = ("_names", "_stage", "_values")

    def __init__(self, stage: str, names: tuple[str, ...], values: Mapping[str, Any]) -> None:
        self._stage = stage
        self._names = names
        self._values = {n: values[n] for n in names if n in values}

    def __getitem__(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        raise KeyError(f"stage {self._stage!r} reads the run parameter {name!r} without declaring it: add "
                       f"params=[{name!r}] to @pipe.stage (the values a stage reads are part of its task key)")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"StageParams({self._values!r})"


def _coerce(text: str, param: Param, where: str) -> Any:
    default = None if param.required else param.default
    try:
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError("not true or false")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            number = float(text)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return number
        if isinstance(default, (list, dict)):
            value = json.loads(text)
            if not isinstance(value, type(default)):
                raise ValueError(f"not a JSON {type(default).__name__}")
            _check_value(value, where)
            return value
    except ValueError as exc:
        kind = type(default).__name__
        raise UserError(f"{where}: {text!r} is not of type {kind} (the parameter's default is {default!r}): "
                        f"{exc}") from None
    return text


def _check_value(value: Any, where: str) -> None:
    try:
        encode({"v": value})
    except (TypeError, ValueError):
        raise PipelineError(f"{where} is {value!r}; parameter values must be JSON-like (str, finite number, "
                            "bool, None, lists and dicts with str keys)") from None
