"""The per-turn path against real Redis: append, duplicates, gaps, budget checks, dead letters."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.events import (
    DeadLetter,
    Trigger,
)
from compaction_worker.settings import Settings
from compaction_worker.turns import TurnStatus
from tests.orchestration import Published, assistant, raw, user

pytestmark = pytest.mark.integration

BAD_INPUTS = [
    (b"{not json", "malformed_json"),
    (b"\xff\xfe", "malformed_json"),
    (b"[1, 2]", "schema_violation"),
    (
        json.dumps({"conversation_id": "c", "turn_seq": 0, "model": "gpt-4o", "messages": []}).encode(),
        "schema_violation",
    ),
    (
        json.dumps(
            {
                "conversation_id": "c",
                "turn_seq": 1,
                "model": "gpt-4o",
                "messages": [{"role": "tool", "content": "x"}],
            }
        ).encode(),
        "schema_violation",
    ),
    (b"x" * 20000, "oversized"),
]


class TestTurns:
    @pytest.mark.parametrize(("payload", "reason"), BAD_INPUTS)
    async def test_bad_input_is_dead_lettered_with_original_bytes(
        self, parts: Any, published: Published, redis_client: redis.asyncio.Redis, payload: bytes, reason: str
    ) -> None:
        """Bad input becomes a DLQ record with its reason and original bytes; nothing is stored."""
        turns, *_ = parts
        outcome = await turns.handle(payload, b"c", 3, 42)
        assert outcome.status is TurnStatus.DEAD_LETTERED
        (record,) = published.on("conversation.turn.dlq")
        letter = DeadLetter.model_validate(record)
        assert (letter.reason.value, letter.partition, letter.offset) == (reason, 3, 42)
        assert base64.b64decode(letter.original_b64) == payload
        assert await redis_client.keys("*") == []

    async def test_key_must_be_the_conversation_id(self, parts: Any, published: Published) -> None:
        """An event keyed by something else would lose its ordering; it is dead-lettered."""
        turns, *_ = parts
        outcome = await turns.handle(raw("c", 1, user("hi")), b"other")
        assert outcome.reason == "key_mismatch"

    async def test_duplicate_changes_nothing(self, parts: Any) -> None:
        """A redelivered turn is recognised and stores nothing (invariant 2)."""
        turns, _, store, _ = parts
        assert (await turns.handle(raw("c", 1, user("hi")), b"c")).status is TurnStatus.APPENDED
        before = await store.meta("c")
        assert (await turns.handle(raw("c", 1, user("hi")), b"c")).status is TurnStatus.DUPLICATE
        assert await store.meta("c") == before

    async def test_gap_is_held_until_filled_then_applied_in_order(self, parts: Any) -> None:
        """Turns ahead of a gap wait; the missing turn releases them in order."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("one")), b"c")
        assert (await turns.handle(raw("c", 3, user("three")), b"c")).status is TurnStatus.BUFFERED
        assert (await turns.handle(raw("c", 4, assistant("four")), b"c")).status is TurnStatus.BUFFERED
        assert (await store.meta("c")).last_seq == 1
        await turns.handle(raw("c", 2, assistant("two")), b"c")
        assert [r["m"]["content"] for r in await store.transcript("c")] == ["one", "two", "three", "four"]
        assert await store.pending_seqs("c") == []

    async def test_threshold_schedules_a_job(self, parts: Any) -> None:
        """References 000-004 (the automatic trigger): crossing the hard threshold records a threshold job."""
        turns, _, store, jobs = parts
        outcome = await turns.handle(raw("c", 1, user("word " * 900), context_window=1024), b"c")
        assert outcome.scheduled is Trigger.THRESHOLD
        assert (await store.job("c")).trigger is Trigger.THRESHOLD
        assert await jobs.due(5) == ["c"]

    async def test_soft_threshold(self, parts: Any, settings: Settings) -> None:
        """DESIGN "Budget", instead of references 000 (waiting) and 004 (warnings): between the soft and hard thresholds a background (soft) job is recorded."""
        turns, *_ = parts
        settings.budget.soft_trigger_fraction = 0.3
        outcome = await turns.handle(raw("c", 1, user("word " * 700), context_window=2048), b"c")
        assert outcome.scheduled is Trigger.SOFT_THRESHOLD

    async def test_manual_and_reactive_requests(self, parts: Any) -> None:
        """References 000 and 002 (manual /compact, reactive compaction): a turn's compaction request is recorded with the turn, reactive with its error."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hi"), compaction={"mode": "force"}), b"c")
        assert (await store.job("c")).trigger is Trigger.MANUAL
        err = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
        await turns.handle(raw("c", 2, compaction={"mode": "overflow", "error": err}), b"c")
        job = await store.job("c")
        assert (job.trigger, job.error) == (Trigger.REACTIVE, err)

    async def test_automatic_compaction_can_be_switched_off(self, parts: Any, settings: Settings) -> None:
        """Reference 004 (``enabled``, the master switch): off, a crossed threshold schedules nothing; a manual request still does."""
        turns, _, store, _ = parts
        settings.budget.auto_compact = False
        outcome = await turns.handle(raw("c", 1, user("word " * 900), context_window=1024), b"c")
        assert outcome.scheduled is None
        assert await store.job("c") is None
        await turns.handle(
            raw("c", 2, assistant("ok"), compaction={"mode": "force"}, context_window=1024), b"c"
        )
        assert (await store.job("c")).trigger is Trigger.MANUAL

    async def test_the_request_framing_counts_once(self, parts: Any, settings: Settings) -> None:
        """Reference 004 (TOKENS_PER_CONVERSATION, 24): a conversation-level overhead is part of the fixed tokens."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hi")), b"c")
        meta = await store.meta("c")
        assert meta.overhead_tokens == settings.budget.conversation_overhead_tokens == 24
        assert meta.total_tokens == meta.history_tokens + meta.system_tokens + meta.tools_tokens + 24

    async def test_a_stated_maximum_below_the_window_becomes_the_window(self, parts: Any) -> None:
        """Reference 004 (reactive): the provider's stated maximum caps the window for every later budget check."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hi"), context_window=128_000), b"c")
        before = await store.meta("c")
        assert (before.window, before.observed_window) == (128_000, None)
        err = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
        await turns.handle(
            raw("c", 2, compaction={"mode": "overflow", "error": err}, context_window=128_000), b"c"
        )
        after = await store.meta("c")
        assert (after.window, after.observed_window) == (8192, 8192)
        assert after.threshold < before.threshold
        # Later turns, even ones that still claim the larger window, keep the provider's word.
        await turns.handle(raw("c", 3, assistant("ok"), context_window=128_000), b"c")
        assert (await store.meta("c")).window == 8192
        # A larger stated maximum does not raise it again; an error without numbers changes nothing.
        big = err.replace("8192", "16384")
        await turns.handle(raw("c", 4, compaction={"mode": "overflow", "error": big}), b"c")
        await turns.handle(raw("c", 5, compaction={"mode": "overflow", "error": "prompt is too long"}), b"c")
        assert (await store.meta("c")).window == 8192

    async def test_calibration_follows_reported_usage(self, parts: Any) -> None:
        """Reference 003 (estimates close to the provider's count): provider-reported prompt tokens move the calibration factor."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hello " * 100)), b"c")
        estimate = (await store.meta("c")).total_tokens
        await turns.handle(raw("c", 2, assistant("ok"), usage={"prompt_tokens": estimate * 2}), b"c")
        assert (await store.meta("c")).calibration > 1.2

    async def test_system_prompt_and_tool_schemas_count_toward_the_threshold(self, parts: Any) -> None:
        """References 000 (context meter), 001 and 004 (budget checker): the system prompt and tool schemas count toward the threshold."""
        turns, _, store, _ = parts
        message = user("word " * 300)  # well under the 768-token threshold of a 1,024-token window
        schema = {"type": "function", "function": {"name": "search", "description": "word " * 600}}
        alone = await turns.handle(raw("alone", 1, message, context_window=1024), b"alone")
        tools = await turns.handle(raw("tools", 1, message, tools=[schema], context_window=1024), b"tools")
        prompt = await turns.handle(
            raw("prompt", 1, message, system_prompt="rule " * 600, context_window=1024), b"prompt"
        )
        assert alone.scheduled is None
        assert tools.scheduled is prompt.scheduled is Trigger.THRESHOLD
        meta = await store.meta("tools")
        assert meta.total_tokens == meta.history_tokens + meta.tools_tokens + meta.overhead_tokens
        assert meta.history_tokens < meta.threshold < meta.total_tokens
