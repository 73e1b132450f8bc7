"""Issue 21 point 4, black-box: reasoning blocks survive a compaction, rendered in the runtime's format.

Through the real broker and Redis, with the extractive summarizer: a coding agent's
12-step tool loop with extended thinking (each assistant message: a signed thinking
block, then a tool_use; each user message: its tool_result) is published in Anthropic's
shape, compacted by a worker and rendered back with ``format="anthropic"``; the same
loop as Responses items (a reasoning item with ``encrypted_content`` before each
function_call) with ``format="responses"``. The rendered history must pass the rules the
providers document (:mod:`tests.formats.provider_rules`), keep the verbatim tail's
reasoning exactly as published, and keep every trace of reasoning out of the summary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.history import SUMMARY_HEADER
from compaction_worker.formats import anthropic, responses
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_event
from tests.formats.provider_rules import anthropic_problems, responses_problems
from tests.orchestration import make_settings

pytestmark = pytest.mark.integration

STEPS = 12
MODEL = "claude-sonnet-4-5"
TASK = "The test tests/test_parser.py::test_nested fails. Find the cause and fix it."


def source(step: int) -> str:
    """What the step's tool returned: a module of about 250 tokens."""
    return "\n".join(
        f"def handler_{step}_{i}(node):\n    return node.child({i})  # parser step {step}" for i in range(10)
    )


def anthropic_loop() -> list[dict[str, Any]]:
    """The Anthropic messages of the loop: the task, then 12 thinking + tool_use / tool_result steps."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for step in range(1, STEPS + 1):
        thinking: list[dict[str, Any]] = [
            {
                "type": "thinking",
                "thinking": f"THINK-{step}: the nesting bug may sit in module {step}; read it next.",
                "signature": f"SIG{step}-" + "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" * 2,
            }
        ]
        if step == STEPS - 1:
            thinking.append({"type": "redacted_thinking", "data": "REDACTED-EmwKAhgBEgy3va3pzix/LafPsn4a"})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    *thinking,
                    {
                        "type": "tool_use",
                        "id": f"toolu_{step:02d}",
                        "name": "read_file",
                        "input": {"path": f"src/parser/m{step}.py"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{step:02d}", "content": source(step)}
                ],
            }
        )
    return messages


def responses_loop() -> list[dict[str, Any]]:
    """The same loop as Responses items: a reasoning item before each function_call."""
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for step in range(1, STEPS + 1):
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{step:02d}",
                "summary": [{"type": "summary_text", "text": f"THINK-{step}: read module {step} next."}],
                "encrypted_content": f"ENC{step}-gAAAAABo" + "x9Kq2LmZ" * 8,
            },
            {
                "type": "function_call",
                "id": f"fc_{step:02d}",
                "call_id": f"call_{step:02d}",
                "name": "read_file",
                "arguments": json.dumps({"path": f"src/parser/m{step}.py"}),
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": f"call_{step:02d}", "output": source(step)},
        ]
    return items


async def publish_compact(client: Client, cid: str, turns: Sequence[list[dict[str, Any]]]) -> None:
    """Publish each turn's stored messages, force a compaction, wait for it."""
    for seq, messages in enumerate(turns, 1):
        await client.publish_turn(turn_event(cid, seq, messages, MODEL, context_window=200_000))
    await client.request_compaction(cid, len(turns) + 1, MODEL)
    await client.wait_for(cid)
    history = (await client.snapshot(cid)).history
    assert history.chunks, "the loop was not compacted"
    assert len(history.entries) < sum(map(len, turns)), "nothing left with the summary"


def as_blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def summary_text(texts: Sequence[str]) -> str:
    found = [t for t in texts if SUMMARY_HEADER in t]
    assert len(found) == 1, texts
    return found[0]


async def worker_settings(kafka_bootstrap: str, redis_url: str, make_topics: Any) -> Settings:
    topics = await make_topics("turn", "started", "completed", "dlq")
    settings = make_settings(kafka_bootstrap, redis_url, topics)
    assert settings.summarizer.model is None  # the extractive summarizer
    await ensure_topics(settings)
    return settings


async def test_anthropic_thinking_loop_compacted_and_rendered_back(
    kafka_bootstrap: str, redis_url: str, make_topics: Any
) -> None:
    """The rendered Anthropic history passes the extended-thinking tool-use rules; the tail's thinking is unchanged."""
    settings = await worker_settings(kafka_bootstrap, redis_url, make_topics)
    loop = anthropic_loop()
    # The runtime publishes each step as it happens: the task, then an assistant message and its result.
    turns = [anthropic.to_openai(loop[:1])] + [
        anthropic.to_openai(loop[i : i + 2]) for i in range(1, len(loop), 2)
    ]
    async with build_worker(settings).running(), Client.connect(settings) as client:
        await publish_compact(client, "thinking-loop", turns)
        system, messages = await client.messages("thinking-loop", format="anthropic")

    assert anthropic_problems(messages, loop) == []
    tail = [
        m
        for m in messages
        if isinstance(m["content"], list) and any(b.get("type") == "tool_use" for b in m["content"])
    ]
    assert len(tail) >= 2  # the verbatim tail holds several steps of the loop...
    assert all(m in loop for m in tail)  # ...each assistant message exactly as published
    assert messages[-2] == loop[-2]  # the last one, whose thinking the API checks, among them
    assert len(tail) < STEPS  # and the steps before them were summarized
    # The task and the summary turn make one user message (Anthropic's turns alternate): by block.
    texts = [b["text"] for m in messages for b in as_blocks(m["content"]) if b.get("type") == "text"]
    summary = summary_text(texts)
    for secret in ("THINK-", "SIG", "REDACTED-"):  # no reasoning text, signature or redacted data
        assert secret not in summary
    assert system is None


async def test_responses_reasoning_loop_compacted_and_rendered_back(
    kafka_bootstrap: str, redis_url: str, make_topics: Any
) -> None:
    """The rendered Responses items keep each tail call's reasoning item, encrypted content unchanged."""
    settings = await worker_settings(kafka_bootstrap, redis_url, make_topics)
    loop = responses_loop()
    turns = [responses.to_openai(loop[:1])] + [
        responses.to_openai(loop[i : i + 3]) for i in range(1, len(loop), 3)
    ]
    async with build_worker(settings).running(), Client.connect(settings) as client:
        await publish_compact(client, "reasoning-loop", turns)
        items = await client.messages("reasoning-loop", format="responses")

    assert responses_problems(items, loop) == []
    kept = [item for item in items if item.get("type") == "reasoning"]
    assert 2 <= len(kept) < STEPS
    assert items[-3:] == loop[-3:]  # the last step, reasoning and all, as published
    summary = summary_text([item["content"] for item in items if isinstance(item.get("content"), str)])
    for secret in ("THINK-", "ENC"):  # no reasoning summary or encrypted content
        assert secret not in summary
    assert items.index(kept[0]) > next(
        i for i, item in enumerate(items) if SUMMARY_HEADER in str(item.get("content"))
    )
