"""The bench's cost rows, run small against the tests' Redis and fake LLM (figures are printed, never asserted)."""

from __future__ import annotations

import pytest
import redis.asyncio

from compaction_worker import _litellm
from compaction_worker.bench import costs
from compaction_worker.bench.costs import CostEnv, LLMClock
from compaction_worker.bench.report import Row
from compaction_worker.testing import FakeLLMServer


async def test_the_llm_clock_times_litellm_calls_and_puts_the_original_back() -> None:
    module = _litellm.load()
    original = module.acompletion
    clock = LLMClock()
    with clock.installed():
        assert module.acompletion is not original
        await module.acompletion(
            model="openai/x", messages=[{"role": "user", "content": "hi"}], mock_response="ok"
        )
    assert module.acompletion is original
    assert clock.seconds > 0


@pytest.mark.integration
async def test_every_row_runs_small(redis_client: redis.asyncio.Redis, fake_llm: FakeLLMServer) -> None:
    """All rows at a tiny scale: each reports its figure beside its baseline, and the long
    conversation compacts, with summaries, on its way."""
    env = CostEnv(redis_client, fake_llm, scale=0.002, freeze_gc=False)
    seen: list[str] = []
    rows: list[Row] = []
    for scenario in costs.ROWS:
        rows += await scenario(env, seen.append)
    by_name = {row.name: row for row in rows}
    assert seen
    per_turn = [r for r in rows if r.name.startswith("per-turn cost,")]
    assert len(per_turn) == 3
    assert all(r.value > 0 and r.baseline and r.baseline > 0 for r in per_turn)
    ratio = by_name["per-turn cost at 2K / at 1K"]
    assert ratio.target == 1.2
    assert ratio.met is not None
    p50, p99 = (
        by_name["compaction cost excl. LLM, 16K tokens, p50"],
        by_name["compaction cost excl. LLM, 16K tokens, p99"],
    )
    assert 0 < p50.value <= p99.value
    assert p99.target == 50.0
    memory = [r for r in rows if r.name.startswith("Redis bytes")]
    assert [r.name.split(", ")[1].split(" ")[0] for r in memory] == ["before", "after"]
    assert all(r.baseline and r.value > r.baseline / 2 for r in memory)  # the transcript alone is a copy
    (summaries,) = [r for r in rows if r.name.startswith("summarizer input tokens")]
    assert summaries.value > 0
    assert summaries.baseline
