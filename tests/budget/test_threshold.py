"""Tests for when a conversation needs compacting (compaction_worker.budget.threshold)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from compaction_worker.budget.threshold import (
    moved_threshold,
    paying_total,
    short_saving,
    threshold_trigger,
)
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
    floor_tokens: int = 0
    last_seq: int = 5
    compacted_seq: int = 0


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


SMALL = BudgetSettings()
"""A 4K window at the defaults: available 3,072 tokens (a quarter is the output's), threshold
2,457, target 1,536, a tenth of the history to save."""


def small(total: int, **marks: int) -> Trigger | None:
    facts = Facts(total, model="gpt-4o-mini", context_window=4096, **marks)
    return threshold_trigger(facts, SMALL, 0.0)


def test_the_small_window_s_numbers() -> None:
    _, budget = budget_for("gpt-4o-mini", SMALL, 4096, None)
    assert (budget.available, budget.threshold, budget.target) == (3072, 2457, 1536)
    assert SMALL.min_saving_fraction == 0.1


def test_a_floor_over_the_target_moves_the_threshold_to_where_a_compaction_saves_its_share() -> None:
    """Issue: where the system prompt alone was over the target, every compaction ended just under
    the threshold and the next turn set off another, saving a few percent each."""
    assert small(2500) is Trigger.THRESHOLD  # no floor known: the threshold
    assert small(2500, floor_tokens=1400) is Trigger.THRESHOLD  # a floor under the target moves nothing
    assert small(2500, floor_tokens=2455) is None  # 2455 / 0.9 = 2727.8: from 2728 a run saves 10%
    assert small(2727, floor_tokens=2455) is None
    assert small(2728, floor_tokens=2455) is Trigger.THRESHOLD
    assert small(2600, floor_tokens=2455, compacted_seq=0) is None


def test_the_moved_threshold_stops_at_what_the_window_leaves_where_it_always_runs() -> None:
    _, budget = budget_for("gpt-4o-mini", SMALL, 4096, None)
    assert paying_total(3000, SMALL, budget) == 3072  # 3,334 would be over the window
    assert small(3071, floor_tokens=3000) is None
    assert small(3072, floor_tokens=3000) is Trigger.THRESHOLD
    assert small(5000, floor_tokens=4000) is Trigger.THRESHOLD  # a floor past the window: at the window


def test_a_no_op_within_the_window_waits_for_growth_until_the_history_is_over_the_window() -> None:
    """A run that saved too little (or nothing) waits for the history to grow by the regrowth
    (153 tokens here); past the window it runs at once. A no-op over the window is not retried
    before it has grown (invariant 5)."""
    assert small(2600 + 153, noop_tokens=2600) is None
    assert small(2600 + 154, noop_tokens=2600) is Trigger.THRESHOLD
    assert small(3072, noop_tokens=3000) is None  # at the window, within it
    assert small(3073, noop_tokens=3000) is Trigger.THRESHOLD
    assert small(3100, noop_tokens=3080) is None
    assert small(3234, noop_tokens=3080) is Trigger.THRESHOLD


def test_after_a_commit_the_same_turn_runs_no_other_unless_it_is_over_its_window() -> None:
    """The commit marks the turn it ran on (compacted_seq): a compaction runs once per turn."""
    assert small(2600, last_seq=5, compacted_seq=5) is None
    assert small(2600, last_seq=6, compacted_seq=5) is Trigger.THRESHOLD  # a turn arrived meanwhile
    assert small(3073, last_seq=5, compacted_seq=5) is Trigger.THRESHOLD  # over the window


def test_the_soft_threshold_moves_up_with_the_floor_and_its_break_even_counts_from_there() -> None:
    soft = BudgetSettings(soft_trigger_fraction=0.6)

    def trigger_at(total: int, settings: BudgetSettings = soft, floor: int = 0) -> Trigger | None:
        facts = Facts(total, model="gpt-4o-mini", context_window=4096, floor_tokens=floor, fixed_tokens=500)
        return threshold_trigger(facts, settings, 0.0)

    assert trigger_at(1900) is Trigger.SOFT_THRESHOLD  # soft threshold 1,843
    assert trigger_at(1900, floor=1800) is None  # 1800 / 0.9 = 2000
    assert trigger_at(2000, floor=1800) is Trigger.SOFT_THRESHOLD
    waits = soft.model_copy(update={"soft_break_even_calls": 4.0})
    # gpt-4o-mini: a cache read costs half of input, so the rewritten prompt pays back after
    # (its tokens) / (the tokens removed) calls.
    assert trigger_at(2300, waits) is Trigger.SOFT_THRESHOLD  # 1,036 / 764: 1.4 calls
    assert trigger_at(2300, waits, floor=2050) is None  # down to the floor only: 1,550 / 250, 6.2 calls


def test_a_threshold_compaction_pays_with_its_share_or_by_bringing_the_history_under_its_window() -> None:
    def why(trigger: Trigger, before: int, after: int) -> str | None:
        return short_saving(trigger, before, after, available=3072, settings=SMALL)

    assert why(Trigger.THRESHOLD, 2649, 2455) == (
        "it would save 194 of 2,649 tokens (7.3%), under the minimum 10% for a history within its "
        "window (3,072 tokens): nothing committed"
    )
    assert why(Trigger.SOFT_THRESHOLD, 2649, 2455) is not None
    assert why(Trigger.THRESHOLD, 2700, 2430) is None  # exactly 10%
    assert why(Trigger.THRESHOLD, 3280, 3070) is None  # over the window, brought under it
    assert why(Trigger.THRESHOLD, 3072, 3000) is not None  # at the window is within it
    assert why(Trigger.MANUAL, 2649, 2600) is None  # someone asked
    assert why(Trigger.REACTIVE, 2649, 2600) is None
    assert (
        short_saving(
            Trigger.THRESHOLD, 2649, 2455, available=3072, settings=BudgetSettings(min_saving_fraction=0)
        )
        is None
    )


@pytest.mark.parametrize(
    ("floor", "says"),
    [
        (1500, None),  # under the target: nothing found to move
        (2200, None),  # 2,445 would be under the threshold: nothing moves
        (2455, "the threshold (2,457) moves up to 2,728 tokens, where a compaction saves 10% of it"),
        (
            3000,
            "moves up to what the window leaves, 3,072 tokens: it compacts when the history reaches its window",
        ),
    ],
)
def test_the_event_says_how_far_a_floor_moves_the_threshold(floor: int, says: str | None) -> None:
    _, budget = budget_for("gpt-4o-mini", SMALL, 4096, None)
    note = moved_threshold(floor, SMALL, budget)
    if says is None:
        assert note is None
    else:
        assert note is not None
        assert note.startswith(f"compactions end at {floor:,} tokens here, over the target (1,536)")
        assert note.endswith(says)
