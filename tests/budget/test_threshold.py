"""Tests for when a conversation needs compacting (compaction_worker.budget.threshold)."""

from __future__ import annotations

from dataclasses import dataclass

from compaction_worker.budget.threshold import threshold_trigger
from compaction_worker.budget.tokens import budget_for
from compaction_worker.contracts.events import Trigger
from compaction_worker.settings import BudgetSettings


@dataclass
class Facts:
    total_tokens: int
    model: str = "claude-3-5-sonnet-20241022"
    context_window: int | None = 100_000
    max_output_tokens: int | None = None
    observed_window: int | None = None
    calibration: float = 1.0
    noop_tokens: int = 0
    retry_after: float = 0.0
    fixed_tokens: int = 2_000


SETTINGS = {"soft_trigger_fraction": 0.5, "trigger_fraction": 0.8, "target_fraction": 0.3}


def trigger(total: int, **settings: object) -> Trigger | None:
    return threshold_trigger(Facts(total), BudgetSettings.model_validate({**SETTINGS, **settings}), 0.0)


def test_the_soft_threshold_starts_early_unless_told_to_wait_for_its_break_even() -> None:
    """Issue 36: Anthropic's cache reads cost a tenth of its input, so compacting at the soft
    threshold pays back only after many calls; with a horizon it waits until it would pay."""
    _, budget = budget_for(
        "claude-3-5-sonnet-20241022", BudgetSettings.model_validate(SETTINGS), 100_000, None
    )
    assert budget.soft_threshold is not None
    soft = budget.soft_threshold + 100

    assert trigger(soft) is Trigger.SOFT_THRESHOLD
    assert trigger(soft, soft_break_even_calls=10) is None  # ~16 calls to pay back there
    assert trigger(soft, soft_break_even_calls=50) is Trigger.SOFT_THRESHOLD


def test_the_hard_threshold_never_waits_for_its_break_even() -> None:
    _, budget = budget_for(
        "claude-3-5-sonnet-20241022", BudgetSettings.model_validate(SETTINGS), 100_000, None
    )

    assert trigger(budget.threshold, soft_break_even_calls=0.001) is Trigger.THRESHOLD
