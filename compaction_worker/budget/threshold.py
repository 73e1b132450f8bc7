"""When a conversation needs compacting: its calibrated total against its thresholds, one rule for all.

The turn handler, the compactor's re-check after a run, the client and replay all ask here.
"""

from __future__ import annotations

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
    """What the threshold rule needs: the budget's facts, the total, and the last run's marks."""

    @property
    def noop_tokens(self) -> int: ...
    @property
    def retry_after(self) -> float: ...
    @property
    def fixed_tokens(self) -> int: ...


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

    None while a failed run's backoff lasts, and while the total has not grown by
    ``noop_regrowth_fraction`` of the budget since a run that could not shrink it. The soft
    threshold waits too while the compaction would not pay for the prompt cache it rewrites
    within ``soft_break_even_calls`` later calls (:func:`~compaction_worker.budget.economics.projected_break_even`).
    """
    if not settings.auto_compact:
        return None  # manual and reactive requests travel with their turns, not through here
    if facts.retry_after and now < facts.retry_after:
        return None
    if budget is None:
        _, budget = conversation_budget(facts, settings)
    total = calibrated_total(facts)
    regrowth = int(settings.noop_regrowth_fraction * budget.available)
    if facts.noop_tokens and total <= facts.noop_tokens + regrowth:
        return None  # the last attempt could not shrink this; wait for real growth
    if total >= budget.threshold:
        return Trigger.THRESHOLD
    soft = budget.soft_threshold is not None and total >= budget.soft_threshold
    # Not worth its cache yet: it waits while the total grows until it is, or the hard threshold.
    horizon = settings.soft_break_even_calls
    if soft and (horizon is None or _break_even(facts, total, budget) <= horizon):
        return Trigger.SOFT_THRESHOLD
    return None


def _break_even(facts: ThresholdFacts, total: int, budget: Budget) -> float:
    fixed = int(facts.fixed_tokens * scale_of(facts))
    return projected_break_even(Prices.of(facts.model), total=total, target=budget.target, fixed=fixed)
