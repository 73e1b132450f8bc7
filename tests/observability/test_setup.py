"""setup.configure: which providers and exporters the OTEL_* variables (and the health port) install."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider

from compaction_worker.observability import setup, tracing
from compaction_worker.settings import Settings


class Installed:
    """Stands in for the global setters (the real globals can be set once per process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tracer: TracerProvider | None = None
        self.meter: MeterProvider | None = None
        monkeypatch.setattr("opentelemetry.trace.set_tracer_provider", self._tracer)
        monkeypatch.setattr("opentelemetry.metrics.set_meter_provider", self._meter)
        monkeypatch.setattr(tracing, "capture_content", False)

    def _tracer(self, provider: Any) -> None:
        self.tracer = provider

    def _meter(self, provider: Any) -> None:
        self.meter = provider


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Installed:
    return Installed(monkeypatch)


def test_nothing_set_installs_nothing(installed: Installed) -> None:
    telemetry = setup.configure(Settings(), {})
    assert telemetry.exporters == []
    assert installed.tracer is None
    assert installed.meter is None


def test_an_otlp_endpoint_alone_exports_both_signals_over_otlp(installed: Installed) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SERVICE_NAME": "cw-test"}
    telemetry = setup.configure(Settings(), env)
    assert telemetry.exporters == ["traces:otlp", "metrics:otlp"]
    assert installed.tracer is not None
    assert installed.meter is not None
    assert [type(e) for e in telemetry.span_exporters] == [OTLPSpanExporter]
    assert installed.tracer.resource.attributes["service.name"] == "cw-test"
    (reader,) = telemetry.metric_readers
    assert isinstance(reader, PeriodicExportingMetricReader)
    assert isinstance(reader._exporter, OTLPMetricExporter)
    telemetry.shutdown()


def test_exporter_variables_choose_per_signal(installed: Installed) -> None:
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "prometheus"}
    telemetry = setup.configure(Settings(), env)
    assert telemetry.exporters == ["metrics:prometheus"]
    assert installed.tracer is None
    assert installed.meter is not None
    assert [type(r) for r in telemetry.metric_readers] == [PrometheusMetricReader]
    telemetry.shutdown()


def test_the_health_port_adds_the_prometheus_reader(installed: Installed) -> None:
    telemetry = setup.configure(Settings(health={"enabled": True}), {})
    assert telemetry.exporters == ["metrics:prometheus"]
    assert [type(r) for r in telemetry.metric_readers] == [PrometheusMetricReader]
    assert installed.tracer is None
    telemetry.shutdown()


def test_sdk_disabled_wins(installed: Installed) -> None:
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}
    assert setup.configure(Settings(health={"enabled": True}), env).exporters == []
    assert installed.tracer is None


def test_message_capture_is_opt_in(installed: Installed) -> None:
    setup.configure(Settings(), {})
    assert tracing.capture_content is False
    setup.configure(Settings(), {setup.CAPTURE_CONTENT: "true"})
    assert tracing.capture_content is True


def test_an_unknown_exporter_is_an_error(installed: Installed) -> None:
    with pytest.raises(ValueError, match="zipkin"):
        setup.configure(Settings(), {"OTEL_TRACES_EXPORTER": "zipkin"})
