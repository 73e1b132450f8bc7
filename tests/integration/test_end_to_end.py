"""The whole flow on the real broker and Redis: turns in, compactions through LiteLLM, events out."""

from __future__ import annotations

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import summary_message_text
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import fake_summarizer, make_settings

from .helpers import compaction_events, coverage_problems, read_topic, settle

pytestmark = pytest.mark.integration

CONVERSATIONS = 4
TURNS = 60
WINDOW = 3000


async def test_turns_twice_over_the_real_broker(
    kafka_bootstrap: str, redis_url: str, make_topics: object, fake_llm: FakeLLMServer
) -> None:
    """240 turns of 4 conversations, each delivered twice: compacted, counted once, reported consistently;
    each completion carries the summary the history then starts with (``topics.completed_summary``)."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=4)  # type: ignore[operator]
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(fake_llm),
        topics={"completed_summary": True},
    )
    await ensure_topics(settings)
    streams = {
        f"conv-{i}": synthetic_turns(f"conv-{i}", TURNS, context_window=WINDOW, seed=i)
        for i in range(CONVERSATIONS)
    }
    worker = build_worker(settings)
    async with worker.running(), Client.connect(settings) as client:
        for seq in range(TURNS):
            for events in streams.values():
                payload = events[seq].model_dump_json(exclude_none=True).encode()
                key = events[seq].conversation_id.encode()
                await client.publish_raw(payload, key)
                await client.publish_raw(payload, key)  # every turn is delivered twice
        await settle([worker], 2 * CONVERSATIONS * TURNS)

        started, completed = compaction_events(
            await read_topic(settings, settings.topics.started),
            await read_topic(settings, settings.topics.completed),
        )
        assert fake_llm.requests, "the LLM summarizer was never called"
        for cid, events in streams.items():
            done = completed[cid]
            compacted = [c for c in done if c.outcome is Outcome.COMPACTED]
            assert len(compacted) >= 2, f"{cid}: {[(c.outcome, c.error) for c in done]}"
            # Each compaction summarized through the LLM, or stopped at the cheap stages
            # (tool-output pruning, de-duplication) because they reached the target alone.
            cheap = {"prune", "deduplicate", "truncate_oversized"}
            assert all(
                c.summarizer_model == "openai/fake-summarizer"
                or (c.summarizer_model is None and c.stages and set(c.stages) <= cheap)
                for c in compacted
            ), [(c.stages, c.summarizer_model) for c in compacted]
            # After each compaction, the effective history was under the target (below the threshold).
            assert all(c.tokens_after <= c.target < c.tokens_before for c in compacted)
            # Started and completed pair up with the same numbers; versions count up by one.
            by_id = {s.compaction_id: s for s in started[cid]}
            assert set(by_id) == {c.compaction_id for c in done}
            assert all(by_id[c.compaction_id].tokens_before == c.tokens_before for c in done)
            assert [c.version for c in compacted] == list(range(1, len(compacted) + 1))

            # Every turn is in the transcript exactly once, message for message.
            transcript = await client.transcript(cid)
            expected = [m.to_dict() for e in events for m in e.messages]
            assert [r["m"] for r in transcript] == expected
            assert [r["n"] for r in transcript] == list(range(1, len(expected) + 1))

            snapshot = await client.snapshot(cid)
            assert snapshot.meta.version == len(compacted)
            # The last commit's event holds the summary the stored history starts with, word for word.
            assert snapshot.history.chunks
            assert compacted[-1].summary == summary_message_text(snapshot.history.chunks)
            assert coverage_problems(snapshot.history, len(expected)) == []
            assert int(snapshot.meta.total_tokens * snapshot.meta.calibration) < snapshot.meta.threshold
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []
