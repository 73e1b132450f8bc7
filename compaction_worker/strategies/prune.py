"""Tool-output pruning: old tool results become a placeholder; the call/result pairing stays.

Reference 002 (microcompact) and reference 004 (stage 1, "Tool Output Pruning"): the
cheapest stage, no LLM call. Rules:

- Tool results are walked newest first. They are protected while their tokens add up to
  at most ``min(prune_protect_tokens, prune_protect_fraction * window)``; from the first
  one that does not fit, every older one is cleared (recency, not size, decides).
- The results of the agent's current step (those that answer the latest assistant message
  with tool calls, paired by position, when no user message came after it) are always
  protected, even over the budget: the model is acting on them now, and clearing them
  makes an agent re-run the same calls. They still count toward the budget. Reference
  002 protects recent turns the same way.
- Results of ``protected_tools`` (named by their own call), pinned entries, and
  results that already hold a placeholder are left alone and do not use the budget.
- A result is cleared only when the placeholder saves at least 30% of its tokens (see
  :data:`~compaction_worker.strategies.edits.MIN_ENTRY_SAVING`); short outputs stay.
- The whole stage applies only when the saving reaches
  ``min(prune_minimum_savings_tokens, prune_minimum_savings_fraction * window)``:
  clearing outputs loses information (the originals stay in the transcript, not in the
  history), which a small saving does not pay for. Otherwise the draft is unchanged.

The cleared content, images included, becomes one string:
``[Old tool result cleared: read_file, 1,234 tokens; the full output is preserved in the
transcript]``. Images in an old tool result (screenshots) are part of the stale output and
cost a fixed amount each, so they go too; the placeholder says how many there were.

What must stay exact outlives the clearing: the output's error texts, commands, paths,
URLs and ids (its artifact ledger, :mod:`compaction_worker.summaries.artifacts`) follow the
placeholder, within ``prune_keep_artifact_tokens``. An agent that cleared a failing test
log still knows the exact error; and a later summary's ledger, which reads the
effective history, finds them there.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction_worker.contracts.history import Entry
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome
from compaction_worker.strategies.edits import (
    PLACEHOLDER_EDITS,
    image_count,
    outcome,
    plural,
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


def _current_step(entries: tuple[Entry, ...]) -> int | None:
    """Index of the latest assistant message with tool calls, unless a user message followed it."""
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if entry.role == "user":
            return None
        if entry.role == "assistant" and entry.message.get("tool_calls"):
            return i
    return None
