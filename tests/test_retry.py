"""The one failure policy: full-jitter backoff, a bounded number of tries, a deadline."""

from __future__ import annotations

import asyncio
import random

import pytest

from compaction_worker.retry import RetryPolicy, RetrySettings
from compaction_worker.settings import Settings


class Sleeps:
    """A fake sleep that records the waits instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class Failing:
    """A call that raises ``errors`` in turn, then returns its count of calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.calls


def test_backoff_is_full_jitter_under_a_doubling_capped_ceiling() -> None:
    policy = RetryPolicy(attempts=5, base_seconds=0.5, cap_seconds=3.0)
    assert [policy.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert policy.ceiling(10_000) == 3.0  # no overflow far out
    rng, twin = random.Random(7), random.Random(7)
    waits = [policy.backoff(n, rng) for n in range(1, 7)]
    # Exactly uniform(0, ceiling) drawn from the same seeded generator.
    assert waits == [twin.uniform(0.0, policy.ceiling(n)) for n in range(1, 7)]
    assert all(0.0 <= w <= policy.ceiling(n) for n, w in zip(range(1, 7), waits, strict=True))


def test_backoff_spreads_over_the_whole_range() -> None:
    """Full jitter, not "half plus jitter": waits near 0 and near the ceiling both occur."""
    policy = RetryPolicy(attempts=0, base_seconds=1.0, cap_seconds=1.0)
    rng = random.Random(1)
    waits = [policy.backoff(3, rng) for _ in range(2000)]
    assert min(waits) < 0.05
    assert max(waits) > 0.95
    assert max(waits) <= 1.0


def test_exhausted_counts_the_first_try() -> None:
    assert [RetryPolicy(3, 1, 1).exhausted(n) for n in range(5)] == [False, False, False, True, True]
    assert not any(RetryPolicy(0, 1, 1).exhausted(n) for n in range(1000))
    assert not RetryPolicy(-1, 1, 1).exhausted(10**9)


async def test_run_retries_what_retry_if_accepts_with_backoff_between() -> None:
    sleeps, call = Sleeps(), Failing(ConnectionError("a"), ConnectionError("b"))
    policy = RetryPolicy(attempts=3, base_seconds=1.0, cap_seconds=10.0)
    result = await policy.run(
        call, retry_if=lambda e: isinstance(e, ConnectionError), sleep=sleeps, rng=random.Random(3)
    )
    assert result == 3
    twin = random.Random(3)
    assert sleeps.delays == [twin.uniform(0, 1.0), twin.uniform(0, 2.0)]


async def test_run_gives_up_after_the_last_attempt_with_its_error() -> None:
    sleeps = Sleeps()
    call = Failing(*(ConnectionError(str(n)) for n in range(5)))
    with pytest.raises(ConnectionError, match=r"^2$"):
        await RetryPolicy(3, 1.0, 10.0).run(call, retry_if=lambda e: True, sleep=sleeps)
    assert call.calls == 3
    assert len(sleeps.delays) == 2


async def test_run_does_not_retry_what_retry_if_refuses() -> None:
    sleeps, call = Sleeps(), Failing(ConnectionError("x"), ValueError("final"))
    with pytest.raises(ValueError, match="final"):
        await RetryPolicy(10, 1.0, 10.0).run(
            call, retry_if=lambda e: isinstance(e, ConnectionError), sleep=sleeps
        )
    assert call.calls == 2
    assert len(sleeps.delays) == 1


async def test_run_continues_from_earlier_failures_and_tells_each_retry() -> None:
    """A turn that already failed twice (in a run) waits its third backoff first, then has the tries left."""
    sleeps, call = Sleeps(), Failing(*(ValueError(str(n)) for n in range(5)))
    told: list[tuple[str, int]] = []
    policy = RetryPolicy(attempts=4, base_seconds=1.0, cap_seconds=100.0)
    with pytest.raises(ValueError, match=r"^1$"):
        await policy.run(
            call,
            retry_if=lambda e: True,
            failures=2,
            on_retry=lambda e, n: told.append((str(e), n)),
            sleep=sleeps,
            rng=random.Random(5),
        )
    assert call.calls == 2  # tries 3 and 4 of 4
    assert told == [("0", 3)]  # the last failure is raised, not retried
    twin = random.Random(5)
    assert sleeps.delays == [twin.uniform(0, 2.0), twin.uniform(0, 4.0)]


async def test_an_async_on_retry_is_done_before_the_next_try() -> None:
    """What the next try needs first (a reactive compaction, in client/llm.py) is awaited before it."""
    order: list[str] = []

    async def call() -> str:
        order.append("call")
        if len(order) == 1:
            raise ValueError("over the window")
        return "ok"

    async def fix(error: BaseException, failures: int) -> None:
        await asyncio.sleep(0)
        order.append(f"fix {error} {failures}")

    policy = RetryPolicy(attempts=2, base_seconds=0.0, cap_seconds=0.0)
    assert await policy.run(call, retry_if=lambda e: True, on_retry=fix) == "ok"
    assert order == ["call", "fix over the window 1", "call"]


async def test_run_with_unlimited_attempts_keeps_trying() -> None:
    sleeps, call = Sleeps(), Failing(*(OSError() for _ in range(50)))
    assert await RetryPolicy(0, 0.01, 0.02).run(call, retry_if=lambda e: True, sleep=sleeps) == 51
    assert len(sleeps.delays) == 50


async def test_run_stops_at_its_deadline() -> None:
    """The deadline bounds the whole run, backoffs included: a call that never returns is cut off."""
    started = asyncio.Event()

    async def stuck() -> None:
        started.set()
        await asyncio.Event().wait()

    with pytest.raises(TimeoutError):
        await RetryPolicy(0, 1.0, 1.0, deadline_seconds=0.05).run(stuck, retry_if=lambda e: True)
    assert started.is_set()


async def test_cancellation_is_never_retried() -> None:
    retried: list[BaseException] = []

    async def cancelled() -> None:
        raise asyncio.CancelledError

    def retry_if(error: BaseException) -> bool:
        retried.append(error)
        return True

    with pytest.raises(asyncio.CancelledError):
        await RetryPolicy(5, 1.0, 1.0).run(cancelled, retry_if=retry_if, sleep=Sleeps())
    assert retried == []


def test_settings_build_each_policy() -> None:
    retry = Settings(
        retry={"base_seconds": 0.5, "cap_seconds": 30, "turn_attempts": 4, "llm_attempts": 2}
    ).retry
    assert retry.turns == RetryPolicy(4, 0.5, 30.0)
    assert retry.llm == RetryPolicy(2, 0.5, 30.0)
    assert retry.compactions == RetryPolicy(0, 0.5, 30.0, deadline_seconds=600.0)
    assert not retry.compactions.exhausted(10**6)  # a failed compaction is tried again, without end
    with pytest.raises(ValueError, match="cap_seconds"):
        RetrySettings(base_seconds=10, cap_seconds=1)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_RETRY__TURN_ATTEMPTS", "7")
    monkeypatch.setenv("COMPACTION_RETRY__COMPACTION_DEADLINE_SECONDS", "90")
    retry = Settings().retry
    assert retry.turns.attempts == 7
    assert retry.compactions.deadline_seconds == 90.0
