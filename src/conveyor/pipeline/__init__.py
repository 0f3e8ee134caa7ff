"""Declaration API and graph: pure Python, no I/O.

The names below are imported from their modules when first used, so that what only reads a run's recorded
declarations (``conveyor status``) does not load the whole declaration API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.lazy import lazy_names

if TYPE_CHECKING:
    from conveyor.pipeline.alerts import Alerts
    from conveyor.pipeline.budget import Breaker
    from conveyor.pipeline.declare import KINDS, Pipeline, Stage
    from conveyor.pipeline.graph import GROUP_PREFIX, Gather, Graph
    from conveyor.pipeline.limits import RateLimit, find_limit, parse_limits
    from conveyor.pipeline.params import Param
    from conveyor.pipeline.retry import Retry

__all__ = [
           "GROUP_PREFIX",
           "KINDS",
           "Alerts",
           "Breaker",
           "Gather",
           "Graph",
           "Param",
           "Pipeline",
           "RateLimit",
           "Retry",
           "Stage",
           "find_limit",
           "parse_limits",
]

_LAZY = {
    "Alerts": "conveyor.pipeline.alerts",
    "Breaker": "conveyor.pipeline.budget",
    **dict.fromkeys(("KINDS", "Pipeline", "Stage"), "conveyor.pipeline.declare"),
    **dict.fromkeys(("GROUP_PREFIX", "Gather", "Graph"), "conveyor.pipeline.graph"),
    **dict.fromkeys(("RateLimit", "find_limit", "parse_limits"), "conveyor.pipeline.limits"),
    "Param": "conveyor.pipeline.params",
    "Retry": "conveyor.pipeline.retry",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)
