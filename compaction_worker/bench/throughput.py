"""The throughput rows: one worker process beside the bare loops, two beside one, what one costs Redis
(redis_cost.py), and head-of-line latency.

Workers run as ``compaction-worker run`` child processes and are measured black-box: input is
published with aiokafka, stored turns are counted in Redis. Each run gets its own consumer group
and Redis key prefix (deleted after it), so runs over the same topic never share state.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from compaction_worker.bench.cpu import CpuFigures, CpuMeter, cores
from compaction_worker.bench.environment import RUN, BenchEnv, Workers, WorkerSource
from compaction_worker.bench.load import (
    MODELS,
    PARTITIONS,
    Attached,
    Batches,
    Input,
    StoredCounter,
    delete_prefix,
    drop_topic,
    encode,
    make_input,
    new_topic,
    producer,
    stored_rate,
    topic_overrides,
    wait_group,
    warmup_input,
)
from compaction_worker.bench.redis_cost import (
    TurnCost,
    cost_rows,
    idle_seconds,
    median_cost,
    redis_phases,
    worker_connections,
)
from compaction_worker.bench.report import Progress, Row, quantile, spread

BARE = ("-m", "compaction_worker.bench.bare")
PIPELINED = (*BARE, "--pipelined")
LLM_DELAY = 2.0
"""Seconds the fake LLM takes per call in the head-of-line row."""
POLL = 0.005
"""How often the head-of-line row looks for stored turns: the resolution of its latencies."""


@dataclass(frozen=True, slots=True)
class _Kind:
    """One kind of run in the throughput rows: what runs, how many processes, whose code."""

    name: str
    processes: int
    command: tuple[str, ...] = RUN
    source: WorkerSource | None = None
    redis: bool = False
    """Measure the Redis rows on it once its rate is measured (redis_cost.py)."""


@dataclass(frozen=True, slots=True)
class _Run:
    rate: float
    cpu: CpuFigures | None
    cost: TurnCost | None
    redis_us: float
    """Redis process CPU (INFO cpu, user + system) per stored turn over the timed input."""
    connections: int
    """The Redis connections the worker processes held once the input was stored (CLIENT LIST)."""


async def _one_run(env: BenchEnv, data: Input, kind: _Kind, progress: Progress) -> _Run:
    """Turns/s of ``kind``'s processes, a fresh group consuming ``data`` on a fresh topic, and
    their CPU per stored turn (cpu.py); then its Redis figures.

    The input is sent only once the group is stable (every process holding its partitions) and
    a warm-up turn of each model on each partition is stored, as record batches built
    beforehand: neither a rebalance, a cold start nor the publishing counts in the rate.
    """
    topic, group, prefix = await new_topic(env), env.unique(f"{kind.name}-group"), env.unique(kind.name)
    overrides = topic_overrides(topic, group, prefix)
    counter = StoredCounter(env, prefix, data.conversations)
    warm = warmup_input()
    try:
        async with Batches(env, data.events) as batches:
            built, warm_built = batches.build(), batches.build(warm.events)
            with Workers(
                env, kind.processes, kind.name, overrides, kind.command, source=kind.source
            ) as workers:
                await wait_group(env, group, kind.processes)
                await batches.send(topic, warm_built)
                warm_counter = StoredCounter(env, prefix, warm.conversations)
                await stored_rate(warm_counter, warm.total, alive=workers.check_alive, within=120)
                meter = CpuMeter([p.process.pid for p in workers.processes if p.process is not None])
                meter.start()
                redis_before = await _redis_cpu(env)
                await batches.send(topic, built)
                timeout = 60 + data.total / 50  # a floor of 50 turns/s: slower is a failure, not a figure
                rate = await stored_rate(counter, data.total, alive=workers.check_alive, within=timeout)
                redis_us = (await _redis_cpu(env) - redis_before) * 1e6 / data.total
                cpu = meter.stop(data.total)
                held = await worker_connections(env.redis) if isinstance(env.redis, Redis) else 0
                if not kind.redis:
                    return _Run(rate, cpu, None, redis_us, held)
                attached = Attached(topic, group, prefix, batches, workers.check_alive)
                cost = await redis_phases(
                    env, attached, idle_seconds(env.scale), progress, shard=kind.source is None
                )
                return _Run(rate, cpu, cost, redis_us, held)
    finally:
        await delete_prefix(env, prefix)
        await drop_topic(env, topic)


async def _redis_cpu(env: BenchEnv) -> float:
    """The Redis process's CPU seconds so far (user + system; a cluster's nodes added up)."""
    info: Any = await env.redis.info("cpu")
    nodes = info.values() if isinstance(env.redis, RedisCluster) else [info]
    return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes)


async def throughput_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """One worker process beside the bare loops, two beside one, and what one costs Redis.

    Same partitions, same input, one after the other in each round; with a baseline source,
    its worker's one and two processes run in the same rounds.
    """
    conversations, turns = env.size(200, 8), env.size(25, 3)
    data = make_input(conversations, turns)
    kinds = [
        _Kind("bare", 1, BARE),
        _Kind("pipelined", 1, PIPELINED),
        _Kind("one", 1, redis=True),
        _Kind("two", 2),
        _Kind("four", 4),
    ]
    if env.baseline is not None:
        kinds += [
            _Kind("base-one", 1, source=env.baseline, redis=True),
            _Kind("base-two", 2, source=env.baseline),
        ]
    runs: dict[str, list[_Run]] = {kind.name: [] for kind in kinds}
    for repeat in range(env.repeat):
        for kind in kinds:
            progress(f"throughput: {kind.name} ({kind.processes} process), run {repeat + 1}/{env.repeat}")
            runs[kind.name].append(await _one_run(env, data, kind, progress))
    rates = {name: [run.rate for run in each] for name, each in runs.items()}
    rows = _rate_rows(env, rates, f"{conversations} conversations x {turns} turns") + _cpu_rows(runs)
    rows += _scaling_rows(rates, runs)
    costs = {name: [run.cost for run in each if run.cost is not None] for name, each in runs.items()}
    base = median_cost(costs["base-one"]) if env.baseline is not None else None
    return rows + cost_rows(
        median_cost(costs["one"]), base, env.baseline, env.repeat, idle_seconds(env.scale)
    )


def _rate_rows(env: BenchEnv, rates: dict[str, list[float]], input_shape: str) -> list[Row]:
    median = {name: statistics.median(values) for name, values in rates.items()}
    consumers = env.settings.kafka.consumers
    shape = (
        f"{input_shape}, {PARTITIONS} partitions, no compaction due; median (min-max) of {env.repeat} runs: "
        + ", ".join(f"{name} {spread(values)}" for name, values in rates.items())
        + f"; ratios run by run: one/bare {_ratios(rates['one'], rates['bare'])}, "
        f"two/one {_ratios(rates['two'], rates['one'])}"
    )
    if env.baseline is not None:
        shape += (
            f", {env.baseline.label}: one/bare {_ratios(rates['base-one'], rates['bare'])}, "
            f"two/one {_ratios(rates['base-two'], rates['base-one'])}"
        )
    rows = [
        Row(
            "one worker / bare loop (same fetch settings)",
            median["one"],
            "turns/s",
            median["bare"],
            f"bare loop: {consumers} consumers, 1 awaited script call/event, commit/batch",
            target=0.6,
            at_least=True,
            note=shape,
        ),
        Row(
            "one worker / pipelined bare loop",
            median["one"],
            "turns/s",
            median["pipelined"],
            f"pipelined bare loop: {consumers} consumers, 1 Redis pipeline/batch",
        ),
        Row(
            "two workers / one worker",
            median["two"],
            "turns/s",
            median["one"],
            "one worker",
            target=1.6,
            at_least=True,
        ),
    ]
    if env.baseline is not None:
        label = env.baseline.label
        rows += [
            Row("one worker, this checkout", median["one"], "turns/s", median["base-one"], f"one, {label}"),
            Row("two workers, this checkout", median["two"], "turns/s", median["base-two"], f"two, {label}"),
        ]
    return rows


def _cpu_rows(runs: dict[str, list[_Run]]) -> list[Row]:
    """CPU per stored turn: one worker beside the bare loop, two beside one, and what the whole
    machine spent with two; none where /proc does not tell (not Linux)."""
    cpus = {name: [run.cpu for run in runs[name] if run.cpu is not None] for name in ("bare", "one", "two")}
    if not all(cpus.values()):
        return []
    own = {name: statistics.median(c.process_us for c in cpus[name]) for name in ("bare", "one", "two")}
    machine = statistics.median(c.machine_us for c in cpus["two"])
    busy = statistics.median(c.busy for c in cpus["two"])
    return [
        Row("worker CPU per stored turn", own["one"], "µs", own["bare"], "bare loop's CPU per turn"),
        Row("two workers' CPU per stored turn", own["two"], "µs", own["one"], "one worker's"),
        Row(
            "machine CPU per stored turn, two workers",
            machine,
            "µs",
            note=f"every core's busy time (workers, Redis, broker, bench) from publishing to the last "
            f"turn stored: {busy:.0%} of {cores()} cores busy; two workers cannot beat "
            f"{cores()} cores / this, however fast each is",
        ),
    ]


def _scaling_rows(rates: dict[str, list[float]], runs: dict[str, list[_Run]]) -> list[Row]:
    """Issue 35: adding workers never lowers throughput, and a stored turn costs Redis the same
    whatever the number of workers (and of their connections)."""
    median = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {name: statistics.median(run.redis_us for run in each) for name, each in runs.items()}
    held = {name: max(run.connections for run in each) for name, each in runs.items()}
    per = ", ".join(
        f"{name} {cpu[name]:.3g} µs ({held[name]} connections)" for name in ("one", "two", "four")
    )
    return [
        Row(
            "four workers / two workers",
            median["four"],
            "turns/s",
            median["two"],
            "two workers",
            target=0.9,
            at_least=True,
            note=f"four processes, 16 consumers for {PARTITIONS} partitions, on {cores()} cores: past what the "
            f"machine runs at once, the rate must hold (0.9x: within this machine's noise), not fall; "
            f"run by run {_ratios(rates['four'], rates['two'])}",
        ),
        Row(
            "Redis CPU per stored turn, four workers / one",
            cpu["four"],
            "µs",
            cpu["one"],
            "one worker",
            target=1.25,
            note=f"INFO cpu over each run's input (a backlog); by workers: {per}",
        ),
    ]


def _ratios(values: list[float], baselines: list[float]) -> str:
    return " ".join(f"{v / b:.2f}" for v, b in zip(values, baselines, strict=True))


class _Latencies:
    """Closed-loop conversations (publish a turn, wait until it is stored, think, repeat) and their latencies."""

    def __init__(self, env: BenchEnv, topic: str, counter: StoredCounter, cids: tuple[str, ...]) -> None:
        self.env, self.topic, self.counter, self.cids = env, topic, counter, cids
        self.seq = [0] * len(cids)
        self.waiting: dict[int, tuple[int, float, asyncio.Future[float]]] = {}

    async def poll(self) -> None:
        """Resolve each waiting turn once Redis shows its conversation's last seq at or past it."""
        while True:
            indexes = list(self.waiting)
            seqs = await self.counter.last_seqs(indexes)
            now = time.monotonic()
            for index, last in zip(indexes, seqs, strict=True):
                seq, sent, done = self.waiting[index]
                if last >= seq:
                    del self.waiting[index]
                    done.set_result(now - sent)
            await asyncio.sleep(POLL)

    async def conversation(
        self, index: int, window: int | None, until: float, think: float, out: list[float] | None
    ) -> None:
        cid = self.cids[index]
        model = MODELS[index % len(MODELS)]
        publisher = self.publisher
        await asyncio.sleep(think * index / len(self.cids))  # spread the starts
        while time.monotonic() < until:
            self.seq[index] += 1
            seq = self.seq[index]
            # A compacting conversation's turns are larger (~1.5K tokens): a compaction is due every few.
            value = encode(cid, seq, model, 60, context_window=window) if window else encode(cid, seq, model)
            done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            sent = time.monotonic()
            self.waiting[index] = (seq, sent, done)
            await publisher.send_and_wait(self.topic, value, key=cid.encode())
            latency = await asyncio.wait_for(done, timeout=120)
            if out is not None:
                out.append(latency)
            await asyncio.sleep(think)

    async def phase(
        self, seconds: float, think: float, windows: Mapping[int, int]
    ) -> tuple[list[float], list[float]]:
        """Run every conversation for ``seconds``; the latencies of the others' and of the windowed ones' turns."""
        others: list[float] = []
        compacting: list[float] = []
        until = time.monotonic() + seconds
        poller = asyncio.create_task(self.poll())
        try:
            await asyncio.gather(
                *(
                    self.conversation(i, windows.get(i), until, think, compacting if i in windows else others)
                    for i in range(len(self.cids))
                )
            )
        finally:
            poller.cancel()
        return others, compacting

    async def __aenter__(self) -> _Latencies:
        self.publisher = producer(self.env, linger_ms=0)
        await self.publisher.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.publisher.stop()


async def _warm_up_compactions(env: BenchEnv, topic: str, prefix: str, name: str, think: float) -> int:
    """A few conversations compacting through an instant LLM: the worker's first LLM call and
    compaction (imports, clients, caches) are behind it before anything is timed. Returns the LLM calls."""
    cids = tuple(f"{name}-{i}" for i in range(4))
    before = len(env.llm.requests)
    env.llm.set_delay(0.0)
    try:
        async with _Latencies(env, topic, StoredCounter(env, prefix, cids), cids) as warm:
            await warm.phase(3.0, think / 3, dict.fromkeys(range(len(cids)), 6_000))
        for _ in range(300):  # the compactions run in the background: wait (up to 30 s) for their calls
            if len(env.llm.requests) > before and not env.llm.in_flight:
                break
            await asyncio.sleep(0.1)
    finally:
        env.llm.set_delay(LLM_DELAY)
    return len(env.llm.requests) - before


async def head_of_line_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """p99 publish-to-stored latency of non-compacting turns while 10% of conversations compact (2 s LLM).

    Beside it, the same worker and load with no compaction running (the same conversations,
    the 10% at a normal window): each run is a quiet phase, then a compacting one.
    """
    conversations, seconds = env.size(100, 10), max(3.0, 10 * env.scale)
    think = 0.5  # ~2 turns/s per conversation: 200 turns/s at full size, well under one worker's rate
    compacting = dict.fromkeys(range(0, conversations, 10), 6_000)  # compaction due every few turns
    quiet_p99: list[float] = []
    busy_p99: list[float] = []
    own_p99: list[float] = []  # the compacting conversations' own turns
    samples = llm_calls = warm_calls = 0
    env.llm.set_delay(LLM_DELAY)
    try:
        for repeat in range(env.repeat):
            topic = await new_topic(env)
            group, prefix = env.unique("hol-group"), env.unique("hol")
            overrides = {
                **topic_overrides(topic, group, prefix),
                "SUMMARIZER__MODEL": "openai/gpt-4o-mini",
                "SUMMARIZER__API_BASE": env.llm.url,
                "SUMMARIZER__API_KEY": "fake",
                "RETRY__LLM_ATTEMPTS": "1",
                "WORKER__SHUTDOWN_GRACE_SECONDS": "1",  # compactions still running are handed back
            }
            cids = tuple(f"hol-{repeat}-{i:04d}" for i in range(conversations))
            counter = StoredCounter(env, prefix, cids)
            try:
                with Workers(env, 1, "head-of-line", overrides):
                    await wait_group(env, group, 1)
                    progress(f"head-of-line: warming up, run {repeat + 1}/{env.repeat}")
                    warm_calls += await _warm_up_compactions(env, topic, prefix, f"hol-warm-{repeat}", think)
                    async with _Latencies(env, topic, counter, cids) as load:
                        await load.phase(1.0, think, {})
                        progress(f"head-of-line: no compaction, run {repeat + 1}/{env.repeat}")
                        quiet, _ = await load.phase(seconds, think, {})
                        before = len(env.llm.requests)
                        progress(f"head-of-line: 10% compacting, run {repeat + 1}/{env.repeat}")
                        busy, own = await load.phase(seconds, think, compacting)
                        llm_calls += len(env.llm.requests) - before
            finally:
                await delete_prefix(env, prefix)
                await drop_topic(env, topic)
            quiet_p99.append(quantile(quiet, 0.99) * 1000)
            busy_p99.append(quantile(busy, 0.99) * 1000)
            own_p99.append(quantile(own, 0.99) * 1000 if own else 0.0)
            samples += len(busy)
    finally:
        env.llm.set_delay(0.0)
    return [
        Row(
            "head-of-line: p99 store latency, 10% compacting",
            statistics.median(busy_p99),
            "ms",
            statistics.median(quiet_p99),
            "p99 with no compaction running",
            target=100.0,
            target_on_value=True,
            note=(
                f"{conversations} conversations, 1 worker, {seconds:.0f} s per phase, {samples} turns timed, "
                f"{llm_calls} LLM calls of {LLM_DELAY:g} s (after a warm-up with {warm_calls} instant ones); publish to stored, polled every {POLL * 1000:.0f} ms; "
                f"median (min-max) of {env.repeat} runs: {spread(busy_p99)} ms, quiet {spread(quiet_p99)} ms; "
                f"the compacting conversations' own turns: p99 {spread(own_p99)} ms"
            ),
        )
    ]
