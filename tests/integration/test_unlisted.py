"""Kinds no list names, through the real broker and Redis, as real traffic arrives (``compaction-worker
quality unlisted``'s conversations): a worker on ``openrouter/openai/gpt-4`` (8K) whose LLM, a fake
OpenAI-compatible server reached through LiteLLM, writes summaries that keep nothing."""

from __future__ import annotations

import pytest

from compaction_worker.bench.traffic import settings_data
from compaction_worker.bench.unlisted import (
    HELD_OUT_SEED,
    SEED,
    TARGET,
    TURNS,
    Measured,
    conversations,
    paraphrase_summary,
    send,
)
from compaction_worker.testing import FakeLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
async def measured(kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer) -> list[Measured]:
    """Both conversations (24 kinds every other turn; 30 held-out kinds once each), a turn at a time."""
    fake_llm_server.reset()
    fake_llm_server.set_reply(paraphrase_summary())
    try:
        data = settings_data(kafka_bootstrap, redis_url, fake_llm_server.url, label="unlisted")
        runs = await send(data, conversations(SEED, HELD_OUT_SEED, TURNS))
        asked = len(fake_llm_server.requests)
    finally:
        fake_llm_server.reset()
    assert asked >= sum(len(m.compactions) for m in runs), (
        "every summary went through LiteLLM to the fake LLM"
    )
    return runs


def test_the_conversations_compact_as_real_traffic_does(measured: list[Measured]) -> None:
    """Each conversation is compacted at least ten times, one turn's threshold at a time, every run committed."""
    for m in measured:
        assert len(m.compactions) >= 10, m.label
        assert m.outcomes == {"compacted": len(m.compactions)}, m.label


def test_artifacts_dropped_is_what_the_history_lost(measured: list[Measured]) -> None:
    """Invariant 12: each compaction's ``artifacts_dropped`` is what it let go; over the run, within 10% of
    the identifiers (planted, or named by a tool) the history held before a compaction and not after."""
    # Nothing lost, nothing reported; what loses something at 4K is tests/state/test_archive.py.
    for m in measured:
        assert abs(m.reported - m.identifiers_lost) <= m.identifiers_lost / 10, (
            m.label,
            m.reported,
            m.identifiers_lost,
        )


def test_unlisted_kinds_survive_ten_compactions(measured: list[Measured]) -> None:
    """At least 95% of what was stated in prose, of kinds no list names, is in ``Client.messages`` verbatim."""
    assert [m.label for m in measured if m.fraction < TARGET] == []
