"""The summary stage: older turns become an additive chunk; chunks fold when over their budget.

Reference 003: each span is summarized once and its chunk kept (additive); only when the
chunks together would outgrow their budget are they folded, with the new span, into one
(recursive). Every chunk carries a verbatim artifact ledger (exact paths, commands,
errors, URLs and ids of what it covers, see :mod:`compaction_worker.artifacts`), because
summaries paraphrase what must stay exact; a fold merges the ledgers of what it folds.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from compaction_worker.artifacts import KINDS, extract_artifacts
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
    tried: int = 0
    """How many summarizers were asked (0: the stage found nothing to summarize)."""
    failures: int = 0
    """How many of them failed; the first one asked is the primary."""


async def summarize_with_fallback(
    request: SummaryRequest, summarizers: Sequence[Summarizer]
) -> tuple[SummaryResult | None, list[str], LlmUsage]:
    """Try each summarizer in order; returns the first valid result, the errors, and total usage.

    The usage includes the calls of summarizers that failed: they were paid for.
    """
    errors: list[str] = []
    usage = LlmUsage()
    for summarizer in summarizers:
        try:
            result = await summarizer.summarize(request)
        except SummarizerError as e:
            errors.append(f"{summarizer.name}: {e}")
            if e.usage is not None:
                usage = add_usage(usage, e.usage)
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


def merge_ledgers(ledgers: Sequence[Sequence[str]], budget: int, count: CountText) -> tuple[str, ...]:
    """One ledger from several, given newest first, within ``budget`` tokens (items joined by newlines).

    Items are de-duplicated (the newest copy counts). When they do not all fit, an item's
    rank is its kind's place in ``KINDS`` plus its age (0 for the newest ledger): one step
    older weighs as much as one step down in kind, so a recent command outranks an old
    error but not a recent one, and old items give way gradually as folds repeat. Within
    one ledger, later items of a kind are the more recent (see ``extract_artifacts``).
    The result is listed like a fresh ledger: by kind, oldest first.
    """
    if budget <= 0:
        return ()
    kind_rank = {kind: i for i, kind in enumerate(KINDS)}
    found: dict[str, tuple[int, int, int]] = {}  # item -> (kind rank, age, position)
    for age, ledger in enumerate(ledgers):
        for position, item in enumerate(ledger):
            if item not in found:
                found[item] = (kind_rank.get(item.split(":", 1)[0], len(KINDS)), age, position)
    ranked = sorted(found, key=lambda it: (found[it][0] + found[it][1], found[it][1], -found[it][2]))
    chosen: list[str] = []
    used = 0
    for item in ranked:
        cost = count(item) + 1  # +1 for the newline joining it to the next
        if used + cost <= budget + 1:
            chosen.append(item)
            used += cost

    def listed(items: list[str]) -> list[str]:
        return sorted(items, key=lambda it: (found[it][0], -found[it][1], found[it][2]))

    # Token counts are not exactly additive; the joined text is what must fit.
    while chosen and count("\n".join(listed(chosen))) > budget:
        chosen.pop()
    return tuple(listed(chosen))


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
    cover them, nor what the folded chunks had kept and it does not cover now. Its ``tokens``
    are those of its rendering: span header, summary and ledger.
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
        # What a folded chunk kept stays kept, unless it is covered now (no longer pinned).
        kept=tuple(
            sorted({e.n for e in kept} | ({n for c in folded for n in c.kept} - {e.n for e in covered}))
        ),
    )
    return replace(chunk, tokens=count(chunk.render_text()))


def span_ledger(
    messages: Sequence[Mapping[str, Any]], folded: Sequence[SummaryChunk], budget: int, count: CountText
) -> tuple[str, ...]:
    """The ledger of a new chunk: its span's artifacts, merged with the folded chunks' ledgers."""
    if not folded:
        return tuple(extract_artifacts(messages, budget, count))
    # All of the span's items compete with the folded ones, not a pre-trimmed few.
    fresh = extract_artifacts(messages, sys.maxsize, count)
    return merge_ledgers([fresh, *(c.artifacts for c in reversed(folded))], budget, count)


def _frame(
    head: Sequence[Entry], folded: Sequence[SummaryChunk], ledger: Sequence[str], count: CountText
) -> tuple[int, int]:
    """Tokens of the rendered chunk around its summary: the span heading, and the ledger block."""
    bare = make_chunk("", head, folded, model="", stages=(), count=count)
    if not ledger:
        return bare.tokens, 0
    full = make_chunk("", head, folded, model="", stages=(), count=count, artifacts=ledger)
    return bare.tokens, full.tokens - bare.tokens


def ledger_allowance(ctx: StageContext) -> int:
    """What a chunk's ledger may take before room runs out (see ``summarize`` for the room).

    It scales with the window: a span of a long coding session names hundreds of files,
    commands and errors, and a fixed few hundred tokens would keep a fraction of them,
    while the window has room for all. ``artifact_budget_tokens`` is the floor.
    """
    settings = ctx.settings
    if settings.artifact_budget_tokens == 0:
        return 0
    return max(settings.artifact_budget_tokens, int(settings.artifact_budget_fraction * ctx.limits.window))


async def summarize(
    draft: Draft,
    ctx: StageContext,
    summarizers: Sequence[Summarizer],
    *,
    originals: Mapping[int, Mapping[str, Any]] | None = None,
    conversation_id: str = "",
    conversation_model: str = "",
) -> SummaryOutcome:
    """Summarize what lies before the verbatim tail, folding earlier chunks if they are too big.

    ``originals`` are transcript messages by ordinal: the summary and its ledger read an
    entry's original when there is one, not what pruning, de-duplication or truncation
    left of it, because the chunk replaces the messages themselves (the cheap stages'
    edits made them cheaper to keep, not less worth summarizing).
    """
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens
    # What the new summary may cost: capped by settings, and by a share of the room so
    # that a small window still keeps a verbatim tail.
    reserve = min(limits.max_summary_tokens, max(0, int(room * ctx.settings.summary_share)))
    # The new chunk also carries a ledger, at most about as large as its summary (below).
    chunk_reserve = reserve + min(ledger_allowance(ctx), reserve)
    existing = sum(c.tokens for c in draft.chunks)
    fold = bool(draft.chunks) and existing + chunk_reserve > limits.chunk_budget
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
    replaced = sum(e.tokens for e in head) + sum(c.tokens for c in folded)
    # The ledger takes at most half of what is left beyond a minimal summary, both of the
    # room and of what the chunk replaces: the summary always keeps the larger share.
    allowance = ledger_allowance(ctx)
    if fold and allowance:
        # A fold merges every chunk's ledger: it may keep up to half the chunk budget,
        # so that the folded chunk still leaves half for the additive chunks to come.
        allowance = max(allowance, limits.chunk_budget // 2 - reserve)
    ledger_budget = min(allowance, max(0, (min(space, replaced) - MIN_SUMMARY_TOKENS) // 2))
    stages = ("summarize", "fold") if fold else ("summarize",)
    originals = originals or {}
    messages = [public_message(originals.get(e.n, e.message)) for e in head]
    ledger = span_ledger(messages, folded, ledger_budget, ctx.count)
    heading, ledger_tokens = _frame(head, folded, ledger, ctx.count)
    if min(limits.max_summary_tokens, space - ledger_tokens) < MIN_SUMMARY_TOKENS:
        return SummaryOutcome(None, errors=(f"no room for a summary: {space} tokens left under the target",))
    # The chunk is heading, summary and ledger: the summary gets what the other two leave.
    summary_cap = min(limits.max_summary_tokens, space - ledger_tokens - heading)
    request = SummaryRequest(
        conversation_id=conversation_id,
        messages=messages,
        previous_summaries=[c.text for c in folded],
        max_summary_tokens=summary_cap,
        # The whole chunk must be smaller than what it replaces; 0 would mean "unknown".
        replaced_tokens=max(1, replaced - ledger_tokens - heading),
        conversation_model=conversation_model,
        ledger=ledger,
    )
    summary, errors, usage = await summarize_with_fallback(request, summarizers)
    tried = len(errors) + (summary is not None)
    if summary is None:
        return SummaryOutcome(None, usage=usage, errors=tuple(errors), tried=tried, failures=len(errors))
    chunk = make_chunk(
        summary.text,
        head,
        folded,
        model=summary.model,
        stages=stages,
        count=ctx.count,
        artifacts=ledger,
        kept=pinned,
    )
    return SummaryOutcome(
        Draft((*kept_chunks, chunk), (*pinned, *tail)),
        StageReport("summarize", replaced - chunk.tokens, summary.model),
        stages=stages,
        summarizer=summary.model,
        summary_tokens=chunk.tokens,
        usage=usage,
        errors=tuple(errors),
        tried=tried,
        failures=len(errors),
    )
