"""Public names a package loads on first use (PEP 562), so that importing the package costs nothing for the
commands that never touch them (tests/test_startup_imports.py keeps it so)."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing's: `conveyor --version` loads this module and must not load typing
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_names(namespace: dict[str, Any], lazy: Mapping[str, str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``lazy`` (name -> the module that defines it): a name is
    imported from its module when first read and kept in ``namespace`` (the package's ``globals()``), so later
    reads skip the hook. Use as ``__getattr__, __dir__ = lazy_names(globals(), {...})``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
