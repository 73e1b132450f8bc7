"""CPU time from /proc (Linux): the workers' own and the whole machine's, per stored turn.

The rates say how fast; these say what a turn costs, which a busy machine disturbs less, and
whether a run had the machine to itself: two workers can only be twice one while the cores
they, Redis and the broker share have time to spare.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cores() -> int:
    """The cores :func:`machine_ticks` sums over: the ``cpuN`` lines of /proc/stat, else
    what the OS counts."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            listed = sum(1 for line in stat if line.startswith("cpu") and line[3:4].isdigit())
    except OSError:
        listed = 0
    return listed or os.cpu_count() or 1


def process_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a process (None: no /proc, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_ticks() -> tuple[int, int] | None:
    """Clock ticks every core of the machine spent busy (user, nice, system, irq, softirq), and
    in all (busy, idle, waiting and stolen): the busy share is one over the other, on one clock."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


@dataclass(frozen=True, slots=True)
class CpuFigures:
    """CPU per stored turn over one timed phase."""

    process_us: float
    """The measured processes' CPU per turn, summed over them."""
    machine_us: float
    """Every core's busy time per turn: the processes, Redis, the broker and the bench itself."""
    busy: float
    """The share of all cores' time that was busy during the phase."""


class CpuMeter:
    """CPU of some processes and of the machine between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._start: tuple[tuple[int, int] | None, list[float | None]] | None = None

    def start(self) -> None:
        self._start = (machine_ticks(), [process_seconds(p) for p in self.pids])

    def stop(self, turns: int) -> CpuFigures | None:
        """The figures per stored turn, or None where /proc does not tell them."""
        if self._start is None or turns <= 0:
            return None
        machine, processes = self._start
        machine_now = machine_ticks()
        spent = [
            (now - before) if now is not None and before is not None else None
            for before, now in zip(processes, (process_seconds(p) for p in self.pids), strict=True)
        ]
        if machine is None or machine_now is None or None in spent:
            return None
        busy, total = machine_now[0] - machine[0], machine_now[1] - machine[1]
        if total <= 0:  # a phase within one clock tick
            return None
        own = sum(s for s in spent if s is not None)
        return CpuFigures(own / turns * 1e6, busy / _TICK / turns * 1e6, busy / total)
