"""Whether a run's result pays (docs/design.md, invariant 14), as the compactor and the replay settle it.

A threshold compaction (hard or soft) commits only when it saves ``budget.min_saving_fraction``
of the history, or brings a history over the window under it; otherwise the run is a no-op
whose error says why, with the numbers. A result that ends over its target tells where
compactions end for this conversation (the floor the meta keeps); the threshold rule moves up
to where a compaction from there pays (budget/threshold.py), and the run's event says so.
"""

from __future__ import annotations

from dataclasses import replace

from compaction_worker import strategies
from compaction_worker.budget.threshold import effective_threshold, moved_threshold, short_saving
from compaction_worker.budget.tokens import Budget
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.settings import BudgetSettings


def floor_of(result: strategies.CompactionResult, *, scale: float, target: int) -> int:
    """Where ``result`` ends (provider tokens, as ``target``) when it shrinks the history but not to
    ``target``; 0 when it reaches the target or shrinks nothing (it found no floor)."""
    after = int(result.tokens_after * scale)
    return after if result.tokens_after < result.tokens_before and after > target else 0


def paid(
    result: strategies.CompactionResult,
    trigger: Trigger,
    *,
    before: int,
    scale: float,
    target: int,
    budget: Budget,
    settings: BudgetSettings,
) -> strategies.CompactionResult:
    """``result`` as its run settles it: a no-op saying why when a threshold's saving is too small
    (``before`` is the history's calibrated total, as the no-op mark records it), with a note when
    the floor it found moves the threshold up."""
    if not result.shrinks:
        return result
    floor = floor_of(result, scale=scale, target=target)
    moved = moved_threshold(floor, settings, budget)
    why = short_saving(
        trigger, before, int(result.tokens_after * scale), available=budget.available, settings=settings
    )
    if why is None:
        return replace(result, notes=(*result.notes, moved)) if moved else result
    # As the no-op marks it: no threshold run until the history has grown, and past the floor's level.
    regrown = before + int(settings.noop_regrowth_fraction * budget.available) + 1
    waits = f"no threshold compaction before {max(regrown, effective_threshold(floor, settings, budget)):,} tokens"
    error = "; ".join(part for part in (why, moved, waits) if part)
    # What the discarded draft did is no longer the run's: its stages and notes go with it.
    return replace(result, outcome=Outcome.NOOP, error=error, stages=(), reports=(), notes=())
