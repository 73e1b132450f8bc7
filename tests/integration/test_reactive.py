"""Reactive compaction through the real worker: a provider's overflow error in, a smaller history out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.budget.tokens import budget_for, calibrate, counter_for
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionMode,
    CompactionRequest,
    CompactionStarted,
    Outcome,
    Trigger,
    TurnEvent,
)
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import Worker
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer, provider_overflow_error, turn_event
from tests.orchestration import fake_summarizer, fresh_topics, make_settings, running_worker

from .helpers import coverage_problems, settle

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
WINDOW = 8000
MAX_OUTPUT = 500
PROVIDER_MAX = 4096
"""The window the provider enforces: smaller than the configured one (a wrong override)."""
RATIO = 1.5
"""The provider's tokenizer counts this many tokens per token of our estimate."""
GROW_TO = 3000
"""Estimated tokens to grow to: under the normal target (3750), so an estimate-only
pipeline would call the history "already under the target"; over PROVIDER_MAX / RATIO."""
ROLES = ("assistant", "user")


def _openai(actual: int) -> str:
    return str(provider_overflow_error("openai", actual, PROVIDER_MAX)[1]["error"]["message"])


def _anthropic(actual: int) -> str:
    # As a runtime gets it from LiteLLM: the exception text around the provider's JSON body.
    body = provider_overflow_error("anthropic", actual, PROVIDER_MAX)[1]
    return f"litellm.BadRequestError: AnthropicException - {json.dumps(body)}"


def _gemini(actual: int) -> str:
    return str(provider_overflow_error("gemini", actual, PROVIDER_MAX)[1]["error"]["message"])


def _bedrock(actual: int) -> str:
    # Bedrock's InvokeModel text states no numbers at all.
    return (
        "An error occurred (ValidationException) when calling the InvokeModel operation: "
        "Input is too long for requested model."
    )


PROVIDERS = {"openai": _openai, "anthropic": _anthropic, "gemini": _gemini, "bedrock": _bedrock}


@dataclass
class Events:
    """Every record of the output topics, collected from the start by one consumer."""

    records: dict[str, list[bytes]] = field(default_factory=dict)

    def of(self, topic: str) -> list[bytes]:
        return self.records.get(topic, [])

    async def collect(self, settings: Settings, topics: list[str], ready: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=settings.kafka.bootstrap_servers,
            group_id=f"reader-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        ready.set()
        try:
            while True:
                for tp, batch in (await consumer.getmany(timeout_ms=200)).items():
                    self.records.setdefault(tp.topic, []).extend(r.value for r in batch if r.value)
        finally:
            await consumer.stop()


@dataclass
class Running:
    """The module's worker, its client and settings, and the events it published."""

    worker: Worker
    client: Client
    settings: Settings
    events: Events

    async def completed(self, cid: str, count: int) -> list[CompactionCompleted]:
        """The conversation's completion events, once there are ``count`` of them."""
        for _ in range(150):
            found = [
                e
                for e in map(
                    CompactionCompleted.model_validate_json, self.events.of(self.settings.topics.completed)
                )
                if e.conversation_id == cid
            ]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.2)
        raise AssertionError(f"{cid}: {count} compaction.completed events never arrived")

    def started(self, cid: str) -> list[CompactionStarted]:
        events = map(CompactionStarted.model_validate_json, self.events.of(self.settings.topics.started))
        return [e for e in events if e.conversation_id == cid]


@pytest.fixture(scope="module")
async def running(
    kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer
) -> AsyncIterator[Running]:
    """One worker for the module (starting one per case would dominate the run), on its own topics."""
    topics = fresh_topics()
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm_server),
    )
    await ensure_topics(settings)
    events = Events()
    ready = asyncio.Event()
    collector = asyncio.create_task(events.collect(settings, topics[1:], ready))
    await asyncio.wait_for(ready.wait(), timeout=30)
    try:
        async with running_worker(settings) as (worker, client):
            yield Running(worker, client, settings, events)
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector


def _turn(cid: str, seq: int, role: str | None = None, **fields: Any) -> TurnEvent:
    """Turn ``seq`` of ``cid``: 40 words of ``role``'s (no role: no message), the first with a system prompt."""
    words = " ".join(f"{role}{seq}-word{i}" for i in range(40))
    messages = [] if role is None else [{"role": role, "content": f"turn {seq}: {words}"}]
    if seq == 1:
        fields.setdefault("system_prompt", "You are a careful assistant.")
    return turn_event(
        cid, seq, messages, MODEL, context_window=WINDOW, max_output_tokens=MAX_OUTPUT, **fields
    )


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_overflow_turn_compacts_to_the_reactive_target(
    running: Running, fake_llm: FakeLLMServer, provider: str
) -> None:
    """References 002, 003 and 004 (reactive compaction): an overflow turn under the normal target still compacts, to the target the error implies, and turns go on."""
    worker, client, settings = running.worker, running.client, running.settings
    _, budget = budget_for(MODEL, settings.budget, WINDOW, MAX_OUTPUT)
    cid = f"reactive-{provider}-{uuid.uuid4().hex[:6]}"
    handled = worker.handled
    # Our own count says how many turns make GROW_TO, so they go out in one batch.
    counter = counter_for(MODEL, settings.budget)
    seq, total = 0, 0
    while total < GROW_TO:
        seq += 1
        event = _turn(cid, seq, ROLES[seq % 2])
        if event.system_prompt:
            total += counter.text(event.system_prompt) + settings.budget.message_overhead_tokens
        total += sum(counter.message(m.to_dict()) for m in event.messages)
        await client.publish_turn(event)
    await settle([worker], handled + seq)
    grown = await client.meta(cid)
    assert grown.total_tokens < budget.target < budget.threshold  # nothing would compact it
    assert (grown.version, await client.job(cid)) == (0, None)

    estimate = grown.total_tokens
    actual = int(estimate * RATIO)
    error = PROVIDERS[provider](actual)
    overflow = detect_overflow(error)
    assert overflow is not None
    has_numbers = overflow.max_tokens is not None
    assert has_numbers == (provider != "bedrock")
    seq += 1
    request = CompactionRequest(mode=CompactionMode.OVERFLOW, error=error)
    await client.publish_turn(_turn(cid, seq, compaction=request))
    await settle([worker], handled + seq)

    (done,) = await running.completed(cid, 1)
    (begun,) = running.started(cid)
    assert (done.trigger, done.outcome) == (Trigger.REACTIVE, Outcome.COMPACTED), done.error
    assert fake_llm.requests, "the LLM summarizer was never called"
    # A stated maximum becomes the conversation's window: the reactive target is the smaller
    # window's budget aimed lower still.
    _, narrowed = budget_for(MODEL, settings.budget, WINDOW, MAX_OUTPUT, PROVIDER_MAX)
    expected_target = narrowed.reactive_target(PROVIDER_MAX) if has_numbers else budget.target
    assert begun.target == done.target == expected_target
    assert done.tokens_after <= expected_target
    assert done.tokens_after < done.tokens_before
    assert done.stage_savings["summarize"] > 0
    after = await client.meta(cid)
    if has_numbers:
        assert expected_target < budget.target
        # Reported in the provider's units: the rejected prompt's own count.
        assert abs(done.tokens_before - actual) <= 1
        assert after.calibration == pytest.approx(calibrate(1.0, estimate, actual))
        # What the provider would count now (by the observed ratio) is under the target.
        assert after.total_tokens * RATIO <= expected_target
    else:
        assert after.calibration == 1.0
        assert done.tokens_before == estimate < expected_target  # the estimate alone would not compact
        assert after.total_tokens <= expected_target
    assert after.version == done.version == 1

    # The overflow turn had no messages: roles go on from the last message's.
    for role in [ROLES[seq % 2], ROLES[(seq + 1) % 2]] * 2:
        seq += 1
        await client.publish_turn(_turn(cid, seq, role))
    await settle([worker], handled + seq)
    final = await client.snapshot(cid)
    assert final.meta.last_seq == seq
    transcript = await client.transcript(cid)
    assert [r["seq"] for r in transcript][-4:] == list(range(seq - 3, seq + 1))
    assert [e.seq for e in final.history.entries][-4:] == list(range(seq - 3, seq + 1))
    assert coverage_problems(final.history, len(transcript)) == []
    assert final.meta.version == 1  # the next turns needed no further compaction
    assert running.events.of(settings.topics.dlq) == []
