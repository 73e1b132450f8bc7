"""The scenarios of ``bench`` by name, and running a selection of them into one list of rows."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from redis.asyncio import Redis

from compaction_worker.bench import costs
from compaction_worker.bench.cache import cache_rows
from compaction_worker.bench.cold import cold_backlog_rows
from compaction_worker.bench.environment import BenchEnv, BenchError
from compaction_worker.bench.recall import recall_rows
from compaction_worker.bench.replays import replay_rows
from compaction_worker.bench.report import Progress, Row
from compaction_worker.bench.startup import startup_rows
from compaction_worker.bench.telemetry import telemetry_rows
from compaction_worker.bench.throughput import head_of_line_rows, throughput_rows

Scenario = Callable[[BenchEnv, Progress], Awaitable[Sequence[Row]]]
"""A group of rows: it runs on the shared environment, says what it does, returns its rows."""


def cost_scenario(scenario: Scenario) -> Scenario:
    """A cost scenario (``costs.ROWS``), on a single Redis only (its rows read MEMORY USAGE key by key)."""

    async def run(env: BenchEnv, progress: Progress) -> Sequence[Row]:
        if not isinstance(env.redis, Redis):
            raise BenchError(
                "the cost rows need a single Redis, not a cluster (--only throughput --only head_of_line)"
            )
        return await scenario(env, progress)

    return run


SCENARIOS: dict[str, Scenario] = {
    "startup": startup_rows,
    "cold_backlog": cold_backlog_rows,
    "throughput": throughput_rows,
    "head_of_line": head_of_line_rows,
    **{scenario.__name__.removesuffix("_rows"): cost_scenario(scenario) for scenario in costs.ROWS},
    "telemetry": telemetry_rows,
    "recall": recall_rows,
    "cache": cache_rows,
    "replays": replay_rows,
}
"""Every scenario, in the order the table shows them; ``--only`` takes these names."""


def select(only: Sequence[str]) -> list[str]:
    """The scenario names ``--only`` picks (each a name or a part of one); all of them without it."""
    if not only:
        return list(SCENARIOS)
    unknown = [part for part in only if not any(part in name for name in SCENARIOS)]
    if unknown:
        raise ValueError(f"no scenario matches {', '.join(unknown)}; scenarios: {', '.join(SCENARIOS)}")
    return [name for name in SCENARIOS if any(part in name for part in only)]


async def run_scenarios(env: BenchEnv, names: Sequence[str], progress: Progress) -> list[Row]:
    """Run the named scenarios one after another (never side by side: they would share the CPU)."""
    rows: list[Row] = []
    for name in names:
        progress(f"{name}: starting")
        rows.extend(await SCENARIOS[name](env, progress))
    return rows
