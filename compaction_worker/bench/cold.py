"""The cold-backlog rows of ``bench``: a worker started under a backlog, beside the same worker warm.

KEDA adds a worker because of lag, so a new worker starts with a backlog waiting. Each run
publishes ``BACKLOG`` turns (no compaction due) to a fresh topic, then starts one
``compaction-worker run`` with an LLM summarizer set (the fake LLM, never called) and counts
the turns stored in Redis from the first: its rate over the first ``FIRST_SECONDS`` and over
the whole backlog. Then the same process, warm, is sent a second backlog of the same shape,
counted from when it is all published (its sending would otherwise weigh on the warm rate alone). py-spy (when installed: it is not a dependency)
samples the process meanwhile with ``--gil``: each sample is the thread holding the
interpreter, and the share inside an import is what a cold start takes from the turns. With
``--baseline-source`` the other checkout's worker runs the same, in the same rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compaction_worker.bench.cpu import process_seconds
from compaction_worker.bench.environment import BenchEnv, BenchError, WorkerProcess, WorkerSource
from compaction_worker.bench.load import (
    Batches,
    Input,
    StoredCounter,
    delete_prefix,
    drop_topic,
    make_input,
    new_topic,
    topic_overrides,
)
from compaction_worker.bench.report import Progress, Row

BACKLOG_CONVERSATIONS, BACKLOG_TURNS = 800, 25
"""20K turns, as the bench's throughput input shapes them."""
FIRST_SECONDS = 3.0
"""The start of a backlog the first rate is taken over: where a cold worker's imports fall."""
COLD_TARGET = 0.9
"""A cold worker stores at least this share of what a warm one does (issue 54)."""
POLL = 0.02
IMPORT_FRAME = "_find_and_load ("
"""The frame every ``import`` statement runs under (importlib's), in py-spy's raw stacks."""


@dataclass(frozen=True, slots=True)
class Drain:
    """How fast one backlog was stored, and what the worker's interpreter spent on imports meanwhile."""

    first: float
    """Turns/s over the first FIRST_SECONDS from the first turn stored (the whole backlog, if quicker)."""
    whole: float
    """Turns/s from the first turn stored to the last."""
    import_share: float | None
    """The share of py-spy's samples (the thread holding the GIL) inside an import; None without py-spy."""


@dataclass(frozen=True, slots=True)
class _Run:
    cold: Drain
    warm: Drain


def py_spy() -> str | None:
    """py-spy beside this interpreter (a virtualenv's bin), else on PATH; None if not installed."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


class Sampler:
    """``py-spy record --gil -f raw`` on a process, from :meth:`start` to :meth:`stop`; a no-op without py-spy."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start sampling (again after :meth:`stop`; a no-op while it samples)."""
        binary = py_spy()
        if binary is None or self.process is not None:
            return
        self.out.unlink(missing_ok=True)
        command = [binary, "record", "-p", str(self.pid), "-r", "100", "-f", "raw", "--gil"]
        # --nonblocking: sampling never pauses the worker, so it costs the rate next to nothing.
        command += ["--nonblocking", "-o", str(self.out)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> float | None:
        """Stop sampling; the share of the samples inside an import (None: no py-spy, or no samples)."""
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        return import_share(self.out.read_text(errors="replace") if self.out.exists() else "")


def import_share(raw: str) -> float | None:
    """The share of a py-spy raw profile's samples whose stack is inside an import (None: no samples)."""
    total = imports = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        if IMPORT_FRAME in stack:
            imports += int(count)
    return imports / total if total else None


async def _drain(
    counter: StoredCounter,
    total: int,
    alive: Callable[[], None],
    sampler: Sampler,
    start: tuple[float, int] | None = None,
) -> Drain:
    """Count ``total`` turns stored, the rates from ``start`` (a time and the count then), else
    from the first turn stored.

    py-spy samples from the first turn stored (attaching to a process that is not yet running
    Python fails), or from ``start``, to the last.
    """
    deadline = time.monotonic() + 120 + total / 50  # a floor of 50 turns/s: slower is a failure
    at_first: tuple[float, int] | None = None
    while True:
        now, stored = time.monotonic(), await counter.stored()
        if start is None and stored > 0:
            start = (now, stored)
            sampler.start()
        if start is not None and at_first is None and now - start[0] >= FIRST_SECONDS:
            at_first = (now, stored)
        if start is not None and stored >= total:
            share = sampler.stop()
            whole = (total - start[1]) / max(now - start[0], POLL)
            first = whole if at_first is None else (at_first[1] - start[1]) / (at_first[0] - start[0])
            return Drain(first, whole, share)
        if now > deadline:
            sampler.stop()
            raise BenchError(f"only {stored} of {total} turns stored within the bench's time")
        alive()
        await asyncio.sleep(POLL)


async def _settled(pid: int, within: float = 120.0) -> None:
    """Wait until the process idles (under a tenth of a core for half a second): it is warm."""
    deadline = time.monotonic() + within
    before = process_seconds(pid)
    while before is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = process_seconds(pid)
        if now is None or now - before < 0.05:
            return
        before = now


async def _one_run(env: BenchEnv, cold: Input, warm: Input, name: str, source: WorkerSource | None) -> _Run:
    """A worker started on ``cold`` waiting in a fresh topic, then, warm, sent ``warm``."""
    topic, group, prefix = await new_topic(env), env.unique(f"{name}-group"), env.unique(name)
    overrides = {
        **topic_overrides(topic, group, prefix),
        "SUMMARIZER__MODEL": "openai/gpt-4o-mini",
        "SUMMARIZER__API_BASE": env.llm.url,
        "SUMMARIZER__API_KEY": "fake",
    }
    worker = WorkerProcess(env, env.unique(name), overrides, source=source)
    try:
        async with Batches(env, [*cold.events, *warm.events]) as batches:
            await batches.send(topic, batches.build(cold.events))
            warm_built = batches.build(warm.events)
            worker.start()
            assert worker.process is not None
            sampler = Sampler(worker.process.pid, env.workdir / f"{name}.spy")
            cold_counter = StoredCounter(env, prefix, cold.conversations)
            first = await _drain(cold_counter, cold.total, worker.check_alive, sampler)
            await _settled(worker.process.pid)  # whatever the start left running (an import on a thread) ends
            warm_counter = StoredCounter(env, prefix, warm.conversations)
            await batches.send(topic, warm_built)
            sent = (time.monotonic(), await warm_counter.stored())
            sampler.start()  # where the cold phase's started: its attaching weighs on both alike
            if sent[1] > warm.total // 2:
                raise BenchError(f"{sent[1]} of {warm.total} turns were stored while they were sent")
            second = await _drain(warm_counter, warm.total, worker.check_alive, sampler, sent)
            return _Run(first, second)
    finally:
        worker.stop()
        await delete_prefix(env, prefix)
        with contextlib.suppress(Exception):
            await drop_topic(env, topic)


async def cold_backlog_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """A cold worker with an LLM summarizer set, under a backlog, beside the same worker warm."""
    conversations = env.size(BACKLOG_CONVERSATIONS, 8)
    cold, warm = (make_input(conversations, BACKLOG_TURNS, prefix) for prefix in ("cold", "warm"))
    sources: list[tuple[str, WorkerSource | None]] = [("this checkout", None)]
    if env.baseline is not None:
        sources.append((env.baseline.label, env.baseline))
    runs: dict[str, list[_Run]] = {label: [] for label, _ in sources}
    for repeat in range(env.repeat):
        for index, (label, source) in enumerate(sources):
            progress(f"cold backlog: {label}, run {repeat + 1}/{env.repeat}")
            runs[label].append(await _one_run(env, cold, warm, f"cold-{index}", source))
    shape = f"{cold.total} turns ({conversations} conversations x {BACKLOG_TURNS}), no compaction due"
    return [row for label, _ in sources for row in _rows(label, runs[label], shape, env.repeat)]


def _median_run(runs: list[_Run], of: Callable[[Drain], float]) -> _Run:
    """The run whose cold/warm ratio is the median (the lower of the middle two): a row shows its
    two rates, so that its ratio is the median ratio of runs that each compare within themselves."""
    ordered = sorted(runs, key=lambda r: of(r.cold) / of(r.warm))
    return ordered[(len(ordered) - 1) // 2]


def _rows(label: str, runs: list[_Run], shape: str, repeat: int) -> list[Row]:
    def ratios(of: Callable[[Drain], float]) -> str:
        return " ".join(f"{of(r.cold) / of(r.warm):.2f}" for r in runs)

    first, whole = _median_run(runs, lambda d: d.first), _median_run(runs, lambda d: d.whole)

    def rates(of: Callable[[Drain], float]) -> str:
        return ", ".join(f"{of(r.cold):,.0f}/{of(r.warm):,.0f}" for r in runs)

    shares = [r.cold.import_share for r in runs]
    warm_shares = [r.warm.import_share for r in runs]
    rows = [
        Row(
            f"cold worker / warm, first {FIRST_SECONDS:g} s of a backlog ({label})",
            first.cold.first,
            "turns/s",
            first.warm.first,
            "the same worker warm",
            target=COLD_TARGET,
            at_least=True,
            note=f"{shape}, an LLM summarizer set; the run of the median ratio; cold/warm turns/s run by "
            f"run: {rates(lambda d: d.first)}; ratios {ratios(lambda d: d.first)} ({repeat} runs)",
        ),
        Row(
            f"cold worker / warm, whole backlog ({label})",
            whole.cold.whole,
            "turns/s",
            whole.warm.whole,
            "the same worker warm",
            target=COLD_TARGET,
            at_least=True,
            note=f"run by run: {rates(lambda d: d.whole)}; ratios {ratios(lambda d: d.whole)}",
        ),
    ]
    if all(s is not None for s in shares):
        measured = [s for s in shares if s is not None]
        rows.append(
            Row(
                f"cold worker's samples in imports, over the backlog ({label})",
                statistics.median(measured) * 100,
                "%",
                note="py-spy --gil (the thread holding the interpreter), run by run: "
                + " ".join(f"{s:.0%}" for s in measured)
                + "; warm: "
                + " ".join(f"{s:.0%}" if s is not None else "-" for s in warm_shares),
            )
        )
    return rows
