"""Shared inputs for the summarizer tests: a deterministic counter and a short coding session."""

from __future__ import annotations

import re
from typing import Any

from compaction_worker.summaries.llm import SummaryRequest

_PIECES = re.compile(r"\w+|[^\w\s]")


def count(text: str) -> int:
    """A simple deterministic token counter: words and punctuation marks."""
    return len(_PIECES.findall(text))


def request(messages: list[dict[str, Any]] | None = None, **fields: Any) -> SummaryRequest:
    """A summary request over ``messages`` (a short coding session by default)."""
    return SummaryRequest(conversation_id="conv-1", messages=messages or SESSION, **fields)


SESSION: list[dict[str, Any]] = [
    {"role": "user", "content": "Add a /health endpoint to src/api/app.py. Keep it dependency-free."},
    {
        "role": "assistant",
        "content": "I will add the route to the existing FastAPI app because it already has a router.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "run", "arguments": '{"command": "pytest -q tests/test_app.py"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "FAILED tests/test_app.py::test_health - AssertionError: 404 != 200\n1 failed",
    },
    {"role": "assistant", "content": "The test fails with 404 because the route is missing. I added it."},
    {"role": "user", "content": "Now also document it in docs/api.md please."},
]
