"""The last resort: a sliding window that drops the oldest turns behind a marker chunk.

Reference 004, stage 4: no LLM call; the first user-assistant exchange is always kept and
a marker says that earlier history was truncated. Our effective history is summary
chunks, then entries, so the first exchange cannot stay in place ahead of the marker:
the marker chunk quotes it verbatim instead (trimmed, with a notice, when huge). When the
start of the conversation already lies inside an earlier chunk, that chunk's text is
what the marker keeps. The marker covers everything it replaced, earlier chunks
included (invariant 1); pinned entries stay entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from compaction_worker.history import Entry, SummaryChunk
from compaction_worker.prompts import render_content
from compaction_worker.strategies.draft import CountText, Draft, StageContext, StageOutcome, StageReport
from compaction_worker.strategies.repair import repair
from compaction_worker.strategies.summarize import make_chunk
from compaction_worker.strategies.tail import partition

TRUNCATION_MODEL = "truncation"
MARKER_RESERVE = 64
"""Tokens set aside for the marker's own sentences when choosing the tail."""
QUOTE_TOKENS = 256
"""At most this many tokens of each quoted message (or of the kept first chunk, twice this)."""


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


def _opening(chunks: Sequence[SummaryChunk], quoted: Sequence[Entry], budget: int, count: CountText) -> str:
    """What the marker keeps of the conversation's start: the first chunk's text, or the quotes."""
    if budget <= 0:
        return ""
    if chunks:
        first = chunks[0]
        span = f"turns {first.first_seq}-{first.last_seq}"
        return (
            f"The start of the conversation ({span}), as an earlier compaction left it:\n"
            + trim_to_tokens(first.text.strip(), 2 * budget, count)
        )
    if not quoted:
        return ""
    labels = {"user": "First user message", "assistant": "First assistant reply"}
    parts = ["The conversation began with this exchange, quoted verbatim:"]
    for entry in quoted:
        parts.append(f"{labels[entry.role]}:\n{trim_to_tokens(_message_text(entry), budget, count)}")
    return "\n\n".join(parts)


def truncation_chunk(
    covered: Sequence[Entry],
    folded: Sequence[SummaryChunk],
    count: CountText,
    *,
    quoted: Sequence[Entry] = (),
    kept: Sequence[Entry] = (),
    quote_tokens: int = QUOTE_TOKENS,
) -> SummaryChunk:
    """The marker that stands for what the window dropped: the opening kept, then a notice.

    ``quoted`` are covered entries shown verbatim (the first exchange); when ``folded``
    chunks exist, the first one's text is kept instead. With ``quote_tokens`` 0 neither
    is, and the marker is the notice alone. The notice counts what is shown neither way.
    """
    opening = _opening(folded, quoted, quote_tokens, count)
    shown = 0 if not opening else _covered_count(folded[0]) if folded else len(quoted)
    total = len(covered) + sum(_covered_count(c) for c in folded)
    earlier = "later" if opening else "earlier"
    notice = (
        # Worded so that it cannot pass for a provider's error text (see validate_summary).
        f"[{total - shown} {earlier} messages were removed here to keep the conversation within "
        "its token budget; no summary of them could be produced. The original messages are "
        "preserved in the transcript.]"
    )
    text = f"{opening}\n\n{notice}" if opening else notice
    return make_chunk(
        text, covered, folded, model=TRUNCATION_MODEL, stages=("truncate",), count=count, kept=kept
    )


def sliding_window(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Everything before a tail that fits (pinned entries aside) becomes one marker chunk.

    The marker quotes the first exchange when that still reaches the target; otherwise it
    is the notice alone, so that quoting never turns a reachable target into a no-op. A
    window that would not save anything changes nothing.
    """
    room = ctx.limits.target - ctx.limits.fixed_tokens - ctx.overhead
    # The quotes take at most a quarter of the room: the verbatim tail matters more.
    quoting = _window(draft, ctx, min(QUOTE_TOKENS, max(0, room // 8)))
    # Judged as the pipeline judges it: after repair, whose synthetic messages cost tokens too.
    if quoting.report is None or (
        quoting.report.tokens_saved > 0 and ctx.fits(repair(quoting.draft, ctx).draft)
    ):
        return quoting
    plain = _window(draft, ctx, 0)
    # A marker larger than what it replaces (a forced compaction of a short history) is no saving.
    return plain if plain.report is not None and plain.report.tokens_saved > 0 else StageOutcome(draft)


def _window(draft: Draft, ctx: StageContext, quote_tokens: int) -> StageOutcome:
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens - ctx.overhead
    # With chunks, the conversation's start is in the first of them, not among the entries.
    start = () if draft.chunks else first_exchange(draft.entries)
    opening = _opening(draft.chunks, start, quote_tokens, ctx.count)
    marker_budget = MARKER_RESERVE + (ctx.count(opening) if opening else 0)
    parts = partition(
        draft.entries, limits.tail_max_messages, min(limits.tail_max_tokens, max(0, room - marker_budget))
    )
    head, pinned, tail = parts.head, parts.pinned, parts.tail
    if not head and not draft.chunks:
        return StageOutcome(draft)
    # Only what the marker covers is quoted: a pinned or tail message is verbatim already.
    covered = {e.n for e in head}
    quoted = tuple(e for e in start if e.n in covered)
    marker = truncation_chunk(
        head, draft.chunks, ctx.count, quoted=quoted, kept=pinned, quote_tokens=quote_tokens
    )
    out = Draft((marker,), (*pinned, *tail))
    replaced = len(head) + sum(_covered_count(c) for c in draft.chunks)
    saved = ctx.tokens(draft) - ctx.tokens(out)
    return StageOutcome(out, StageReport("truncate", saved, f"{replaced} messages behind a marker"))


def _covered_count(chunk: SummaryChunk) -> int:
    """How many transcript messages a chunk stands for (its span minus the pinned ones in it)."""
    inside = [n for n in chunk.kept if chunk.first_n <= n <= chunk.last_n]
    return chunk.last_n - chunk.first_n + 1 - len(inside)
