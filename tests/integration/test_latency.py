"""No head-of-line blocking (docs/design.md, invariant 7): a slow LLM call never holds up other turns on its partition.

A real worker (one consumer) reads a one-partition turns topic from the real broker. While
conversation X's compaction waits on an LLM that takes 5 s per call, turns of
conversations Y and Z, which share that one partition, are stored within a fraction of
that time, one by one, each measured from its publication to its appearance in Redis.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import TYPE_CHECKING

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, TurnEvent
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import FakeLLMServer

from .helpers import coverage_problems, poll_until, read_topic, worker_settings

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

LLM_DELAY = 5.0
MAX_LATENCY = 2.5
"""Seconds from publication to storage: half the LLM's delay, so a turn that waited for it fails."""
WINDOW = 2048
X_TURNS = 16
"""Turns that take conversation X over its threshold (window 2048) and so start its compaction."""
OTHER_TURNS = 6
"""Turns of each other conversation published while X's compaction runs."""


def small_turn(cid: str, seq: int) -> TurnEvent:
    role = "user" if seq % 2 else "assistant"
    return TurnEvent.model_validate(
        {
            "conversation_id": cid,
            "turn_seq": seq,
            "model": "gpt-4o-mini",
            "context_window": WINDOW,
            "messages": [{"role": role, "content": f"{role} turn {seq} of {cid}: short and to the point."}],
        }
    )


async def test_turns_of_other_conversations_do_not_wait_for_a_slow_compaction(
    kafka_bootstrap: str, redis_url: str, make_topics: MakeTopics, fake_llm: FakeLLMServer
) -> None:
    """Y's and Z's turns on X's partition are stored in well under the 5 s X's LLM call takes; X then completes."""
    fake_llm.set_delay(LLM_DELAY)
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=1)
    settings = worker_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        kafka={"consumers": 1},
        summarizer={"model": "openai/fake-summarizer", "api_base": fake_llm.url, "api_key": "fake-0123"},
    )
    x, others = "conv-x", ("conv-y", "conv-z")
    x_events = synthetic_turns(x, X_TURNS, context_window=WINDOW, tool_output_words=(20, 40))
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:

        async def stored(event: TurnEvent) -> float:
            """Publish one turn; the seconds until Redis shows it."""

            async def visible() -> bool:
                return (await client.meta(event.conversation_id)).last_seq >= event.turn_seq

            start = time.monotonic()
            await client.publish_turn(event)
            await poll_until(visible, 30, f"turn {event.turn_seq} of {event.conversation_id} stored", 0.005)
            return time.monotonic() - start

        # For comparison: the same path with no compaction anywhere (after the group join,
        # which the first turn waits for).
        baseline = [await stored(small_turn("conv-w", seq)) for seq in range(1, OTHER_TURNS + 2)][1:]

        async def llm_idle() -> bool:  # no call of an earlier test's workers still counts
            return fake_llm.in_flight == 0

        async def x_compaction_in_llm_call() -> bool:
            return fake_llm.in_flight > 0

        await poll_until(llm_idle, 30, "the fake LLM idle")
        for event in x_events:
            await client.publish_turn(event)

        await poll_until(x_compaction_in_llm_call, 60, "X's compaction calling the LLM", interval=0.01)
        call_began = time.monotonic()
        assert await client.store.redis.exists(client.store.keys(x).lock)  # X's compaction holds its lock

        latencies: dict[str, list[float]] = {cid: [] for cid in (*others, x)}
        for seq in range(1, OTHER_TURNS + 1):  # Y's and Z's turns in parallel, each in order
            for cid, took in zip(
                others, await asyncio.gather(*(stored(small_turn(c, seq)) for c in others)), strict=True
            ):
                latencies[cid].append(took)
        # One more turn of X itself, appended while its compaction runs: it must survive the commit.
        x_extra = synthetic_turns(x, X_TURNS + 1, context_window=WINDOW, tool_output_words=(20, 40))[-1]
        latencies[x].append(await stored(x_extra))
        measured_within = time.monotonic() - call_began
        in_flight_after = fake_llm.in_flight

        every = [t for ts in latencies.values() for t in ts]
        print(
            f"\nturn latency while X's {LLM_DELAY:.0f}s LLM call ran ({len(every)} turns in "
            f"{measured_within:.2f}s): max {max(every) * 1000:.0f} ms, median "
            f"{statistics.median(every) * 1000:.0f} ms"
        )
        print(f"  no compaction running (conv-w): {', '.join(f'{t * 1000:.0f}' for t in baseline)} ms")
        for cid, ts in latencies.items():
            print(f"  {cid}: {', '.join(f'{t * 1000:.0f}' for t in ts)} ms")
        assert max(every) < MAX_LATENCY, latencies
        # All of that happened while X's call was still under way.
        assert in_flight_after == 1
        assert (await client.meta(x)).version == 0

        # X's compaction completes afterwards, slow as its LLM is, keeping the turn appended meanwhile.
        async def x_compacted() -> bool:
            return (await client.meta(x)).version == 1

        await poll_until(x_compacted, 30, "X compacted")
        completed = [
            CompactionCompleted.model_validate_json(raw)
            for raw in await read_topic(settings, settings.topics.completed, idle=1.0)
        ]
        (done,) = [c for c in completed if c.conversation_id == x]
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.summarizer_model == "openai/fake-summarizer"
        assert done.duration_ms >= LLM_DELAY * 1000
        assert [c.conversation_id for c in completed] == [x]  # Y and Z never needed one
        snapshot = await client.snapshot(x)
        transcript = await client.transcript(x)
        assert coverage_problems(snapshot.history, len(transcript)) == []
        assert snapshot.history.entries[-1].seq == X_TURNS + 1
        for cid in others:
            assert [r["seq"] for r in await client.transcript(cid)] == list(range(1, OTHER_TURNS + 1))
