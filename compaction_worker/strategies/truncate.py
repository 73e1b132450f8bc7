"""The sliding window, the last resort: the oldest turns go behind a marker chunk, no LLM call.

The marker quotes the first exchange, or keeps what fits of the earlier summaries, and
says what was left out; it covers everything it replaced (docs/design.md, invariant 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.strategies.draft import (
    CountText,
    Draft,
    StageContext,
    StageKind,
    StageOutcome,
    StageReport,
    make_chunk,
    plural,
)
from compaction_worker.strategies.repair import reaches_target
from compaction_worker.strategies.tail import partition
from compaction_worker.summaries.instructions import Terms
from compaction_worker.summaries.ledger import merge_ledgers
from compaction_worker.summaries.prompts import render_content

STAGE = "truncate"
TRUNCATION_MODEL = "truncation"
"""The marker chunk's ``model``: no summarizer wrote it."""
MARKER_RESERVE = 96
"""Tokens set aside for the marker's own sentences when choosing the tail."""
QUOTE_TOKENS = 256
"""At most this many tokens of each quoted message of the first exchange."""
MIN_KEPT_TOKENS = 24
"""Less than this of an earlier summary is a heading and a cut notice: it is left out instead."""


def trim_to_tokens(text: str, budget: int, count: CountText) -> str:
    """``text`` verbatim if it fits ``budget``; else its longest prefix that fits with a notice."""
    if count(text) <= budget:
        return text
    notice = f"\n[... {len(text)} more characters of this message are in the transcript]"
    room = budget - count(notice)
    # A token is rarely more than a few characters: no need to count megabytes of prefix.
    low, high = 0, min(len(text), max(0, room) * 16)  # text[:low] fits; text[:high + 1] does not
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid]) <= room:
            low = mid
        else:
            high = mid - 1
    cut = text[:low]
    # End at a word boundary when there is one: half a word reads as a typo, not a cut.
    space = cut.rfind(" ")
    cut = cut[:space] if space > len(cut) // 2 else cut
    return f"{cut}\n[... {len(text) - len(cut)} more characters of this message are in the transcript]"


def _message_text(entry: Entry) -> str:
    text = render_content(entry.message.get("content")).strip()
    if text:
        return text
    names = [
        str(call["function"].get("name", "?"))
        for call in entry.message.get("tool_calls") or ()
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping)
    ]
    return f"[tool calls: {', '.join(names)}]" if names else "[no text]"


def first_exchange(entries: Sequence[Entry]) -> tuple[Entry, ...]:
    """The conversation's first user message and the assistant's first reply to it (if any).

    The reply is the first assistant message with text before the next user message,
    falling back to the first assistant message (a tool call) of that exchange.
    """
    users = [i for i, e in enumerate(entries) if e.role == "user" and not e.synthetic]
    if not users:
        return ()
    start, stop = users[0], users[1] if len(users) > 1 else len(entries)
    replies = [e for e in entries[start + 1 : stop] if e.role == "assistant" and not e.synthetic]
    with_text = [e for e in replies if render_content(e.message.get("content")).strip()]
    reply = with_text[:1] or replies[:1]
    return (entries[start], *reply)


def _quotes(quoted: Sequence[Entry], budget: int, count: CountText) -> str:
    """The first exchange, quoted verbatim (each message trimmed to ``budget``)."""
    if budget <= 0 or not quoted:
        return ""
    labels = {"user": "First user message", "assistant": "First assistant reply"}
    parts = ["The conversation began with this exchange, quoted verbatim:"]
    for entry in quoted:
        parts.append(f"{labels[entry.role]}:\n{trim_to_tokens(_message_text(entry), budget, count)}")
    return "\n\n".join(parts)


def equal_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Split ``budget`` so that each gets an equal share, or its whole size when that is less.

    What a small one leaves over goes to the others (max-min fairness): the shares add up
    to at most ``budget`` and to all of it when the sizes do.
    """
    shares = [0] * len(sizes)
    left = max(0, budget)
    for k, i in enumerate(sorted(range(len(sizes)), key=lambda i: sizes[i])):
        shares[i] = min(sizes[i], left // (len(sizes) - k))
        left -= shares[i]
    return shares


@dataclass(frozen=True, slots=True)
class Retained:
    """What the marker keeps of the earlier chunks: their text, shortened or whole, and ledgers."""

    text: str
    """The kept summaries, oldest first, each under its span; empty when none is kept."""
    kept: tuple[SummaryChunk, ...]
    shortened: int
    dropped: tuple[SummaryChunk, ...]
    ledger: tuple[str, ...]
    """Their verbatim ledgers merged (newest items ranked first), within the budget."""
    ledger_dropped: int
    """Distinct ledger items that did not fit."""


def retain_summaries(
    chunks: Sequence[SummaryChunk], budget: int, count: CountText, *, terms: Terms = frozenset()
) -> Retained:
    """Keep what fits of every chunk's summary within ``budget`` tokens (a third for their ledgers).

    Every summary gets an equal share and a short one passes what it does not need to the
    others (``equal_shares``), each cut to its share from the end. Not newest-first: that
    would drop the oldest summary, which holds what the conversation set out to do (the
    reason reference 004 keeps the first exchange); not proportional to size: that would
    cut a short summary as hard as a long one. When shares would be too small to say
    anything, the first summary and the newest ones stay and those between go, as the
    window itself keeps the start and the recent turns. Ledger items sharing ``terms`` (the
    compaction instructions') are kept first.
    """
    items = list(dict.fromkeys(item for c in chunks for item in c.artifacts))
    ledger = (
        merge_ledgers([c.artifacts for c in reversed(chunks)], budget // 3, count, terms=terms)
        if items
        else ()
    )
    room = budget - (count("\n".join(ledger)) + 8 if ledger else 0)
    candidates = list(chunks)
    while len(candidates) > 1 and room // len(candidates) < MIN_KEPT_TOKENS:
        candidates.pop(1)
    blocks = [f"[{_span(c)}]\n{c.text.strip()}" for c in candidates]
    # A block's share also pays for the blank line that joins it to the next.
    costs = [count(b) + 1 for b in blocks]
    kept, text, shortened = [], [], 0
    for chunk, block, cost, share in zip(candidates, blocks, costs, equal_shares(costs, room), strict=True):
        if cost <= share:
            kept.append(chunk)
            text.append(block)
        elif share >= MIN_KEPT_TOKENS:
            head = f"[{_span(chunk)}, shortened]\n"
            kept.append(chunk)
            text.append(head + trim_to_tokens(chunk.text.strip(), share - 1 - count(head), count))
            shortened += 1
    dropped = tuple(c for c in chunks if c not in kept)
    return Retained("\n\n".join(text), tuple(kept), shortened, dropped, ledger, len(items) - len(ledger))


def _span(chunk: SummaryChunk) -> str:
    first, last = chunk.first_seq, chunk.last_seq
    return f"summary of turns {first}-{last}" if first != last else f"summary of turn {first}"


def truncation_chunk(
    covered: Sequence[Entry],
    folded: Sequence[SummaryChunk],
    count: CountText,
    *,
    quoted: Sequence[Entry] = (),
    kept: Sequence[Entry] = (),
    quote_tokens: int = QUOTE_TOKENS,
    summary_tokens: int | None = None,
    terms: Terms = frozenset(),
) -> SummaryChunk:
    """The marker that stands for what the window dropped: what it keeps, then a notice.

    ``quoted`` are covered entries shown verbatim (the first exchange), each within
    ``quote_tokens``; ``folded`` chunks keep what fits of their summaries and ledgers
    within ``summary_tokens`` (twice ``quote_tokens`` if not given; 0: none). The notice
    says truthfully what is shown neither way: messages removed without a summary, and
    which earlier summaries were shortened or left out.
    """
    budget = 2 * quote_tokens if summary_tokens is None else summary_tokens
    retained = retain_summaries(folded, budget, count, terms=terms) if folded else None
    if retained is not None:
        opening = f"{_RETAINED}\n\n{retained.text}" if retained.text else ""
        removed = len(covered)
    else:
        opening = _quotes(quoted, quote_tokens, count)
        removed = len(covered) - (len(quoted) if opening else 0)
    notice = _notice(removed, bool(opening), retained)
    return make_chunk(
        f"{opening}\n\n{notice}" if opening else notice,
        covered,
        folded,
        model=TRUNCATION_MODEL,
        stages=("truncate",),
        count=count,
        kept=kept,
        artifacts=retained.ledger if retained else (),
    )


_RETAINED = "The conversation before this point, as earlier compactions summarized it:"


def _notice(removed: int, after: bool, retained: Retained | None) -> str:
    """The marker's closing sentences: what went without a summary, what of the summaries changed."""
    # Worded so that it cannot pass for a provider's error text (see validate_summary).
    sentences = []
    if removed or retained is None:
        sentences.append(
            f"{removed} {'later' if after else 'earlier'} messages were removed here without a summary, "
            "to keep the conversation within its token budget."
        )
    if retained is not None and retained.dropped:
        gone = retained.dropped
        one = len(gone) == 1
        sentences.append(
            f"{len(gone)} earlier {'summary' if one else 'summaries'} (of "
            f"{plural(sum(_covered_count(c) for c in gone), 'message')}, within turns "
            f"{min(c.first_seq for c in gone)}-{max(c.last_seq for c in gone)}) did not fit and "
            f"{'is' if one else 'are'} left out."
        )
    if retained is not None and retained.shortened:
        were = "was" if retained.shortened == 1 else "were"
        sentences.append(f"{retained.shortened} of the earlier summaries above {were} shortened to fit.")
    if retained is not None and retained.ledger_dropped:
        sentences.append(f"{plural(retained.ledger_dropped, 'verbatim reference')} of theirs did not fit.")
    sentences.append("The original messages are preserved in the transcript.")
    return "[" + " ".join(sentences) + "]"


def sliding_window(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Everything before a tail that fits (pinned entries aside) becomes one marker chunk.

    The marker quotes the first exchange, or keeps what fits of the earlier summaries (up
    to a quarter of the room, then a sixteenth), when that still reaches the target;
    otherwise it is the notice alone, so that keeping them never turns a reachable target
    into a no-op. A window that would not save anything changes nothing.
    """
    room = ctx.limits.target - ctx.limits.fixed_tokens - ctx.overhead
    # The quotes take at most a quarter of the room: the verbatim tail matters more.
    quote = min(QUOTE_TOKENS, max(0, room // 8))
    budgets = (max(0, room // 4), max(0, room // 16)) if draft.chunks else (2 * quote,)
    for budget in dict.fromkeys(budgets):
        keeping = _window(draft, ctx, quote, budget)
        if keeping.report is None or (keeping.report.tokens_saved > 0 and reaches_target(keeping.draft, ctx)):
            return keeping
    plain = _window(draft, ctx, 0, 0)
    # A marker larger than what it replaces (a forced compaction of a short history) is no saving.
    return plain if plain.report is not None and plain.report.tokens_saved > 0 else StageOutcome(draft)


def _window(draft: Draft, ctx: StageContext, quote_tokens: int, summary_tokens: int) -> StageOutcome:
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens - ctx.overhead
    # With chunks, the conversation's start is in the first of them, not among the entries.
    start = () if draft.chunks else first_exchange(draft.entries)
    if draft.chunks:
        retained = retain_summaries(draft.chunks, summary_tokens, ctx.count, terms=ctx.terms)
        opening = f"{_RETAINED}\n{retained.text}\n" + "\n".join(f"- {item}" for item in retained.ledger)
    else:
        opening = _quotes(start, quote_tokens, ctx.count)
    marker_budget = MARKER_RESERVE + (ctx.count(opening) if opening else 0)
    parts = partition(
        draft.entries,
        limits.tail_max_messages,
        min(limits.tail_max_tokens, max(0, room - marker_budget)),
        task=limits.task_max_tokens > 0,
    )
    head, pinned, tail = parts.head, parts.pinned, parts.tail
    if not head and not draft.chunks:
        return StageOutcome(draft)
    # Only what the marker covers is quoted: a pinned or tail message is verbatim already.
    covered = {e.n for e in head}
    quoted = tuple(e for e in start if e.n in covered)
    marker = truncation_chunk(
        head,
        draft.chunks,
        ctx.count,
        quoted=quoted,
        kept=pinned,
        quote_tokens=quote_tokens,
        summary_tokens=summary_tokens,
        terms=ctx.terms,
    )
    out = Draft((marker,), (*pinned, *tail))
    replaced = len(head) + sum(_covered_count(c) for c in draft.chunks)
    saved = ctx.tokens(draft) - ctx.tokens(out)
    return StageOutcome(
        out,
        StageReport(STAGE, saved, f"{replaced} messages behind a marker"),
        notes=(parts.note,) if parts.note else (),
        summary_tokens=marker.tokens,
        summarizer=TRUNCATION_MODEL,
    )


def _covered_count(chunk: SummaryChunk) -> int:
    """How many transcript messages a chunk stands for (its span minus the pinned ones in it)."""
    inside = [n for n in chunk.kept if chunk.first_n <= n <= chunk.last_n]
    return chunk.last_n - chunk.first_n + 1 - len(inside)


class SlidingWindowStage:
    """:func:`sliding_window` as the pipeline's last resort: it counts only when it reaches the target."""

    name = STAGE
    kind = StageKind.LAST_RESORT

    async def __call__(self, draft: Draft, ctx: StageContext) -> StageOutcome:
        """The windowed draft when it reaches the target; else the input draft, unchanged."""
        out = sliding_window(draft, ctx)
        return out if out.report is not None and reaches_target(out.draft, ctx) else StageOutcome(draft)


SLIDING_WINDOW = SlidingWindowStage()
"""The stage as the pipeline runs it."""
