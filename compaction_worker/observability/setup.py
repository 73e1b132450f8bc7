"""Installing the OpenTelemetry SDK from the standard ``OTEL_*`` variables (the CLI's ``run`` calls it once).

With none of them set nothing is installed: the API stays a no-op and a turn pays nothing
for telemetry. The exception is the Prometheus reader, added whenever the health port
serves ``/metrics`` (prometheus_client's default registry).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from compaction_worker.observability import tracing
from compaction_worker.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "compaction-worker"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@dataclass
class Telemetry:
    """What ``configure`` installed; ``shutdown`` flushes and stops it."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    exporters: list[str] = field(default_factory=list)
    """What exports, as ``signal:name`` (``traces:otlp``, ``metrics:prometheus``, ...)."""
    span_exporters: list[SpanExporter] = field(default_factory=list)
    metric_readers: list[MetricReader] = field(default_factory=list)

    def shutdown(self) -> None:
        """Flush pending spans and metrics and stop the exporters."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def _names(environ: Mapping[str, str], variable: str, signal: str) -> list[str]:
    """The exporters a variable names; unset means OTLP only when an OTLP endpoint is set."""
    value = environ.get(variable)
    if value is None:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
            f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    return [] if "none" in names else names


def _span_exporter(name: str) -> SpanExporter:
    if name == "otlp":
        return OTLPSpanExporter()
    if name == "console":
        return ConsoleSpanExporter()
    raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} (otlp, console, none)")


def _metric_reader(name: str) -> MetricReader:
    if name == "otlp":
        return PeriodicExportingMetricReader(OTLPMetricExporter())
    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if name == "prometheus":
        return PrometheusMetricReader()
    raise ValueError(
        f"OTEL_METRICS_EXPORTER: unsupported exporter {name!r} (otlp, prometheus, console, none)"
    )


def configure(settings: Settings, environ: Mapping[str, str] | None = None) -> Telemetry:
    """Install tracer and meter providers as the ``OTEL_*`` variables (and the health port) ask.

    The sampler follows ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (the SDK reads
    them), the OTLP exporters ``OTEL_EXPORTER_OTLP_*``. ``OTEL_SDK_DISABLED=true`` installs nothing.
    """
    env = os.environ if environ is None else environ
    installed = Telemetry()
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return installed
    tracing.capture_content = env.get(CAPTURE_CONTENT, "").strip().lower() == "true"
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME})

    span_exporters = _names(env, "OTEL_TRACES_EXPORTER", "TRACES")
    if span_exporters:
        tracer_provider = TracerProvider(resource=resource)
        installed.span_exporters = [_span_exporter(name) for name in span_exporters]
        for exporter in installed.span_exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        installed.tracer_provider = tracer_provider
        installed.exporters += [f"traces:{name}" for name in span_exporters]

    metric_exporters = _names(env, "OTEL_METRICS_EXPORTER", "METRICS")
    if settings.health.enabled and "prometheus" not in metric_exporters:
        metric_exporters.append("prometheus")
    if metric_exporters:
        installed.metric_readers = [_metric_reader(name) for name in metric_exporters]
        meter_provider = MeterProvider(metric_readers=installed.metric_readers, resource=resource)
        metrics.set_meter_provider(meter_provider)
        installed.meter_provider = meter_provider
        installed.exporters += [f"metrics:{name}" for name in metric_exporters]
    if installed.exporters:
        log.info("telemetry: %s", ", ".join(installed.exporters))
    return installed
