"""The telemetry rows of ``bench``: what a stored turn costs with the instrumentation bare, off and on.

Each configuration times the whole per-turn path (parse, count, plan, the append) inside the
worker's consume span (a ``traceparent`` header, as the broker delivers it) on a conversation
of :data:`HISTORY` messages, against the bench's Redis:

- off: no SDK installed, as a worker runs with no ``OTEL_*`` variable (the default);
- bare: the telemetry calls replaced by nothing (the path without instrumentation);
- on: SDK tracer and meter providers, every span exported (in memory).

OpenTelemetry's global providers can be set once per process, so "on" runs in a child process
of its own and "off" in another (``python -m compaction_worker.bench.telemetry``), for
``repeat`` rounds. Off and bare alternate turn by turn in one process, so that the machine's
noise, which moves far more between two processes than the calls cost, hits both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from unittest import mock

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from compaction_worker.bench.agent_data import store_turn
from compaction_worker.bench.environment import BenchEnv, BenchError, worker_environment
from compaction_worker.bench.load import delete_prefix
from compaction_worker.bench.report import Progress, Row
from compaction_worker.observability import metrics as metrics_api
from compaction_worker.observability import tracing
from compaction_worker.runtime.components import build_components
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.settings import load_settings
from compaction_worker.testing import turn_payload

MODES = ("off", "on")
"""The child processes: "off" times off and bare turn by turn; "on" times on."""
HISTORY = 1_000
"""Messages stored before the timed turns (nothing on the per-turn path reads them)."""
MODEL = "gpt-4.1"
"""A 1M-token window: no compaction comes due while the turns are timed."""
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OFF_TARGET = 1.05
"""Off against bare: with no SDK the instrumentation must cost next to nothing."""


async def telemetry_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """Per-turn cost off against bare, and on against off (medians of the rounds' medians)."""
    turns = env.size(300, 40)
    medians: dict[str, list[float]] = {"off": [], "bare": [], "on": []}
    for round_ in range(env.repeat):
        for mode in MODES:
            progress(f"telemetry: round {round_ + 1}/{env.repeat}, {mode}, {turns} turns")
            prefix = env.unique(f"telemetry-{mode}")
            try:
                figures = await _child(env, mode, turns, prefix)
            finally:
                await delete_prefix(env, prefix)
            for name, seconds in figures.items():
                medians[name].append(seconds)
    bare, off, on = (statistics.median(medians[name]) for name in ("bare", "off", "on"))
    calls = calls_cost()
    shape = (
        f"{turns} turns on a {HISTORY}-message history, inside the consume span, off and bare alternating "
        f"turn by turn in one process; median of {env.repeat} rounds"
    )
    return [
        Row(
            "per-turn cost, telemetry off (no SDK: the default)",
            off * 1000,
            "ms",
            bare * 1000,
            "no telemetry calls",
            target=OFF_TARGET,
            note=f"{shape}; the telemetry calls of one turn alone, off: {calls * 1e6:.2f} µs "
            f"({calls / off:.2%} of the turn)",
        ),
        Row(
            "per-turn cost, telemetry on (SDK, every span exported)",
            on * 1000,
            "ms",
            off * 1000,
            "telemetry off",
            note="the SDK's tracer and meter providers, spans to an in-memory exporter (no network); "
            "a process of its own beside off's",
        ),
    ]


async def _child(env: BenchEnv, mode: str, turns: int, prefix: str) -> dict[str, float]:
    """The median seconds per turn of one child process in ``mode``, by configuration."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        mode,
        str(turns),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=worker_environment(env, {"REDIS__KEY_PREFIX": prefix}),  # the bench's Redis, its settings
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise BenchError(f"the telemetry child ({mode}) failed: {err.decode(errors='replace')[-2000:]}")
    figures: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return figures


@contextlib.contextmanager
def _stripped() -> Iterator[None]:
    """The instrumentation's entry points replaced by nothing while the block runs (``bare``)."""

    def nothing(*_args: object, **_kwargs: object) -> contextlib.nullcontext[trace.Span]:
        return contextlib.nullcontext(trace.INVALID_SPAN)

    def no_value(*_args: object, **_kwargs: object) -> None:
        return None

    with (
        mock.patch.object(tracing, "span", nothing),
        mock.patch.object(tracing, "consume_span", nothing),
        mock.patch.object(tracing, "current_traceparent", no_value),
        mock.patch.object(metrics_api, "record_turn", no_value),
    ):
        yield


async def timed_turns(mode: str, turns: int) -> dict[str, float]:
    """Median seconds per stored turn in this process, by configuration: off and bare turn by
    turn, or on (a child's work, on the settings its environment gives: the bench's Redis, a key
    prefix of its own)."""
    exporter = InMemorySpanExporter()
    if mode == "on":
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    settings = load_settings()
    redis = connect_redis(settings.redis)

    async def discard(topic: str, payload: bytes, key: bytes | None) -> None:
        """No compaction comes due: nothing is published."""

    timings: dict[str, list[float]] = {"on": []} if mode == "on" else {"off": [], "bare": []}
    try:
        parts = build_components(settings, redis, discard)
        cid = "t"
        filler = [{"role": "user", "content": f"message {i} " * 5} for i in range(HISTORY)]
        await store_turn(parts, cid, 1, filler, MODEL)
        for turn in range(turns):
            config = "on" if mode == "on" else ("off", "bare")[turn % 2]
            message = {"role": "assistant", "content": f"reply {turn} " * 20}
            payload = json.dumps(turn_payload(cid, turn + 2, [message], model=MODEL)).encode()
            with _stripped() if config == "bare" else contextlib.nullcontext():
                started = time.perf_counter()
                with _consumed(turn, cid):
                    outcome = await parts.turns.handle(payload, cid.encode())
                timings[config].append(time.perf_counter() - started)
            if outcome.status.value != "appended":
                raise BenchError(f"turn {turn + 2} was {outcome.status.value}, not appended")
    finally:
        await redis.aclose()
    if mode == "on" and not exporter.get_finished_spans():
        raise BenchError("telemetry on, yet no span was exported")
    return {config: statistics.median(values) for config, values in timings.items()}


def _consumed(offset: int, cid: str) -> AbstractContextManager[trace.Span]:
    """The worker's consume span of record ``offset``, its producer's trace in the headers (looked up
    on the module at each call: bare turns get the stub)."""
    return tracing.consume_span(
        topic="turns",
        partition=0,
        offset=offset,
        group="bench",
        conversation_id=cid,
        headers=[("traceparent", TRACEPARENT)],
    )


def _one_turns_calls() -> None:
    """The telemetry calls the per-turn path makes: the consume, append and budget spans, the turn counter."""
    with _consumed(0, "t"):
        with tracing.span(tracing.APPEND_SPAN) as append:
            append.set_attribute("compaction.append.status", "appended")
        with tracing.span(tracing.BUDGET_SPAN):
            tracing.current_traceparent()
        metrics_api.record_turn("appended")


def calls_cost(repeat: int = 20_000) -> float:
    """Seconds per turn of the telemetry calls alone, in this process (the bench's: no SDK, off);
    the best of five timings, the least disturbed by other processes."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            _one_turns_calls()
        best = min(best, (time.perf_counter() - started) / repeat)
    return best


if __name__ == "__main__":  # a child: MODE TURNS
    print(json.dumps(asyncio.run(timed_turns(sys.argv[1], int(sys.argv[2])))))
