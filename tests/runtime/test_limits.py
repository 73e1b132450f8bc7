"""A run's limits (runtime/limits.py): where it aims when the target is out of reach."""

from __future__ import annotations

from compaction_worker.budget.tokens import Budget
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.limits import limits_for
from compaction_worker.settings import Settings


def test_a_run_out_of_reach_of_its_target_aims_halfway_to_the_threshold_then_at_it_then_at_the_window() -> (
    None
):
    """Invariant 5: ceilings above the target, in order, never past what the window leaves for input."""
    budget = Budget(
        window=8_000,
        output_reserve=1_000,
        available=7_000,
        threshold=5_600,
        soft_threshold=None,
        target=3_000,
    )
    limits = limits_for(Settings(), Meta(), budget, budget.target, 1.0, force=False)
    assert limits.ceilings == (4_300, 5_600, 7_000)
    scaled = limits_for(Settings(), Meta(), budget, budget.target, 2.0, force=False)
    assert scaled.ceilings == (2_150, 2_800, 3_500)  # in the estimate's units, as the target is
    higher = limits_for(Settings(), Meta(), budget, 6_000, 1.0, force=True)
    assert higher.ceilings == (7_000,)  # only what lies above its own target
