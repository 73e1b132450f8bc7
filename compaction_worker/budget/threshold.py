"""When a conversation needs compacting: its calibrated total against its thresholds, one rule for all.

The turn handler, the compactor's re-check after a run, the client and replay all ask here.
"""

from __future__ import annotations

import math
from typing import Protocol

from compaction_worker.budget.economics import Prices, projected_break_even
from compaction_worker.budget.tokens import Budget, BudgetFacts, conversation_budget
from compaction_worker.contracts.events import Trigger
from compaction_worker.settings import BudgetSettings


class TotalFacts(Protocol):
    """What the calibrated total needs of a conversation's stored metadata (state.meta.Meta has it)."""

    @property
    def total_tokens(self) -> int: ...
    @property
    def calibration(self) -> float: ...


class ThresholdFacts(BudgetFacts, TotalFacts, Protocol):
    """What the threshold rule needs: the budget's facts, the total, and the last runs' marks."""

    @property
    def noop_tokens(self) -> int: ...
    @property
    def retry_after(self) -> float: ...
    @property
    def fixed_tokens(self) -> int: ...
    @property
    def floor_tokens(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def compacted_seq(self) -> int: ...


def scale_of(facts: TotalFacts) -> float:
    """The calibration factor (provider tokens per estimated token); 1 when none is known."""
    return facts.calibration or 1.0


def calibrated_total(facts: TotalFacts) -> int:
    """The conversation's estimated prompt tokens, in the provider's units."""
    return int(facts.total_tokens * scale_of(facts))


def threshold_trigger(
    facts: ThresholdFacts, settings: BudgetSettings, now: float, *, budget: Budget | None = None
) -> Trigger | None:
    """The threshold a conversation's calibrated total has crossed at ``now``, if any.

    ``budget`` is the conversation's, when the caller has just computed it (the turn's plan).

    None while a failed run's backoff lasts; after a commit until a later turn arrives (a
    compaction runs at most once per turn); and while the total has not grown by
    ``noop_regrowth_fraction`` of the budget since a run that could not shrink it, or not by
    enough. Where compactions cannot go below a floor over the target (``floor_tokens``), the
    thresholds move up to where one saves ``min_saving_fraction`` of the history
    (:func:`paying_total`), never past what the window leaves: over the window a compaction
    always runs (docs/design.md, invariant 14). The soft threshold waits too while the compaction
    would not pay for the prompt cache it rewrites within ``soft_break_even_calls`` later calls
    (:func:`~compaction_worker.budget.economics.projected_break_even`).
    """
    if not settings.auto_compact:
        return None  # manual and reactive requests travel with their turns, not through here
    if facts.retry_after and now < facts.retry_after:
        return None
    if budget is None:
        _, budget = conversation_budget(facts, settings)
    total = calibrated_total(facts)
    if _held(facts, total, budget, settings):
        return None
    paying = paying_total(facts.floor_tokens, settings, budget)
    if total >= max(budget.threshold, paying):
        return Trigger.THRESHOLD
    soft = budget.soft_threshold is not None and total >= max(budget.soft_threshold, paying)
    # Not worth its cache yet: it waits while the total grows until it is, or the hard threshold.
    horizon = settings.soft_break_even_calls
    if soft and (horizon is None or _break_even(facts, total, budget) <= horizon):
        return Trigger.SOFT_THRESHOLD
    return None


def _held(facts: ThresholdFacts, total: int, budget: Budget, settings: BudgetSettings) -> bool:
    """Whether the last runs' marks hold the thresholds off ``total``."""
    if facts.compacted_seq and facts.compacted_seq >= facts.last_seq and total <= budget.available:
        return True  # this turn's compaction has run; the next waits for the next turn
    regrowth = int(settings.noop_regrowth_fraction * budget.available)
    # The last attempt could not shrink this (enough): wait for real growth. A no-op within the
    # window waits only while the history stays within it: over it, a run can bring it back under.
    # One over the window is not retried before then (invariant 5).
    if total > budget.available >= facts.noop_tokens:
        return False
    return bool(facts.noop_tokens) and total <= facts.noop_tokens + regrowth


def paying_total(floor: int, settings: BudgetSettings, budget: Budget) -> int:
    """The total from which a compaction down to ``floor`` (what compactions could not go below,
    0: none found) saves ``min_saving_fraction`` of it, capped at what the window leaves; 0 without
    a floor."""
    if floor <= 0:
        return 0
    return min(budget.available, math.ceil(floor / (1 - settings.min_saving_fraction)))


def effective_threshold(floor: int, settings: BudgetSettings, budget: Budget) -> int:
    """The hard threshold once a ``floor`` has moved it up (:func:`paying_total`)."""
    return max(budget.threshold, paying_total(floor, settings, budget))


def short_saving(
    trigger: Trigger, before: int, after: int, *, available: int, settings: BudgetSettings
) -> str | None:
    """Why a compaction from ``before`` to ``after`` tokens does not pay, or None when it does.

    Only a threshold's (hard or soft) can fail to: it must save ``min_saving_fraction`` of the
    history, or bring a history over the window (``available``) under it. A manual or reactive
    request is someone's call, not ours.
    """
    if trigger not in (Trigger.THRESHOLD, Trigger.SOFT_THRESHOLD):
        return None
    if before > available >= after:
        return None
    share, saved = settings.min_saving_fraction, before - after
    if saved >= share * before:
        return None
    shown = math.floor(saved / before * 1000) / 10  # 9.98% is not "10.0%, under the minimum 10%"
    return (
        f"it would save {saved:,} of {before:,} tokens ({shown:.1f}%), under the minimum "
        f"{share * 100:g}% for a history within its window ({available:,} tokens): nothing committed"
    )


def moved_threshold(floor: int, settings: BudgetSettings, budget: Budget) -> str | None:
    """What a ``floor`` found over the target does to the threshold, for a run's event; None when
    it moves nothing."""
    threshold = effective_threshold(floor, settings, budget)
    if floor <= budget.target or threshold <= budget.threshold:
        return None
    where = (
        f"what the window leaves, {threshold:,} tokens: it compacts when the history reaches its window"
        if threshold >= budget.available
        else f"{threshold:,} tokens, where a compaction saves {settings.min_saving_fraction * 100:g}% of it"
    )
    return (
        f"compactions end at {floor:,} tokens here, over the target ({budget.target:,}): what they keep "
        f"(the system prompt, tools, system and pinned messages, the task, the newest step, a summary) "
        f"takes that much; the threshold ({budget.threshold:,}) moves up to {where}"
    )


def _break_even(facts: ThresholdFacts, total: int, budget: Budget) -> float:
    fixed = int(facts.fixed_tokens * scale_of(facts))
    # Where a compaction would end: the target, or the floor past it compactions found.
    target = max(budget.target, facts.floor_tokens)
    return projected_break_even(Prices.of(facts.model), total=total, target=target, fixed=fixed)
