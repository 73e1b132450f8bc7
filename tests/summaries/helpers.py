"""Shared by the summarizer tests: the test counter, a short coding session, a LiteLLM summarizer on the fake server."""

from __future__ import annotations

import random
from typing import Any

from pydantic import SecretStr

from compaction_worker.retry import RetryPolicy
from compaction_worker.settings import SummarizerSettings
from compaction_worker.summaries.contract import SummaryRequest
from compaction_worker.summaries.llm import LiteLLMSummarizer
from compaction_worker.summaries.prompts import SECTIONS
from compaction_worker.testing import FakeLLMServer, WordCounter

count = WordCounter().text
"""The shared test counter's count of a text: its words."""

GOOD_SUMMARY = "\n".join(f"## {s}\n- noted" for s in SECTIONS)
"""A valid summary: every section, each with one line."""


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


def llm_settings(server: FakeLLMServer, **fields: Any) -> SummarizerSettings:
    """Settings that point the summarizer at the fake server."""
    values: dict[str, Any] = {
        "model": "openai/fake-summarizer",
        "api_base": server.url,
        "api_key": SecretStr("fake"),
        "timeout_seconds": 5,
    }
    return SummarizerSettings(**(values | fields))


class Sleeps:
    """An injectable sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def llm_retry(attempts: int = 3) -> RetryPolicy:
    """The summarizer's retries in these tests: ``attempts`` tries, waits under 0.5 s, 1 s, 2 s..."""
    return RetryPolicy(attempts=attempts, base_seconds=0.5, cap_seconds=8.0)


class Midpoint(random.Random):
    """A jitter source that always picks the middle of the range: waits are half their ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def summarizer(
    server: FakeLLMServer, sleeps: Sleeps | None = None, *, attempts: int = 3, **fields: Any
) -> LiteLLMSummarizer:
    """A LiteLLMSummarizer against the fake server: ``attempts`` tries per model, recorded sleeps, fixed jitter."""
    return LiteLLMSummarizer(
        llm_settings(server, **fields),
        count,
        retry=llm_retry(attempts),
        sleep=sleeps or Sleeps(),
        rng=Midpoint(),
    )


def user_text(body: dict[str, Any]) -> str:
    """The user message of a request the fake server received."""
    content: str = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return content
