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
        """Crossing the hard threshold records a threshold job."""
        turns, _, store, jobs = parts
        outcome = await turns.handle(raw("c", 1, user("word " * 900), context_window=1024), b"c")
        assert outcome.scheduled is Trigger.THRESHOLD
        assert (await store.job("c")).trigger is Trigger.THRESHOLD
        assert await jobs.due(5) == ["c"]

    async def test_soft_threshold(self, parts: Any, settings: Settings) -> None:
        """Between the soft and hard thresholds a background (soft) job is recorded."""
        turns, *_ = parts
        settings.budget.soft_trigger_fraction = 0.3
        outcome = await turns.handle(raw("c", 1, user("word " * 700), context_window=2048), b"c")
        assert outcome.scheduled is Trigger.SOFT_THRESHOLD

    async def test_manual_and_reactive_requests(self, parts: Any) -> None:
        """A turn's compaction request is recorded with the turn, reactive with its error."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hi"), compaction={"mode": "force"}), b"c")
        assert (await store.job("c")).trigger is Trigger.MANUAL
        err = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
        await turns.handle(raw("c", 2, compaction={"mode": "overflow", "error": err}), b"c")
        job = await store.job("c")
        assert (job.trigger, job.error) == (Trigger.REACTIVE, err)

    async def test_calibration_follows_reported_usage(self, parts: Any) -> None:
        """Provider-reported prompt tokens move the calibration factor."""
        turns, _, store, _ = parts
        await turns.handle(raw("c", 1, user("hello " * 100)), b"c")
        estimate = (await store.meta("c")).total_tokens
        await turns.handle(raw("c", 2, assistant("ok"), usage={"prompt_tokens": estimate * 2}), b"c")
        assert (await store.meta("c")).calibration > 1.2
