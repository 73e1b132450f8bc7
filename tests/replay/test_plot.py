"""The sawtooth PNG: a valid image of the size asked for, with the line that the report gives."""

from __future__ import annotations

import struct
from pathlib import Path

from compaction_worker.budget.tokens import Budget
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.contracts.history import EffectiveHistory
from compaction_worker.conversation.meta import Meta
from compaction_worker.replay.plot import HEIGHT, WIDTH, plot, sawtooth
from compaction_worker.replay.simulate import Compaction, ConversationReport, TurnPoint

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (which must come first); fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND"
    return width, height


def _report(name: str, threshold: int = 2400) -> ConversationReport:
    budget = Budget(
        window=4000,
        output_reserve=1000,
        available=3000,
        threshold=threshold,
        soft_threshold=None,
        target=1500,
    )
    report = ConversationReport(name, "gpt-4o-mini", budget, Meta(), EffectiveHistory((), ()))
    report.points = [TurnPoint(1, 900, 900), TurnPoint(2, 1800, 1800), TurnPoint(3, 2700, 1400)]
    report.runs = [Compaction(3, Trigger.THRESHOLD, Outcome.COMPACTED, 2700, 1400)]
    return report


def test_the_line_rises_per_turn_and_drops_at_a_compaction() -> None:
    assert sawtooth(_report("a")) == ([1, 2, 3, 3], [900, 1800, 2700, 1400])


def test_one_conversation_makes_a_png_of_the_default_size(tmp_path: Path) -> None:
    path = plot([_report("a")], tmp_path / "one.png")
    assert png_size(path) == (WIDTH, HEIGHT) == (1200, 600)


def test_several_conversations_and_budgets_share_one_figure_of_the_size_asked(tmp_path: Path) -> None:
    reports = [_report("a"), _report("b", threshold=2000), _report("c")]
    path = plot(reports, tmp_path / "many.png", width=800, height=500)
    assert png_size(path) == (800, 500)
