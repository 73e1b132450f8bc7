"""The last resort: a sliding window that drops the oldest turns behind a marker chunk."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_worker.history import Entry, SummaryChunk
from compaction_worker.strategies.draft import CountText, Draft, StageContext, StageOutcome, StageReport
from compaction_worker.strategies.summarize import make_chunk
from compaction_worker.strategies.tail import select_tail

TRUNCATION_MODEL = "truncation"
MARKER_RESERVE = 64
"""Tokens set aside for the marker chunk when choosing the tail."""


def truncation_chunk(
    covered: Sequence[Entry], folded: Sequence[SummaryChunk], count: CountText
) -> SummaryChunk:
    """The marker that stands for what the window dropped (it says so, and where the originals are)."""
    omitted = len(covered) + sum(c.last_n - c.first_n + 1 for c in folded)
    text = (
        f"[{omitted} earlier messages were removed to fit the context window; "
        "no summary could be produced. The full transcript is preserved by the compaction service.]"
    )
    return make_chunk(text, covered, folded, model=TRUNCATION_MODEL, stages=("truncate",), count=count)


def sliding_window(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Everything before a tail that fits is replaced by one marker chunk (all chunks folded in)."""
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens - ctx.overhead - MARKER_RESERVE
    split = select_tail(draft.entries, limits.tail_max_messages, min(limits.tail_max_tokens, max(0, room)))
    head, tail = draft.entries[:split], draft.entries[split:]
    if not head and not draft.chunks:
        return StageOutcome(draft)
    marker = truncation_chunk(head, draft.chunks, ctx.count)
    out = Draft((marker,), tuple(tail))
    return StageOutcome(
        out, StageReport("truncate", ctx.tokens(draft) - ctx.tokens(out), f"{len(head)} messages")
    )
