"""What a provider checks in a tool loop with reasoning, as validators: a list of problems, empty when valid.

Anthropic, extended thinking with tool use (Messages API docs, "Preserving thinking
blocks"): roles alternate from a user message on; every ``tool_use`` is answered by a
``tool_result`` at the start of the very next (user) message and every ``tool_result``
answers a ``tool_use`` of the assistant message right before it; thinking and
redacted_thinking blocks come first in an assistant message; in a tool loop the last
assistant message starts with a thinking block, and thinking blocks go back complete and
unmodified (signature included), the sequence as the model produced it.

OpenAI Responses, stateless reasoning (``store=false``, ``include=["reasoning.encrypted_content"]``):
a ``reasoning`` item goes back with its ``encrypted_content`` and must be followed by the
item it came with (a ``function_call`` or an assistant ``message``); every
``function_call_output`` answers an earlier ``function_call``; every call is answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

THINKING = ("thinking", "redacted_thinking")


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _thinking_by_call(published: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The thinking blocks the model produced with each tool_use, by tool_use id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for message in published:
        if message.get("role") != "assistant":
            continue
        blocks = _blocks(message)
        thinking = [b for b in blocks if b.get("type") in THINKING]
        for block in blocks:
            if block.get("type") == "tool_use":
                out[str(block["id"])] = thinking
    return out


def anthropic_problems(
    messages: Sequence[Mapping[str, Any]], published: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What the Messages API would reject in ``messages`` (extended thinking on, in a tool loop).

    ``published`` are the Anthropic messages the runtime published: the thinking blocks it
    must get back unchanged.
    """
    problems: list[str] = []
    by_call = _thinking_by_call(published)
    if not messages or messages[0].get("role") != "user":
        problems.append("the first message is not a user message")
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: role {role!r}")
        if i and messages[i - 1].get("role") == role:
            problems.append(f"message {i}: a second {role} message in a row")
        blocks = _blocks(message)
        kinds = [str(b.get("type")) for b in blocks]
        uses = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        results = [str(b.get("tool_use_id")) for b in blocks if b.get("type") == "tool_result"]
        if role == "assistant":
            leading = len(kinds) - len(_after_thinking(kinds))
            if any(k in THINKING for k in kinds[leading:]):
                problems.append(f"message {i}: a thinking block after another block")
            thinking = [b for b in blocks if b.get("type") in THINKING]
            for block in thinking:
                if block.get("type") == "thinking" and not block.get("signature"):
                    problems.append(f"message {i}: a thinking block without its signature")
            for use in uses:
                if use in by_call and thinking != by_call[use]:
                    problems.append(
                        f"message {i}: the thinking of tool_use {use} is not as the model produced it"
                    )
        if results:
            before = messages[i - 1] if i else {}
            asked = [str(b.get("id")) for b in _blocks(before) if b.get("type") == "tool_use"]
            if before.get("role") != "assistant" or sorted(results) != sorted(asked):
                problems.append(
                    f"message {i}: tool results {results} do not answer the calls before them {asked}"
                )
            if kinds[: len(results)] != ["tool_result"] * len(results):
                problems.append(f"message {i}: tool_result blocks are not first")
        if uses:
            after = messages[i + 1] if i + 1 < len(messages) else None
            answered = [
                str(b.get("tool_use_id")) for b in _blocks(after or {}) if b.get("type") == "tool_result"
            ]
            if after is None or sorted(answered) != sorted(uses):
                problems.append(f"message {i}: tool_use {uses} not answered by the next message")
    last_user = messages[-1] if messages else {}
    in_loop = any(b.get("type") == "tool_result" for b in _blocks(last_user))
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if in_loop and assistants and str(_blocks(assistants[-1])[0].get("type")) not in THINKING:
        problems.append("in a tool loop, the last assistant message does not start with a thinking block")
    return problems


def _after_thinking(kinds: Sequence[str]) -> Sequence[str]:
    i = 0
    while i < len(kinds) and kinds[i] in THINKING:
        i += 1
    return kinds[i:]


def responses_problems(
    items: Sequence[Mapping[str, Any]], published: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What the Responses API would reject in ``items`` (stateless, encrypted reasoning).

    ``published`` are the items the runtime published: every reasoning item must come back
    as it was, and the last call's reasoning with it.
    """
    problems: list[str] = []
    reasoning = {str(item.get("id")): item for item in published if item.get("type") == "reasoning"}
    open_calls: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "reasoning":
            if reasoning.get(str(item.get("id"))) != item:
                problems.append(f"item {i}: reasoning {item.get('id')} is not as published")
            if not item.get("encrypted_content"):
                problems.append(f"item {i}: reasoning without encrypted_content")
            after = items[i + 1] if i + 1 < len(items) else {}
            follows = after.get("type") == "function_call" or (
                after.get("type", "message") == "message" and after.get("role") == "assistant"
            )
            if not follows:
                problems.append(f"item {i}: reasoning {item.get('id')} without its required following item")
        elif kind == "function_call":
            open_calls.add(str(item.get("call_id")))
        elif kind == "function_call_output":
            call = str(item.get("call_id"))
            if call not in open_calls:
                problems.append(f"item {i}: output for {call}, which no earlier call left open")
            open_calls.discard(call)
    if open_calls:
        problems.append(f"calls never answered: {sorted(open_calls)}")
    calls = [i for i, item in enumerate(items) if item.get("type") == "function_call"]
    if calls and reasoning:
        first = calls[-1]
        while first > 0 and items[first - 1].get("type") == "function_call":
            first -= 1
        if first == 0 or items[first - 1].get("type") != "reasoning":
            problems.append("the last function_call came back without its reasoning item")
    return problems
