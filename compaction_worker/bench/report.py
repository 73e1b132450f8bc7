"""The bench's rows, the one table they print as, their JSON, and the progress line on stderr."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

Progress = Callable[[str], None]
"""What a scenario calls to say what it is doing (one short line, no newline)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a figure, the figure measured beside it, their ratio and the target on it."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: float | None = None
    """The ratio (or, without a baseline, the value) must be at most this; at least it with ``at_least``."""
    at_least: bool = False
    target_on_value: bool = False
    """The target is on the value even though a baseline is shown beside it."""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        measured = self.value if self.target_on_value or self.baseline is None else self.ratio
        if measured is None:
            return False
        return measured >= self.target if self.at_least else measured <= self.target


def target_text(row: Row) -> str:
    """``>= 0.6x: met``, ``<= 100 ms: MISSED``, or empty without a target."""
    if row.target is None:
        return ""
    sign = ">=" if row.at_least else "<="
    unit = f" {row.unit}" if row.target_on_value or row.baseline is None else "x"
    target = f"{row.target:,.0f}" if abs(row.target) >= 100 else f"{row.target:.3g}"
    return f"{sign} {target}{unit}: {'met' if row.met else 'MISSED'}"


def _figure(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"
    return f"{text} {unit}"


def _cells(row: Row) -> tuple[str, str, str, str, str]:
    """The row's name, value, the figure beside it, the ratio and the target, as the tables show them."""
    beside = f"{_figure(row.baseline, row.unit)} ({row.baseline_name})" if row.baseline is not None else ""
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}x" if row.ratio >= 0.1 else f"{row.ratio:.2g}x"
    return row.name, _figure(row.value, row.unit), beside, ratio, target_text(row)


def spread(values: Sequence[float]) -> str:
    """The runs behind a median, for a row's note: ``383 (350-420)``."""
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, nearest rank (with few samples the p99 is their maximum)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def format_table(rows: Sequence[Row]) -> str:
    """The rows as one plain-text table (notes on the line under their row)."""
    header = ("row", "value", "beside it", "ratio", "target")
    lines: list[tuple[str, ...]] = [header]
    notes: dict[int, str] = {}
    for row in rows:
        lines.append(_cells(row))
        if row.note:
            notes[len(lines) - 1] = row.note
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for index, line in enumerate(lines):
        cells = [
            cell.rjust(width) if i in (1, 3) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
        if index in notes:
            out.append(f"    {notes[index]}")
    return "\n".join(out)


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as JSON objects: every field, the ratio and whether the target is met."""
    return [{**asdict(row), "ratio": row.ratio, "met": row.met} for row in rows]


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table, for docs/performance.md."""
    out = ["| row | value | beside it | ratio | target |", "|---|--:|---|--:|---|"]
    for row in rows:
        *cells, target = _cells(row)
        out.append(f"| {' | '.join(cells)} | {target.replace('MISSED', '**missed**')} |")
    notes = [f"- {row.name}: {row.note}" for row in rows if row.note]
    return "\n".join([*out, "", *notes] if notes else out)


class ProgressLine:
    """One line on stderr, rewritten in place on a terminal (one line per update elsewhere, at most 1/s)."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._width = 0

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        line = f"[{now - self.started:5.0f}s] {text}"
        if self.tty:
            self.stream.write("\r" + line.ljust(self._width)[:160])
            self._width = min(160, len(line))
        elif now - self._last >= 1.0:
            self.stream.write(line + "\n")
        else:
            return
        self._last = now
        self.stream.flush()

    def done(self) -> None:
        """Clear the line (a terminal) so that the table starts on a clean one."""
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
