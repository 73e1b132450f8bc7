"""The start-up rows of ``bench``: ``compaction-worker --help`` and a worker's cold start.

A worker's cold start is process start to its "worker consuming" line (every consumer has
joined the group and holds its partitions). Part of it is the broker's: a new group's first
join waits out the broker's initial rebalance delay (Kafka's ``group.initial.rebalance.delay.ms``,
3 s by default; the embedded broker's ~5 s). So the row is shown beside a bare aiokafka
consumer joining a fresh group on the same broker, and the worker's own share (imports,
wiring, connections) is the difference, with the target on it.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer

from compaction_worker.bench.bare import consumer_args
from compaction_worker.bench.environment import BenchEnv, Workers
from compaction_worker.bench.load import drop_topic, new_topic, topic_overrides
from compaction_worker.bench.report import Progress, Row

HELP_TARGET = 0.5
"""Seconds ``--help`` may take (issue 32)."""
OWN_START_TARGET = 3.0
"""Seconds a worker may take to start beyond the broker's group join (issue 32)."""


async def startup_rows(env: BenchEnv, progress: Progress) -> Sequence[Row]:
    """``--help`` and the cold start, each the median of ``env.repeat`` runs."""
    helps = []
    for i in range(env.repeat):
        progress(f"startup: --help {i + 1}/{env.repeat}")
        helps.append(await asyncio.to_thread(_timed_help))
    starts, joins = [], []
    for i in range(env.repeat):
        progress(f"startup: a worker's cold start {i + 1}/{env.repeat}")
        topic = await new_topic(env)
        try:
            joins.append(await _bare_join(env, topic))
            overrides = topic_overrides(topic, env.unique("start-group"), env.unique("start"))
            started = time.monotonic()
            with Workers(env, 1, env.unique("start"), overrides):  # started, and waited for until it consumes
                starts.append(time.monotonic() - started)
        finally:
            await drop_topic(env, topic)
    start, join = statistics.median(starts), statistics.median(joins)
    runs = f"runs: {', '.join(f'{s:.2f}' for s in starts)} s"
    return [
        Row("cli: --help", statistics.median(helps), "s", target=HELP_TARGET),
        Row(
            "worker: cold start (process start to consuming)",
            start,
            "s",
            baseline=join,
            baseline_name="bare consumers' first group join",
            note=f"{runs}; the broker's join delay is in both",
        ),
        Row(
            "worker: cold start beyond the group join",
            max(0.0, start - join),
            "s",
            target=OWN_START_TARGET,
            note="imports, wiring, tokenizers, Redis and broker connections; LiteLLM loads at the first LLM summary",
        ),
    ]


def _timed_help() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "compaction_worker.cli", "--help"], check=True, capture_output=True)
    return time.monotonic() - started


async def _bare_join(env: BenchEnv, topic: str) -> float:
    """Seconds bare aiokafka consumers (as many as a worker runs) take to join a fresh group on ``topic``
    together, until each holds its partitions: what the broker makes any new worker wait."""
    args = {**consumer_args(env.settings), "group_id": env.unique("bare-join")}
    consumers = [AIOKafkaConsumer(topic, **args) for _ in range(env.settings.kafka.consumers)]
    started = time.monotonic()
    await asyncio.gather(*(c.start() for c in consumers))
    try:
        while not all(c.assignment() for c in consumers):
            await asyncio.gather(*(c.getmany(timeout_ms=50) for c in consumers))
        return time.monotonic() - started
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))
