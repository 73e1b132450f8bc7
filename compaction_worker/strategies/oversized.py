"""The truncate_oversized stage: huge single messages are cut to a head and a tail, no LLM call.

A message over ``oversized_fraction`` of the window, or a tool output over the byte or line
limit, keeps its start and end around a notice; the latest user message, tool-call
arguments, images and system messages are never cut. The task and pinned messages stay
whole up to ``Limits.task_max_tokens``; past it they keep their head and tail, and the
notice between carries the distinctive terms of what it omits (:mod:`..summaries.carry`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from compaction_worker.budget.tokens import TEXT_TYPES
from compaction_worker.contracts.history import Entry
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, plural
from compaction_worker.strategies.edits import PLACEHOLDER_EDITS, EditStage, outcome, rewrite
from compaction_worker.strategies.tail import task_index
from compaction_worker.summaries.carry import carry, distinctive_terms
from compaction_worker.summaries.sentences import asking

EDIT = "truncated"
STAGE = "truncate_oversized"

NOTICE_MARK = "omitted; the full text is preserved in the transcript"
NOTICE_RESERVE_BYTES = 200
"""Bytes set aside for the notice and its line breaks, so a cut output stays within its limit."""
MIN_KEEP_BYTES = 256
"""The least text a cut keeps, even when the message's other parts already use its budget."""
ATTEMPTS = 3
"""Re-cuts when the kept text is denser in tokens than the message's average."""


def truncate_oversized(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Cut huge messages (and tool outputs over the size limits) to a head and a tail."""
    settings, window = ctx.settings, ctx.limits.window
    huge = int(settings.oversized_fraction * window)
    keep = int(min(settings.oversized_keep_fraction, settings.oversized_fraction) * window)
    entries = draft.entries
    last_user = max((i for i, e in enumerate(entries) if e.role == "user"), default=-1)
    task_budget = ctx.limits.task_max_tokens
    task = task_index(entries) if task_budget > 0 else None
    edited: dict[int, Entry] = {}
    notes: list[str] = []
    for i, entry in enumerate(entries):
        if entry.edit == EDIT or entry.edit in PLACEHOLDER_EDITS or entry.role == "system":
            continue
        if i == task or entry.pinned:
            if task_budget > 0 and entry.tokens > task_budget:
                kept = cut_kept(entry, task_budget, ctx)
                if kept is not None:
                    edited[i], note = kept
                    notes.append(f"{'the task' if i == task else 'a pinned message'} {note}")
            continue
        if entry.role not in ("user", "assistant", "tool") or i == last_user:
            continue
        tokens = keep if entry.tokens > huge else None
        tool = entry.role == "tool"
        max_bytes = settings.max_tool_output_bytes if tool else None
        max_lines = settings.max_tool_output_lines if tool else None
        if tokens is None and max_bytes is None and max_lines is None:
            continue  # within every limit
        if (new := shrink(entry, ctx, tokens=tokens, max_bytes=max_bytes, max_lines=max_lines)) is not None:
            edited[i] = new
    out = outcome(draft, ctx, edited, STAGE, plural(len(edited), "message"))
    return replace(out, notes=tuple(notes)) if notes else out


def cut_to(entries: Sequence[Entry], budget: int, ctx: StageContext) -> tuple[Entry, ...]:
    """``entries`` (the newest step) within ``budget`` tokens where cutting can get them there: the
    largest first, its text to a head and a tail, then the longest string values of its tool-call
    arguments likewise (the arguments stay valid JSON); system and pinned messages never."""
    out = list(entries)
    over = sum(e.tokens for e in out) - budget
    for i in sorted(range(len(out)), key=lambda i: -out[i].tokens):
        entry = out[i]
        if over <= 0:
            break
        if entry.role == "system" or entry.pinned or entry.edit in PLACEHOLDER_EDITS:
            continue
        cut = shrink(entry, ctx, tokens=max(0, entry.tokens - over)) or entry
        cut = _cut_arguments(cut, over - (entry.tokens - cut.tokens), ctx)
        if cut is not entry:
            over -= entry.tokens - cut.tokens
            out[i] = cut
    return tuple(out)


def _cut_arguments(entry: Entry, over: int, ctx: StageContext) -> Entry:
    """``entry`` with its tool calls' longest string arguments cut to a head and a tail until about
    ``over`` tokens are saved; the entry itself when it has none worth cutting."""
    calls = entry.message.get("tool_calls")
    if over <= 0 or not isinstance(calls, list) or not calls:
        return entry
    parsed: list[tuple[int, dict[str, Any]]] = []
    for index, call in enumerate(calls):
        raw = call.get("function", {}).get("arguments") if isinstance(call, Mapping) else None
        try:
            value = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            continue
        if isinstance(value, dict):
            parsed.append((index, value))
    longest = sorted(
        ((len(v), index, key) for index, args in parsed for key, v in args.items() if isinstance(v, str)),
        reverse=True,
    )
    changed = dict(parsed)
    ratio = max(1.0, len(json.dumps(entry.message, ensure_ascii=False)) / max(1, entry.tokens))
    left = over
    for size, index, key in longest:
        if left <= 0 or size <= 2 * MIN_KEEP_BYTES:
            break
        keep = max(MIN_KEEP_BYTES, size - int(left * ratio))
        cut = cut_text(changed[index][key], keep, None)
        if cut is None:
            continue
        changed[index] = {**changed[index], key: cut}
        left -= int((size - len(cut)) / ratio)
    if left == over:
        return entry
    new_calls = [
        {**call, "function": {**call["function"], "arguments": json.dumps(changed[i], ensure_ascii=False)}}
        if i in changed
        else call
        for i, call in enumerate(calls)
    ]
    message = {**entry.message, "tool_calls": new_calls}
    return replace(entry, message=message, tokens=ctx.count_message(message), edit=EDIT)


def cut_kept(entry: Entry, budget: int, ctx: StageContext) -> tuple[Entry, str] | None:
    """A task or pinned message over ``budget``: its head and tail, with the omitted part's terms.

    Head and tail take three quarters of the budget; the notice between them carries the
    distinctive terms found only in the omitted part, each with a few words of context, in
    what is left. Returns the entry and a note of what was carried and what was not.
    """
    cut = shrink(entry, ctx, tokens=budget * 3 // 4)
    if cut is None:
        return None
    original = "\n".join(_texts(entry.message.get("content")))
    kept = "\n".join(_texts(cut.message.get("content")))
    room = budget - cut.tokens - ctx.count(CARRIED_INTRO)
    carried = carry(original, max(0, room), ctx.count, skip=distinctive_terms(kept), prefer=ctx.terms)
    if carried.phrases:
        quoted = CARRIED_INTRO + "; ".join(f"«{p}»" for p in carried.phrases)
        content = _carry_in_notice(cut.message.get("content"), quoted)
        if content is not None:
            cut = rewrite(entry, content, EDIT, ctx)
    total = len(carried.carried) + len(carried.dropped)
    note = (
        f"({plural(entry.tokens, 'token')}) was cut to its budget of {plural(budget, 'token')}: "
        f"head and tail verbatim, {len(carried.carried)} of {plural(total, 'distinctive term')} "
        "of the part between carried"
    )
    if carried.dropped:
        note += f", {len(carried.dropped)} left out (all in the transcript)"
    return cut, note


STATEMENT_MARK = " [...]"
"""What stands for the remarks a task's statement leaves out (all in the transcript)."""


def statement(entry: Entry, ctx: StageContext, budget: int | None = None) -> Entry | None:
    """The task cut to its statement: the sentences that ask for work, in order, and the distinctive
    terms of the rest in context, within ``budget`` when given; None when it has no such sentences, its
    content is not plain text, it saves nothing, or a term of the rest does not fit (then the head and
    tail cut, :func:`cut_kept`, keeps more of it)."""
    content = entry.message.get("content")
    if not isinstance(content, str):
        return None
    asked = asking(content)
    if not asked:
        return None
    said = " ".join(asked)
    cut = rewrite(entry, said + STATEMENT_MARK, EDIT, ctx)
    room = (budget if budget is not None else entry.tokens) - cut.tokens - ctx.count(CARRIED_INTRO)
    carried = carry(content, max(0, room), ctx.count, skip=distinctive_terms(said), prefer=ctx.terms)
    if carried.dropped:
        return None
    if carried.phrases:
        quoted = CARRIED_INTRO + "; ".join(f"«{p}»" for p in carried.phrases)
        cut = rewrite(entry, f"{said} [...{quoted}]", EDIT, ctx)
    return cut if cut.tokens < entry.tokens else None


CARRIED_INTRO = "; its distinctive terms, in context: "
_NOTICE_END = " ...]"


def _carry_in_notice(content: object, quoted: str) -> str | list[Any] | None:
    """``content`` with ``quoted`` added to its first cut notice; None when it has none."""

    def add(text: str) -> str | None:
        at = text.find(NOTICE_MARK)
        end = text.find(_NOTICE_END, at) if at >= 0 else -1
        return None if end < 0 else f"{text[:end]}{quoted}{text[end:]}"

    if isinstance(content, str):
        return add(content)
    if isinstance(content, list | tuple):
        out = list(content)
        for i, part in enumerate(out):
            text = _part_text(part)
            if text is not None and (new := add(text)) is not None:
                out[i] = {**part, "text": new}
                return out
    return None


TRUNCATE_OVERSIZED = EditStage(STAGE, truncate_oversized)
"""The stage as the pipeline runs it."""


def shrink(
    entry: Entry,
    ctx: StageContext,
    *,
    tokens: int | None = None,
    max_bytes: int | None = None,
    max_lines: int | None = None,
) -> Entry | None:
    """The entry with its text cut to the limits given, or None when it is within them or cannot shrink."""
    content = entry.message.get("content")
    texts = _texts(content)
    if not texts:
        return None
    total_bytes = sum(len(t.encode()) for t in texts)
    max_bytes = total_bytes if max_bytes is None else max_bytes
    if tokens is not None:
        # The entry's count already includes the text: count the message without it (cheap)
        # rather than the text itself (a second pass over what may be megabytes).
        other = ctx.count_message({**entry.message, "content": _without_text(content)})
        text_tokens = max(1, entry.tokens - other)
        # What the text may cost once images, tool calls and overhead are paid for.
        room = tokens - other
        max_bytes = min(max_bytes, max(MIN_KEEP_BYTES, total_bytes * room // text_tokens))
    best: Entry | None = None
    for _ in range(ATTEMPTS):
        cut = cut_content(content, max_bytes, max_lines)
        if cut is None:
            break
        best = rewrite(entry, cut, EDIT, ctx)
        if tokens is None or best.tokens <= tokens:
            break
        max_bytes = max(MIN_KEEP_BYTES, int(max_bytes * tokens / best.tokens * 0.9))
    return best if best is not None and best.tokens < entry.tokens else None


def cut_content(content: object, max_bytes: int, max_lines: int | None) -> str | list[Any] | None:
    """The content with its text cut to the limits (text parts share them), or None if within."""
    if isinstance(content, str):
        return cut_text(content, max_bytes, max_lines)
    if not isinstance(content, list | tuple):
        return None
    texts = _texts(content)
    total_bytes = max(1, sum(len(t.encode()) for t in texts))
    total_lines = max(1, sum(t.count("\n") + 1 for t in texts))
    out: list[Any] = []
    changed = False
    for part in content:
        text = _part_text(part)
        if text is None:
            out.append(part)
            continue
        share_bytes = max_bytes * len(text.encode()) // total_bytes
        share_lines = None if max_lines is None else max(3, max_lines * (text.count("\n") + 1) // total_lines)
        cut = cut_text(text, share_bytes, share_lines)
        changed |= cut is not None
        out.append(part if cut is None else {**part, "text": cut})
    return out if changed else None


def cut_text(text: str, max_bytes: int, max_lines: int | None) -> str | None:
    """Head, notice, tail: at most ``max_bytes`` UTF-8 bytes and ``max_lines`` lines; None if within."""
    raw = text.encode()
    over_bytes = len(raw) > max_bytes
    over_lines = max_lines is not None and text.count("\n") + 1 > max_lines
    if not over_bytes and not over_lines:
        return None
    # Once cutting, both limits hold for the result, notice included: a cut for lines
    # must not push a text near the byte limit over it, nor a cut for bytes add lines.
    head_end, tail_start = len(text), 0
    body = max(0, max_bytes - NOTICE_RESERVE_BYTES)
    if len(raw) > body:
        head_bytes = body // 2
        tail_bytes = body - head_bytes
        # Decoding a byte prefix/suffix drops a character split by the cut.
        head_end = len(raw[:head_bytes].decode("utf-8", "ignore"))
        tail_start = len(text) - len(raw[len(raw) - tail_bytes :].decode("utf-8", "ignore"))
    if max_lines is not None:
        head_lines = (max_lines - 1) // 2  # one line for the notice
        head_end = min(head_end, _end_of_lines(text, head_lines))
        tail_start = max(tail_start, _start_of_last_lines(text, max_lines - 1 - head_lines))
    # Whole lines read better than a cut mid-line, when a line break is close to the cut.
    if 0 < head_end < len(text) and text[head_end] != "\n":
        nl = text.rfind("\n", 0, head_end)
        if nl >= head_end // 2:
            head_end = nl
    if 0 < tail_start < len(text) and text[tail_start - 1] != "\n":
        nl = text.find("\n", tail_start)
        if nl != -1 and nl + 1 - tail_start <= (len(text) - tail_start) // 2:
            tail_start = nl + 1
    if head_end >= tail_start:
        return None
    middle = text[head_end:tail_start]
    lines = max(0, middle.count("\n") - 1)
    what = f"{len(middle):,} characters" + (f" ({plural(lines, 'line')})" if lines else "")
    notice = f"[... {what} {NOTICE_MARK}{_NOTICE_END}"
    return f"{text[:head_end]}\n{notice}\n{text[tail_start:]}"


def _end_of_lines(text: str, count: int) -> int:
    """Where the first ``count`` lines end (before their last line break)."""
    if count <= 0:
        return 0
    pos = -1
    for _ in range(count):
        pos = text.find("\n", pos + 1)
        if pos == -1:
            return len(text)
    return pos


def _start_of_last_lines(text: str, count: int) -> int:
    """Where the last ``count`` lines start."""
    if count <= 0:
        return len(text)
    pos = len(text)
    for _ in range(count):
        pos = text.rfind("\n", 0, pos)
        if pos == -1:
            return 0
    return pos + 1


def _part_text(part: object) -> str | None:
    if isinstance(part, Mapping) and part.get("type") in TEXT_TYPES and isinstance(part.get("text"), str):
        return str(part["text"])
    return None


def _without_text(content: object) -> object:
    if isinstance(content, str):
        return ""
    if isinstance(content, list | tuple):
        return [{**p, "text": ""} if _part_text(p) is not None else p for p in content]
    return content


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, Sequence):
        return [t for t in map(_part_text, content) if t is not None]
    return []
