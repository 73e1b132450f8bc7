"""A worker with an LLM summarizer set consumes turns without importing LiteLLM (issue 54).

A new worker under a backlog shared its CPU with LiteLLM's import (seconds) that no turn needs.
The worker runs in a process of its own, on the real broker and Redis, so that ``sys.modules``
says what its turns and its first compaction imported: a future import on the turn path fails here.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import fake_summarizer, make_settings

from .processes import settings_env

pytestmark = pytest.mark.integration

MODELS = (
    "gpt-4o-mini",
    "anthropic/claude-3-5-sonnet-20241022",
    "openrouter/openai/gpt-4.1",
    "gemini/gemini-1.5-pro",
)
"""Models of several providers: each turn's budget counts its tokens and looks up its window."""

_WORKER = """
import asyncio, sys
from compaction_worker.client.client import Client
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings

async def until(done):
    while not done():
        await asyncio.sleep(0.05)

async def main():
    settings = Settings()
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        turns = [t for i, m in enumerate(MODELS) for t in synthetic_turns(f"cold-{i}", 12, model=m, seed=i)]
        for turn in turns:
            await client.publish_turn(turn)
        await asyncio.wait_for(until(lambda: worker.handled >= len(turns)), 120)
        print("turns", worker.handled, "litellm" in sys.modules)
        await client.request_compaction("cold-0", 13, MODELS[0])
        await asyncio.wait_for(until(lambda: worker.pool.completed + worker.pool.failed >= 1), 120)
        print("compaction", worker.pool.completed, "litellm" in sys.modules)

asyncio.run(main())
"""


async def test_turns_import_no_litellm_until_a_summary_is_due(
    kafka_bootstrap: str, redis_url: str, make_topics: object, fake_llm: FakeLLMServer
) -> None:
    """48 turns of four providers' models are stored with LiteLLM not imported; a manual compaction
    then imports it and summarizes through it."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=2)  # type: ignore[operator]
    settings = make_settings(kafka_bootstrap, redis_url, topics, summarizer=fake_summarizer(fake_llm))
    await ensure_topics(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    env.update(settings_env(settings))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"MODELS = {MODELS!r}\n{_WORKER}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(child.communicate(), 300)
    log = err.decode(errors="replace")[-3000:]

    assert child.returncode == 0, log
    assert out.decode().splitlines() == ["turns 48 False", "compaction 1 True"], log
    assert fake_llm.requests, "the compaction did not summarize through LiteLLM"
