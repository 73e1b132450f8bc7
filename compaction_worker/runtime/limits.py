"""The numbers one run works to: the pipeline's limits, and a reactive run's target and scale."""

from __future__ import annotations

from dataclasses import dataclass, replace

from compaction_worker import strategies
from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.budget.threshold import scale_of
from compaction_worker.budget.tokens import CALIBRATION_BOUNDS, Budget, TokenCounter, conversation_budget
from compaction_worker.budget.windows import WindowInfo
from compaction_worker.contracts.events import Trigger
from compaction_worker.conversation.meta import Job, Meta
from compaction_worker.settings import Settings
from compaction_worker.state.store import Snapshot


@dataclass(frozen=True, slots=True)
class RunLimits:
    """What one run of ``job`` on a snapshot works to."""

    info: WindowInfo
    budget: Budget
    target: int
    """In provider tokens."""
    scale: float
    """Provider tokens per estimated token."""
    limits: strategies.Limits
    """The pipeline's, in estimate units."""


def run_limits(settings: Settings, snapshot: Snapshot, counter: TokenCounter, job: Job) -> RunLimits:
    """The limits a run of ``job`` compacts ``snapshot`` to (the compactor's run and a preview share them)."""
    meta = snapshot.meta
    info, budget = conversation_budget(meta, settings.budget)
    # Limits are in our estimate's units; calibration converts provider tokens back.
    target, scale = budget.target, scale_of(meta)
    if job.trigger is Trigger.REACTIVE:
        target, scale = reactive_target(job, meta, budget)
    limits = limits_for(settings, meta, budget, target, scale, force=job.trigger is Trigger.MANUAL)
    if job.trigger is Trigger.REACTIVE:
        # The provider's own limit may lie below our window: no ceiling past its target. And
        # as it refused this history, "already under the target" is our estimate's mistake
        # (no numbers to calibrate with, or beyond the clamp): compact anyway, as far as the
        # pipeline goes, instead of a no-op.
        under = estimate(snapshot, counter) <= limits.target
        limits = replace(limits, ceilings=(), force=limits.force or under)
    return RunLimits(info, budget, target, scale, limits)


def limits_for(
    settings: Settings, meta: Meta, budget: Budget, target: int, scale: float, *, force: bool
) -> strategies.Limits:
    """The pipeline's limits, in our estimate's units (``scale`` converts provider tokens back)."""
    pipeline = settings.pipeline
    return strategies.Limits(
        target=int(target / scale),
        fixed_tokens=meta.fixed_tokens,
        window=int(budget.window / scale),
        tail_max_messages=settings.tail.max_messages,
        tail_max_tokens=int(settings.tail.max_fraction * budget.window / scale),
        max_summary_tokens=settings.summarizer.max_summary_tokens,
        chunk_budget=int(target / scale * pipeline.chunk_budget_fraction),
        force=force,
        task_max_tokens=_capped(pipeline.task_max_tokens, pipeline.task_max_fraction, budget.window, scale),
        user_words_max_tokens=_capped(
            pipeline.user_words_max_tokens, pipeline.user_words_max_fraction, budget.window, scale
        ),
        ceilings=_ceilings(target, budget, scale),
    )


def _ceilings(target: int, budget: Budget, scale: float) -> tuple[int, ...]:
    """Where a run aims when the target is out of reach: halfway to the threshold (so that the next
    turns do not set off another run at once), the threshold, what the window leaves for input."""
    aims = ((target + budget.threshold) // 2, budget.threshold, budget.available)
    return tuple(dict.fromkeys(int(aim / scale) for aim in aims if aim > target))


def _capped(tokens: int, fraction: float, window: int, scale: float) -> int:
    """A budget set as tokens and as a share of the window, the smaller, in estimate units."""
    return int(min(tokens, fraction * window) / scale)


def reactive_target(job: Job, meta: Meta, budget: Budget) -> tuple[int, float]:
    """The target and estimate scale of a reactive compaction (docs/design.md, "Reactive compaction")."""
    overflow = detect_overflow(job.error) if job.error else None
    target = budget.reactive_target(overflow.max_tokens if overflow else None)
    scale = scale_of(meta)
    if overflow is not None and overflow.actual_tokens and job.estimate > 0:
        low, high = CALIBRATION_BOUNDS
        scale = max(scale, min(high, max(low, overflow.actual_tokens / job.estimate)))
    return target, scale


def estimate(snapshot: Snapshot, counter: TokenCounter) -> int:
    """The history's total as the pipeline measures it (estimate units, fixed tokens included)."""
    history = snapshot.history
    overhead = strategies.summary_overhead(counter)
    return snapshot.meta.fixed_tokens + strategies.draft_tokens(
        strategies.Draft(history.chunks, history.entries), overhead
    )
