"""The compaction pipeline: plain functions over plain data, cheapest stage first.

Every stage takes a :class:`Draft` (summary chunks plus entries) and returns a new one
with a :class:`StageReport`; :func:`compact` runs them in cost order and stops as soon
as the draft is under the target. The only I/O is the injected summarizer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from compaction_worker.errors import SummarizerError
from compaction_worker.events import LlmUsage, Outcome
from compaction_worker.history import (
    SUMMARY_ACK,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    public_message,
    render,
    summary_message_text,
)
from compaction_worker.summarizer import Summarizer, SummaryRequest, SummaryResult

CountText = Callable[[str], int]

TRUNCATION_MODEL = "truncation"

SUMMARY_SHARE = 0.3
"""At most this share of the room under the target goes to a new summary."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a compaction must achieve and the bounds it works within (tokens are estimates)."""

    target: int
    """The effective history, system prompt and tools included, must end at or under this."""
    fixed_tokens: int
    """System prompt and tool schemas: repeated on every request, never compacted."""
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


# --- measuring ------------------------------------------------------------------------


def summary_overhead(count: CountText, per_message: int) -> int:
    """Tokens the summary turn costs beyond its chunks: header, intro, acknowledgment."""
    return count(summary_message_text(())) + count(SUMMARY_ACK) + 2 * per_message


def draft_tokens(draft: Draft, overhead: int) -> int:
    """Estimated tokens of a draft's chunks and entries (without system prompt and tools)."""
    chunk_tokens = sum(c.tokens for c in draft.chunks)
    return sum(e.tokens for e in draft.entries) + (chunk_tokens + overhead if draft.chunks else 0)


def message_count(history: EffectiveHistory) -> int:
    """How many messages the history renders to."""
    return len(render(history))


# --- tail selection -------------------------------------------------------------------


def split_points(entries: Sequence[Entry]) -> list[int]:
    """Indexes where a verbatim tail may start without splitting a tool call from its result.

    A user message always starts a clean boundary when every earlier tool call has its
    result before it; an assistant message does too, under the same condition (this lets a
    single long tool-calling turn compact, which a user-only rule cannot).
    """
    open_calls: set[str] = set()
    points: list[int] = []
    for i, entry in enumerate(entries):
        role = entry.role
        if not open_calls and role in ("user", "assistant"):
            points.append(i)
        if role == "assistant":
            for call in entry.message.get("tool_calls") or ():
                open_calls.add(str(call.get("id")))
        elif role == "tool":
            open_calls.discard(str(entry.message.get("tool_call_id")))
    return points


def select_tail(entries: Sequence[Entry], max_messages: int, max_tokens: int) -> int:
    """The index where the verbatim tail starts: the longest clean tail within both bounds.

    User-message boundaries are preferred; an assistant boundary is used only when no user
    boundary gives a non-empty head. Returns ``len(entries)`` for an empty tail.
    """
    n = len(entries)
    suffix_tokens = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix_tokens[i] = suffix_tokens[i + 1] + entries[i].tokens
    fits = [i for i in split_points(entries) if n - i <= max_messages and suffix_tokens[i] <= max_tokens]
    user_fits = [i for i in fits if entries[i].role == "user" and i > 0]
    if user_fits:
        return min(user_fits)
    other = [i for i in fits if i > 0]
    return min(other) if other else n


# --- summarizing ----------------------------------------------------------------------


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
        usage = _add_usage(usage, result.usage)
        return result, errors, usage
    return None, errors, usage


def _add_usage(a: LlmUsage, b: LlmUsage) -> LlmUsage:
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
) -> SummaryChunk:
    """A summary chunk covering the folded chunks (if any) and then the covered entries."""
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
    )
    return replace(chunk, tokens=count(chunk.render_text()))


def truncation_chunk(
    covered: Sequence[Entry], folded: Sequence[SummaryChunk], count: CountText
) -> SummaryChunk:
    """The last-resort marker: says what was dropped, keeps the first exchange's gist out."""
    omitted = len(covered) + sum(c.last_n - c.first_n + 1 for c in folded)
    text = (
        f"[{omitted} earlier messages were removed to fit the context window; "
        "no summary could be produced. The full transcript is preserved by the compaction service.]"
    )
    return make_chunk(text, covered, folded, model=TRUNCATION_MODEL, stages=("truncate",), count=count)


# --- the pipeline -----------------------------------------------------------------------


async def compact(
    history: EffectiveHistory,
    limits: Limits,
    summarizers: Sequence[Summarizer],
    count: CountText,
    per_message_tokens: int,
    *,
    conversation_id: str = "",
    conversation_model: str = "",
) -> CompactionResult:
    """Run the pipeline over a history; the result says whether to commit and what."""
    overhead = summary_overhead(count, per_message_tokens)
    start = Draft(history.chunks, history.entries)
    before = limits.fixed_tokens + draft_tokens(start, overhead)
    messages_before = message_count(history)

    def result(outcome: Outcome, draft: Draft, **kw: Any) -> CompactionResult:
        after_history = history.with_parts(draft.chunks, draft.entries)
        return CompactionResult(
            outcome=outcome,
            draft=draft,
            tokens_before=before,
            tokens_after=limits.fixed_tokens + draft_tokens(draft, overhead),
            messages_before=messages_before,
            messages_after=message_count(after_history),
            **kw,
        )

    if before <= limits.target and not limits.force:
        return result(Outcome.NOOP, start, error="already under the target")

    room = limits.target - limits.fixed_tokens
    # What the new summary may cost: capped by settings, and by a share of the room so
    # that a small window still keeps a verbatim tail.
    reserve = min(limits.max_summary_tokens, max(0, int(room * SUMMARY_SHARE)))
    fold = bool(start.chunks) and sum(c.tokens for c in start.chunks) + reserve > limits.chunk_budget
    kept_chunks: tuple[SummaryChunk, ...] = () if fold else start.chunks
    folded: tuple[SummaryChunk, ...] = start.chunks if fold else ()
    kept_chunk_tokens = sum(c.tokens for c in kept_chunks)
    tail_budget = min(limits.tail_max_tokens, max(0, room - overhead - kept_chunk_tokens - reserve))
    split = select_tail(start.entries, limits.tail_max_messages, tail_budget)
    head, tail = start.entries[:split], start.entries[split:]
    if not head and not fold:
        return result(Outcome.NOOP, start, error="nothing before the verbatim tail to compact")

    tail_tokens = sum(e.tokens for e in tail)
    space = room - overhead - tail_tokens - kept_chunk_tokens
    summary_cap = min(limits.max_summary_tokens, space)
    replaced = sum(e.tokens for e in head) + sum(c.tokens for c in folded)
    stages = ["summarize"] + (["fold"] if fold else [])

    summary: SummaryResult | None = None
    errors: list[str] = []
    usage = LlmUsage()
    if summary_cap >= 32:
        request = SummaryRequest(
            conversation_id=conversation_id,
            messages=[public_message(e.message) for e in head],
            previous_summaries=[c.text for c in folded],
            max_summary_tokens=summary_cap,
            replaced_tokens=replaced,
            conversation_model=conversation_model,
        )
        summary, errors, usage = await summarize_with_fallback(request, summarizers)
    else:
        errors.append(f"no room for a summary: {space} tokens left under the target")

    if summary is not None:
        chunk = make_chunk(summary.text, head, folded, model=summary.model, stages=stages, count=count)
        draft = Draft((*kept_chunks, chunk), tuple(tail))
        if limits.fixed_tokens + draft_tokens(draft, overhead) <= limits.target:
            return result(
                Outcome.COMPACTED,
                draft,
                stages=tuple(stages),
                reports=(StageReport("summarize", replaced - chunk.tokens, summary.model),),
                summary_tokens=chunk.tokens,
                summarizer=summary.model,
                usage=usage,
                error="; ".join(errors) or None,
            )
        errors.append(f"summary by {summary.model} left the history over the target")

    # Last resort: a marker that covers everything before the tail, all chunks folded in.
    marker = truncation_chunk(head, start.chunks, count)
    draft = Draft((marker,), tuple(tail))
    if limits.fixed_tokens + draft_tokens(draft, overhead) <= limits.target:
        return result(
            Outcome.COMPACTED,
            draft,
            stages=("truncate",),
            reports=(StageReport("truncate", before - limits.fixed_tokens - draft_tokens(draft, overhead)),),
            summary_tokens=marker.tokens,
            summarizer=TRUNCATION_MODEL,
            usage=usage,
            error="; ".join(errors) or None,
        )
    errors.append("even truncation cannot reach the target (system prompt, tools and tail are too large)")
    return result(Outcome.NOOP, start, usage=usage, error="; ".join(errors))


# --- checks -----------------------------------------------------------------------------


def provider_problems(
    messages: Sequence[Mapping[str, Any]], allow_open_calls_at_end: bool = True
) -> list[str]:
    """Ways a rendered history would be rejected by some provider (invariant 4); empty if none."""
    problems: list[str] = []
    body = list(messages)
    if body and body[0].get("role") == "system":
        body = body[1:]
    if any(m.get("role") == "system" for m in body):
        problems.append("a system message after the first message")
    if body and body[0].get("role") != "user":
        problems.append(f"first non-system message is {body[0].get('role')}, not user")
    open_calls: dict[str, int] = {}
    for i, m in enumerate(body):
        role = m.get("role")
        if role == "tool":
            call_id = str(m.get("tool_call_id"))
            if call_id not in open_calls:
                problems.append(f"tool result {call_id} at {i} without its call")
            open_calls.pop(call_id, None)
        else:
            if open_calls and role in ("user", "assistant"):
                problems.append(f"tool calls {sorted(open_calls)} unanswered before message {i}")
                open_calls.clear()
            for call in m.get("tool_calls") or ():
                open_calls[str(call.get("id"))] = i
        if i > 0 and role == body[i - 1].get("role") and role == "assistant":
            problems.append(f"two consecutive assistant messages at {i}")
    if open_calls and not allow_open_calls_at_end:
        problems.append(f"tool calls {sorted(open_calls)} never answered")
    return problems
