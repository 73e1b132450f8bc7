"""Settings: where the budget knobs come from (YAML, environment) and the defaults the pipeline gets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compaction_worker.budget.tokens import budget_for
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.limits import limits_for
from compaction_worker.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No COMPACTION_* variable of the machine running the tests leaks into them."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_"):
            monkeypatch.delenv(name)


class TestBudgetKnobs:
    def test_trigger_fraction_and_floor_from_a_yaml_file(self, tmp_path: Path) -> None:
        """Reference 003 (Decision 4, B+A+D): the percentage and the token floor are admin-configurable in YAML."""
        config = tmp_path / "compaction.yaml"
        config.write_text("budget:\n  trigger_fraction: 0.7\n  floor_tokens: 2000\n")

        settings = load_settings(config)
        _, large = budget_for("gpt-4o", settings.budget, 100_000, 0)
        _, small = budget_for("gpt-4o", settings.budget, 2_400, 0)

        expected = (70_000, 2_000)  # 70% of a large window; the floor on a small one

        assert expected == (large.threshold, small.threshold)

    def test_environment_beats_the_yaml_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Reference 004 (a threshold override from the environment): COMPACTION_TRIGGER_FRACTION wins over the file."""
        config = tmp_path / "compaction.yaml"
        config.write_text("budget:\n  trigger_fraction: 0.9\n")
        monkeypatch.setenv("COMPACTION_TRIGGER_FRACTION", "0.7")

        settings = load_settings(config)

        assert settings.budget.trigger_fraction == 0.7


class TestDefaults:
    def test_tail_bounds_are_six_messages_and_a_quarter_of_the_window(self) -> None:
        """Reference 000 (keepRecentMessages 6, keepRecentFraction 0.25): the tail bounds the pipeline gets by default."""
        settings = Settings()
        _, budget = budget_for("gpt-4o", settings.budget, 100_000, None)

        limits = limits_for(settings, Meta(model="gpt-4o"), budget, budget.target, 1.0, force=False)

        expected = (6, 25_000)

        assert expected == (limits.tail_max_messages, limits.tail_max_tokens)
