"""Rows, their targets either way, and the table, JSON and Markdown they print as."""

from __future__ import annotations

import io
import json

from compaction_worker.bench.report import ProgressLine, Row, format_table, markdown_table, rows_json, spread


def test_a_ceiling_is_met_at_or_under_it_a_floor_at_or_over_it() -> None:
    assert Row("cost", 1.2, "ms", 1.0, "at 1K", target=1.2).met is True
    assert Row("cost", 1.3, "ms", 1.0, "at 1K", target=1.2).met is False
    assert Row("one", 3.0, "turns/s", 5.0, "bare", target=0.6, at_least=True).met is True
    assert Row("one", 2.9, "turns/s", 5.0, "bare", target=0.6, at_least=True).met is False
    assert Row("p99", 90.0, "ms", target=100.0).met is True
    assert Row("free", 1.0, "ms").met is None


def test_a_target_on_the_value_ignores_the_baseline_beside_it() -> None:
    row = Row("p99", 120.0, "ms", 20.0, "quiet", target=100.0, target_on_value=True)
    assert row.ratio == 6.0
    assert row.met is False
    assert Row("p99", 80.0, "ms", 20.0, "quiet", target=100.0, target_on_value=True).met is True


def test_a_zero_baseline_has_no_ratio_and_misses_a_ratio_target() -> None:
    row = Row("one", 5.0, "turns/s", 0.0, "bare", target=0.6, at_least=True)
    assert row.ratio is None
    assert row.met is False


def test_the_table_shows_each_row_its_ratio_and_whether_it_met_its_target() -> None:
    rows = [
        Row(
            "one worker process",
            600.0,
            "turns/s",
            5000.0,
            "bare loop",
            target=0.6,
            at_least=True,
            note="shape",
        ),
        Row("p99", 80.0, "ms", target=100.0),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["row", "value", "beside", "it", "ratio", "target"]
    for part in ("600 turns/s", "5,000 turns/s (bare loop)", "0.12x", ">= 0.6x: MISSED"):
        assert part in lines[2]
    assert lines[3].strip() == "shape"
    assert "<= 100 ms: met" in lines[4]
    assert "| one worker process | 600 turns/s |" in markdown_table(rows)
    assert "**missed**" in markdown_table(rows)


def test_json_carries_every_field_the_ratio_and_met() -> None:
    (data,) = json.loads(json.dumps(rows_json([Row("p99", 80.0, "ms", 40.0, "quiet", target=1.5)])))
    assert (data["value"], data["ratio"], data["met"]) == (80.0, 2.0, False)
    assert (data["baseline_name"], data["at_least"]) == ("quiet", False)


def test_progress_writes_a_line_per_update_off_a_terminal_at_most_once_a_second() -> None:
    stream = io.StringIO()
    progress = ProgressLine(stream)
    progress("first")
    progress("second, too soon")
    assert stream.getvalue().splitlines() == [stream.getvalue().splitlines()[0]]
    assert stream.getvalue().rstrip().endswith("first")
    quiet = io.StringIO()
    ProgressLine(quiet, enabled=False)("nothing")
    assert quiet.getvalue() == ""


def test_small_ratios_keep_two_significant_digits_and_spread_shows_the_runs() -> None:
    assert "0.0037x" in format_table([Row("per-turn", 1.0, "ms", 272.0, "naive")])
    assert spread([383.0, 350.2, 1420.0]) == "383 (350-1,420)"
