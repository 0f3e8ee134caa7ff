"""Prometheus metrics of a conveyor store: ``conveyor serve`` at /metrics, ``conveyor worker --metrics-port``."""

from conveyor.metrics.collector import StoreCollector, exposition, new_registry, serve_metrics

__all__ = ["StoreCollector", "exposition", "new_registry", "serve_metrics"]
