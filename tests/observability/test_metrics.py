"""Metrics: the values after a known sequence of turns, a compaction, LLM calls, lock contention, gauges."""

from __future__ import annotations

import asyncio

import pytest

from compaction_worker._litellm import litellm
from compaction_worker.observability import metrics
from compaction_worker.observability.operations import exported_series
from compaction_worker.runtime.components import observe_backlog
from compaction_worker.runtime.pool import run_job
from compaction_worker.state.lock import Lease
from compaction_worker.summaries.contract import SummarizerError
from compaction_worker.testing import FakeLLMServer, turn_bytes
from tests.observability.memory import Memory
from tests.orchestration import Parts, compact_now, conversation, user
from tests.summaries.helpers import GOOD_SUMMARY, request, summarizer


class TestTurns:
    async def test_outcomes_of_a_known_sequence(self, telemetry: Memory, parts: Parts) -> None:
        turns = conversation(3)
        await parts.turns.handle(turns[0], b"c")  # appended
        await parts.turns.handle(turns[0], b"c")  # duplicate
        await parts.turns.handle(turns[2], b"c")  # held behind turn 2
        await parts.turns.handle(b"{not json", b"c")  # dead-lettered
        await parts.turns.handle(turn_bytes("d", 1, [user("hi")]), b"other")  # dead-lettered: key mismatch
        await parts.turns.handle(turns[1], b"c")  # appended (releases turn 3: not a consumed record)
        assert telemetry.values("compaction.turns") == {
            (("status", "appended"),): 2,
            (("status", "duplicate"),): 1,
            (("status", "held"),): 1,
            (("reason", "malformed_json"), ("status", "dead_lettered")): 1,
            (("reason", "key_mismatch"), ("status", "dead_lettered")): 1,
        }


class TestRedis:
    async def test_each_round_trip_of_turns_records_its_time_and_calls(
        self, telemetry: Memory, parts: Parts
    ) -> None:
        """Issue 35: the saturation signal. Three conversations' turns handled together travel in one
        round trip (three calls); one turn alone is a round trip of one."""
        await asyncio.gather(*(parts.turns.handle(turn_bytes(c, 1, [user("hi")]), c.encode()) for c in "abc"))
        await parts.turns.handle(turn_bytes("a", 2, [user("again")]), b"a")
        count, calls = telemetry.histogram("compaction.redis.round_trip.calls")[()]
        assert (count, calls) == (2, 4)
        assert telemetry.histogram("compaction.redis.round_trip.duration")[()][0] == 2


class TestCompactions:
    async def test_a_committed_run_counts_its_trigger_outcome_and_tokens(
        self, telemetry: Memory, parts: Parts
    ) -> None:
        for turn in conversation(40):
            if (await parts.turns.handle(turn, b"c")).scheduled is not None:
                break
        telemetry.clear()
        completed = await compact_now(parts.jobs, parts.compactor)
        assert telemetry.values("compaction.runs") == {
            (("outcome", "compacted"), ("trigger", "threshold")): 1
        }
        saved = completed.tokens_before - completed.tokens_after
        assert saved > 0
        assert telemetry.values("compaction.tokens.saved") == {(): saved}
        assert telemetry.histogram("compaction.tokens.before") == {(): (1, completed.tokens_before)}
        assert telemetry.histogram("compaction.tokens.after") == {(): (1, completed.tokens_after)}
        ((attributes, (waits, _)),) = telemetry.histogram("compaction.lock.wait.duration").items()
        assert attributes == (("acquired", "true"),)
        assert waits == 1
        assert telemetry.values("compaction.lock.contended") == {}

    async def test_a_busy_lock_counts_as_contention(self, telemetry: Memory, parts: Parts) -> None:
        for turn in conversation(40):
            if (await parts.turns.handle(turn, b"c")).scheduled is not None:
                break
        lease = await parts.locks.acquire("c", parts.store.keys("c"))  # another worker's run
        assert isinstance(lease, Lease)
        telemetry.clear()
        assert await run_job(parts.jobs, parts.compactor, "c") is None
        assert telemetry.values("compaction.lock.contended") == {(): 1}
        assert telemetry.histogram("compaction.lock.wait.duration")[(("acquired", "false"),)][0] == 1
        assert telemetry.values("compaction.runs") == {}  # a postponed job is no run


class TestLLM:
    async def test_tokens_latency_and_cost_of_a_priced_model(
        self, telemetry: Memory, fake_llm: FakeLLMServer
    ) -> None:
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm, model="openai/gpt-4o-mini").summarize(request())
        base = (("gen_ai.operation.name", "chat"), ("gen_ai.request.model", "openai/gpt-4o-mini"))
        usage = telemetry.histogram("gen_ai.client.token.usage")
        assert usage[(*base, ("gen_ai.token.type", "input"))] == (1, result.usage.prompt_tokens)
        assert usage[(*base, ("gen_ai.token.type", "output"))] == (1, result.usage.completion_tokens)
        assert telemetry.histogram("gen_ai.client.operation.duration")[base][0] == 1
        cost = telemetry.values("gen_ai.client.cost")[(("gen_ai.request.model", "openai/gpt-4o-mini"),)]
        price = litellm.model_cost["gpt-4o-mini"]
        assert cost == pytest.approx(
            result.usage.prompt_tokens * price["input_cost_per_token"]
            + result.usage.completion_tokens * price["output_cost_per_token"]
        )
        assert telemetry.values("compaction.llm.failures") == {}

    async def test_failures_are_counted_per_call(self, telemetry: Memory, fake_llm: FakeLLMServer) -> None:
        fake_llm.fail_next(10, status=401)  # not retried: one call
        with pytest.raises(SummarizerError):
            await summarizer(fake_llm, attempts=1, fallback_models=[]).summarize(request())
        failures = telemetry.values("compaction.llm.failures")
        assert sum(failures.values()) == 1
        ((attributes, _),) = failures.items()
        assert dict(attributes)["error.type"] == "AuthenticationError"


class TestGauges:
    async def test_backlog_gauges_read_the_queues(self, telemetry: Memory, parts: Parts) -> None:
        for turn in conversation(40):
            if (await parts.turns.handle(turn, b"c")).scheduled is not None:
                break
        await parts.turns.handle(turn_bytes("h", 5, [user("early")]), b"h")  # held: turns 1-4 missing
        await observe_backlog(parts.jobs, parts.gaps, parts.outbox)
        values = {name: telemetry.values(name) for name in (m.name for m in metrics.METRICS)}
        assert values["compaction.jobs.pending"] == {(): 1}
        assert values["compaction.turns.held"] == {(): 1}
        assert values["compaction.outbox.backlog"] == {(): 0}
        assert 0 <= values["compaction.jobs.oldest_due_age"][()] < 60

    def test_lag_per_partition(self, telemetry: Memory) -> None:
        metrics.record_lag("turns", 0, 12)
        metrics.record_lag("turns", 1, 0)
        metrics.record_lag("turns", 0, 7)
        lag = telemetry.values("messaging.kafka.consumer.lag")
        assert lag[(("partition", "0"), ("topic", "turns"))] == 7
        assert lag[(("partition", "1"), ("topic", "turns"))] == 0


class TestCatalogue:
    def test_every_instrument_is_created_with_its_catalogue_kind_and_unit(self, telemetry: Memory) -> None:
        """The catalogue (operations.md, the dashboard) names what the meter really exports."""
        names = [m.name for m in metrics.METRICS]
        assert len(set(names)) == len(names)
        for instrument in metrics.METRICS:
            assert exported_series(instrument), instrument.name
        metrics.record_turn("appended")
        metrics.record_backlog(jobs_pending=0)
        seen = {name for name, _, _, _ in telemetry.points()}
        assert {"compaction.turns", "compaction.jobs.pending"} <= seen <= set(names)
