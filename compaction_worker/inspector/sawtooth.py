"""The sawtooth: a conversation's context tokens per turn, and a marker per compaction, as SVG.

Drawn from what Redis keeps, nothing recorded for the purpose but one thing: each transcript
record stores the tokens its append counted (``t``), so the history grows turn by turn by
those; each record of the compaction log says after which turn it committed (``last_seq``)
and what the history's total was right after (``history_tokens``), both written by the commit
script itself (state/lua/replace.lua), so the drop lands exactly where and as far as it did.
A commit's record also holds its ``compaction.completed`` event (``completed``), which the
marker's tooltip quotes.

matplotlib draws (the ``inspect`` extra); each marker is its own SVG group whose id names the
version (``compaction-v3``, ``rewind-v5``) and whose ``<title>`` is the browser's tooltip.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import matplotlib

    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a smaller SVG, searchable labels
    matplotlib.rcParams["svg.hashsalt"] = "inspector"  # the same page twice is the same SVG
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
except ImportError as e:  # an optional extra: the pages work without it and say what is missing
    MISSING: ImportError | None = e
else:
    MISSING = None

SVG_NS = "http://www.w3.org/2000/svg"
WIDTH, HEIGHT, DPI = 960, 320, 96


@dataclass(frozen=True, slots=True)
class Marker:
    """One committed compaction (or rewind) on the sawtooth."""

    version: int
    seq: int
    """The last turn stored when it committed: the drop is drawn at this turn."""
    before: int
    after: int
    rewind: bool
    tooltip: str

    @property
    def gid(self) -> str:
        return f"{'rewind' if self.rewind else 'compaction'}-v{self.version}"


@dataclass(frozen=True, slots=True)
class Series:
    """Context tokens after each turn (and after each drop), with the markers."""

    seqs: tuple[int, ...]
    tokens: tuple[int, ...]
    markers: tuple[Marker, ...]


def series(
    records: Sequence[Mapping[str, Any]], log: Sequence[Mapping[str, Any]], *, fixed: int, scale: float
) -> Series:
    """The sawtooth of a conversation from its transcript records and compaction log (pure).

    ``fixed`` is what every request repeats (system prompt, tools, framing: the meta's
    current ones) and ``scale`` the calibration, so the line is in the units of the budget's
    threshold.
    """
    per_turn: dict[int, int] = {}
    for r in records:
        per_turn[int(r["seq"])] = per_turn.get(int(r["seq"]), 0) + int(r["t"])
    commits: dict[int, list[Mapping[str, Any]]] = {}
    for rec in log:
        commits.setdefault(int(rec["last_seq"]), []).append(rec)

    def shown(history: int) -> int:
        return int((history + fixed) * scale)

    running = 0
    seqs: list[int] = []
    tokens: list[int] = []
    markers: list[Marker] = []
    for seq in sorted(set(per_turn) | set(commits)):
        running += per_turn.get(seq, 0)
        seqs.append(seq)
        tokens.append(shown(running))
        for rec in commits.get(seq, []):
            before = running
            running = int(rec["history_tokens"])
            seqs.append(seq)
            tokens.append(shown(running))
            rewind = rec.get("trigger") == "rewind"
            markers.append(
                Marker(int(rec["version"]), seq, shown(before), shown(running), rewind, tooltip(rec, seq))
            )
    return Series(tuple(seqs), tuple(tokens), tuple(markers))


def tooltip(record: Mapping[str, Any], seq: int) -> str:
    """What a marker says: trigger, stages, tokens, the summarizer, its LLM usage and cost, duration."""
    event: Mapping[str, Any] = record.get("completed") or {}
    trigger = record.get("trigger", "?")
    if trigger == "rewind":
        return (
            f"rewind v{record['version']} after turn {seq}: undid compaction v{record.get('rewound_version')}"
        )
    lines = [
        f"compaction v{record['version']} ({trigger}) after turn {seq}",
        f"stages: {', '.join(record.get('stages') or []) or '-'}",
        f"tokens: {event.get('tokens_before', record.get('tokens_before'))} -> "
        f"{event.get('tokens_after', record.get('tokens_after'))}",
    ]
    if event:
        usage = event.get("llm_usage") or {}
        cost = usage.get("cost_usd")
        lines += [
            f"messages: {event.get('messages_before')} -> {event.get('messages_after')}",
            f"summarizer: {event.get('summarizer_model') or 'none'}",
            f"LLM: {usage.get('calls', 0)} calls, {usage.get('prompt_tokens', 0)} + "
            f"{usage.get('completion_tokens', 0)} tokens"
            + (f", ${cost:.4f}" if isinstance(cost, int | float) else ""),
            f"duration: {event.get('duration_ms')} ms",
        ]
        if isinstance(paid := event.get("cost"), dict):
            lines.append(_cost_line(paid))
        if event.get("artifacts_dropped"):
            lines.append(f"artifacts no longer in the history: {event['artifacts_dropped']}")
        if isinstance(standing := event.get("standing_state"), dict):
            lines.append(f"standing state: {_by_kind(standing)}")
        if event.get("error"):
            lines.append(f"note: {event['error']}")
    return "\n".join(lines)


def _cost_line(cost: Mapping[str, Any]) -> str:
    """The compaction's cost at the model's prices: the cache it rewrote, the saving per call, the break-even."""
    line = f"cache rewritten: {cost.get('cache_write_tokens', 0)} tokens"
    if isinstance(write := cost.get("cache_write_cost"), int | float):
        line += f" (${write:.4f})"
    if isinstance(saving := cost.get("saving_per_call"), int | float):
        line += f"; saves ${saving:.4f} a call"
    if isinstance(calls := cost.get("break_even_calls"), int | float):
        line += f"; paid back after {calls:.1f} calls"
    return line


def svg(drawn: Series, *, threshold: int, target: int, window: int) -> str:
    """The sawtooth as an inline ``<svg>`` element: the line, the budget's lines, one group per marker.

    Builds a ``Figure`` directly (no pyplot), so concurrent requests draw on their own figures.
    """
    if MISSING is not None:
        raise RuntimeError("the sawtooth needs matplotlib: pip install 'compaction-worker[inspect]'")
    figure = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="tight")
    axes = figure.add_subplot()
    axes.plot(drawn.seqs, drawn.tokens, color="#3465a4", linewidth=1.5, label="context tokens")
    for value, style, label in ((threshold, "--", "threshold"), (target, ":", "target")):
        if value:
            axes.axhline(value, color="#cc0000" if label == "threshold" else "#4e9a06", ls=style, label=label)
    if window:
        axes.axhline(window, color="#555753", linewidth=0.8, label="window")
    for m in drawn.markers:
        (point,) = axes.plot(
            [m.seq],
            [m.before],
            marker="^" if m.rewind else "v",
            markersize=9,
            color="#75507b" if m.rewind else "#f57900",
            linestyle="none",
        )
        point.set_gid(m.gid)
    axes.set_xlabel("turn")
    axes.set_ylabel("context tokens")
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left", fontsize="small")
    buffer = io.StringIO()
    FigureCanvasSVG(figure).print_svg(buffer)  # type: ignore[no-untyped-call]  # matplotlib's own annotation
    return _with_tooltips(buffer.getvalue(), {m.gid: m.tooltip for m in drawn.markers})


def _with_tooltips(document: str, tooltips: Mapping[str, str]) -> str:
    """The SVG element with a ``<title>`` first in each marker's group (escaped by the serializer)."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(document)
    for group in root.iter(f"{{{SVG_NS}}}g"):
        text = tooltips.get(group.get("id", ""))
        if text is not None:
            title = ET.Element(f"{{{SVG_NS}}}title")
            title.text = text
            group.insert(0, title)
            group.set("class", "marker")
    root.set("role", "img")
    root.set("aria-label", "context tokens per turn, with a marker per compaction")
    return ET.tostring(root, encoding="unicode")


def _by_kind(report: dict[str, Any]) -> str:
    """``6 kept (rule 1, constraint 2, ...), 1 let go (fact 1), 2 superseded``."""

    def part(counts: Any, what: str) -> str:
        counts = counts if isinstance(counts, dict) else {}
        inner = ", ".join(f"{kind} {n}" for kind, n in counts.items())
        return f"{sum(counts.values())} {what}" + (f" ({inner})" if inner else "")

    return f"{part(report.get('kept'), 'kept')}, {part(report.get('let_go'), 'let go')}, {report.get('superseded', 0)} superseded"
