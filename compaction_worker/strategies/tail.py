"""Where the verbatim tail starts: bounded, snapped to a clean boundary, never splitting a tool pair."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction_worker.history import Entry


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
    boundary gives a non-empty head. When even the shortest clean tail is over the bounds,
    the tail degrades to nothing (reference 003's degrading guard). Returns ``len(entries)``
    for an empty tail.
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


@dataclass(frozen=True, slots=True)
class Partition:
    """The entries split three ways: to summarize, kept because pinned, and the verbatim tail."""

    head: tuple[Entry, ...]
    pinned: tuple[Entry, ...]
    """Pinned entries from before the tail (with their tool calls/results), in order."""
    tail: tuple[Entry, ...]


def partition(entries: Sequence[Entry], max_messages: int, max_tokens: int) -> Partition:
    """Choose the tail, then lift pinned messages (and their tool pairs) out of the head."""
    split = select_tail(entries, max_messages, max_tokens)
    head, tail = entries[:split], entries[split:]
    keep = _pinned_units(head)
    return Partition(
        head=tuple(e for e in head if e.n not in keep),
        pinned=tuple(e for e in head if e.n in keep),
        tail=tuple(tail),
    )


def _pinned_units(entries: Sequence[Entry]) -> set[int]:
    """Ordinals of pinned entries plus the tool calls and results that belong with them."""
    by_call: dict[str, list[Entry]] = {}
    caller: dict[str, Entry] = {}
    for entry in entries:
        for call in entry.message.get("tool_calls") or ():
            caller[str(call.get("id"))] = entry
        if entry.role == "tool":
            by_call.setdefault(str(entry.message.get("tool_call_id")), []).append(entry)
    keep: set[int] = set()
    for entry in entries:
        if not entry.pinned:
            continue
        unit = [entry]
        if entry.role == "tool" and (call_entry := caller.get(str(entry.message.get("tool_call_id")))):
            unit.append(call_entry)
        for member in list(unit):
            for call in member.message.get("tool_calls") or ():
                unit.extend(by_call.get(str(call.get("id")), ()))
        keep.update(e.n for e in unit)
    return keep
