"""Issue 20, one failure policy: the model's breaker shared by conversations and workers, the
compactions' backoff, and a non-commit event that is published again when its job runs again."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import redis.asyncio

from compaction_worker import retry
from compaction_worker.contracts.events import CompactionCompleted, LlmUsage, Outcome
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.components import Components
from compaction_worker.settings import Settings
from compaction_worker.summaries.contract import SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.testing import turn_bytes
from tests.orchestration import (
    Parts,
    Published,
    assistant,
    compact_now,
    compactor_with,
    connect,
    make_parts,
    user,
)

pytestmark = pytest.mark.integration


class Down:
    """An LLM summarizer whose provider is down; counts the calls it gets."""

    name = "provider/model"

    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.calls += 1
        raise SummarizerError("provider unavailable (HTTP 503)", usage=LlmUsage(calls=1))


async def chat(parts: Components, cid: str, turns: int = 24) -> None:
    for seq in range(1, turns + 1):
        text = f"question {seq}: " + "detail " * 60 if seq % 2 else f"answer {seq}: " + "because " * 60
        message = user(text) if seq % 2 else assistant(text)
        await parts.turns.handle(turn_bytes(cid, seq, [message], context_window=2048), cid.encode())


async def forced(parts: Components, compactor: Compactor, cid: str, seq: int) -> CompactionCompleted:
    turn = turn_bytes(cid, seq, [user(f"more {seq} " + "detail " * 80)], compaction={"mode": "force"})
    await parts.turns.handle(turn, cid.encode())
    return await compact_now(parts.jobs, compactor, cid)


async def test_an_outage_opens_the_model_s_breaker_for_every_conversation_and_worker(
    redis_client: redis.asyncio.Redis, redis_url: str, settings: Settings, published: Published
) -> None:
    """Conversation A's failed runs on worker 1 open the model's breaker; conversation B on worker 2
    then skips the LLM at once, without a failure of its own."""
    settings.summarizer.breaker_failures = 2
    settings.tail.max_messages = 2
    other = connect(redis_url)
    try:
        one, two = make_parts(redis_client, settings, published), make_parts(other, settings, published)
        down_one, down_two = Down(), Down()
        worker_one = compactor_with(one, published, lambda _m, c: [down_one, ExtractiveSummarizer(c.text)])
        worker_two = compactor_with(two, published, lambda _m, c: [down_two, ExtractiveSummarizer(c.text)])
        await chat(one, "a")
        await chat(two, "b")

        runs_a = [await forced(one, worker_one, "a", seq) for seq in (25, 26)]
        assert [(r.outcome, r.llm_failures, r.circuit_open) for r in runs_a] == [
            (Outcome.COMPACTED, 1, False),
            (Outcome.COMPACTED, 2, False),
        ]
        assert down_one.calls == 2

        run_b = await forced(two, worker_two, "b", 25)
        assert (run_b.outcome, run_b.circuit_open, run_b.llm_failures) == (Outcome.COMPACTED, True, 2)
        assert run_b.summarizer_model == "extractive"
        assert down_two.calls == 0  # B never waited for the provider
        assert (await worker_two.breaker.peek("provider/model")).open
    finally:
        await other.aclose()


async def test_a_failed_run_backs_off_with_the_compactions_policy(
    parts: Parts, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Full jitter under a doubling, capped ceiling (``retry.compactions``), counted in the conversation's meta."""
    settings.retry.base_seconds, settings.retry.cap_seconds = 100.0, 150.0
    monkeypatch.setattr(retry, "_RNG", random.Random(11))
    twin = random.Random(11)

    async def broken(*_args: Any) -> Any:
        raise RuntimeError("the store is broken")

    monkeypatch.setattr(parts.store, "originals", broken)
    await chat(parts, "c")
    for failures, ceiling in ((1, 100.0), (2, 150.0)):
        before = time.time()
        done = await (
            compact_now(parts.jobs, parts.compactor)
            if failures == 1
            else forced(parts, parts.compactor, "c", 25)
        )
        after = time.time()
        assert (done.outcome, done.error) == (Outcome.FAILED, "RuntimeError: the store is broken")
        meta = await parts.store.meta("c")
        assert meta.failures == failures
        wait = twin.uniform(0.0, ceiling)
        assert before + wait <= meta.retry_after <= after + wait


class FailsOnce(Published):
    """A publisher whose first ``compaction.completed`` does not go out (the broker is away)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        if topic == "compaction.completed" and not self.failed:
            self.failed = True
            raise ConnectionError("broker unavailable")
        await super().__call__(topic, payload, key)


@pytest.mark.parametrize("outcome", [Outcome.NOOP, Outcome.FAILED])
async def test_a_non_commit_event_that_is_not_published_is_published_when_the_job_runs_again(
    redis_client: redis.asyncio.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, outcome: Outcome
) -> None:
    """docs/design.md, "The outbox": a no-op's or a failure's event is published before the job is
    finished, so a publish that fails leaves the job pending, and its next run publishes one."""
    published = FailsOnce()
    parts = make_parts(redis_client, settings, published)
    if outcome is Outcome.NOOP:  # the system prompt alone is over the target: nothing can shrink
        turn = turn_bytes("c", 1, [user("hi")], system_prompt="rule " * 900, context_window=1024)
        await parts.turns.handle(turn, b"c")
    else:

        async def broken(*_args: Any) -> Any:
            raise RuntimeError("the store is broken")

        monkeypatch.setattr(parts.store, "originals", broken)
        await chat(parts, "c")

    async def run_once() -> None:
        async with parts.jobs.claim("c") as claim:
            assert claim is not None
            await parts.compactor.run(claim)

    with pytest.raises(ConnectionError):
        await run_once()
    assert published.on("compaction.completed") == []
    first = await parts.jobs.job("c")
    assert first is not None  # not finished: the claim hands it back (its lock is free again)

    done = await compact_now(parts.jobs, parts.compactor)
    (event,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
    assert event.compaction_id == done.compaction_id
    assert done.outcome is outcome
    # The job is finished; after a failure a new one waits out the backoff (still over the threshold).
    after = await parts.jobs.job("c")
    assert after is None if outcome is Outcome.NOOP else (after is not None and after.id != first.id)
