"""Static checks of the observability stack: docker-compose.yml's `observability` profile and the Grafana dashboard.

Docker cannot run here, so these read the files and hold them to each other and to the
code: mounted files exist, services find each other on the ports they listen on,
Prometheus scrapes the port and path the worker serves, and every dashboard query names a
metric the worker exports (its Prometheus name, as OpenTelemetry's reader writes it).
"""

from __future__ import annotations

import json
import re
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from compaction_worker.observability.health import METRICS
from compaction_worker.observability.metrics import METRICS as CATALOGUE
from compaction_worker.observability.operations import exported_series
from tests.test_deploy import REPO, compose, container_env, image_env, load_settings_from

PROFILE = "observability"
STACK = ("otel-collector", "jaeger", "prometheus", "grafana")
COMPOSE_DIR = REPO / "deploy" / "compose"
DASHBOARD = REPO / "deploy" / "grafana" / "compaction-worker.json"


def service(name: str) -> dict[str, Any]:
    return typing.cast(dict[str, Any], compose()["services"][name])


def bind_mounts(name: str) -> dict[str, str]:
    """A service's bind mounts: container path -> host path (relative to the repository)."""
    mounts: dict[str, str] = {}
    for volume in service(name).get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            mounts[target] = source
    return mounts


def mounted_file(name: str, target: str) -> Path:
    return REPO / bind_mounts(name)[target]


def load_yaml(path: Path) -> dict[str, Any]:
    return typing.cast(dict[str, Any], yaml.safe_load(path.read_text()))


def container_ports(name: str) -> set[int]:
    """The container side of a service's published ports."""
    return {int(str(port).split(":")[-1].split("/")[0]) for port in service(name).get("ports", [])}


def worker_health_port(monkeypatch: pytest.MonkeyPatch) -> int:
    settings = load_settings_from(monkeypatch, {**image_env(), **container_env("worker", {})})
    assert settings.health.enabled
    return settings.health.port


class TestComposeProfile:
    def test_the_stack_runs_only_with_the_profile(self) -> None:
        """The collector, Jaeger, Prometheus and Grafana are in the profile; the core services in none."""
        services = compose()["services"]
        for name in STACK:
            assert services[name]["profiles"] == [PROFILE], name
        for name in ("kafka", "redis", "topics", "worker"):
            assert "profiles" not in services[name], name

    def test_every_mounted_file_exists(self) -> None:
        """Bind mounts name files and directories of this repository."""
        for name in compose()["services"]:
            for source in bind_mounts(name).values():
                assert (REPO / source).exists(), f"{name}: {source}"

    def test_ports_are_published_on_localhost_only(self) -> None:
        for name in STACK:
            for port in service(name).get("ports", []):
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"

    def test_workers_send_otlp_to_the_collector(self) -> None:
        """The worker takes the OTLP endpoint from the shell; the documented value reaches the collector's HTTP receiver."""
        worker = container_env("worker", {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
        assert worker["OTEL_EXPORTER_OTLP_ENDPOINT"] == "x"  # passed through
        assert worker["OTEL_SERVICE_NAME"]
        (documented,) = set(
            re.findall(r"OTEL_EXPORTER_OTLP_ENDPOINT=(\S+)", (REPO / "docker-compose.yml").read_text())
        )
        host, port = documented.removeprefix("http://").split(":")
        config = load_yaml(mounted_file(host, "/etc/otelcol/config.yaml"))
        assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(f":{port}")
        assert worker["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert worker["OTEL_METRICS_EXPORTER"] == "prometheus"  # scraped, not pushed too

    def test_collector_pipelines_use_defined_components(self) -> None:
        """Each pipeline's receivers, processors and exporters are defined; traces go to Jaeger's OTLP port."""
        config = load_yaml(mounted_file("otel-collector", "/etc/otelcol/config.yaml"))
        for pipeline in config["service"]["pipelines"].values():
            for part in ("receivers", "processors", "exporters"):
                for component in pipeline.get(part, []):
                    assert component in config[part], component
        traces = config["service"]["pipelines"]["traces"]["exporters"]
        (jaeger,) = [config["exporters"][e]["endpoint"] for e in traces if e.startswith("otlp")]
        assert jaeger == "jaeger:4317"
        assert service("jaeger")["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"

    def test_prometheus_scrapes_every_worker_on_its_health_port(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """DNS service discovery of the worker service, on the port and path the worker serves."""
        config = load_yaml(mounted_file("prometheus", "/etc/prometheus/prometheus.yml"))
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        worker = jobs["compaction-worker"]
        assert worker["metrics_path"] == METRICS
        (discovery,) = worker["dns_sd_configs"]
        assert discovery["names"] == ["worker"]
        assert discovery["port"] == worker_health_port(monkeypatch)
        collector = load_yaml(mounted_file("otel-collector", "/etc/otelcol/config.yaml"))
        (reader,) = collector["service"]["telemetry"]["metrics"]["readers"]
        (target,) = jobs["otel-collector"]["static_configs"][0]["targets"]
        assert target == f"otel-collector:{reader['pull']['exporter']['prometheus']['port']}"

    def test_grafana_finds_prometheus_and_the_dashboard(self) -> None:
        """The provisioned data source is the prometheus service; the dashboards provider reads the mounted folder."""
        provisioning = mounted_file("grafana", "/etc/grafana/provisioning")
        sources = load_yaml(provisioning / "datasources" / "datasources.yaml")["datasources"]
        (prometheus,) = [s for s in sources if s["type"] == "prometheus"]
        assert prometheus["url"] == f"http://prometheus:{next(iter(container_ports('prometheus')))}"
        (provider,) = load_yaml(provisioning / "dashboards" / "dashboards.yaml")["providers"]
        folder = provider["options"]["path"]
        assert bind_mounts("grafana")[folder] == "./deploy/grafana"
        home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        assert (REPO / "deploy" / "grafana" / Path(home).relative_to(folder)) == DASHBOARD


# --- the dashboard --------------------------------------------------------------------------

# PromQL words that are not metric names: functions, aggregations, keywords.
_PROMQL_WORDS = {
    "sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "max", "min", "avg",
    "count", "topk", "le", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "clamp_min", "clamp_max", "delta", "deriv", "vector", "scalar", "abs", "time", "offset", "bool",
}  # fmt: skip


def panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard, rows' nested panels included."""
    dashboard = json.loads(DASHBOARD.read_text())
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, durations and strings removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {w for w in words if w not in _PROMQL_WORDS and not re.fullmatch(r"\d+[smhd]", w)}


def labels_of(expr: str) -> set[str]:
    """The labels a PromQL expression groups by or matches on."""
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    matched = re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", expr)
    return {label.strip() for group in grouped for label in group.split(",") if label.strip()} | set(matched)


def attribute_labels(series: str) -> set[str]:
    """The Prometheus labels of the catalogue metric that exports ``series`` (its attributes, sanitized)."""
    (metric,) = [m for m in CATALOGUE if series in series_by_metric()[m.name]]
    return {re.sub(r"[^A-Za-z0-9_]", "_", attribute) for attribute in metric.attributes}


@cache
def series_by_metric() -> dict[str, list[str]]:
    """Each catalogue metric's series names on /metrics, as OpenTelemetry's Prometheus reader exports them."""
    return {metric.name: exported_series(metric) for metric in CATALOGUE}


def exported() -> set[str]:
    """Every series name the worker's metrics have on /metrics."""
    return {name for names in series_by_metric().values() for name in names}


class TestDashboard:
    def test_parses_with_panels_and_queries(self) -> None:
        dashboard = json.loads(DASHBOARD.read_text())
        assert dashboard["title"]
        assert [t["expr"] for p in panels() for t in p.get("targets", [])]

    def test_every_query_names_an_exported_metric(self) -> None:
        """A renamed or misspelt metric leaves a panel empty; here it fails instead."""
        for panel in panels():
            for target in panel.get("targets", []):
                names = metric_names(target["expr"])
                assert names, f"{panel['title']}: no metric in {target['expr']}"
                assert names <= exported(), f"{panel['title']}: {sorted(names - exported())}"

    def test_every_label_is_an_attribute_of_its_metric(self) -> None:
        """Grouping and matching labels are attributes the queried metrics carry (``le`` for histograms)."""
        for panel in panels():
            for target in panel.get("targets", []):
                expr = target["expr"]
                allowed = {"le"} | {label for name in metric_names(expr) for label in attribute_labels(name)}
                assert labels_of(expr) <= allowed, f"{panel['title']}: {sorted(labels_of(expr) - allowed)}"

    def test_covers_what_operators_watch(self) -> None:
        """Turn rate, lag, compactions, tokens saved, LLM latency and cost, dead letters."""
        titles = " ".join(p["title"].lower() for p in panels())
        for topic in ("turn", "lag", "compaction", "tokens saved", "llm latency", "cost", "dead letter"):
            assert topic in titles, topic

    def test_panels_use_the_provisioned_prometheus(self) -> None:
        sources = load_yaml(COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "datasources.yaml")
        (uid,) = [s["uid"] for s in sources["datasources"] if s["type"] == "prometheus"]
        for panel in panels():
            if panel.get("targets"):
                assert panel["datasource"]["uid"] == uid, panel["title"]

    def test_metric_names_parser(self) -> None:
        """The parser finds metrics and skips functions, labels and ranges."""
        expr = 'histogram_quantile(0.95, sum by (le, model) (rate(a_seconds_bucket{x="y"}[5m]))) / b_total'
        assert metric_names(expr) == {"a_seconds_bucket", "b_total"}
        assert labels_of(expr) == {"le", "model", "x"}
