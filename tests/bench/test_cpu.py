"""CPU per stored turn from /proc (compaction_worker.bench.cpu)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from compaction_worker.bench.cpu import CpuMeter, cores, machine_ticks, process_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_busy_process_shows_its_cpu_and_the_machines() -> None:
    meter = CpuMeter([os.getpid()])
    meter.start()
    spin(0.3)

    figures = meter.stop(turns=1000)

    assert figures is not None
    assert 250 <= figures.process_us <= 400  # 0.3 s of CPU over 1,000 turns, give or take a tick
    # The machine's CPU holds this process's (a tick's rounding aside); no bound on the clock.
    assert figures.machine_us >= figures.process_us * 0.9
    assert 0 < figures.busy <= 1.0


def test_a_gone_process_gives_no_figures() -> None:
    meter = CpuMeter([2**22 + 12345])  # above the kernel's pid limit: never a process
    meter.start()

    assert process_seconds(2**22 + 12345) is None
    assert meter.stop(turns=10) is None


def test_the_machine_and_its_cores() -> None:
    assert cores() >= 1
    ticks = machine_ticks()
    assert ticks is not None
    busy, total = ticks
    assert 0 < busy < total
