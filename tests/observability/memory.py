"""In-memory OpenTelemetry providers for tests: installed once per process, read and cleared per test.

The global providers can be set only once, so every test that looks at spans or metrics
shares these (``memory()``); each test starts from ``clear()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# Deltas: each collection holds only what was recorded since the previous one (clear() collects).
_DELTA: dict[type, AggregationTemporality] = dict.fromkeys(
    (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge),
    AggregationTemporality.DELTA,
)


class _Gate(SimpleSpanProcessor):
    """Exports only while a test looks: the providers stay installed for the rest of the session."""

    open = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            super().on_end(span)


@dataclass
class Memory:
    """The installed exporter and reader; metric points are kept as collected, until ``clear``."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    gate: _Gate
    collected: list[tuple[str, bool, dict[str, object], object]] = field(default_factory=list)

    def clear(self) -> None:
        """Forget the spans and metrics recorded so far."""
        self.spans.clear()
        self.reader.collect()
        self.collected.clear()

    @contextlib.contextmanager
    def recording(self) -> Iterator[Memory]:
        """Cleared, then keeping finished spans until the block ends (a test's fixture)."""
        self.clear()
        self.gate.open = True
        try:
            yield self
        finally:
            self.gate.open = False
            self.clear()

    def finished(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def points(self) -> list[tuple[str, bool, dict[str, object], object]]:
        """(metric name, is a gauge, attributes, delta point) of every collection since ``clear``."""
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    gauge = isinstance(metric.data, Gauge)
                    for point in metric.data.data_points:
                        self.collected.append((metric.name, gauge, dict(point.attributes or {}), point))
        return self.collected

    def values(self, name: str) -> dict[tuple[tuple[str, object], ...], float]:
        """A counter's totals (or a gauge's last values) by attribute set (sorted items) since ``clear``."""
        out: dict[tuple[tuple[str, object], ...], float] = {}
        for metric, gauge, attributes, point in self.points():
            if metric == name and isinstance(point, NumberDataPoint):
                key = tuple(sorted(attributes.items()))
                out[key] = point.value if gauge else out.get(key, 0) + point.value
        return out

    def histogram(self, name: str) -> dict[tuple[tuple[str, object], ...], tuple[int, float]]:
        """A histogram's (count, sum) by attribute set (sorted items) since ``clear``."""
        out: dict[tuple[tuple[str, object], ...], tuple[int, float]] = {}
        for metric, _, attributes, point in self.points():
            if metric == name and isinstance(point, HistogramDataPoint):
                key = tuple(sorted(attributes.items()))
                count, total = out.get(key, (0, 0.0))
                out[key] = (count + point.count, total + point.sum)
        return out


@cache
def memory() -> Memory:
    """Install the in-memory providers as the global ones (once per process)."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    gate = _Gate(exporter)
    tracer_provider.add_span_processor(gate)
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader(preferred_temporality=_DELTA)
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    if (
        trace.get_tracer_provider() is not tracer_provider
        or metrics.get_meter_provider() is not meter_provider
    ):
        raise RuntimeError("another global OpenTelemetry provider was installed first in this process")
    return Memory(exporter, reader, gate)


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    """The spans whose parent is ``parent``."""
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
