"""What every stage shares: the limits, the draft, stage reports and results, and measuring."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import (
    SUMMARY_ACK,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    SummaryPlacement,
    render,
    summary_message_text,
)
from compaction_worker.settings import PipelineSettings

CountText = Callable[[str], int]


def plural(count: int, noun: str) -> str:
    """``1 image``, ``2 images``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


class Counter(Protocol):
    """Counts tokens the way the store counted them at append time (tokens.TokenCounter)."""

    def text(self, text: str) -> int: ...

    def message(self, message: Mapping[str, Any]) -> int: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """What a compaction must achieve and the bounds it works within (tokens are estimates)."""

    target: int
    """The effective history, system prompt and tools included, must end at or under this."""
    fixed_tokens: int
    """System prompt and tool schemas: repeated on every request, never compacted."""
    window: int
    tail_max_messages: int
    tail_max_tokens: int
    max_summary_tokens: int
    chunk_budget: int
    """When the summary chunks together would exceed this, they fold into one."""
    force: bool = False
    """Manual compaction: summarize what lies before the tail even when under the target."""


@dataclass(frozen=True, slots=True)
class StageReport:
    """What one stage did."""

    stage: str
    tokens_saved: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Draft:
    """A candidate effective history: summary chunks, then entries."""

    chunks: tuple[SummaryChunk, ...]
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class StageContext:
    """Everything a stage may read besides the draft."""

    limits: Limits
    settings: PipelineSettings
    counter: Counter
    overhead: int
    """Tokens the summary turn costs beyond its chunks (see :func:`summary_overhead`)."""

    def count(self, text: str) -> int:
        """Tokens of a text (a summary, a placeholder)."""
        return self.counter.text(text)

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of a whole message, as an entry's ``tokens`` holds them."""
        return self.counter.message(message)

    def tokens(self, draft: Draft) -> int:
        """The draft's total, system prompt and tools included, in estimate units."""
        return self.limits.fixed_tokens + draft_tokens(draft, self.overhead)

    def fits(self, draft: Draft) -> bool:
        return self.tokens(draft) <= self.limits.target


@dataclass(frozen=True, slots=True)
class StageOutcome:
    """A pure stage's result: the new draft, and its report when it changed anything."""

    draft: Draft
    report: StageReport | None = None
    notes: tuple[str, ...] = ()
    """Human-readable remarks for the completion event (see ``CompactionResult.notes``)."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The outcome of one pipeline run, with everything the completion event reports."""

    outcome: Outcome
    draft: Draft
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    stages: tuple[str, ...] = ()
    reports: tuple[StageReport, ...] = ()
    summary_tokens: int = 0
    summarizer: str | None = None
    usage: LlmUsage = field(default_factory=LlmUsage)
    error: str | None = None
    summarizers_tried: int = 0
    """How many summarizers the summary stage asked (0 when it did not run or found nothing)."""
    summarizer_failures: int = 0
    """How many of them failed: the primary's health, for the circuit breaker."""
    notes: tuple[str, ...] = ()
    """What a reader of the completion event should know: the tail could not start at a
    user turn, a span was summarized in pieces, earlier summaries were shortened."""


def summary_overhead(counter: Counter) -> int:
    """Tokens the summary turn costs beyond its chunks: header, intro, acknowledgment.

    That is the ``separate`` placement's cost; ``merge`` saves the acknowledgment and a
    message's overhead, so this bounds both placements from above.
    """
    return counter.message({"role": "user", "content": summary_message_text(())}) + counter.message(
        {"role": "assistant", "content": SUMMARY_ACK}
    )


def draft_tokens(draft: Draft, overhead: int) -> int:
    """Estimated tokens of a draft's chunks and entries (without system prompt and tools)."""
    chunk_tokens = sum(c.tokens for c in draft.chunks)
    return sum(e.tokens for e in draft.entries) + (chunk_tokens + overhead if draft.chunks else 0)


def message_count(history: EffectiveHistory, placement: SummaryPlacement = "separate") -> int:
    """How many messages the history renders to with the given summary placement."""
    return len(render(history, placement))
