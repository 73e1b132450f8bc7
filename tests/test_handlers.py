"""The per-turn path, one compaction run and a rewind, against real Redis, with events captured in memory."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.errors import LockNotAcquiredError, RewindError
from compaction_worker.events import (
    CompactionCompleted,
    CompactionStarted,
    DeadLetter,
    LlmUsage,
    Outcome,
    Trigger,
)
from compaction_worker.extractive import ExtractiveSummarizer
from compaction_worker.handlers import Compactor, Rewinder, TurnHandler, TurnStatus, budget_for
from compaction_worker.history import public_message, render
from compaction_worker.jobs import JobQueue
from compaction_worker.lock import Locks
from compaction_worker.settings import Settings
from compaction_worker.store import Store
from compaction_worker.strategies import provider_problems, summary_overhead
from compaction_worker.summarizer import SummaryRequest, SummaryResult
from compaction_worker.testing import turn_payload
from compaction_worker.tokens import calibrate, counter_for

pytestmark = pytest.mark.integration


class Published:
    """An in-memory publisher: (topic, payload, key) triples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, bytes | None]] = []

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        self.events.append((topic, payload, key))

    def on(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(p) for t, p, _ in self.events if t == topic]


@pytest.fixture
def settings() -> Settings:
    return Settings(redis={"key_prefix": "t"}, kafka={"max_event_bytes": 16384})  # type: ignore[arg-type]


@pytest.fixture
def published() -> Published:
    return Published()


@pytest.fixture
def parts(
    redis_client: redis.asyncio.Redis, settings: Settings, published: Published
) -> tuple[TurnHandler, Compactor, Store, JobQueue]:
    store = Store(redis_client, "t", None)
    jobs = JobQueue(store, 60)
    turns = TurnHandler(settings, store, jobs, published)
    compactor = Compactor(
        settings,
        store,
        Locks(redis_client, 30),
        jobs,
        published,
        summarizers=lambda _m, c: [ExtractiveSummarizer(c.text)],
    )
    return turns, compactor, store, jobs


def raw(cid: str, seq: int, *messages: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps(turn_payload(cid, seq, list(messages), **fields)).encode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


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


def conversation(turns: int) -> list[bytes]:
    out = []
    for seq in range(1, turns + 1):
        msg = (
            user(f"question {seq}: " + "detail " * 60)
            if seq % 2
            else assistant(f"answer {seq}: " + "because " * 60)
        )
        out.append(
            raw("c", seq, msg, context_window=2048, **({"system_prompt": "Be brief."} if seq == 1 else {}))
        )
    return out


class TestCompactor:
    async def test_compaction_commits_and_reports(self, parts: Any, published: Published) -> None:
        """A due job compacts under the target, commits, and publishes consistent events."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        claim = await jobs.claim("c")
        assert claim is not None
        completed = await compactor.run(claim)
        assert completed is not None
        assert completed.outcome is Outcome.COMPACTED
        (started,) = [CompactionStarted.model_validate(e) for e in published.on("compaction.started")]
        (done,) = [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]
        assert started.compaction_id == done.compaction_id
        assert started.tokens_before == done.tokens_before > done.tokens_after
        assert done.tokens_after <= done.target
        snapshot = await store.snapshot("c")
        assert snapshot.meta.version == done.version == 1
        assert snapshot.meta.total_tokens <= done.target
        assert provider_problems(render(snapshot.history)) == []
        covered = {n for c in snapshot.history.chunks for n in range(c.first_n, c.last_n + 1) if c.covers(n)}
        assert covered | {e.n for e in snapshot.history.entries} == set(range(1, 25))
        assert await store.job("c") is None

    async def test_busy_lock_postpones(self, parts: Any, redis_client: redis.asyncio.Redis) -> None:
        """When another worker holds the lock, the job is postponed, not run twice."""
        turns, compactor, store, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        other = await Locks(redis_client, 30).acquire("c", store.keys("c"))
        assert other is not None
        claim = await jobs.claim("c")
        assert await compactor.run(claim) is None
        assert await store.job("c") is not None
        assert await jobs.due(5) == []

    async def test_noop_is_not_retried_in_a_loop(self, parts: Any, published: Published) -> None:
        """A compaction that cannot shrink commits nothing and blocks re-triggering (invariant 5)."""
        turns, compactor, store, jobs = parts
        # The system prompt alone is over the target: no stage can reach it.
        await turns.handle(raw("c", 1, user("hi"), system_prompt="rule " * 900, context_window=1024), b"c")
        claim = await jobs.claim("c")
        completed = await compactor.run(claim)
        assert completed is not None
        assert completed.outcome is Outcome.NOOP
        assert (await store.meta("c")).version == 0
        outcome = await turns.handle(raw("c", 2, assistant("ok"), context_window=1024), b"c")
        assert outcome.scheduled is None


# --- stage savings, reactive compaction, rewind ---------------------------------------------


async def _compact_now(jobs: JobQueue, compactor: Compactor, cid: str = "c") -> CompactionCompleted:
    claim = await jobs.claim(cid)
    assert claim is not None
    completed = await compactor.run(claim)
    assert completed is not None
    return completed


def _overhead() -> int:
    return summary_overhead(counter_for("gpt-4o-mini", Settings().budget))


class TestStageSavings:
    async def test_savings_account_for_the_tokens_saved(self, parts: Any) -> None:
        """Each reported stage has its saving; together they explain before minus after."""
        turns, compactor, _, jobs = parts
        for event in conversation(24):
            await turns.handle(event, b"c")
        done = await _compact_now(jobs, compactor)
        assert done.outcome is Outcome.COMPACTED
        assert set(done.stage_savings) <= set(done.stages)
        assert done.stage_savings["summarize"] > 0
        # The first chunk brings the summary turn's own overhead with it.
        assert sum(done.stage_savings.values()) - _overhead() == done.tokens_before - done.tokens_after

    async def test_noop_saves_nothing(self, parts: Any) -> None:
        """A compaction that commits nothing reports no savings."""
        turns, compactor, _, jobs = parts
        await turns.handle(raw("c", 1, user("hi"), system_prompt="rule " * 900, context_window=1024), b"c")
        done = await _compact_now(jobs, compactor)
        assert (done.outcome, done.stage_savings) == (Outcome.NOOP, {})


class Wordy:
    """A summarizer whose summary saves less than the summary turn's overhead costs."""

    name = "wordy"

    def __init__(self, overhead: int) -> None:
        self.overhead = overhead

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        words = max(1, request.replaced_tokens - self.overhead // 2)
        return SummaryResult(" ".join(["word"] * words), self.name, words, LlmUsage())


OPENAI_OVERFLOW = (
    "This model's maximum context length is {maximum} tokens. However, your messages resulted in "
    "{actual} tokens. Please reduce the length of the messages."
)
BEDROCK_OVERFLOW = "ValidationException: Input is too long for requested model."


class TestReactive:
    async def _grown(self, turns: TurnHandler, store: Store, count: int = 10) -> int:
        """A conversation under the normal target; returns its estimate."""
        for event in conversation(count):
            await turns.handle(event, b"c")
        return (await store.meta("c")).total_tokens

    async def test_overflow_turn_records_its_estimate_and_calibrates(self, parts: Any) -> None:
        """The provider's count of the rejected prompt moves the factor toward it; the job keeps the estimate."""
        turns, _, store, _ = parts
        estimate = await self._grown(turns, store)
        error = OPENAI_OVERFLOW.format(maximum=1000, actual=2 * estimate)
        outcome = await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": error}), b"c")
        assert outcome.scheduled is Trigger.REACTIVE
        job = await store.job("c")
        assert (job.trigger, job.estimate) == (Trigger.REACTIVE, estimate)
        assert (await store.meta("c")).calibration == pytest.approx(calibrate(1.0, estimate, 2 * estimate))

    async def test_numbers_set_the_target_and_the_scale(self, parts: Any, published: Published) -> None:
        """The parsed maximum lowers the target and the observed ratio sizes the compaction."""
        turns, compactor, store, jobs = parts
        estimate = await self._grown(turns, store)
        actual, maximum = int(estimate * 1.5), 1200
        error = OPENAI_OVERFLOW.format(maximum=maximum, actual=actual)
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": error}), b"c")
        done = await _compact_now(jobs, compactor)
        _, budget = budget_for("gpt-4o-mini", Settings(), 2048, None)
        assert done.outcome is Outcome.COMPACTED, done.error
        assert done.target == budget.reactive_target(maximum) < budget.target
        assert abs(done.tokens_before - actual) <= 1  # reported in the provider's units
        assert (await store.meta("c")).total_tokens * 1.5 <= done.target

    async def test_under_the_target_without_numbers_still_compacts(
        self, parts: Any, settings: Settings
    ) -> None:
        """The provider's refusal overrides an estimate that says the history already fits."""
        turns, compactor, store, jobs = parts
        settings.tail.max_messages = 2  # leaves a head worth summarizing in a short conversation
        estimate = await self._grown(turns, store)
        _, budget = budget_for("gpt-4o-mini", Settings(), 2048, None)
        assert estimate < budget.target
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c")
        done = await _compact_now(jobs, compactor)
        assert (done.trigger, done.outcome) == (Trigger.REACTIVE, Outcome.COMPACTED), done.error
        assert done.target == budget.target
        assert done.tokens_after < done.tokens_before
        assert (await store.meta("c")).version == 1

    async def test_a_forced_run_that_would_grow_the_history_commits_nothing(
        self, parts: Any, settings: Settings, published: Published
    ) -> None:
        """When the summary turn costs more than the span it replaces, the reactive run is a no-op."""
        turns, compactor, store, jobs = parts
        await self._grown(turns, store)
        await turns.handle(raw("c", 11, compaction={"mode": "overflow", "error": BEDROCK_OVERFLOW}), b"c")
        wordy = Compactor(
            settings, store, compactor.locks, jobs, published, summarizers=lambda _m, _c: [Wordy(_overhead())]
        )
        done = await _compact_now(jobs, wordy)
        assert done.outcome is Outcome.NOOP
        assert done.error is not None
        assert "would not shrink" in done.error
        assert done.tokens_after == done.tokens_before
        assert (await store.meta("c")).version == 0


class TestRewinder:
    @pytest.fixture
    def rewinder(self, parts: Any, settings: Settings, published: Published) -> Rewinder:
        _, compactor, store, _ = parts
        return Rewinder(settings, store, compactor.locks, published)

    async def _until_scheduled(self, turns: TurnHandler, events: list[bytes]) -> int:
        """Hand turns in until one schedules a compaction; returns how many were handed in."""
        for i, event in enumerate(events, start=1):
            if (await turns.handle(event, b"c")).scheduled is not None:
                return i
        raise AssertionError("no turn crossed the threshold")

    async def test_undoing_the_second_compaction_gives_the_first_plus_later_turns(
        self, parts: Any, rewinder: Rewinder, published: Published
    ) -> None:
        """Compact twice, rewind the second: the first's history plus every turn appended since."""
        turns, compactor, store, jobs = parts
        events = conversation(80)
        handed = await self._until_scheduled(turns, events)
        assert (await _compact_now(jobs, compactor)).version == 1
        first = await store.snapshot("c")
        handed += await self._until_scheduled(turns, events[handed:])
        assert (await _compact_now(jobs, compactor)).version == 2
        for event in events[handed : handed + 2]:  # appended after the second compaction
            await turns.handle(event, b"c")
        handed += 2
        since = [r for r in await store.transcript("c") if r["n"] > first.meta.msg_count]
        assert len(since) > 2

        rewound = await rewinder.rewind("c")

        after = await store.snapshot("c")
        assert render(after.history) == render(first.history) + [public_message(r["m"]) for r in since]
        assert after.history.chunks == first.history.chunks
        assert after.meta.history_tokens == first.meta.history_tokens + sum(r["t"] for r in since)
        assert (after.meta.version, after.meta.last_seq) == (3, handed)
        assert provider_problems(render(after.history)) == []
        assert (rewound.rewound_version, rewound.completed.version) == (2, 3)
        started = CompactionStarted.model_validate(published.on("compaction.started")[-1])
        done = CompactionCompleted.model_validate(published.on("compaction.completed")[-1])
        assert (done.trigger, done.outcome, done.compaction_id) == (
            Trigger.REWIND,
            Outcome.COMPACTED,
            started.compaction_id,
        )
        assert done.tokens_after == after.meta.total_tokens > done.tokens_before
        assert done.messages_after == len(render(after.history))

    async def test_repeated_rewinds_walk_back_to_the_transcript(self, parts: Any, rewinder: Rewinder) -> None:
        """Undo, undo again: the whole transcript verbatim; a third undo has nothing left."""
        turns, compactor, store, jobs = parts
        events = conversation(80)
        handed = await self._until_scheduled(turns, events)
        await _compact_now(jobs, compactor)
        handed += await self._until_scheduled(turns, events[handed:])
        await _compact_now(jobs, compactor)
        assert (await rewinder.rewind("c")).rewound_version == 2
        assert (await rewinder.rewind("c")).rewound_version == 1
        after = await store.snapshot("c")
        transcript = await store.transcript("c")
        assert after.history.chunks == ()
        assert [e.message for e in after.history.entries] == [r["m"] for r in transcript]
        assert after.meta.context_status.value == "full"
        with pytest.raises(RewindError, match="nothing to undo"):
            await rewinder.rewind("c")
        assert (await store.meta("c")).version == 4

    async def test_busy_lock_refuses_and_changes_nothing(
        self, parts: Any, rewinder: Rewinder, redis_client: redis.asyncio.Redis, published: Published
    ) -> None:
        """While a compaction holds the lock, a rewind is refused and publishes nothing."""
        turns, compactor, store, jobs = parts
        await self._until_scheduled(turns, conversation(80))
        await _compact_now(jobs, compactor)
        before = len(published.events)
        assert await Locks(redis_client, 30).acquire("c", store.keys("c")) is not None
        with pytest.raises(LockNotAcquiredError):
            await rewinder.rewind("c")
        assert (await store.meta("c")).version == 1
        assert len(published.events) == before
