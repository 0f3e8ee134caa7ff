"""conveyor: durable, idempotent multi-stage batch pipelines.

Declare stages on a :class:`Pipeline`; run them with ``conveyor run`` or from Python::

    import conveyor
    from conveyor import Pipeline, Retry

    pipe = Pipeline("manuals")

    @pipe.stage(version="1", timeout=30)
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode()}

    run = pipe.run([("a", "some text")])      # a Run: status(), reconcile(), resume(), results()
    frame = run.to_pandas()                   # one row per item, with its outcome and provenance
    conveyor.open().collection("manuals").to_arrow()
"""

from __future__ import annotations

__version__ = "0.1.0"

# Not typing's: `conveyor --version` answers before anything imports typing (see cli/main.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from conveyor.client import Collection, Result, Run, Workspace, open
    from conveyor.errors import ConveyorError, InputError, Interrupted, RetryLater, TerminalError, UserError
    from conveyor.pipeline import Alerts, Breaker, Param, Pipeline, RateLimit, Retry, Stage

__all__ = ["Alerts", "Breaker", "Collection", "ConveyorError", "InputError", "Interrupted", "Param", "Pipeline",
           "RateLimit", "Result", "Retry", "RetryLater", "Run", "Stage", "TerminalError", "UserError", "Workspace",
           "__version__", "open"]

# The public names, by the module that defines each: imported when first used, so that a command that needs
# none of them (`conveyor --version`, `conveyor status`) does not pay for the declaration API.
_LAZY = {
    **dict.fromkeys(("ConveyorError", "InputError", "Interrupted", "RetryLater", "TerminalError", "UserError"),
                    "conveyor.errors"),
    **dict.fromkeys(("Collection", "Result", "Run", "Workspace", "open"), "conveyor.client"),
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
