"""The bench's cost rows, run small against the tests' Redis and fake LLM (figures are printed, never asserted)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import redis.asyncio

from compaction_worker import _litellm
from compaction_worker.bench import costs
from compaction_worker.bench.costs import LLMClock
from compaction_worker.bench.environment import BenchEnv
from compaction_worker.bench.report import Row
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_the_llm_clock_leaves_out_the_wait_keeps_the_clients_cpu_and_puts_the_original_back() -> None:
    """CPU on the loop and on an executor thread (where LiteLLM builds a request) is the client's;
    the CPU of the thread the fake LLM answers on is the LLM's, and so is the time waited for it."""
    module = _litellm.load()
    original = module.acompletion
    answered, release = threading.Event(), threading.Event()

    def serve() -> None:  # like FakeLLMServer's thread, it outlives the call
        _burn(0.3)
        answered.set()
        release.wait()

    server = threading.Thread(target=serve, name=costs.FAKE_LLM_THREAD)

    async def call(*_args: object, **_kwargs: object) -> str:
        _burn(0.05)
        await asyncio.get_running_loop().run_in_executor(None, _burn, 0.05)
        server.start()
        await asyncio.to_thread(answered.wait)
        return "ok"

    module.acompletion = call
    clock = LLMClock()
    try:
        with clock.installed():
            assert module.acompletion is not call
            assert await module.acompletion(model="openai/x", messages=[]) == "ok"
        assert module.acompletion is call
    finally:
        module.acompletion = original
        release.set()
        server.join()
    assert clock.client_cpu >= 0.1
    assert clock.client_cpu < 0.1 + 0.3  # the server thread's CPU is not the client's
    assert clock.seconds > 0.1  # at least the server's 0.3 s less what the client's CPU overstates


@pytest.mark.integration
async def test_every_row_runs_small(
    redis_client: redis.asyncio.Redis, fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """All rows at a tiny scale: each reports its figure beside its baseline, and the long
    conversation compacts, with summaries, on its way."""
    env = BenchEnv(Settings(), redis_client, fake_llm, scale=0.002, workdir=tmp_path, tune_gc=False)
    seen: list[str] = []
    rows: list[Row] = []
    for scenario in costs.ROWS:
        rows += await scenario(env, seen.append)
    by_name = {row.name: row for row in rows}
    assert seen
    per_turn = [r for r in rows if r.name.startswith("per-turn cost,")]
    assert len(per_turn) == 3
    assert all(r.value > 0 and r.baseline and r.baseline > 0 for r in per_turn)
    assert {r.baseline_name for r in per_turn} == {"recount every turn (naive baseline)"}
    ratio = by_name["per-turn cost at 2K / at 1K"]
    assert ratio.target == 1.2
    assert ratio.met is not None
    p50, p99 = (
        by_name["compaction cost incl. LiteLLM's CPU, excl. the LLM's wait, 16K tokens, p50"],
        by_name["compaction cost incl. LiteLLM's CPU, excl. the LLM's wait, 16K tokens, p99"],
    )
    assert 0 < p50.value <= p99.value
    assert p99.target == 50.0
    memory = [r for r in rows if r.name.startswith("Redis bytes")]
    assert [r.name.split(", ")[1].split(" ")[0] for r in memory] == ["before", "after"]
    assert all(r.baseline and r.value > r.baseline / 2 for r in memory)  # the transcript alone is a copy
    (summaries,) = [r for r in rows if r.name.startswith("summarizer input tokens")]
    assert summaries.value > 0
    assert summaries.baseline
