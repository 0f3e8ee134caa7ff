"""Typer's parameter coercion without pydantic for the plain values conveyor's commands take.

Typer coerces every parameter's value through a pydantic ``TypeAdapter``: the first command line that
carries a value imports pydantic and builds an adapter per parameter, about 0.1 s of every ``conveyor status``
(issue 32). Conveyor's parameters are strings, integers (some with a minimum or maximum), floats, flags and
lists of those, so this module answers the values whose coercion is plain (``"12"`` for an int in range,
``"1.5"`` for a float, any string for a string) itself, with the result pydantic would give; everything else
(a value out of range, ``" 5"``, ``"1e3"``, a type other than those) goes to Typer's own pydantic coercion,
which then makes the same value or says the same error, word for word. tests/test_startup_imports.py holds
the two to the same answers.

The seam is one private name of Typer's (``typer.core.build_runtime_param``, over ``typer._coercion``): when a
Typer release moves it, ``install`` leaves Typer as it is, and the commands are only slower
(tests/test_startup_imports.py then says pydantic is imported again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_INT = re.compile(r"-?[0-9]{1,18}")  # what int() and pydantic read alike (no sign, space, "_" or exponent)
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")
_PLAIN = (str, int, float, bool)


class _Defer(Exception):
    """The value is not plain: Typer's pydantic coercion decides it."""


def install() -> None:
    """Route the coercion of plain parameters past pydantic (idempotent; a no-op when Typer's seam moved)."""
    try:
        from typer import _coercion, core
    except ImportError:  # pragma: no cover - a Typer without the seam
        return
    original = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if original is None or base is None or getattr(original, "_conveyor_plain", False):
        return
    core.build_runtime_param = _builder(original, _plain_class(base))  # type: ignore[attr-defined]


def _builder(original: Any, plain: type) -> Any:
    def build_runtime_param(descriptor: Any) -> Any:
        if _is_plain(descriptor):
            return plain(annotation=descriptor.annotation, parameter_info=descriptor.parameter_info,
                         descriptor=descriptor, original=original)
        return original(descriptor)

    build_runtime_param._conveyor_plain = True  # type: ignore[attr-defined]
    return build_runtime_param


def _is_plain(descriptor: Any) -> bool:
    """A parameter of a plain type, with no parser, file or clamp: Typer's descriptor as this module knows it
    (one that reads otherwise is left to Typer)."""
    try:
        info = descriptor.parameter_info
        return (descriptor.file_annotation is None and info.parser is None and not info.clamp
                and isinstance(info.min, int | float | None) and isinstance(info.max, int | float | None)
                and _kind(descriptor.annotation) is not None)
    except AttributeError:
        return False


def _kind(annotation: Any) -> type | None:
    """The element type when ``annotation`` is one of the plain types or a list of one, else None."""
    if annotation in _PLAIN:
        return annotation  # type: ignore[no-any-return]
    if getattr(annotation, "__origin__", None) is list:
        (element,) = annotation.__args__
        return element if element in _PLAIN else None
    return None


def _plain_class(base: type) -> type:
    @dataclass(frozen=True)
    class PlainRuntimeParam(base):  # type: ignore[misc]
        """A plain parameter: coerced here when the value is plain, else by ``original(descriptor)``."""

        descriptor: Any
        original: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return plain_value(self.annotation, value, self.parameter_info.min, self.parameter_info.max)
            except _Defer:
                return self.original(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

    return PlainRuntimeParam


def plain_value(annotation: Any, value: Any, low: float | None = None, high: float | None = None) -> Any:
    """What pydantic makes of ``value`` for ``annotation`` (a plain type or a list of one); ``_Defer`` when
    the value is not one this module reads the way pydantic does."""
    if getattr(annotation, "__origin__", None) is list:
        if not isinstance(value, list | tuple):
            raise _Defer
        (element,) = annotation.__args__
        return [plain_value(element, item, low, high) for item in value]
    if annotation is str and type(value) is str:
        return value
    if annotation is int:
        number = value if type(value) is int else int(value) if type(value) is str and _INT.fullmatch(value) else None
        if number is not None and (low is None or number >= low) and (high is None or number <= high):
            return number
    elif annotation is float and low is None and high is None:
        if type(value) is float:
            return value
        if type(value) is str and _FLOAT.fullmatch(value):
            return float(value)
    raise _Defer
