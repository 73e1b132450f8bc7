"""docs/operations.md: its generated tables match the settings model and the telemetry catalogue."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from compaction_worker.cli import main
from compaction_worker.observability import operations
from compaction_worker.observability.metrics import Instrument
from compaction_worker.observability.operations import (
    OPERATIONS_PAGE,
    check,
    default_regions,
    exported_name,
    exported_series,
    fill,
)
from compaction_worker.observability.tracing import SpanInfo
from compaction_worker.settings import Settings
from tests.test_deploy import setting_path

VARIABLE = re.compile(r"^\| `(COMPACTION_[A-Z0-9_]+)` \| `([^`]*)` \|", re.MULTILINE)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults are compared with Settings(): no COMPACTION_* variable of this machine may leak in."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_"):
            monkeypatch.delenv(name)


def leaf_paths(model: type[BaseModel] = Settings, prefix: str = "") -> set[str]:
    """Every leaf setting's dotted path, walked independently of the generator."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= leaf_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(prefix + name)
    return paths


def lookup(settings: Settings, path: str) -> object:
    value: object = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


class TestThePage:
    def test_is_up_to_date(self) -> None:
        """The committed page is what the generator writes; run the module to refresh it."""
        assert check(OPERATIONS_PAGE, default_regions()) == []

    def test_lists_every_setting_by_a_variable_that_sets_it(self) -> None:
        """Each leaf of the settings model has a row, named by the variable pydantic-settings reads."""
        rows = dict(VARIABLE.findall(OPERATIONS_PAGE.read_text()))
        paths = {setting_path(variable) for variable in rows}
        assert None not in paths
        assert paths == leaf_paths()

    def test_defaults_are_the_models(self) -> None:
        """The default column is the value a worker with nothing configured runs with."""
        rows = dict(VARIABLE.findall(OPERATIONS_PAGE.read_text()))
        defaults = Settings()
        for variable, shown in rows.items():
            path = setting_path(variable)
            assert path is not None
            value = lookup(defaults, path)
            if value is None or "password" in path or "api_key" in path:
                assert shown == "unset", variable
            elif isinstance(value, bool):
                assert shown == str(value).lower(), variable
            elif not isinstance(value, list | dict):
                assert shown == str(getattr(value, "value", value)), variable


class _Extra(BaseModel):
    """A section that does not exist in the real settings."""

    knob: int = Field(default=7, ge=1, description="A new knob.")


class _Grown(Settings):
    extra: _Extra = Field(default_factory=_Extra)


class TestDrift:
    def test_a_new_setting_makes_the_check_fail(self, tmp_path: Path) -> None:
        """A field added to the model without regenerating the page is reported, by region."""
        page = tmp_path / "operations.md"
        page.write_text(OPERATIONS_PAGE.read_text())
        grown = {"settings": operations.settings_markdown(_Grown)}
        assert check(page, grown) == [f"{page}: the settings region is out of date"]
        assert "| `COMPACTION_EXTRA__KNOB` | `7` | A new knob. (≥ 1) |" in fill(page.read_text(), grown)

    def test_check_and_write_from_the_command_line(self, tmp_path: Path) -> None:
        """`docs --check` fails on a stale page; `docs` rewrites its tables and keeps the prose."""
        page = tmp_path / "operations.md"
        stale = OPERATIONS_PAGE.read_text().replace(
            "`COMPACTION_KAFKA__GROUP_ID`", "`COMPACTION_KAFKA__GROUP`"
        )
        page.write_text(stale)
        runner = CliRunner()
        failed = runner.invoke(main, ["docs", "--check", "--path", str(page)])
        assert failed.exit_code == 1
        assert "the settings region is out of date" in failed.output
        assert runner.invoke(main, ["docs", "--path", str(page)]).exit_code == 0
        assert runner.invoke(main, ["docs", "--check", "--path", str(page)]).exit_code == 0
        assert page.read_text() == OPERATIONS_PAGE.read_text()

    def test_a_missing_region_is_an_error(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="settings"):
            fill("# Operations\n", {"settings": "x"})
        page = tmp_path / "operations.md"
        page.write_text("# Operations\n")
        assert check(page, {"settings": "x"}) != []


class TestCatalogueTables:
    def test_prometheus_names_are_the_readers(self) -> None:
        """Counters get _total, units a suffix, histograms their three series: as the reader exports them."""
        turns = Instrument("compaction.turns", "counter", "{turn}", "Turns handled.")
        latency = Instrument("gen_ai.client.operation.duration", "histogram", "s", "LLM call time.")
        lag = Instrument("messaging.kafka.consumer.lag", "observable_gauge", "{message}", "Lag.")
        assert exported_series(turns) == ["compaction_turns_total"]
        assert exported_series(latency) == [
            "gen_ai_client_operation_duration_seconds_bucket",
            "gen_ai_client_operation_duration_seconds_count",
            "gen_ai_client_operation_duration_seconds_sum",
        ]
        assert [exported_name(m) for m in (turns, latency, lag)] == [
            "compaction_turns_total",
            "gen_ai_client_operation_duration_seconds",
            "messaging_kafka_consumer_lag",
        ]

    def test_an_unknown_kind_is_an_error(self) -> None:
        unknown = Instrument("x", "thermometer", "", "")  # type: ignore[arg-type]  # a kind no branch knows
        with pytest.raises(ValueError, match="unknown instrument kind"):
            exported_series(unknown)

    def test_tables(self) -> None:
        metrics = operations.metrics_markdown(
            [Instrument("compaction.turns", "counter", "{turn}", "Turns | handled.")], exported_name
        )
        assert (
            "| `compaction.turns` | `compaction_turns_total` | counter | `{turn}` | Turns \\| handled. |"
            in metrics
        )
        spans = operations.spans_markdown([SpanInfo("compaction.run", "internal", "One compaction.")])
        assert spans.splitlines()[-1] == "| `compaction.run` | internal | One compaction. |"
