"""Traces: one OpenTelemetry trace per item, a span per attempt; off unless configured.

When tracing is on, admitting an item starts its trace (a ``conveyor.item`` root span) and stores the
root's W3C ``traceparent`` with the item row; every attempt at any stage, retry or worker is then recorded,
once its outcome is committed, as a ``conveyor.attempt <stage>`` span under that parent (runtime/spans.py).
The sampler decides once per item, at admission: an item it drops gets no stored context and no span.

Tracing is on when the process is configured for it, with the standard OpenTelemetry variables
(``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or with ``CONVEYOR_TRACING=1`` (``CONVEYOR_TRACING=0`` and
``OTEL_SDK_DISABLED=true`` turn it off). Off, nothing here imports OpenTelemetry and the hot paths pay one
module-global read per batch. A program that configures OpenTelemetry itself passes its provider to
``install``; tests use that with the SDK's in-memory exporter.

Example::

    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 conveyor worker pipe.py:pipe
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from conveyor.errors import UserError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

    from conveyor.runtime.spans import ItemTracer

log = logging.getLogger("conveyor.tracing")
DEFAULT_RATIO = 0.1  # of the items of a batch run traced when OTEL_TRACES_SAMPLER is not set
BSP_QUEUE = 16_384  # spans buffered for export (the SDK's BatchSpanProcessor), unless OTEL_BSP_MAX_QUEUE_SIZE
INSTALL = "pip install 'conveyor[tracing]'"
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
_ON, _OFF = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}

_tracer: ItemTracer | None = None


def active() -> ItemTracer | None:
    """The tracer when tracing is on, else None (what the hot paths check, once per batch)."""
    return _tracer


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    switch = environ.get("CONVEYOR_TRACING", "").strip().lower()
    if switch in _OFF or switch in _ON:
        return switch in _ON
    if switch:
        raise UserError(f"CONVEYOR_TRACING={switch!r} is neither on nor off; set it to 1 or 0")
    exporters = _exporter_names(environ)
    if exporters is not None:
        return bool(exporters)
    return any(environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on when the environment asks for it: a provider with the configured sampler and a
    batching exporter (OTLP over HTTP unless ``OTEL_TRACES_EXPORTER`` says ``console``). Returns whether
    tracing is on. UserError, saying what to install or set, when it is asked for and cannot be had."""
    if not wanted(environ):
        return False
    if not _installed("opentelemetry.sdk.trace"):
        raise UserError(f"tracing is configured but OpenTelemetry is not installed; {INSTALL} "
                        "(or unset OTEL_EXPORTER_OTLP_ENDPOINT / CONVEYOR_TRACING)")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "conveyor"}))
    chosen, exporters = sampler(environ), _exporters(environ)
    provider = TracerProvider(sampler=chosen, resource=resource)
    # A commit ends a thousand attempts' spans at once: the SDK's default queue (2,048) would drop spans of
    # a burst before its exporter thread wakes; OTEL_BSP_MAX_QUEUE_SIZE still decides when it is set.
    queue = None if environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else BSP_QUEUE
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=queue))
    install(provider)
    return True


def install(provider: TracerProvider) -> ItemTracer:
    """Record items' traces with ``provider`` (its sampler decides which items) from now on."""
    global _tracer
    from conveyor.runtime.spans import ItemTracer

    _tracer = ItemTracer(provider)
    return _tracer


def uninstall() -> None:
    """Turn tracing off again (what was recorded is flushed first)."""
    global _tracer
    flush()
    _tracer = None


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered (a worker does this as it stops)."""
    if _tracer is not None and not _tracer.provider.force_flush(int(timeout_s * 1000)):
        log.warning("some spans could not be exported within %.0f s", timeout_s, extra={"event": "trace_flush"})


def sampler(environ: Mapping[str, str] = os.environ) -> Sampler:
    """``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` as the SDK reads them, with conveyor's default:
    ``parentbased_traceidratio`` at DEFAULT_RATIO (a batch of a million items makes a hundred thousand traces,
    not a million). The decision is made once per item, on its root span: its attempts follow it."""
    from opentelemetry.sdk.trace import sampling

    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio").strip().lower()
    if name not in SAMPLERS:
        raise UserError(f"OTEL_TRACES_SAMPLER={name!r} is not a sampler conveyor knows; use one of "
                        f"{', '.join(SAMPLERS)}")
    if name.endswith("always_on") or name.endswith("always_off"):
        fixed: Sampler = sampling.ALWAYS_ON if name.endswith("always_on") else sampling.ALWAYS_OFF
        return sampling.ParentBased(fixed) if name.startswith("parentbased") else fixed
    ratio = sampling.TraceIdRatioBased(_ratio(environ.get("OTEL_TRACES_SAMPLER_ARG")))
    return sampling.ParentBased(ratio) if name.startswith("parentbased") else ratio


def _ratio(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_RATIO
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise UserError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio; give a number from 0 to 1 "
                        f"(the share of items traced, {DEFAULT_RATIO:g} by default)")
    return ratio


def _exporter_names(environ: Mapping[str, str]) -> list[str] | None:
    """OTEL_TRACES_EXPORTER's names (``none`` dropped), or None when it is not set."""
    text = environ.get("OTEL_TRACES_EXPORTER")
    if text is None or not text.strip():
        return None
    return [n for n in (part.strip().lower() for part in text.split(",")) if n and n != "none"]


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    names = _exporter_names(environ) or ["otlp"]
    unknown = sorted(set(names) - {"otlp", "console"})
    if unknown:
        raise UserError(f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: conveyor exports to otlp or console")
    return [_otlp(environ) if name == "otlp" else _console() for name in names]


def _otlp(environ: Mapping[str, str]) -> SpanExporter:
    """The standard OTLP exporter, over HTTP/protobuf; it reads the OTEL_EXPORTER_OTLP_* variables itself
    (endpoint, headers, timeout, compression)."""
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol not in (None, "", "http/protobuf"):
        raise UserError(f"OTLP protocol {protocol!r}: conveyor exports traces over http/protobuf; set "
                        "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and the collector's HTTP port (4318)")
    if not _installed("opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        raise UserError(f"tracing is configured to export over OTLP but its exporter is not installed; {INSTALL}")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def _console() -> SpanExporter:
    """Spans printed on stderr: stdout is the command's own output (one JSON object with --json)."""
    import sys

    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter(out=sys.stderr)
