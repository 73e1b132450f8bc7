"""The cost rows of ``bench``: per-turn cost against history length, compaction overhead, Redis bytes, summarizer tokens.

Each row is an async function over the bench's Redis and fake LLM (no broker); the data is
shaped like real runtimes' (agent_data.py) and the model strings carry routing prefixes. Figures are medians or percentiles of
repeated runs, and every comparison is a ratio measured side by side in the same run.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

from compaction_worker import _litellm
from compaction_worker.bench.agent_data import agent_turn, fill, label, store_turn
from compaction_worker.bench.environment import BenchEnv
from compaction_worker.bench.report import Progress, Row, quantile
from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.runtime.components import Components, build_components
from compaction_worker.runtime.pool import run_job
from compaction_worker.runtime.worker import tune_gc
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import encode
from compaction_worker.testing import FakeLLMServer, turn_payload

TURN_MODEL = "openrouter/openai/gpt-4.1"
"""A 1M-token window: the per-turn rows never have a compaction due."""
COMPACT_MODEL = "azure/gpt-4o"
"""A 128K window: the 1M-token conversation compacts many times on its way."""
FAKE_LLM_THREAD = "fake-llm-server"
"""The name of the thread FakeLLMServer answers on: its CPU is the LLM's, not the worker's."""
LARGE_WINDOW = 8_000_000
"""The window the per-turn rows' events state, so a 1M-token history stays under its threshold."""


def _repeats(env: BenchEnv, full: int) -> int:
    """A row's runs: fewer on a small run (``--quick``, the tests), two at least."""
    return max(2, int(full * min(1.0, env.scale * 4)))


def offline_components(redis: RedisClient, prefix: str, llm: FakeLLMServer | None = None) -> Components:
    """Components under ``prefix`` with no broker (their events go nowhere); with ``llm``, its
    summarizer, one try per call (a failure is the row's to see)."""
    summarizer: dict[str, Any] = {}
    if llm is not None:
        summarizer = {"model": "openai/gpt-4o-mini", "api_base": llm.url, "api_key": "fake"}
    settings = Settings(
        redis={"key_prefix": prefix, "retention_seconds": None},
        kafka={"max_event_bytes": 4 << 20},
        summarizer=summarizer,
        retry={"llm_attempts": 1},
    )
    return build_components(settings, redis, _discard)


async def _discard(topic: str, payload: bytes, key: bytes | None) -> None:
    """The bench's publisher: events go nowhere (no broker in these rows)."""


# --- row 1: per-turn cost against history length -------------------------------------------------


async def per_turn_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """Median per-turn cost at 1K, 100K and 1M tokens of history, beside a naive baseline that recounts it every turn."""
    sizes = (1_000, env.size(100_000, 500), env.size(1_000_000, 500))
    turns, naive_turns = _repeats(env, 60), _repeats(env, 5)
    parts = offline_components(env.redis, f"bt{uuid.uuid4().hex[:6]}")
    counter = counter_for(TURN_MODEL, parts.settings.budget)
    cids = {}
    for size in sizes:
        cids[size] = cid = f"turns-{size}"
        progress(f"per-turn: storing {size:,} tokens of history")
        await fill(parts, cid, size, TURN_MODEL, counter)
        await fill(parts, f"naive-{cid}", size, TURN_MODEL, counter)
    worker: dict[int, list[float]] = {s: [] for s in sizes}
    naive: dict[int, list[float]] = {s: [] for s in sizes}
    next_seq = {s: (await parts.store.meta(cids[s])).last_seq + 1 for s in sizes}
    for turn in range(turns):
        progress(f"per-turn: turn {turn + 1}/{turns}")
        for size in sizes:  # interleaved, so that noise hits every size alike
            cid, seq = cids[size], next_seq[size]
            payload = encode(
                turn_payload(cid, seq, agent_turn(seq)[:1], model=TURN_MODEL, context_window=LARGE_WINDOW)
            ).encode()
            start = time.perf_counter()
            outcome = await parts.turns.handle(payload, cid.encode())
            worker[size].append(time.perf_counter() - start)
            if outcome.status.value != "appended":
                raise RuntimeError(f"bench turn not appended: {outcome}")
            next_seq[size] += 1
            if turn < naive_turns:
                naive[size].append(await _naive_turn(parts, f"naive-{cid}", counter))
    rows = [
        Row(
            f"per-turn cost, {label(size)} tokens of history",
            statistics.median(worker[size]) * 1000,
            "ms",
            statistics.median(naive[size]) * 1000,
            "recount every turn (naive baseline)",
        )
        for size in sizes
    ]
    first, last = label(sizes[0]), label(sizes[-1])
    ratio = Row(
        f"per-turn cost at {last} / at {first}",
        rows[-1].value,
        "ms",
        rows[0].value,
        f"per-turn cost at {first}",
        target=1.2,
    )
    return [*rows, ratio]


async def _naive_turn(parts: Components, cid: str, counter: TokenCounter) -> float:
    """One turn of the naive baseline: read and decode the whole history (never compacted: the
    transcript) and recount it, as a worker that keeps no counts does to decide; then append as
    the worker does."""
    start = time.perf_counter()
    meta = await parts.store.meta(cid)
    message = agent_turn(meta.last_seq + 1)[0]
    raw = await parts.store.redis.lrange(parts.store.keys(cid).transcript, 0, -1)
    # The recount is the baseline's cost; its total is what such a worker would decide by.
    _total = sum(counter.message(json.loads(r)["m"]) for r in raw) + counter.message(message)
    await store_turn(parts, cid, meta.last_seq + 1, [message], TURN_MODEL)
    return time.perf_counter() - start


# --- row 2: what a compaction costs beyond the LLM ---------------------------------------------


class LLMClock:
    """Adds up the time the worker waited for the LLM inside LiteLLM's completion calls: the LLM's share, to leave out.

    The time a call was in flight less the CPU this process spent meanwhile outside the fake
    LLM's own thread: LiteLLM's client-side work (it builds the request on an executor
    thread, parses the response, keeps its books) stays in the figure, as do the prompt, its
    token counts and validation. Overlapping calls count once.
    """

    def __init__(self, server_thread: str = FAKE_LLM_THREAD) -> None:
        self.seconds = 0.0
        """The wait: in-flight time less the client's CPU in it."""
        self.client_cpu = 0.0
        """This process's CPU while a call was in flight, the fake LLM's thread's left out: kept in the cost."""
        self.server_thread = server_thread
        self._in_flight = 0
        self._since = (0.0, 0.0)

    def reset(self) -> None:
        self.seconds = self.client_cpu = 0.0

    def _client_cpu(self) -> float:
        """This process's CPU so far, less the fake LLM server thread's (it answers in this process)."""
        server = 0.0
        for thread in threading.enumerate():
            if thread.name == self.server_thread and thread.ident is not None:
                with contextlib.suppress(OSError, AttributeError):  # gone, or no per-thread clocks here
                    server += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        return time.process_time() - server

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._since = (time.perf_counter(), self._client_cpu())
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            wall, cpu = time.perf_counter() - self._since[0], self._client_cpu() - self._since[1]
            self.client_cpu += cpu
            self.seconds += max(0.0, wall - cpu)

    @contextlib.contextmanager
    def installed(self) -> Iterator[LLMClock]:
        module = _litellm.load()
        original = module.acompletion

        async def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter()
            try:
                return await original(*args, **kwargs)
            finally:
                self._leave()

        with mock.patch.object(module, "acompletion", timed):
            yield self


async def compaction_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """p50/p99 of a manual compaction's cost without the wait for its LLM calls, at 50K and 500K tokens.

    LiteLLM's client-side CPU is part of the cost (see ``LLMClock``).
    """
    sizes = (env.size(50_000, 8_000), env.size(500_000, 16_000))
    repeats = _repeats(env, 20)
    if env.tune_gc:
        tune_gc()
    parts, clock = offline_components(env.redis, f"bc{uuid.uuid4().hex[:6]}", env.llm), LLMClock()
    counter = counter_for(COMPACT_MODEL, parts.settings.budget)
    overhead: dict[int, list[float]] = {s: [] for s in sizes}
    waits: dict[int, list[float]] = {s: [] for s in sizes}
    client: dict[int, list[float]] = {s: [] for s in sizes}
    for repeat in range(repeats):
        for size in sizes:
            progress(f"compaction: {size:,} tokens, run {repeat + 1}/{repeats}")
            cid = f"compact-{size}-{repeat}"
            await fill(parts, cid, size, "openrouter/openai/gpt-4.1", counter)
            await parts.jobs.schedule(cid, Trigger.MANUAL)
            clock.reset()
            with clock.installed():
                start = time.perf_counter()
                completed = await run_job(parts.jobs, parts.compactor, cid)
                elapsed = time.perf_counter() - start
            if completed is None or completed.outcome is not Outcome.COMPACTED:
                raise RuntimeError(f"bench compaction did not compact: {completed}")
            overhead[size].append((elapsed - clock.seconds) * 1000)
            waits[size].append(clock.seconds * 1000)
            client[size].append(clock.client_cpu * 1000)
            await parts.store.delete(cid)
    rows = []
    for size in sizes:
        note = (
            f"{repeats} runs; waiting for the fake LLM took {statistics.median(waits[size]):.0f} ms (median, left out); "
            f"the client's CPU during the calls (LiteLLM's) {statistics.median(client[size]):.1f} ms (median, included)"
        )
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            rows.append(
                Row(
                    f"compaction cost incl. LiteLLM's CPU, excl. the LLM's wait, {label(size)} tokens, {name}",
                    quantile(overhead[size], q),
                    "ms",
                    target=50.0 if name == "p99" and size == sizes[-1] else None,
                    note=note,
                )
            )
    return rows


# --- rows 3 and 4: Redis bytes and summarizer tokens over a long conversation -----------------


async def redis_bytes(redis: RedisClient, keys: Sequence[str]) -> int:
    """MEMORY USAGE over ``keys`` (every element counted: SAMPLES 0)."""
    return sum([int(await redis.memory_usage(key, samples=0) or 0) for key in keys])


async def long_conversation_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """A conversation of 1M tokens through the per-turn path, compacted as it goes (fake LLM).

    Reports Redis bytes against the raw transcript's bytes before the first compaction and at
    the end, and the summarizer's input tokens (the prompts as sent, counted with the
    conversation's counter) against the tokens its summaries took out of the history.
    """
    # gpt-4o's window at full scale; a smaller one stated by the events below it, so that a
    # small run still compacts several times.
    window = env.size(128_000, 16_000)
    goal = max(env.size(1_000_000, 500), 4 * window)
    parts = offline_components(env.redis, f"bl{uuid.uuid4().hex[:6]}", env.llm)
    counter = counter_for(COMPACT_MODEL, parts.settings.budget)
    cid, appended, raw, seq = "long", 0, 0, 0
    before: tuple[int, int] | None = None
    env.llm.reset()
    keys = parts.store.keys(cid).all()
    while appended < goal:
        seq += 1
        messages = agent_turn(seq, cid)
        payload = encode(
            turn_payload(cid, seq, messages, model=COMPACT_MODEL, context_window=window)
        ).encode()
        outcome = await parts.turns.handle(payload, cid.encode())
        if outcome.status.value != "appended":
            raise RuntimeError(f"bench turn not appended: {outcome}")
        appended += counter.messages(messages)
        raw += sum(len(encode(m).encode()) for m in messages)
        if outcome.scheduled is not None:
            if before is None:
                before = (await redis_bytes(env.redis, keys), raw)
            progress(f"long conversation: {appended:,} of {goal:,} tokens, compacting")
            await run_job(parts.jobs, parts.compactor, cid)
    after = await redis_bytes(env.redis, keys)
    log = await parts.store.compactions(cid)
    covered = max((int(r.get("covered_through_n") or 0) for r in log), default=0)
    records = await parts.store.transcript(cid, 0, covered - 1) if covered else []
    evicted = sum(int(r.get("t") or counter.message(r["m"])) for r in records)
    sent = sum(counter.messages(r["messages"]) for r in env.llm.requests if "messages" in r)
    moments = [("before compaction", *before)] if before is not None else []
    moments.append((f"after {len(log)} compactions", after, raw))
    rows = [
        Row(f"Redis bytes per conversation, {when}", value, "B", beside, "raw transcript JSON", target=2.5)
        for when, value, beside in moments
    ]
    summarized = Row(
        f"summarizer input tokens over {label(appended)} tokens",
        sent,
        "tokens",
        evicted,
        "tokens evicted into summaries",
        target=1.1,
        note=f"{len(env.llm.requests)} LLM calls, {len(log)} compactions",
    )
    return [*rows, summarized]


ROWS = (per_turn_rows, compaction_rows, long_conversation_rows)
"""The cost scenarios, in the order the table shows them."""
