"""What the content-editing stages (prune, deduplicate, truncate_oversized) share.

They rewrite an entry's content in place, never adding, removing or reordering entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction_worker.budget.tokens import IMAGE_TYPES
from compaction_worker.contracts.history import Entry
from compaction_worker.contracts.toolpairs import ToolCall, pair_results
from compaction_worker.offload import off_loop
from compaction_worker.strategies.draft import Draft, StageContext, StageKind, StageOutcome, StageReport

PLACEHOLDER_EDITS = frozenset({"pruned", "deduplicated"})
"""Edits that leave only a short placeholder: nothing left to clear, compare or cut."""

MIN_ENTRY_SAVING = 0.3
"""A rewrite must save at least this share of the entry's tokens (reference 004's 30%).

Below it a placeholder costs nearly as much as what it replaces, so the model would lose
the content for a handful of tokens.
"""


def tool_calls(entries: Sequence[Entry]) -> dict[int, ToolCall]:
    """For every tool result among the entries (by index), the call it answers.

    Paired by position (:mod:`compaction_worker.contracts.toolpairs`), never by id alone: runtimes
    reuse ids across turns, and an id-keyed lookup would name another call's tool and path.
    """
    return pair_results([e.message for e in entries])


def tool_name(entry: Entry, call: ToolCall | None) -> str:
    """The tool that produced a result: from its own call, else the message's own ``name``."""
    if call is not None and call.name:
        return call.name
    name = entry.message.get("name")
    return name if isinstance(name, str) and name else "tool"


def image_count(content: object) -> int:
    """How many image parts a message content holds."""
    if not isinstance(content, list | tuple):
        return 0
    return sum(1 for p in content if isinstance(p, Mapping) and p.get("type") in IMAGE_TYPES)


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


@dataclass(frozen=True, slots=True)
class EditStage:
    """A content-editing function as a pipeline stage: no I/O, so the call never waits."""

    name: str
    edit: Callable[[Draft, StageContext], StageOutcome]
    kind: StageKind = StageKind.EDIT

    async def __call__(self, draft: Draft, ctx: StageContext) -> StageOutcome:
        """The edit applied to ``draft``, in a thread: a large history's edit would stall the event loop."""
        return await off_loop(self.edit, draft, ctx)
