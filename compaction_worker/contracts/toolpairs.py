"""Which call each tool result answers, by position (docs/design.md, invariant 8).

A result answers the nearest preceding assistant message that issued its id, never just
any call sharing it; every stage, the transcript and the ledger pair this way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of one assistant message."""

    id: str
    name: str
    arguments: str
    """The raw arguments string (JSON by convention; not guaranteed)."""
    owner: int
    """Index of the assistant message that issued the call."""
    slot: int
    """Position among the owner's tool calls: tells apart parallel calls that share an id."""


def issued_calls(message: Mapping[str, Any], owner: int) -> tuple[ToolCall, ...]:
    """The tool calls an assistant message issues, in order (none for other roles)."""
    if message.get("role") != "assistant":
        return ()
    calls = message.get("tool_calls")
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        return ()
    out: list[ToolCall] = []
    for slot, call in enumerate(calls):
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else call
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else json.dumps(arguments, sort_keys=True)
        out.append(ToolCall(str(call.get("id")), str(function.get("name") or ""), arguments, owner, slot))
    return tuple(out)


def arguments_object(raw: str) -> dict[str, Any]:
    """A call's ``arguments`` text as the JSON object it encodes; empty when it encodes none."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return dict(value) if isinstance(value, Mapping) else {}


def result_id(message: Mapping[str, Any]) -> str:
    """The call id a tool result names."""
    return str(message.get("tool_call_id"))


@dataclass(frozen=True, slots=True)
class Pairing:
    """Every call of a history and the result index, if any, that answers each."""

    calls: tuple[ToolCall, ...]
    """All tool calls, in history order."""
    results: Mapping[int, ToolCall]
    """For each tool result's index, the call it answers (orphans are absent)."""


def pairing(messages: Sequence[Mapping[str, Any]]) -> Pairing:
    """Pair every tool result of ``messages`` with the call it answers, by position."""
    calls: list[ToolCall] = []
    results: dict[int, ToolCall] = {}
    # Per id: the calls with that id of the latest assistant message that issued it, and
    # how many of them results have taken so far. A later issuer replaces an earlier one.
    latest: dict[str, tuple[tuple[ToolCall, ...], int]] = {}
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            issued = issued_calls(message, index)
            calls.extend(issued)
            for call_id in dict.fromkeys(c.id for c in issued):
                latest[call_id] = (tuple(c for c in issued if c.id == call_id), 0)
        elif role == "tool":
            call_id = result_id(message)
            waiting, taken = latest.get(call_id, ((), 0))
            if taken < len(waiting):
                results[index] = waiting[taken]
                latest[call_id] = (waiting, taken + 1)
    return Pairing(tuple(calls), results)


def pair_results(messages: Sequence[Mapping[str, Any]]) -> dict[int, ToolCall]:
    """For every tool result's index, the call it answers; orphan results are absent."""
    return dict(pairing(messages).results)


def tool_pairs(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """``(call index, result index)`` of every tool result that answers a call, in result order."""
    return [(call.owner, index) for index, call in sorted(pairing(messages).results.items())]


def unanswered_calls(messages: Sequence[Mapping[str, Any]]) -> tuple[ToolCall, ...]:
    """Tool calls that no result answers, in history order."""
    paired = pairing(messages)
    answered = {(c.owner, c.slot) for c in paired.results.values()}
    return tuple(c for c in paired.calls if (c.owner, c.slot) not in answered)
