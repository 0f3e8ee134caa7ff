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

from conveyor.errors import ConveyorError, RetryLater, TerminalError
from conveyor.pipeline import Alerts, Breaker, Param, Pipeline, RateLimit, Retry, Stage

__all__ = ["Alerts", "Breaker", "ConveyorError", "Param", "Pipeline", "RateLimit", "Retry", "RetryLater", "Stage",
           "TerminalError", "__version__"]
