"""The pipeline: cheap stages first, then the summary, then the sliding window; stop when under target."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies.dedup import deduplicate
from compaction_worker.strategies.draft import (
    CompactionResult,
    Counter,
    Draft,
    Limits,
    StageContext,
    StageOutcome,
    StageReport,
    message_count,
    summary_overhead,
)
from compaction_worker.strategies.oversized import truncate_oversized
from compaction_worker.strategies.prune import prune_tool_outputs
from compaction_worker.strategies.repair import repair
from compaction_worker.strategies.summarize import SummaryOutcome, summarize
from compaction_worker.strategies.truncate import TRUNCATION_MODEL, sliding_window
from compaction_worker.summaries.llm import Summarizer

CheapStage = Callable[[Draft, StageContext], StageOutcome]
"""A stage that needs no LLM: a pure function of the draft and the context."""


def cheap_stages(settings: PipelineSettings) -> list[CheapStage]:
    """The enabled no-LLM stages, cheapest first."""
    stages: list[CheapStage] = []
    if settings.prune:
        stages.append(prune_tool_outputs)
    if settings.deduplicate:
        stages.append(deduplicate)
    if settings.truncate_oversized:
        stages.append(truncate_oversized)
    return stages


async def compact(
    history: EffectiveHistory,
    limits: Limits,
    summarizers: Sequence[Summarizer],
    counter: Counter,
    *,
    settings: PipelineSettings | None = None,
    originals: Mapping[int, Mapping[str, Any]] | None = None,
    conversation_id: str = "",
    conversation_model: str = "",
) -> CompactionResult:
    """Run the pipeline over a history; the result says whether to commit and what.

    ``originals`` are the transcript messages of entries that an earlier compaction
    edited (pruned, de-duplicated, truncated), by ordinal: a summary covering them reads
    what they said, not their placeholders (see :func:`edited_ordinals`).
    """
    settings = settings or PipelineSettings()
    ctx = StageContext(limits, settings, counter, summary_overhead(counter))
    start = Draft(history.chunks, history.entries)
    before = ctx.tokens(start)
    placement = settings.summary_placement
    messages_before = message_count(history, placement)

    def fits(draft: Draft) -> bool:
        # Judged after repair: the synthetic messages it may add cost tokens too.
        return ctx.fits(repair(draft, ctx).draft)

    summary: SummaryOutcome | None = None  # the summary stage's, once it ran

    def result(outcome: Outcome, draft: Draft, **kw: Any) -> CompactionResult:
        if outcome is Outcome.COMPACTED:  # repair runs last on every committed draft
            repaired = repair(draft, ctx)
            draft = repaired.draft
            if repaired.report is not None:
                kw["stages"] = (*kw.get("stages", ()), repaired.report.stage)
                kw["reports"] = (*kw.get("reports", ()), repaired.report)
        return CompactionResult(
            outcome=outcome,
            draft=draft,
            tokens_before=before,
            tokens_after=ctx.tokens(draft),
            messages_before=messages_before,
            messages_after=message_count(history.with_parts(draft.chunks, draft.entries), placement),
            summarizers_tried=summary.tried if summary else 0,
            summarizer_failures=summary.failures if summary else 0,
            **kw,
        )

    if before <= limits.target and not limits.force:
        return result(Outcome.NOOP, start, error="already under the target")

    draft = start
    reports: list[StageReport] = []
    for stage in cheap_stages(settings):
        out = stage(draft, ctx)
        if out.report is not None:
            draft = out.draft
            reports.append(out.report)
            if fits(draft) and not limits.force:
                return result(Outcome.COMPACTED, draft, stages=_names(reports), reports=tuple(reports))

    errors: list[str] = []
    usage = LlmUsage()
    if settings.summarize:
        # What this run's cheap stages edited is in ``history``; what earlier runs did, in ``originals``.
        verbatim = {e.n: e.message for e in history.entries if e.edit is None and not e.synthetic}
        summary = await summarize(
            draft,
            ctx,
            summarizers,
            originals={**verbatim, **(originals or {})},
            conversation_id=conversation_id,
            conversation_model=conversation_model,
        )
        usage = summary.usage
        errors.extend(summary.errors)
        if summary.draft is not None and summary.report is not None:
            if fits(summary.draft):
                reports.append(summary.report)
                return result(
                    Outcome.COMPACTED,
                    summary.draft,
                    stages=(*_names(reports[:-1]), *summary.stages),
                    reports=tuple(reports),
                    summary_tokens=summary.summary_tokens,
                    summarizer=summary.summarizer,
                    usage=usage,
                    error="; ".join(errors) or None,
                    notes=summary.notes,
                )
            errors.append(f"summary by {summary.summarizer} left the history over the target")

    if reports and fits(draft):
        # A manual compaction whose cheap stages did all there was to do.
        return result(Outcome.COMPACTED, draft, stages=_names(reports), reports=tuple(reports), usage=usage)

    if settings.sliding_window:
        out = sliding_window(draft, ctx)
        if out.report is not None and fits(out.draft):
            reports.append(out.report)
            marker = out.draft.chunks[0]
            return result(
                Outcome.COMPACTED,
                out.draft,
                stages=_names(reports),
                reports=tuple(reports),
                summary_tokens=marker.tokens,
                summarizer=TRUNCATION_MODEL,
                usage=usage,
                error="; ".join(errors) or None,
                notes=out.notes,
            )
    errors.append("no stage can reach the target (system prompt, tools and what must stay are too large)")
    return result(Outcome.NOOP, start, usage=usage, error="; ".join(errors))


def edited_ordinals(history: EffectiveHistory) -> list[int]:
    """Ordinals of transcript messages the history holds only in edited form: fetch their originals."""
    return [e.n for e in history.entries if e.edit is not None and not e.synthetic]


def _names(reports: Sequence[StageReport]) -> tuple[str, ...]:
    return tuple(r.stage for r in reports)
