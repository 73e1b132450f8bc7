"""The per-model circuit breaker in Redis: counted by every caller, opened once, probed after the cooldown."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from compaction_worker.observability.metrics import BREAKER_OPENS
from compaction_worker.settings import SummarizerSettings
from compaction_worker.state.breaker import Breaker, BreakerState, breaker_model
from compaction_worker.state.connection import RedisClient
from tests.observability.memory import memory
from tests.orchestration import connect

pytestmark = pytest.mark.integration

MODEL = "openai/gpt-4o-mini"


class Clock:
    """A settable clock (epoch seconds), shared by the breakers of one test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def breaker(client: RedisClient, clock: Clock, failures: int = 3, cooldown: float = 60.0) -> Breaker:
    settings = SummarizerSettings(breaker_failures=failures, breaker_cooldown_seconds=cooldown)
    return Breaker(client, "t", settings, clock=clock)


def opens() -> float:
    return sum(memory().values(BREAKER_OPENS.name).values())


async def test_failures_of_every_caller_open_it_for_every_caller(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    """Two workers (two clients): the third failure in a row, whoever had it, opens the model for both."""
    clock = Clock()
    other_client = connect(redis_url)
    try:
        one, two = breaker(redis_client, clock), breaker(other_client, clock)
        with memory().recording():
            assert await one.record(MODEL, failed=True) == BreakerState(1, False)
            assert await two.record(MODEL, failed=True) == BreakerState(2, False)
            assert await two.check(MODEL) == BreakerState(2, False)
            assert await one.record(MODEL, failed=True) == BreakerState(3, True)
            assert await two.check(MODEL) == BreakerState(3, True)
            assert await one.check(MODEL) == BreakerState(3, True)
            # A run that was already under way fails too: counted, not a second opening.
            assert await two.record(MODEL, failed=True) == BreakerState(4, True)
            assert opens() == 1
        assert await one.check("other/model") == BreakerState(0, False)  # per model
    finally:
        await other_client.aclose()


async def test_concurrent_failures_are_each_counted(redis_client: redis.asyncio.Redis) -> None:
    guard = breaker(redis_client, Clock(), failures=50)
    results = await asyncio.gather(*(guard.record(MODEL, failed=True) for _ in range(40)))
    assert sorted(r.failures for r in results) == list(range(1, 41))
    assert (await guard.peek(MODEL)).failures == 40


async def test_after_the_cooldown_one_run_probes_while_the_others_wait(
    redis_client: redis.asyncio.Redis,
) -> None:
    clock = Clock()
    guard = breaker(redis_client, clock, failures=2, cooldown=60)
    with memory().recording():
        for _ in range(2):
            await guard.record(MODEL, failed=True)
        clock.now += 59.9
        assert (await guard.check(MODEL)).open
        clock.now += 0.2  # the cooldown is over
        assert await guard.peek(MODEL) == BreakerState(2, False)  # a status read takes no turn
        assert await guard.check(MODEL) == BreakerState(2, False)  # the probe
        assert await guard.check(MODEL) == BreakerState(2, True)  # everyone else still skips it
        # The probe fails: open again, a new opening.
        assert await guard.record(MODEL, failed=True) == BreakerState(3, True)
        assert opens() == 2
        clock.now += 61
        assert not (await guard.check(MODEL)).open  # the next probe
        assert await guard.record(MODEL, failed=False) == BreakerState(0, False)
        assert await guard.check(MODEL) == BreakerState(0, False)
        assert await guard.check(MODEL) == BreakerState(0, False)


async def test_a_success_starts_the_count_over(redis_client: redis.asyncio.Redis) -> None:
    guard = breaker(redis_client, Clock(), failures=3)
    await guard.record(MODEL, failed=True)
    await guard.record(MODEL, failed=True)
    await guard.record(MODEL, failed=False)
    assert await guard.record(MODEL, failed=True) == BreakerState(1, False)
    assert not await redis_client.exists(guard.key("gone"))
    await guard.record("gone", failed=False)
    assert not await redis_client.exists(guard.key("gone"))


async def test_zero_failures_counts_but_never_opens(redis_client: redis.asyncio.Redis) -> None:
    guard = breaker(redis_client, Clock(), failures=0)
    for n in range(1, 6):
        assert await guard.record(MODEL, failed=True) == BreakerState(n, False)
    assert not (await guard.check(MODEL)).open


async def test_the_count_expires_when_the_model_is_left_alone(redis_client: redis.asyncio.Redis) -> None:
    guard = breaker(redis_client, Clock(), cooldown=60)
    await guard.record(MODEL, failed=True)
    ttl = await redis_client.pttl(guard.key(MODEL))
    assert 60_000 < ttl <= 60_000 + 24 * 3600 * 1000


def test_the_key_has_the_model_as_its_hash_tag() -> None:
    guard = Breaker(redis.asyncio.Redis(), "cw", SummarizerSettings())
    assert guard.key(MODEL) == "cw:breaker:{openai/gpt-4o-mini}"


def test_a_conversation_summarizer_breaks_on_the_conversation_s_model() -> None:
    assert breaker_model("conversation", MODEL) == MODEL
    assert breaker_model("anthropic/claude-3-5-haiku", MODEL) == "anthropic/claude-3-5-haiku"
