"""The sawtooth from stored records (pure), and its SVG: one titled group per marker, text escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from compaction_worker.inspector import sawtooth
from compaction_worker.inspector.sawtooth import series

pytest.importorskip("matplotlib")

SVG = "{http://www.w3.org/2000/svg}"


def records(turns: int, tokens: int = 100) -> list[dict[str, object]]:
    """Two messages a turn, ``tokens`` each, turn s stored at time s."""
    return [
        {"n": 2 * s - 1 + i, "seq": s, "t": tokens, "m": {}, "at": float(s)}
        for s in range(1, turns + 1)
        for i in (0, 1)
    ]


def test_the_line_grows_by_each_turn_and_drops_where_each_commit_says() -> None:
    log = [
        {
            "version": 1,
            "trigger": "threshold",
            "last_seq": "5",
            "history_tokens": "300",
            "stages": ["summarize"],
        },
        {"version": 2, "trigger": "rewind", "rewound_version": 1, "last_seq": "7", "history_tokens": "1400"},
    ]
    drawn = series(records(8), log, fixed=50, scale=2.0)
    # (history + fixed) * scale: turn s adds 200 tokens; the commit after turn 5 drops to 300.
    assert list(zip(drawn.seqs, drawn.tokens, strict=True)) == [
        (1, 500), (2, 900), (3, 1300), (4, 1700), (5, 2100), (5, 700),
        (6, 1100), (7, 1500), (7, 2900), (8, 3300),
    ]  # fmt: skip
    first, second = drawn.markers
    assert (first.gid, first.seq, first.before, first.after) == ("compaction-v1", 5, 2100, 700)
    assert (second.gid, second.rewind) == ("rewind-v2", True)
    assert "undid compaction v1" in second.tooltip


def test_the_tooltip_quotes_the_completion_event() -> None:
    event = {
        "tokens_before": 5000,
        "tokens_after": 1200,
        "messages_before": 80,
        "messages_after": 9,
        "summarizer_model": "openai/fake",
        "llm_usage": {"calls": 2, "prompt_tokens": 3000, "completion_tokens": 400, "cost_usd": 0.0125},
        "duration_ms": 812,
        "standing_state": {"kept": {"rule": 2, "constraint": 1}, "let_go": {"fact": 1}, "superseded": 1},
        "cost": {"tokens_removed": 3800, "cache_write_tokens": 1100, "cache_write_cost": 0.0038,
                 "saving_per_call": 0.0011, "break_even_calls": 14.8},
    }  # fmt: skip
    record = {"version": 3, "trigger": "reactive", "stages": ["prune", "summarize"], "completed": event}
    text = sawtooth.tooltip(record, 41)
    for part in ("v3 (reactive) after turn 41", "prune, summarize", "5000 -> 1200", "80 -> 9",
                 "openai/fake", "2 calls, 3000 + 400 tokens, $0.0125", "812 ms",
                 "cache rewritten: 1100 tokens ($0.0038); saves $0.0011 a call; paid back after 14.8 calls",
                 "standing state: 3 kept (rule 2, constraint 1), 1 let go (fact 1), 1 superseded"):  # fmt: skip
        assert part in text


def test_the_svg_has_one_titled_group_per_marker_and_escapes_their_text() -> None:
    log = [
        {"version": v, "trigger": "threshold", "last_seq": str(s), "history_tokens": "200", "stages": [],
         "completed": {"summarizer_model": "<script>alert(1)</script>"}}
        for v, s in ((1, 3), (2, 6))
    ]  # fmt: skip
    drawn = series(records(8), log, fixed=0, scale=1.0)
    document = sawtooth.svg(drawn, threshold=1500, target=800, window=2000)
    assert "<script>" not in document
    root = ET.fromstring(document)
    groups = {g.get("id", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "marker"}
    assert sorted(groups) == ["compaction-v1", "compaction-v2"]
    title = groups["compaction-v1"].find(f"{SVG}title")
    assert title is not None
    assert "<script>alert(1)</script>" in (title.text or "")
