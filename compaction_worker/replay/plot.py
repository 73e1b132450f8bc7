"""The sawtooth: context tokens per turn for every replayed conversation, in one PNG.

One line per conversation (up at each turn, down at each compaction, a marker where one
landed) and dashed threshold and dotted target lines, one pair per distinct budget.
matplotlib (the ``replay`` extra) is needed only here, with its file-only Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compaction_worker.replay.reader import ReplayInputError
from compaction_worker.replay.simulate import ConversationReport

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    from matplotlib import pyplot as _plt
    from matplotlib.figure import Figure
except ImportError as e:  # an optional extra: the replay runs without it, the plot says so
    _MISSING: ImportError | None = e
else:
    _MISSING = None

WIDTH, HEIGHT, DPI = 1200, 600, 100
"""The PNG's size in pixels, and the resolution that gives it."""
MAX_LABELS = 8


def sawtooth(report: ConversationReport) -> tuple[list[float], list[int]]:
    """The line's points: each turn's total after its append, then after its compactions (a drop)."""
    xs: list[float] = []
    ys: list[int] = []
    for point in report.points:
        xs.append(point.turn)
        ys.append(point.tokens)
        if point.after != point.tokens:
            xs.append(point.turn)
            ys.append(point.after)
    return xs, ys


def plot(
    reports: Sequence[ConversationReport], path: Path, *, width: int = WIDTH, height: int = HEIGHT
) -> Path:
    """Write the PNG to ``path`` (``width`` x ``height`` pixels) and return it."""
    if _MISSING is not None:
        raise ReplayInputError(
            "the plot needs matplotlib: pip install 'compaction-worker[replay]'"
        ) from _MISSING
    figure: Figure = _plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    try:
        axes = figure.add_subplot()
        budgets: dict[tuple[int, int], Any] = {}  # the first line's colour, for its budget's lines
        for report in reports:
            xs, ys = sawtooth(report)
            # Past a handful of conversations the legend would hide the plot: lines only.
            label = (
                report.name if 1 < len(reports) <= MAX_LABELS else "context" if len(reports) == 1 else None
            )
            (line,) = axes.plot(xs, ys, linewidth=1.2, label=label)
            color = line.get_color()
            landed = report.compactions
            axes.scatter(
                [c.turn for c in landed],
                [c.tokens_after for c in landed],
                marker="v",
                color=color,
                zorder=3,
                label="compaction" if report is reports[0] else None,
            )
            budgets.setdefault((report.budget.threshold, report.budget.target), color)
        single = len(budgets) == 1
        for (threshold, target), own in budgets.items():
            color = "black" if single else own
            axes.axhline(threshold, color=color, linestyle="--", linewidth=1, label=f"threshold {threshold}")
            axes.axhline(target, color=color, linestyle=":", linewidth=1, label=f"target {target}")
        axes.set_xlabel("turn")
        axes.set_ylabel("context tokens (estimated)")
        axes.set_title("compaction-worker replay: context per turn")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper left", fontsize="small")
        # No tight bbox: the file must have exactly the size asked for.
        figure.savefig(path, format="png", dpi=DPI)
    finally:
        _plt.close(figure)
    return path
