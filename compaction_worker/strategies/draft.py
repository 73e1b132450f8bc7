"""What every stage shares: the limits, the draft, the stage type, its outcome, measuring, and
the summary chunks the summary stage and the sliding window write (span, level, ledger)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Protocol

from compaction_worker.contracts.events import LlmUsage, Outcome, StandingStateReport
from compaction_worker.contracts.history import (
    SUMMARY_ACK,
    Entry,
    SummaryChunk,
    summary_message_text,
)
from compaction_worker.settings import PipelineSettings
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.instructions import Terms, instruction_terms
from compaction_worker.summaries.standing import Item

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
    task_max_tokens: int = 0
    """The task (the conversation's first user message) stays verbatim up to this size; past
    it, its head and tail do, with the distinctive terms between them; 0: it is not kept."""
    user_words_max_tokens: int = 0
    """The user's most recent messages stay verbatim while their sizes add up to at most this,
    unless the last resort (the sliding window) needs their room; 0: none is kept."""
    ceilings: tuple[int, ...] = ()
    """Where a run that cannot reach ``target`` aims instead, in order (the hard threshold, then
    what the window leaves for input): the target is a goal, the window the limit (invariant 5)."""


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
    summarizers: Sequence[Summarizer] = ()
    """Who the summary stage asks, in order: the primary, then the fallbacks."""
    originals: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Transcript messages by ordinal: a summary reads these, not what the editing stages left."""
    conversation_id: str = ""
    conversation_model: str = ""
    instructions: str | None = None
    """What the runtime asked this compaction to keep first (``summaries.instructions``)."""
    ledger_need: int = 0
    """Tokens a ledger of every identifier the history's messages and chunks name would take: what the
    identifiers ask of the room they share with the standing state's facts (strategies/allocation.py)."""
    carried: str = ""
    """What the history shows beside any summary (the standing state's items its reservation holds): a
    ledger need not repeat what it names."""

    @property
    def terms(self) -> Terms:
        """The instructions' terms: what the ledgers and cut texts keep first."""
        return instruction_terms(self.instructions)

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
    """A stage's result: the new draft, its report when it changed anything, and what it cost.

    A stage that changed nothing returns its input draft and no report; it may still have
    spent LLM calls and met errors, which the completion event reports.
    """

    draft: Draft
    report: StageReport | None = None
    notes: tuple[str, ...] = ()
    """Human-readable remarks for the completion event (see ``CompactionResult.notes``)."""
    stages: tuple[str, ...] = ()
    """The names the completion event lists for it; the report's stage when empty."""
    summary_tokens: int = 0
    """Tokens of the chunks it wrote (a summary, or the sliding window's marker)."""
    summarizer: str | None = None
    """Who wrote those chunks; several names, comma-separated, when a fallback took over midway."""
    usage: LlmUsage = field(default_factory=LlmUsage)
    errors: tuple[str, ...] = ()
    tried: int = 0
    """How many summarizers it asked (0: none, or it found nothing to summarize)."""
    failures: int = 0
    """How many of them failed; the first one asked is the primary."""
    items: tuple[Item, ...] = ()
    """The user's sentences its summarizer quoted as standing items, each found in a user message
    (``summaries.standing.quoted``): the run adds them to the standing state."""
    items_refused: int = 0
    """Summary items its summarizer stated that the turns they cite do not support: dropped."""
    items_let_go: int = 0
    """Summary items that did not fit the chunk's budget (the oldest resolved first): dropped."""
    short_of_room: bool = False
    """It wrote nothing because what must stay left no room for a summary (no summarizer failed):
    a higher aim may succeed where the target did not (``pipeline._compact``)."""

    @property
    def names(self) -> tuple[str, ...]:
        """What the completion event's ``stages`` lists for this outcome (nothing without a report)."""
        if self.report is None:
            return ()
        return self.stages or (self.report.stage,)


class StageKind(Enum):
    """How the pipeline treats a stage's outcome."""

    EDIT = "edit"
    """Rewrites messages in place: kept even when still over the target; the next stage goes on."""
    REPLACE = "replace"
    """Replaces older turns: reports only a draft that reaches the target, which ends the run."""
    LAST_RESORT = "last_resort"
    """A REPLACE stage that runs only when what the stages before it kept does not reach the target."""


class Stage(Protocol):
    """One step of the pipeline: prune, deduplicate, truncate_oversized, summarize, the window."""

    @property
    def name(self) -> str:
        """The stage's name in the completion event."""
        ...

    @property
    def kind(self) -> StageKind: ...

    async def __call__(self, draft: Draft, ctx: StageContext) -> StageOutcome:
        """Apply the stage to ``draft``; only the summary stage does I/O (its summarizers)."""
        ...


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
    standing: StandingStateReport | None = None
    """What the committed draft keeps of the user's standing state, by kind."""
    items_refused: int = 0
    """Summary items refused by the check against the turns they cite (``summaries.schema``)."""
    items_let_go: int = 0
    """Summary items let go for the budget, the oldest resolved first."""

    @property
    def shrinks(self) -> bool:
        """Whether it is a commit to make: compacted, and smaller (a forced run can turn a short span
        into a summary turn that costs more than the span did)."""
        return self.outcome is Outcome.COMPACTED and self.tokens_after < self.tokens_before


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


# --- summary chunks -----------------------------------------------------------------------


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
    items: Sequence[str] = (),
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
    # What a folded chunk kept stays kept, unless it is covered now or another folded chunk covered it
    # (a kept ordinal names an entry that stayed, inside the span; none outside it is recorded).
    carried = {n for c in folded for n in c.kept if not any(o.covers(n) for o in folded)}
    kept_now = {n for n in {e.n for e in kept} | (carried - {e.n for e in covered}) if first_n <= n <= last_n}
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
        kept=tuple(sorted(kept_now)),
        items=tuple(items),
    )
    return replace(chunk, tokens=count(chunk.render_text()))


def chunk_frame(
    head: Sequence[Entry], folded: Sequence[SummaryChunk], ledger: Sequence[str], count: CountText
) -> tuple[int, int]:
    """Tokens of the rendered chunk around its summary: the span heading, and the ledger block."""
    bare = make_chunk("", head, folded, model="", stages=(), count=count)
    if not ledger:
        return bare.tokens, 0
    full = make_chunk("", head, folded, model="", stages=(), count=count, artifacts=ledger)
    return bare.tokens, full.tokens - bare.tokens
