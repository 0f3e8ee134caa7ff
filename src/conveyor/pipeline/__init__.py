"""Declaration API and graph: pure Python, no I/O."""

from conveyor.pipeline.declare import KINDS, Pipeline, Stage
from conveyor.pipeline.retry import Retry

__all__ = ["KINDS", "Pipeline", "Retry", "Stage"]
