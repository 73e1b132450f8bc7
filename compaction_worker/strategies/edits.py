"""What the content-editing stages (prune, deduplicate, truncate_oversized) share.

Those stages never add, remove or reorder entries: they rewrite one entry's ``content``,
mark it with an ``edit`` and re-count its tokens, so ordinals and tool call/result
pairing stay exactly as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction_worker.history import Entry
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, StageReport

PLACEHOLDER_EDITS = frozenset({"pruned", "deduplicated"})
"""Edits that leave only a short placeholder: nothing left to clear, compare or cut."""

MIN_ENTRY_SAVING = 0.3
"""A rewrite must save at least this share of the entry's tokens (reference 004's 30%).

Below it a placeholder costs nearly as much as what it replaces, so the model would lose
the content for a handful of tokens.
"""

IMAGE_TYPES = frozenset({"image_url", "image", "input_image"})
TEXT_TYPES = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an assistant message, as its result's ``tool_call_id`` names it."""

    id: str
    name: str
    arguments: str
    """The raw arguments string (JSON by convention; not guaranteed)."""


def tool_calls(entries: Iterable[Entry]) -> dict[str, ToolCall]:
    """Every tool call in the entries, by id."""
    calls: dict[str, ToolCall] = {}
    for entry in entries:
        if entry.role != "assistant":
            continue
        for call in entry.message.get("tool_calls") or ():
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            function = function if isinstance(function, Mapping) else call
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = "" if arguments is None else json.dumps(arguments, sort_keys=True)
            call_id = str(call.get("id"))
            calls[call_id] = ToolCall(call_id, str(function.get("name") or ""), arguments)
    return calls


def call_of(entry: Entry, calls: Mapping[str, ToolCall]) -> ToolCall | None:
    """The call a tool result answers, if it is among the entries."""
    return calls.get(str(entry.message.get("tool_call_id")))


def tool_name(entry: Entry, calls: Mapping[str, ToolCall]) -> str:
    """The tool that produced a result: from its call, else the message's own ``name``."""
    call = call_of(entry, calls)
    if call is not None and call.name:
        return call.name
    name = entry.message.get("name")
    return name if isinstance(name, str) and name else "tool"


def image_count(content: object) -> int:
    """How many image parts a message content holds."""
    if not isinstance(content, list | tuple):
        return 0
    return sum(1 for p in content if isinstance(p, Mapping) and p.get("type") in IMAGE_TYPES)


def plural(count: int, noun: str) -> str:
    """``1 image``, ``2 images``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def rewrite(entry: Entry, content: str | Sequence[Any], edit: str, ctx: StageContext) -> Entry:
    """The entry with new content, marked ``edit``, its tokens re-counted exactly."""
    message = {**entry.message, "content": content if isinstance(content, str) else list(content)}
    return replace(entry, message=message, tokens=ctx.count_message(message), edit=edit)


def worth_it(old: Entry, new: Entry) -> bool:
    """Whether a rewrite saves enough of the entry to be worth losing its content."""
    return old.tokens - new.tokens >= MIN_ENTRY_SAVING * old.tokens and new.tokens < old.tokens


def outcome(
    draft: Draft, ctx: StageContext, edited: Mapping[int, Entry], stage: str, detail: str
) -> StageOutcome:
    """The draft with ``edited`` (by index) applied, and a report of the exact saving."""
    if not edited:
        return StageOutcome(draft)
    out = Draft(draft.chunks, tuple(edited.get(i, e) for i, e in enumerate(draft.entries)))
    return StageOutcome(out, StageReport(stage, ctx.tokens(draft) - ctx.tokens(out), detail))
