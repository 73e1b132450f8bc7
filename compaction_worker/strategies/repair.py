"""Provider validity, checked and fixed last: tool pairs and role order (docs/design.md, invariant 4).

:func:`repair` only adds clearly marked synthetic messages; :func:`provider_problems` is
the checker that tests hold every rendered history to.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from compaction_worker.contracts.history import SYNTHETIC, Entry
from compaction_worker.contracts.toolpairs import (
    ToolCall,
    issued_calls,
    pair_results,
    result_id,
    unanswered_calls,
)
from compaction_worker.formats import tool_call
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, StageReport

SYNTHETIC_RESULT = "[Tool result unavailable - conversation was compacted]"
SYNTHETIC_TOOL_NAME = "unknown_tool"
SYNTHETIC_START = "[Conversation start.]"
"""The user turn put before a history that would otherwise open with the assistant."""
SYNTHETIC_GAP = "[Earlier messages between these turns were compacted into the summary above.]"
"""The user turn between two assistant messages whose turns in between were summarized."""
SYNTHETIC_CONTINUE = "[Continue.]"
"""The user turn between two assistant messages that were adjacent already."""

_NOT_A_TURN = ("tool", "system")
"""Roles that neither start a turn nor take part in role alternation once rendered."""


def synthetic_call_text(call_ids: Sequence[str]) -> str:
    """The text of a made-up assistant message that stands for the calls of orphan results."""
    return f"[Tool call for {', '.join(call_ids)} - conversation was compacted]"


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """The ids of an assistant message's tool calls, in order."""
    return [str(call.get("id")) for call in message.get("tool_calls") or () if isinstance(call, Mapping)]


def open_call_index(entries: Sequence[Entry]) -> int | None:
    """The index of the last assistant message if some of its tool calls are still unanswered.

    Only tool results (and system messages) follow it, so the missing results may well be
    on their way: the runtime's next turn brings them. Those calls must stay open, and the
    message must stay verbatim, or the results would arrive as orphans.
    """
    last = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].role not in _NOT_A_TURN), None)
    if last is None or entries[last].role != "assistant":
        return None
    # Paired by position: an answered call_0 of an earlier turn says nothing about this one.
    calls = unanswered_calls([e.message for e in entries[last:]])
    return last if any(c.owner == 0 for c in calls) else None


def repair(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Make the draft valid for every provider; the report says what was made up.

    Tool pairs first: an unanswered call (except the open calls of the very last
    assistant message) gets a synthetic result right after its real ones; orphan results
    get a synthetic assistant call just before them. Then role order: the first rendered
    non-system message must be a user message (the summary is one, when there are chunks),
    and two assistant messages never meet: a short synthetic user turn goes between them.
    Synthetic entries have ``edit="synthetic"`` and ordinal 0, and cost their tokens.
    """
    fixed = _order_roles(_pair_tools(draft.entries, ctx), ctx, summarized=bool(draft.chunks))
    originals = {id(e) for e in draft.entries}
    # Entries only move when a synthetic call is made for them, so nothing added means
    # nothing changed.
    added = [e for e in fixed if id(e) not in originals]
    if not added:
        return StageOutcome(draft)
    kinds = Counter(e.role for e in added)
    detail = ", ".join(f"{count} synthetic {role}" for role, count in sorted(kinds.items()))
    return StageOutcome(
        Draft(draft.chunks, tuple(fixed)),
        StageReport("repair", -sum(e.tokens for e in added), detail),
    )


def reaches_target(draft: Draft, ctx: StageContext) -> bool:
    """Whether the draft is at or under the target once repaired (synthetic messages cost tokens too)."""
    return ctx.fits(repair(draft, ctx).draft)


def _synthetic(message: dict[str, Any], seq: int, ctx: StageContext) -> Entry:
    return Entry(n=0, seq=seq, message=message, tokens=ctx.count_message(message), edit=SYNTHETIC)


def _runs(entries: Sequence[Entry]) -> Iterator[tuple[int, Entry | None, list[int]]]:
    """``(index, head, run)`` for each message that starts a turn, where ``run`` holds the
    indexes of the tool and system messages after a tool-calling head; a stray run of tool
    results (no tool-calling message before it) comes with ``head=None``."""
    i = 0
    while i < len(entries):
        head = entries[i] if entries[i].role != "tool" else None
        start = i + 1 if head is not None else i
        end = start
        if head is None or call_ids(head.message):
            while end < len(entries) and entries[end].role in _NOT_A_TURN:
                end += 1
        yield i, head, list(range(start, end))
        i = max(end, i + 1)


def _pair_tools(entries: Sequence[Entry], ctx: StageContext) -> list[Entry]:
    # Judged by position: a result answers its head only if the pairing says it answers
    # that message (not merely one with the same id), and each call slot is answered once.
    paired = pair_results([e.message for e in entries])
    open_index = open_call_index(entries)
    out: list[Entry] = []
    for index, head, run in _runs(entries):
        waiting = list(issued_calls(head.message, index)) if head is not None else []
        answers: list[Entry] = []
        orphans: list[tuple[Entry, ToolCall | None]] = []
        for j in run:
            entry, call = entries[j], paired.get(j)
            if entry.role == "system":
                answers.append(entry)  # hoisted when rendered: its place among results is moot
            elif call is not None and call in waiting:
                waiting.remove(call)
                answers.append(entry)
            else:
                orphans.append((entry, call))
        if head is not None:
            out.append(head)
        out += answers
        # The last assistant's calls may be answered by the next turn, unless an orphan
        # follows them: then their results could not come right after them any more.
        if head is not None and waiting and not (index == open_index and not orphans):
            out += [
                _synthetic({"role": "tool", "tool_call_id": c.id, "content": SYNTHETIC_RESULT}, head.seq, ctx)
                for c in waiting
            ]
        out += _adopt(orphans, ctx)
    return out


def _adopt(orphans: Sequence[tuple[Entry, ToolCall | None]], ctx: StageContext) -> list[Entry]:
    """Orphan results behind synthetic calls; one call message per batch of distinct ids.

    A synthetic call carries the tool name of the result's own call when the pairing
    found one (a result that arrived after other messages), else the result's ``name``.
    """
    out: list[Entry] = []
    rest = list(orphans)
    while rest:
        batch: list[tuple[Entry, ToolCall | None]] = []
        seen: set[str] = set()
        for item in list(rest):
            if result_id(item[0].message) not in seen:
                seen.add(result_id(item[0].message))
                batch.append(item)
                rest.remove(item)
        ids = [result_id(e.message) for e, _ in batch]
        call = {
            "role": "assistant",
            "content": synthetic_call_text(ids),
            "tool_calls": [
                tool_call(result_id(e.message), _orphan_tool_name(e, own), "{}") for e, own in batch
            ],
        }
        out += [_synthetic(call, batch[0][0].seq, ctx), *(e for e, _ in batch)]
    return out


def _orphan_tool_name(entry: Entry, own: ToolCall | None) -> str:
    if own is not None and own.name:
        return own.name
    return str(entry.message.get("name") or SYNTHETIC_TOOL_NAME)


def _order_roles(entries: Sequence[Entry], ctx: StageContext, *, summarized: bool) -> list[Entry]:
    out: list[Entry] = []
    previous: Entry | None = None
    for entry in entries:
        if entry.role == "system":  # hoisted into the leading system message when rendered
            out.append(entry)
            continue
        text: str | None = None
        if previous is None:
            # With chunks the summary turn (a user message) comes first.
            if not summarized and entry.role != "user":
                text = SYNTHETIC_START
        elif previous.role == "assistant" and entry.role == "assistant":
            adjacent = previous.synthetic or entry.synthetic or entry.n == previous.n + 1
            text = SYNTHETIC_CONTINUE if adjacent or not summarized else SYNTHETIC_GAP
        if text is not None:
            out.append(_synthetic({"role": "user", "content": text}, entry.seq, ctx))
        out.append(entry)
        previous = entry
    return out


def provider_problems(
    messages: Sequence[Mapping[str, Any]],
    allow_open_calls_at_end: bool = True,
    *,
    unique_call_ids: bool = True,
) -> list[str]:
    """Ways a rendered history would be rejected by some provider (docs/design.md, invariant 4); empty if none.

    Checked: one system message, and only first; the first other message is the user's;
    every tool result answers a call of the assistant message right before its run of
    results, once; every call is answered before the next user or assistant message (the
    last assistant message's calls may stay open unless ``allow_open_calls_at_end`` is
    false); no two assistant messages in a row; no id twice among one message's calls
    (Anthropic and OpenAI reject that; ``unique_call_ids=False`` skips the check for a
    history whose runtime already repeated them, which no stage can fix without renaming
    calls). Two user messages in a row are allowed: every current provider accepts or
    merges them.
    """
    body = list(messages)
    if body and body[0].get("role") == "system":
        body = body[1:]
    return _role_problems(body) + _pair_problems(body, allow_open_calls_at_end, unique_call_ids)


def _role_problems(body: Sequence[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    if not body:
        return ["no message besides the system prompt"]
    if body[0].get("role") != "user":
        problems.append(f"first non-system message is {body[0].get('role')}, not user")
    for i, m in enumerate(body):
        role = m.get("role")
        if role == "system":
            problems.append(f"a system message after the first message, at {i}")
        elif role not in ("user", "assistant", "tool"):
            problems.append(f"unknown role {role!r} at {i}")
        elif i > 0 and role == "assistant" and body[i - 1].get("role") == "assistant":
            problems.append(f"two consecutive assistant messages at {i}")
    return problems


def _pair_problems(
    body: Sequence[Mapping[str, Any]], allow_open_calls_at_end: bool, unique_call_ids: bool
) -> list[str]:
    problems: list[str] = []
    # A multiset: parallel calls that share an id each need their own result.
    open_calls: Counter[str] = Counter()
    for i, m in enumerate(body):
        if m.get("role") == "tool":
            call_id = result_id(m)
            if open_calls[call_id] <= 0:
                problems.append(f"tool result {call_id} at {i} without its call")
            else:
                open_calls[call_id] -= 1
            continue
        if +open_calls and m.get("role") in ("user", "assistant"):
            problems.append(f"tool calls {sorted(+open_calls)} unanswered before message {i}")
            open_calls.clear()
        ids = call_ids(m)
        if unique_call_ids and len(set(ids)) != len(ids):
            problems.append(f"duplicate tool call ids in message {i}")
        if m.get("tool_calls") is not None and not ids:
            problems.append(f"empty tool_calls in message {i}")
        open_calls.update(ids)
    if +open_calls and not allow_open_calls_at_end:
        problems.append(f"tool calls {sorted(+open_calls)} never answered")
    return problems
