"""No head-of-line blocking (docs/design.md, invariant 7): a slow LLM call never holds up other turns on its partition.

A real worker (one consumer) reads a one-partition turns topic from the real broker. While
conversation X's compaction is held inside its LLM call (the fake LLM answers only when the
test lets it), turns of conversations Y and Z, which share that one partition, are stored,
one by one: a turn that waited for X's call would never be. Each one's latency, from its
publication to its appearance in Redis, is printed.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, TurnEvent
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import FakeLLMServer, default_summary, turn_event
from tests.orchestration import make_settings

from .helpers import coverage_problems, poll_until, read_topic

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

WINDOW = 2048
X_TURNS = 16
"""Turns that take conversation X over its threshold (window 2048) and so start its compaction."""
OTHER_TURNS = 6
"""Turns of each other conversation published while X's compaction runs."""


def small_turn(cid: str, seq: int) -> TurnEvent:
    """A one-line turn of ``cid``: a user's when ``seq`` is odd, else an assistant's."""
    role = "user" if seq % 2 else "assistant"
    message = {"role": role, "content": f"{role} turn {seq} of {cid}: short and to the point."}
    return turn_event(cid, seq, [message], context_window=WINDOW)


async def test_turns_of_other_conversations_do_not_wait_for_a_slow_compaction(
    kafka_bootstrap: str, redis_url: str, make_topics: MakeTopics, fake_llm: FakeLLMServer
) -> None:
    """Y's and Z's turns on X's partition are stored while X's LLM call is held; X then completes."""
    answer = threading.Event()

    def held(body: dict[str, Any]) -> str:
        # On the fake LLM's own thread: the call stays in flight until the test answers it.
        assert answer.wait(timeout=120), "the test never let the LLM answer"
        return default_summary(body)

    fake_llm.set_responder(held)
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=1)
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        kafka={"consumers": 1},
        # A held call must not time out (and be tried again) on a slow machine.
        summarizer={
            "model": "openai/fake-summarizer",
            "api_base": fake_llm.url,
            "api_key": "fake-0123",
            "timeout_seconds": 180,
        },
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

        try:
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
                f"\nturn latency while X's LLM call was held ({len(every)} turns in "
                f"{measured_within:.2f}s): max {max(every) * 1000:.0f} ms, median "
                f"{statistics.median(every) * 1000:.0f} ms"
            )
            print(f"  no compaction running (conv-w): {', '.join(f'{t * 1000:.0f}' for t in baseline)} ms")
            for cid, ts in latencies.items():
                print(f"  {cid}: {', '.join(f'{t * 1000:.0f}' for t in ts)} ms")
            # All of that happened while X's call was still under way.
            assert in_flight_after == 1
            assert (await client.meta(x)).version == 0

            held_for = time.monotonic() - call_began
        finally:
            answer.set()  # also when failing: never leave the shared fake LLM's thread blocked

        async def x_compacted() -> bool:
            return (await client.meta(x)).version == 1

        # X's compaction completes once its LLM answers, keeping the turn appended meanwhile.
        await poll_until(x_compacted, 30, "X compacted")
        completed = [
            CompactionCompleted.model_validate_json(raw)
            for raw in await read_topic(settings, settings.topics.completed, idle=1.0)
        ]
        (done,) = [c for c in completed if c.conversation_id == x]
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.summarizer_model == "openai/fake-summarizer"
        assert done.duration_ms >= int(held_for * 1000)  # it began before the call, ended after it
        assert [c.conversation_id for c in completed] == [x]  # Y and Z never needed one
        snapshot = await client.snapshot(x)
        transcript = await client.transcript(x)
        assert coverage_problems(snapshot.history, len(transcript)) == []
        assert snapshot.history.entries[-1].seq == X_TURNS + 1
        for cid in others:
            assert [r["seq"] for r in await client.transcript(cid)] == list(range(1, OTHER_TURNS + 1))
