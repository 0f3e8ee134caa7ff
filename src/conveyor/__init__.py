"""conveyor: durable, idempotent multi-stage batch pipelines.

Declare stages on a :class:`Pipeline`; run them with ``conveyor run``::

    from conveyor import Pipeline, Retry

    pipe = Pipeline("manuals")

    @pipe.stage(version="1", timeout=30)
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode()}
"""

from __future__ import annotations

__version__ = "0.1.0"

# Not typing's: `conveyor --version` answers before anything imports typing (see cli/main.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conveyor.errors import ConveyorError, RetryLater, TerminalError
    from conveyor.pipeline import Alerts, Breaker, Param, Pipeline, RateLimit, Retry, Stage

__all__ = ["Alerts", "Breaker", "ConveyorError", "Param", "Pipeline", "RateLimit", "Retry", "RetryLater", "Stage",
           "TerminalError", "__version__"]

# The public names, by the module that defines each: imported when first used, so that a command that needs
# none of them (`conveyor --version`, `conveyor status`) does not pay for the declaration API.
_LAZY = {
    **dict.fromkeys(("ConveyorError", "RetryLater", "TerminalError"), "conveyor.errors"),
    **dict.fromkeys(("Alerts", "Breaker", "Param", "Pipeline", "RateLimit", "Retry", "Stage"), "conveyor.pipeline"),
}


# Written out rather than conveyor.lazy.lazy_names (which store, pipeline and providers use): `conveyor
# --version` imports this package and no module of it beyond the CLI's (tests/test_startup_imports.py).
def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
