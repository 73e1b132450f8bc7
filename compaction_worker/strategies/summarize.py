"""The summary stage: older turns become an additive chunk; chunks fold when over their budget."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from compaction_worker.errors import SummarizerError
from compaction_worker.events import LlmUsage
from compaction_worker.history import Entry, SummaryChunk, public_message
from compaction_worker.strategies.draft import CountText, Draft, StageContext, StageReport
from compaction_worker.strategies.tail import partition
from compaction_worker.summarizer import Summarizer, SummaryRequest, SummaryResult

MIN_SUMMARY_TOKENS = 32
"""Below this much room a summary is not worth an LLM call."""


@dataclass(frozen=True, slots=True)
class SummaryOutcome:
    """The summary stage's result; ``draft`` is None when no summary could be made."""

    draft: Draft | None
    report: StageReport | None = None
    stages: tuple[str, ...] = ()
    summarizer: str | None = None
    summary_tokens: int = 0
    usage: LlmUsage = field(default_factory=LlmUsage)
    errors: tuple[str, ...] = ()


async def summarize_with_fallback(
    request: SummaryRequest, summarizers: Sequence[Summarizer]
) -> tuple[SummaryResult | None, list[str], LlmUsage]:
    """Try each summarizer in order; returns the first valid result, the errors, and total usage."""
    errors: list[str] = []
    usage = LlmUsage()
    for summarizer in summarizers:
        try:
            result = await summarizer.summarize(request)
        except SummarizerError as e:
            errors.append(f"{summarizer.name}: {e}")
            continue
        usage = add_usage(usage, result.usage)
        return result, errors, usage
    return None, errors, usage


def add_usage(a: LlmUsage, b: LlmUsage) -> LlmUsage:
    """The sum of two usages (cost stays unknown only if both are)."""
    cost = None if a.cost_usd is None and b.cost_usd is None else (a.cost_usd or 0.0) + (b.cost_usd or 0.0)
    return LlmUsage(
        calls=a.calls + b.calls,
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        total_tokens=a.total_tokens + b.total_tokens,
        cost_usd=cost,
    )


def make_chunk(
    text: str,
    covered: Sequence[Entry],
    folded: Sequence[SummaryChunk],
    *,
    model: str,
    stages: Sequence[str],
    count: CountText,
    artifacts: Sequence[str] = (),
    kept: Sequence[Entry] = (),
) -> SummaryChunk:
    """A summary chunk covering the folded chunks (if any) and the covered entries.

    ``kept`` are entries inside that span that stay verbatim (pinned); the chunk does not
    cover them, and neither does it cover what the folded chunks had kept.
    """
    firsts = [(c.first_n, c.first_seq) for c in folded] + [(e.n, e.seq) for e in covered]
    lasts = [(c.last_n, c.last_seq) for c in folded] + [(e.n, e.seq) for e in covered]
    first_n, first_seq = min(firsts)
    last_n, last_seq = max(lasts)
    chunk = SummaryChunk(
        id=uuid.uuid4().hex,
        text=text,
        first_seq=first_seq,
        last_seq=last_seq,
        first_n=first_n,
        last_n=last_n,
        tokens=0,
        created_at=datetime.now(UTC).isoformat(),
        model=model,
        stages=tuple(stages),
        level=(max(c.level for c in folded) + 1) if folded else 0,
        artifacts=tuple(artifacts),
        kept=tuple(sorted({e.n for e in kept} | {n for c in folded for n in c.kept})),
    )
    return replace(chunk, tokens=count(chunk.render_text()))


async def summarize(
    draft: Draft,
    ctx: StageContext,
    summarizers: Sequence[Summarizer],
    *,
    conversation_id: str = "",
    conversation_model: str = "",
) -> SummaryOutcome:
    """Summarize what lies before the verbatim tail, folding earlier chunks if they are too big."""
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens
    # What the new summary may cost: capped by settings, and by a share of the room so
    # that a small window still keeps a verbatim tail.
    reserve = min(limits.max_summary_tokens, max(0, int(room * ctx.settings.summary_share)))
    fold = bool(draft.chunks) and sum(c.tokens for c in draft.chunks) + reserve > limits.chunk_budget
    kept_chunks: tuple[SummaryChunk, ...] = () if fold else draft.chunks
    folded: tuple[SummaryChunk, ...] = draft.chunks if fold else ()
    kept_chunk_tokens = sum(c.tokens for c in kept_chunks)
    tail_budget = min(limits.tail_max_tokens, max(0, room - ctx.overhead - kept_chunk_tokens - reserve))
    parts = partition(draft.entries, limits.tail_max_messages, tail_budget)
    head, pinned, tail = parts.head, parts.pinned, parts.tail
    if not head and not fold:
        return SummaryOutcome(None, errors=("nothing before the verbatim tail to compact",))

    tail_tokens = sum(e.tokens for e in pinned) + sum(e.tokens for e in tail)
    space = room - ctx.overhead - tail_tokens - kept_chunk_tokens
    summary_cap = min(limits.max_summary_tokens, space)
    if summary_cap < MIN_SUMMARY_TOKENS:
        return SummaryOutcome(None, errors=(f"no room for a summary: {space} tokens left under the target",))
    replaced = sum(e.tokens for e in head) + sum(c.tokens for c in folded)
    stages = ("summarize", "fold") if fold else ("summarize",)
    request = SummaryRequest(
        conversation_id=conversation_id,
        messages=[public_message(e.message) for e in head],
        previous_summaries=[c.text for c in folded],
        max_summary_tokens=summary_cap,
        replaced_tokens=replaced,
        conversation_model=conversation_model,
    )
    summary, errors, usage = await summarize_with_fallback(request, summarizers)
    if summary is None:
        return SummaryOutcome(None, usage=usage, errors=tuple(errors))
    chunk = make_chunk(
        summary.text, head, folded, model=summary.model, stages=stages, count=ctx.count, kept=pinned
    )
    return SummaryOutcome(
        Draft((*kept_chunks, chunk), (*pinned, *tail)),
        StageReport("summarize", replaced - chunk.tokens, summary.model),
        stages=stages,
        summarizer=summary.model,
        summary_tokens=chunk.tokens,
        usage=usage,
        errors=tuple(errors),
    )
