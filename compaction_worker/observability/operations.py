"""The docs' generated parts: docs/operations.md's every setting with its default and variable,
every metric and span; docs/reference.md's every command (its region made by ``cli/reference.py``).

A page is prose with generated regions between markers; this module rewrites only the
regions, so the prose stays hand-written and the tables cannot drift from the code.
``compaction-worker docs [--check]`` writes or checks them.
"""

from __future__ import annotations

import enum
import json
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from compaction_worker.observability.metrics import METRICS, Instrument
from compaction_worker.observability.tracing import SPANS, SpanInfo
from compaction_worker.settings import Settings, env_name, literal_values

REPOSITORY = Path(__file__).resolve().parent.parent.parent
OPERATIONS_PAGE = REPOSITORY / "docs" / "operations.md"
REFERENCE_PAGE = REPOSITORY / "docs" / "reference.md"

_BEGIN = "<!-- generated: {name} (compaction-worker docs) -->"
_END = "<!-- end generated: {name} -->"


@dataclass(frozen=True, slots=True)
class SettingDoc:
    """One setting as the page lists it."""

    path: str
    variable: str
    default: str
    description: str


# --- settings -------------------------------------------------------------------------------


def _section_model(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is dict:
        return None  # named sets of sections (profiles): one setting, a mapping
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := _section_model(a)) is not None), None)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None or isinstance(value, SecretStr):
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


_BOUNDS: tuple[tuple[type, str, str], ...] = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
)


def _constraints(field: FieldInfo) -> str:
    """The field's bounds and allowed values, as the page states them (``≥ 1``, ``one of …``)."""
    parts = [
        f"{symbol} {getattr(item, attribute)}"
        for item in field.metadata
        for kind, attribute, symbol in _BOUNDS
        if isinstance(item, kind)
    ]
    if values := literal_values(field.annotation):
        parts.append("one of " + ", ".join(f"`{v}`" for v in values))
    return "; ".join(parts)


def settings_docs(model: type[BaseModel] = Settings) -> list[SettingDoc]:
    """Every leaf setting of the model, section by section, with its environment variable."""
    docs: list[SettingDoc] = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue  # the flat aliases: listed apart
        section = _section_model(field.annotation)
        fields = section.model_fields.items() if section else [(None, field)]
        for leaf_name, leaf in fields:
            path = f"{name}.{leaf_name}" if leaf_name else name
            text, bounds = leaf.description or "", _constraints(leaf)
            description = f"{text} ({bounds})" if text and bounds else text or bounds
            docs.append(SettingDoc(path, env_name(path), _default(leaf), description))
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_markdown(model: type[BaseModel] = Settings) -> str:
    """The settings region: a table per section, headed by the section's own docstring."""
    lines: list[str] = []
    current = None
    for doc in settings_docs(model):
        section = doc.path.split(".")[0] if "." in doc.path else ""
        if section != current:
            current = section
            section_model = _section_model(model.model_fields[section].annotation) if section else None
            title = f"`{section}`" if section else "top level"
            summary = (section_model.__doc__ or "").strip().splitlines()[0] if section_model else ""
            lines += ["", f"#### {title}", "", summary, ""] if summary else ["", f"#### {title}", ""]
            lines += ["| variable | default | meaning |", "|---|---|---|"]
        lines.append(f"| `{doc.variable}` | `{_cell(doc.default)}` | {_cell(doc.description)} |")
    aliases = ", ".join(f"`{env_name(name)}`" for name, field in model.model_fields.items() if field.exclude)
    lines += ["", f"Flat aliases of the nested names, for compatibility: {aliases}."]
    return "\n".join(lines).strip()


# --- metrics and spans ------------------------------------------------------------------------


def exported_series(metric: Instrument) -> list[str]:
    """The series names an instrument has on /metrics, as OpenTelemetry's Prometheus reader exports it.

    Found by running the reader on a private registry rather than by re-deriving its naming
    rules (unit suffixes, ``_total``, ``_bucket``), so the names are the reader's own.
    """
    registry = CollectorRegistry(auto_describe=False)
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(disable_target_info=True, registry=registry)]
    )
    try:
        meter = provider.get_meter("compaction_worker.catalogue")
        kind, unit, description = metric.kind, metric.unit, metric.description

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(1)]

        if kind == "counter":
            meter.create_counter(metric.name, unit, description).add(1)
        elif kind == "histogram":
            meter.create_histogram(metric.name, unit, description).record(1)
        elif kind == "gauge":
            meter.create_gauge(metric.name, unit, description).set(1)
        elif kind == "observable_gauge":
            meter.create_observable_gauge(metric.name, [observe], unit, description)
        else:
            raise ValueError(f"{metric.name}: unknown instrument kind {metric.kind!r}")
        return sorted({sample.name for family in registry.collect() for sample in family.samples})
    finally:
        provider.shutdown()


def exported_name(metric: Instrument) -> str:
    """The name to query: the family's ``_total`` for counters, the base name for histograms and gauges."""
    series = exported_series(metric)
    counts = [name.removesuffix("_count") for name in series if name.endswith("_count")]
    return counts[0] if len(series) > 1 and counts else series[0]


def metrics_markdown(metrics: Iterable[Instrument], exported: Callable[[Instrument], str]) -> str:
    """The metrics region: each instrument's name, its Prometheus name, kind, unit and meaning."""
    lines = ["| metric | on /metrics | kind | unit | meaning |", "|---|---|---|---|---|"]
    for m in metrics:
        lines.append(
            f"| `{m.name}` | `{exported(m)}` | {m.kind} | `{m.unit or '1'}` | {_cell(m.description)} |"
        )
    return "\n".join(lines)


def spans_markdown(spans: Iterable[SpanInfo]) -> str:
    """The spans region: each span's name, kind and meaning."""
    lines = ["| span | kind | meaning |", "|---|---|---|"]
    lines += [f"| `{s.name}` | {s.kind} | {_cell(s.description)} |" for s in spans]
    return "\n".join(lines)


# --- the page ------------------------------------------------------------------------------


def fill(page: str, regions: dict[str, str]) -> str:
    """The page with each named region's content replaced; a missing marker is an error."""
    for name, content in regions.items():
        begin, end = _BEGIN.format(name=name), _END.format(name=name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(page):
            raise ValueError(f"{name}: the page has no {begin} ... {end} region")
        replacement = f"{begin}\n{content}\n{end}"
        page = pattern.sub(lambda _match: replacement, page, count=1)  # noqa: B023  # used at once
    return page


def check(path: Path, regions: dict[str, str]) -> list[str]:
    """Why the page at ``path`` differs from what the code generates (empty: up to date)."""
    if not path.is_file():
        return [f"{path} does not exist"]
    current = path.read_text()
    try:
        expected = fill(current, regions)
    except ValueError as e:
        return [str(e)]
    if expected == current:
        return []
    stale = [
        name
        for name in regions
        if _BEGIN.format(name=name) + "\n" + regions[name] + "\n" + _END.format(name=name) not in current
    ]
    return [f"{path}: the {name} region is out of date" for name in stale]


def write(path: Path = OPERATIONS_PAGE, regions: dict[str, str] | None = None) -> None:
    """Rewrite the generated regions of the page at ``path``, leaving its prose as it is."""
    path.write_text(fill(path.read_text(), default_regions() if regions is None else regions))


def default_regions() -> dict[str, str]:
    """The regions from the real settings model and telemetry catalogue."""
    return {
        "metrics": metrics_markdown(METRICS, exported_name),
        "spans": spans_markdown(SPANS),
        "settings": settings_markdown(),
    }
