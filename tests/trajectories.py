"""The repository's published agent trajectories (tests/data/trajectories/: one folder per agent
project, holding its runs and its license), loaded by compaction_worker/bench/trajectories.py."""

from __future__ import annotations

from pathlib import Path

from compaction_worker.bench import trajectories
from compaction_worker.bench.trajectories import Trajectory
from compaction_worker.contracts.history import text_of

DATA = Path(__file__).parent / "data" / "trajectories"
"""One folder per agent project, holding its runs and its license."""

__all__ = ["DATA", "Trajectory", "load_trajectories", "system_prompt", "task"]


def load_trajectories(root: Path = DATA) -> list[Trajectory]:
    """Every run under ``root``, sorted by name (see :func:`trajectories.load_trajectories`)."""
    return trajectories.load_trajectories(root)


def system_prompt(trajectory: Trajectory) -> str:
    """The text of the run's system message (its first message)."""
    first = trajectory.messages[0]
    assert first["role"] == "system", f"{trajectory.name} starts with {first['role']}"
    return text_of(first)


def task(trajectory: Trajectory) -> str:
    """The text of the run's first user message: the task the agent was given."""
    return next(text_of(m) for m in trajectory.messages if m["role"] == "user")
