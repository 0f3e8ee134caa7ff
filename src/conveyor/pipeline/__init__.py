"""Declaration API and graph: pure Python, no I/O."""

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
