"""The prune stage: old tool results become a placeholder that keeps their exact artifacts.

Recent results (and the agent's current step) are protected; the stage applies only when
its saving reaches the configured minimum. The call/result pairing stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction_worker.contracts.history import Entry
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, plural
from compaction_worker.strategies.edits import (
    PLACEHOLDER_EDITS,
    EditStage,
    image_count,
    outcome,
    rewrite,
    tool_calls,
    tool_name,
    worth_it,
)
from compaction_worker.summaries.artifacts import extract_artifacts

EDIT = "pruned"
STAGE = "prune"


def placeholder(tool: str, entry: Entry, kept: Sequence[str] = ()) -> str:
    """What a cleared tool result says instead of its output: its size, then what it kept verbatim."""
    images = image_count(entry.message.get("content"))
    size = f"{entry.tokens:,} tokens" + (f" and {plural(images, 'image')}" if images else "")
    text = f"[Old tool result cleared: {tool}, {size}; the full output is preserved in the transcript]"
    if kept:
        text += "\nKept verbatim from it:\n" + "\n".join(f"- {item}" for item in kept)
    return text


def prune_tool_outputs(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Clear tool results older than the protected recent ones, if that saves enough."""
    settings, window = ctx.settings, ctx.limits.window
    protect = min(settings.prune_protect_tokens, int(settings.prune_protect_fraction * window))
    minimum = min(
        settings.prune_minimum_savings_tokens, int(settings.prune_minimum_savings_fraction * window)
    )
    protected_tools = frozenset(settings.protected_tools)
    entries = draft.entries
    calls = tool_calls(entries)
    current = _current_step(entries)

    edited: dict[int, Entry] = {}
    used, exhausted = 0, False
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if entry.role != "tool" or entry.pinned or entry.edit in PLACEHOLDER_EDITS:
            continue
        call = calls.get(i)
        tool = tool_name(entry, call)
        if tool in protected_tools:
            continue
        # The current step is a message, not a set of ids: runtimes that number calls
        # per turn give every older result one of its ids too.
        step = call is not None and call.owner == current
        if not exhausted and (step or used + entry.tokens <= protect):
            used += entry.tokens
            continue
        exhausted = True
        kept = extract_artifacts([entry.message], settings.prune_keep_artifact_tokens, ctx.count)
        new = rewrite(entry, placeholder(tool, entry, kept), EDIT, ctx)
        if worth_it(entry, new):
            edited[i] = new

    saved = sum(entries[i].tokens - e.tokens for i, e in edited.items())
    if saved < max(1, minimum):
        return StageOutcome(draft)
    return outcome(draft, ctx, edited, STAGE, plural(len(edited), "tool output"))


PRUNE = EditStage(STAGE, prune_tool_outputs)
"""The stage as the pipeline runs it."""


def _current_step(entries: tuple[Entry, ...]) -> int | None:
    """Index of the latest assistant message with tool calls, unless a user message followed it."""
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if entry.role == "user":
            return None
        if entry.role == "assistant" and entry.message.get("tool_calls"):
            return i
    return None
