"""Provider validity: the checks every rendered history must pass (invariant 4)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def provider_problems(
    messages: Sequence[Mapping[str, Any]], allow_open_calls_at_end: bool = True
) -> list[str]:
    """Ways a rendered history would be rejected by some provider (invariant 4); empty if none."""
    problems: list[str] = []
    body = list(messages)
    if body and body[0].get("role") == "system":
        body = body[1:]
    if any(m.get("role") == "system" for m in body):
        problems.append("a system message after the first message")
    if body and body[0].get("role") != "user":
        problems.append(f"first non-system message is {body[0].get('role')}, not user")
    open_calls: dict[str, int] = {}
    for i, m in enumerate(body):
        role = m.get("role")
        if role == "tool":
            call_id = str(m.get("tool_call_id"))
            if call_id not in open_calls:
                problems.append(f"tool result {call_id} at {i} without its call")
            open_calls.pop(call_id, None)
        else:
            if open_calls and role in ("user", "assistant"):
                problems.append(f"tool calls {sorted(open_calls)} unanswered before message {i}")
                open_calls.clear()
            for call in m.get("tool_calls") or ():
                open_calls[str(call.get("id"))] = i
        if i > 0 and role == body[i - 1].get("role") and role == "assistant":
            problems.append(f"two consecutive assistant messages at {i}")
    if open_calls and not allow_open_calls_at_end:
        problems.append(f"tool calls {sorted(open_calls)} never answered")
    return problems
