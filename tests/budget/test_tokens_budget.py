"""The budget of compaction_worker.budget.tokens: thresholds from a window, calibration, invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_worker.budget.tokens import DEFAULT_OUTPUT_RESERVE, Budget, calibrate, compute_budget
from compaction_worker.budget.windows import WindowInfo
from compaction_worker.settings import BudgetSettings

DEFAULTS = BudgetSettings()


def window(size: int, max_output: int | None = None) -> WindowInfo:
    return WindowInfo("some-model", size, max_output, "override")


class TestBudget:
    def test_defaults_for_gpt_4o(self) -> None:
        """References 002 (effective window), 003 (a percentage of the window) and 004 (80% by default): gpt-4o reserves its 16k output limit; thresholds are fractions of the rest."""
        expected = Budget(
            window=128_000,
            output_reserve=16_384,
            available=111_616,
            threshold=89_292,
            soft_threshold=None,
            target=55_808,
            reactive_target_fraction=0.7,
        )

        assert expected == compute_budget(window(128_000, 16_384), DEFAULTS)

    def test_explicit_reserve_wins(self) -> None:
        """Reference 004 (an explicit maxTokens is the output reserve): the event's max_output_tokens beats the settings and the registry."""
        settings = BudgetSettings(output_reserve_tokens=2_000)

        expected = (1_000, 99_000)

        budget = compute_budget(window(100_000, 16_384), settings, max_output_tokens=1_000)

        assert expected == (budget.output_reserve, budget.available)

    def test_settings_reserve_beats_registry(self) -> None:
        """A configured reserve beats the model's registry output limit."""
        settings = BudgetSettings(output_reserve_tokens=2_000)

        budget = compute_budget(window(100_000, 16_384), settings)

        assert settings.output_reserve_tokens == budget.output_reserve

    def test_default_reserve(self) -> None:
        """Reference 004 (an output reserve when none is given; ours is 4,096): without any output limit the reserve is 4096 tokens."""
        expected = 4_096

        budget = compute_budget(window(100_000), DEFAULTS)

        assert expected == DEFAULT_OUTPUT_RESERVE == budget.output_reserve

    @pytest.mark.parametrize("explicit", [None, 50_000])
    def test_reserve_capped_at_fraction(self, explicit: int | None) -> None:
        """Reference 004 (the reserve is capped by a share of the window; ours is 25%): no reserve takes more than max_output_reserve_fraction of the window."""
        expected = 8_192 // 4

        budget = compute_budget(window(8_192, 100_000), DEFAULTS, max_output_tokens=explicit)

        assert expected == budget.output_reserve

    def test_floor_above_available(self) -> None:
        """A floor above the available tokens is capped at them, and the target stays below."""
        settings = BudgetSettings(floor_tokens=50_000)

        expected = (7_192, 7_192, 3_596)

        budget = compute_budget(window(8_192, 1_000), settings)

        assert expected == (budget.available, budget.threshold, budget.target)

    def test_floor_raises_threshold(self) -> None:
        """Reference 003 (Decision 4, a fixed token floor): on a small window the floor, not the fraction, sets the threshold."""
        settings = BudgetSettings(floor_tokens=1_000, output_reserve_tokens=0)

        budget = compute_budget(window(1_100), settings)

        assert (settings.floor_tokens, 880) == (budget.threshold, math.floor(0.8 * 1_100))

    @pytest.mark.parametrize("size", [1, 2, 3, 5, 10, 256])
    def test_tiny_windows(self, size: int) -> None:
        """Even absurd windows give a usable, ordered budget."""
        budget = compute_budget(window(size), DEFAULTS)

        assert 0 <= budget.target < budget.threshold <= budget.available <= budget.window == size
        assert budget.output_reserve <= size * DEFAULTS.max_output_reserve_fraction

    def test_soft_threshold(self) -> None:
        """The soft threshold is its fraction of the available tokens."""
        settings = BudgetSettings(soft_trigger_fraction=0.6, output_reserve_tokens=0)

        expected = (60_000, 80_000)

        budget = compute_budget(window(100_000), settings)

        assert expected == (budget.soft_threshold, budget.threshold)

    def test_soft_threshold_below_floor_threshold(self) -> None:
        """A soft threshold never exceeds the hard one, even when the floor caps both."""
        settings = BudgetSettings(soft_trigger_fraction=0.6, floor_tokens=0, output_reserve_tokens=0)

        budget = compute_budget(window(3), settings)

        assert budget.soft_threshold is not None
        assert budget.soft_threshold <= budget.threshold

    def test_reactive_target_uses_provider_maximum(self) -> None:
        """Reference 004 (70% after an overflow): after an overflow naming a lower maximum, aim at 70% of it minus the reserve."""
        budget = compute_budget(window(128_000, 16_384), DEFAULTS)

        assert math.floor(0.7 * 60_000) - 16_384 == budget.reactive_target(60_000)

    @pytest.mark.parametrize("provider_max", [None, 0, 1_000_000])
    def test_reactive_target_never_above_target(self, provider_max: int | None) -> None:
        """Without a usable lower maximum the reactive target is the normal one."""
        budget = compute_budget(window(128_000, 16_384), DEFAULTS)

        assert budget.target == budget.reactive_target(provider_max)

    def test_reactive_target_at_least_one(self) -> None:
        """A provider maximum below the reserve still leaves a positive target."""
        budget = compute_budget(window(128_000, 16_384), DEFAULTS)

        assert budget.reactive_target(1_000) == 1


class TestCalibrate:
    def test_moving_average(self) -> None:
        """The new observation weighs 0.3 against the running factor."""
        assert pytest.approx(0.7 * 1.0 + 0.3 * 1.5) == calibrate(1.0, 1_000, 1_500)

    def test_converges_to_the_ratio(self) -> None:
        """Repeated observations of the same ratio pull the factor to it."""
        factor = 1.0
        for _ in range(50):
            factor = calibrate(factor, 1_000, 1_200)

        assert pytest.approx(1.2, abs=1e-6) == factor

    @pytest.mark.parametrize(
        ("estimated", "reported", "expected"), [(1_000, 100_000, 2.0), (100_000, 1, 0.5)]
    )
    def test_clamped(self, estimated: int, reported: int, expected: float) -> None:
        """Wild observations cannot push the factor outside [0.5, 2.0]."""
        factor = 1.0
        for _ in range(20):
            factor = calibrate(factor, estimated, reported)

        assert expected == factor

    @pytest.mark.parametrize(("estimated", "reported"), [(0, 500), (500, 0), (0, 0)])
    def test_zero_is_ignored(self, estimated: int, reported: int) -> None:
        """A zero estimate or report carries no information."""
        factor = 1.37

        assert factor == calibrate(factor, estimated, reported)


class TestProperties:
    @given(
        size=st.integers(min_value=1, max_value=4_000_000),
        registry_output=st.one_of(st.none(), st.integers(min_value=1, max_value=500_000)),
        explicit_output=st.one_of(st.none(), st.integers(min_value=1, max_value=500_000)),
        trigger=st.floats(min_value=0.02, max_value=1.0),
        target_share=st.floats(min_value=0.01, max_value=0.99),
        soft_share=st.one_of(st.none(), st.floats(min_value=0.01, max_value=0.99)),
        floor=st.integers(min_value=0, max_value=2_000_000),
        reserve=st.one_of(st.none(), st.integers(min_value=0, max_value=2_000_000)),
        reserve_fraction=st.floats(min_value=0.01, max_value=0.99),
        reactive=st.floats(min_value=0.01, max_value=1.0),
        provider_max=st.one_of(st.none(), st.integers(min_value=-10, max_value=5_000_000)),
    )
    @settings(max_examples=300, deadline=None)
    def test_budget_invariants(
        self,
        *,
        size: int,
        registry_output: int | None,
        explicit_output: int | None,
        trigger: float,
        target_share: float,
        soft_share: float | None,
        floor: int,
        reserve: int | None,
        reserve_fraction: float,
        reactive: float,
        provider_max: int | None,
    ) -> None:
        """Reference 002 (room below the threshold): for any valid settings: 0 <= target < threshold <= available <= window, soft <= threshold."""
        budget_settings = BudgetSettings(
            trigger_fraction=trigger,
            target_fraction=trigger * target_share,
            soft_trigger_fraction=None if soft_share is None else trigger * soft_share,
            floor_tokens=floor,
            output_reserve_tokens=reserve,
            max_output_reserve_fraction=reserve_fraction,
            reactive_target_fraction=reactive,
        )

        budget = compute_budget(window(size, registry_output), budget_settings, explicit_output)

        assert 0 <= budget.target < budget.threshold <= budget.available <= budget.window == size
        assert 0 <= budget.output_reserve <= size * reserve_fraction
        assert budget.available == size - budget.output_reserve
        if budget.output_reserve > 0:
            assert budget.available < budget.window
        if budget.soft_threshold is not None:
            assert 0 <= budget.soft_threshold <= budget.threshold
        assert (budget.soft_threshold is None) == (soft_share is None)
        assert 1 <= budget.reactive_target(provider_max) <= max(budget.target, 1)
        assert all(isinstance(v, int) for v in (budget.threshold, budget.target, budget.available))
