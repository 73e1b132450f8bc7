"""The replay rows of ``bench``: what compactions cost per 100 turns of published agent runs.

The runs in tests/data/trajectories/ (``*/*.traj*``, run from a checkout) go through ``compaction-worker
replay --json`` at 4K, 6K and 8K windows, as a process: this checkout's, and with
``--baseline-source`` the other checkout's beside it, so that one run shows before and after
with the same command. The figures are the replay's own (``per_100_turns``, replay/simulate.py
``Tally``): the history's, not the infrastructure's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from compaction_worker.bench.environment import BenchEnv, BenchError
from compaction_worker.bench.report import Progress, Row

TRAJECTORIES = Path("tests/data/trajectories")
"""The repository's published runs (the bench runs from a checkout)."""
WINDOWS = (4096, 6144, 8192)

FIGURES = (
    ("compactions", "compactions", None),
    ("small_compactions", "compactions saving under 10% of a history within its window", 0.0),
    ("multi_run_turns", "turns with several compaction runs", 0.0),
    ("summary_calls", "summary calls", None),
    ("cache_breaks", "cache breaks", None),
    ("dollars", "dollars (gpt-4o-mini)", None),
)
"""The per-100-turn figures (``ReplayRates``' fields), how the table names them, and the most
allowed (docs/design.md, invariant 14), if any."""

Rates = Mapping[str, float | None]


async def replay_rows(env: BenchEnv, progress: Progress) -> list[Row]:
    """One row per figure over every window; the per-window figures in its note."""
    paths = _published()
    if not paths:
        raise BenchError(f"no published runs under {TRAJECTORIES} (run the bench from a checkout)")
    windows = WINDOWS if env.scale >= 1 else WINDOWS[:1]
    ours: dict[int, Rates] = {}
    theirs: dict[int, Rates] = {}
    for window in windows:
        progress(f"replays: the published runs at a {window:,}-token window")
        ours[window] = await _rates(paths, window, dict(os.environ))
        if env.baseline is not None:
            theirs[window] = await _rates(paths, window, env.baseline.environment(dict(os.environ)))
    rows = []
    for name, label, most in FIGURES:
        value = _mean(ours, name)
        baseline = _mean(theirs, name) if theirs else None
        per_window = ", ".join(f"{w // 1024}K {_text(ours[w][name])}" for w in windows)
        if theirs and env.baseline is not None:
            per_window += f"; {env.baseline.label}: " + ", ".join(
                f"{w // 1024}K {_text(theirs[w][name])}" for w in windows
            )
        rows.append(
            Row(
                f"replays: {label} per 100 turns",
                value if value is not None else 0.0,
                "$" if name == "dollars" else "",
                baseline=baseline,
                baseline_name=env.baseline.label if env.baseline else "",
                target=most,
                target_on_value=True,
                note=f"the {len(paths)} published agent runs; per window {per_window}",
            )
        )
    return rows


def _published() -> list[str]:
    """The published runs' files, absolute (the replay processes may run elsewhere)."""
    return sorted(str(p.resolve()) for p in TRAJECTORIES.glob("*/*.traj*"))


async def _rates(paths: Sequence[str], window: int, environment: dict[str, str]) -> Rates:
    """The replay's per-100-turn totals at ``window``, from a ``replay --json`` process."""
    # -P: not the working directory first on the path, which would shadow a baseline's package.
    command = [sys.executable, "-P", "-m", "compaction_worker.cli", "replay", *paths]
    process = await asyncio.create_subprocess_exec(
        *command,
        "--context-window",
        str(window),
        "--json",
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise BenchError(f"replay at {window} exited {process.returncode}: {err.decode()[-500:]}")
    total = json.loads(out)["total"]
    if "per_100_turns" not in total:
        raise BenchError("that checkout's replay reports no per_100_turns (it predates them)")
    rates: Rates = total["per_100_turns"]
    return rates


def _mean(by_window: Mapping[int, Rates], name: str) -> float | None:
    """The figure over every window (each window's turns count alike: the same runs at each)."""
    values = [rates[name] for rates in by_window.values()]
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _text(value: float | None) -> str:
    return "unpriced" if value is None else f"{value:.4g}"
