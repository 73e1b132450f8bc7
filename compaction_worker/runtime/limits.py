"""The numbers one run works to: the pipeline's limits, and a reactive run's target and scale."""

from __future__ import annotations

from compaction_worker import strategies
from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.budget.threshold import scale_of
from compaction_worker.budget.tokens import CALIBRATION_BOUNDS, Budget, TokenCounter
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import Job
from compaction_worker.state.meta import Meta
from compaction_worker.state.store import Snapshot


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
