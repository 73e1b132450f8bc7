"""The one failure policy: how many tries, how long between them, how long in all.

The consumer (a turn that keeps failing), the compactor (a failed compaction run) and the
summarizer (a failed LLM call) all decide "try again, and when" here, as arq's ``Retry`` and
tenacity do: exponential backoff with full jitter (AWS's "Exponential Backoff and Jitter":
``uniform(0, min(cap, base * 2 ** (failures - 1)))``), so that workers failing together do not
retry together. This module imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

T = TypeVar("T")

_RNG = random.Random()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Tries, backoff and an optional deadline for one kind of work."""

    attempts: int
    """Tries in all, the first included; 0 or less: unlimited."""
    base_seconds: float
    """The backoff's ceiling after the first failure; it doubles with each further one."""
    cap_seconds: float
    """The backoff's ceiling never grows past this."""
    deadline_seconds: float | None = None
    """A whole run's time limit (``asyncio.timeout``), where one applies; None: none."""

    def backoff(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` failures in a row (1 for the first): full jitter."""
        ceiling = self.ceiling(failures)
        return (rng or _RNG).uniform(0.0, ceiling) if ceiling > 0 else 0.0

    def ceiling(self, failures: int) -> float:
        """The most :meth:`backoff` may return after ``failures`` failures."""
        exponent = max(failures, 1) - 1
        # 2 ** exponent overflows a float past ~1024; the cap is reached long before.
        if exponent >= 64:
            return max(self.cap_seconds, 0.0)
        return max(min(self.cap_seconds, self.base_seconds * float(2**exponent)), 0.0)

    def exhausted(self, failures: int) -> bool:
        """Whether ``failures`` failed tries leave none: never, when attempts are unlimited."""
        return self.attempts > 0 and failures >= self.attempts

    async def run(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        retry_if: Callable[[BaseException], bool],
        failures: int = 0,
        on_retry: Callable[[BaseException, int], object] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> T:
        """``await call()`` until it succeeds, retrying what ``retry_if`` accepts with backoff.

        ``failures``: tries that failed before this run (it waits their backoff first).
        ``on_retry(error, failures)`` is told of each failure about to be retried; when it returns
        an awaitable (an ``async`` callback: what the next try needs done first), it is awaited
        before the backoff. An error ``retry_if`` refuses, or the last try's error, propagates
        unchanged; so does cancellation (``retry_if`` never sees it). The deadline, if any, bounds
        the whole run, backoffs included: past it, ``TimeoutError``.
        """
        async with asyncio.timeout(self.deadline_seconds):
            if failures:
                await sleep(self.backoff(failures, rng))
            while True:
                try:
                    return await call()
                except Exception as exc:
                    failures += 1
                    if self.exhausted(failures) or not retry_if(exc):
                        raise
                    if on_retry is not None and inspect.isawaitable(done := on_retry(exc, failures)):
                        await done
                await sleep(self.backoff(failures, rng))


class RetrySettings(BaseModel):
    """The one failure policy (compaction_worker/retry.py): tries, backoff with full jitter, a deadline.

    Every wait is random between 0 and ``base_seconds * 2 ** (failures - 1)``, at most
    ``cap_seconds``, so that workers failing together do not retry together.
    """

    model_config = ConfigDict(extra="forbid")

    base_seconds: float = Field(
        default=1.0,
        gt=0,
        description="The longest wait after a first failure; it doubles with each further one.",
    )
    cap_seconds: float = Field(default=300.0, gt=0, description="No wait is longer than this.")
    turn_attempts: int = Field(
        default=5,
        ge=1,
        description="Tries of a turn that fails other than by a Redis or broker outage (outages are retried "
        "without limit) before it goes to the DLQ as processing_failed.",
    )
    compaction_deadline_seconds: float = Field(
        default=600.0,
        gt=0,
        description="One compaction run's time limit: past it the run fails and its conversation's lock is free.",
    )
    llm_attempts: int = Field(
        default=3,
        ge=1,
        description="Tries of one summarizer model's call (timeouts, 429, 5xx, a transiently bad reply) "
        "before its fallback model.",
    )

    @model_validator(mode="after")
    def _capped(self) -> RetrySettings:
        if self.cap_seconds < self.base_seconds:
            raise ValueError("cap_seconds must not be below base_seconds")
        return self

    @property
    def turns(self) -> RetryPolicy:
        """A turn that keeps failing: retried ``turn_attempts`` times in all, then dead-lettered."""
        return RetryPolicy(self.turn_attempts, self.base_seconds, self.cap_seconds)

    @property
    def compactions(self) -> RetryPolicy:
        """A failed compaction run: the conversation's next run waits a backoff (no limit on
        tries: it stays over its threshold); one run is cut off at the deadline."""
        return RetryPolicy(0, self.base_seconds, self.cap_seconds, self.compaction_deadline_seconds)

    @property
    def llm(self) -> RetryPolicy:
        """One summarizer model's call: ``llm_attempts`` tries, then the next fallback model."""
        return RetryPolicy(self.llm_attempts, self.base_seconds, self.cap_seconds)
