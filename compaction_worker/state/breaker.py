"""The summarizer model's circuit breaker, one per model, shared by every conversation and worker.

In a provider outage every conversation's compaction would wait out the summarizer's
retries and then fall back; after ``breaker_failures`` failed runs in a row on a model, by
any conversation on any worker, runs skip that model for ``breaker_cooldown_seconds`` and
use the fallback at once. After the cooldown one run (the first to ask) tries the model
again, a probe, while the others keep skipping it; a run whose summary works closes the
breaker. The state is one Redis hash per model, ``{prefix}:breaker:{<model>}``, changed only
by ``lua/breaker.lua``, so that concurrent runs count every failure and open it once.
LiteLLM Router's cooldowns would do the skipping, but they live in one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from compaction_worker.conversation.keys import breaker_key
from compaction_worker.observability import metrics
from compaction_worker.settings import SummarizerSettings
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script

_MEMORY_MS: Final = 24 * 3600 * 1000
"""A model's count is forgotten this long after its last change (beyond its cooldown)."""


def breaker_model(summarizer: str, conversation_model: str) -> str:
    """The model a summarizer named ``summarizer`` calls: that name, or the conversation's own
    model for one configured as ``conversation``."""
    return conversation_model if summarizer == "conversation" else summarizer


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A model's breaker, as one run sees it."""

    failures: int = 0
    """Failed runs in a row on the model, by any conversation (0 after a success)."""
    open: bool = False
    """Whether runs skip the model now."""


class Breaker:
    """Checks and updates the per-model breakers."""

    def __init__(
        self,
        redis: RedisClient,
        prefix: str,
        settings: SummarizerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.clock = clock
        self.prefix = prefix
        self.threshold = settings.breaker_failures
        self.cooldown_ms = max(1, int(settings.breaker_cooldown_seconds * 1000))
        self._script = Script(redis, "breaker.lua")

    def key(self, model: str) -> str:
        """The model's hash (keys.breaker_key)."""
        return breaker_key(model, self.prefix)

    async def check(self, model: str) -> BreakerState:
        """Whether this run may ask ``model``; after the cooldown the first caller is the probe."""
        state, _ = await self._call("check", model)
        return state

    async def peek(self, model: str) -> BreakerState:
        """The model's breaker as :meth:`check` would see it, without taking a probe's turn (status)."""
        failures, open_until = await self.redis.hmget(self.key(model), ["failures", "open_until"])
        count = int(failures or 0)
        tripped = 0 < self.threshold <= count
        return BreakerState(count, tripped and int(open_until or 0) > self._now_ms())

    async def record(self, model: str, *, failed: bool) -> BreakerState:
        """Count a run's verdict on ``model``: a failure (that may open it) or a success (that closes it)."""
        state, opened = await self._call("failed" if failed else "worked", model)
        if opened:
            metrics.record_breaker_open()
        return state

    async def _call(self, op: Literal["check", "failed", "worked"], model: str) -> tuple[BreakerState, bool]:
        failures, is_open, opened = await self._script(
            [self.key(model)],
            op=op,
            now_ms=str(self._now_ms()),
            threshold=str(self.threshold),
            cooldown_ms=str(self.cooldown_ms),
            ttl_ms=str(self.cooldown_ms + _MEMORY_MS),
        )
        return BreakerState(int(failures), bool(is_open)), bool(opened)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)
