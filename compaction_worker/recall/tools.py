"""The ``recall`` tool a model calls to look back at what compaction took out of its context.

The same tool in the two function-calling shapes runtimes send (:data:`OPENAI_TOOL` for
OpenAI-style chat completions and LiteLLM, :data:`ANTHROPIC_TOOL` for Anthropic's Messages
API), and the text a call's result carries (:func:`tool_result`). ``complete(..., recall=True)``
(client/llm.py) adds the tool and answers its calls itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_worker.recall.search import RecallResult

__all__ = ["ANTHROPIC_TOOL", "OPENAI_TOOL", "TOOL_NAME", "RecallCall", "recall_calls", "tool_result"]

TOOL_NAME = "recall"

DESCRIPTION = (
    "Search the earlier parts of this conversation that were compacted out of your context "
    "(older messages, tool outputs, and the exact paths, commands, errors, URLs and ids they "
    "named). Returns verbatim snippets, best match first, each with the turn_seq it came from. "
    "Use it when the summary mentions something you need the exact text of."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Words to search for: names, identifiers, error text, or a short description.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": 20,
            "description": "How many snippets to return at most (default 5).",
        },
    },
    "required": ["query"],
}

OPENAI_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS},
}
"""For ``tools=`` of OpenAI-style chat completions (and LiteLLM, for every provider)."""

ANTHROPIC_TOOL: dict[str, Any] = {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}
"""For ``tools=`` of Anthropic's Messages API."""


@dataclass(frozen=True, slots=True)
class RecallCall:
    """One call of the recall tool in an assistant message."""

    id: str
    query: str
    limit: int | None
    error: str | None = None
    """Why the arguments could not be read (the call is answered with it)."""


def recall_calls(tool_calls: Sequence[Mapping[str, Any]]) -> list[RecallCall]:
    """The recall calls among an assistant message's OpenAI-style ``tool_calls``."""
    calls: list[RecallCall] = []
    for call in tool_calls:
        function = call.get("function") or {}
        if function.get("name") != TOOL_NAME:
            continue
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict) or not isinstance(arguments.get("query"), str):
            calls.append(RecallCall(str(call.get("id")), "", None, 'expected arguments {"query": "..."}'))
            continue
        limit = arguments.get("limit")
        calls.append(
            RecallCall(str(call.get("id")), arguments["query"], limit if isinstance(limit, int) else None)
        )
    return calls


def tool_result(result: RecallResult) -> str:
    """A recall's result as the tool message's content: JSON the model reads."""
    body: dict[str, Any] = {"results": [hit.as_json() for hit in result.hits]}
    if not result.hits:
        body["note"] = "nothing compacted away matches; try other words"
    if result.partial:
        body["note"] = "the oldest part of the conversation was too large to search"
    return json.dumps(body, ensure_ascii=False)
