"""An idle worker waits instead of polling: the Redis commands it sends, from the server's own counters.

One whole worker (its Kafka consumers, its compaction pool and sweeper), default worker
settings, on a valkey-server of its own, with nothing to do: the test reads ``INFO
commandstats`` and counts every command the server ran (commands inside scripts included;
the test's own ``INFO`` excluded), over its first ``WARM_UP`` seconds (start-up, and the jobs'
sweep backing off from 2 s) and then over ``WINDOW`` seconds of idleness, which the bound is
about. Before wake-ups, an idle worker sent 71-82 commands a second (every 2 s, every bucket
of three indexes and the backlog gauges); the bound is 5.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from compaction_worker.local.embedded import EmbeddedRedis
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import WorkerSettings
from tests.orchestration import make_settings

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WARM_UP = 30.0
WINDOW = 60.0
"""Seconds of idleness counted, after the warm-up: the safety sweeps' period (60 s) at least."""
PER_SECOND = 5


def calls(stats: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}


@pytest.mark.slow
async def test_an_idle_worker_sends_at_most_five_commands_a_second(
    kafka_bootstrap: str, make_topics: MakeTopics, own_redis: EmbeddedRedis
) -> None:
    topics = await make_topics("turn", "started", "completed", "dlq")
    defaults = WorkerSettings().model_dump()
    settings = make_settings(kafka_bootstrap, own_redis.url, topics, worker=defaults)
    counters = Redis.from_url(own_redis.url)
    try:
        start = calls(await counters.info("commandstats"))
        async with build_worker(settings).running():
            await asyncio.sleep(WARM_UP)
            warm = calls(await counters.info("commandstats"))
            await asyncio.sleep(WINDOW)
            idle = calls(await counters.info("commandstats"))
    finally:
        await counters.aclose()
    first, sent = delta(start, warm), delta(warm, idle)
    for what, seconds, counts in (("first", WARM_UP, first), ("then", WINDOW, sent)):
        total = sum(counts.values())
        print(
            f"\nidle worker, {what} {seconds:.0f}s: {total} commands, {total / seconds:.2f}/s: {sorted(counts.items())}"
        )
    assert sum(sent.values()) <= PER_SECOND * WINDOW, sent


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Commands run between two reads of the counters, but for the reads themselves."""
    counts = {name: n - before.get(name, 0) for name, n in after.items() if name != "info"}
    return {name: n for name, n in counts.items() if n}
