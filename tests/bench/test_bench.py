"""``compaction-worker bench --quick --json`` end to end: embedded broker and Redis, worker processes, every row."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from compaction_worker.bench.report import Row
from compaction_worker.cli import SCHEMAS_DIR, main


@pytest.mark.slow
def test_quick_bench_prints_every_row_with_a_value_and_its_target() -> None:
    result = CliRunner().invoke(main, ["bench", "--quick", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output + (result.stderr or "") + repr(result.exception)
    report = json.loads(result.stdout)
    schema = json.loads((SCHEMAS_DIR / "cli" / "bench.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)
    assert (report["repeat"], report["quick"]) == (1, True)
    rows = {row["name"]: row for row in report["rows"]}
    for row in report["rows"]:  # timing is never asserted: only that each figure was measured
        assert isinstance(row["value"], int | float), row
        assert math.isfinite(row["value"]), row
        assert row["met"] is None or isinstance(row["met"], bool)
    one, two = rows["one worker / bare loop (same fetch settings)"], rows["two workers / one worker"]
    assert min(one["value"], one["baseline"]) > 0
    assert (one["target"], one["at_least"]) == (0.6, True)
    assert rows["one worker / pipelined bare loop"]["baseline"] > 0
    assert (two["baseline"], two["target"]) == (one["value"], 1.6)
    four = rows["four workers / two workers"]  # issue 35: more workers, no lower rate
    assert (four["baseline"], four["target"], four["at_least"]) == (two["value"], 0.9, True)
    assert rows["Redis CPU per stored turn, four workers / one"]["baseline"] > 0
    assert 0 < rows["Redis connections a worker holds"]["value"] <= 16  # redis.max_connections
    head = rows["head-of-line: p99 store latency, 10% compacting"]
    assert head["value"] > 0
    assert (head["target"], head["target_on_value"]) == (100.0, True)
    sent = rows["Redis commands sent per stored turn"]
    # A backlog is stored in runs: one script call for a conversation's consecutive turns in a batch.
    assert 0 < sent["value"] <= 1.5
    assert (sent["target"], sent["baseline"]) == (1.5, None)  # no --baseline-source
    assert rows["Redis commands inside scripts per stored turn"]["target"] == 12
    assert rows["Redis command time per stored turn"]["value"] > 0
    assert rows["Redis commands/s an idle worker sends"]["target"] == 5
    if len(os.sched_getaffinity(0)) > 1:  # the embedded Redis can have a core of its own
        paced = rows["Redis CPU per stored turn, a busy shard, agent pace"]
        assert (paced["target"], paced["baseline"]) == (30.0, None)
        assert rows["Redis CPU per stored turn, a busy shard, backlog"]["value"] > 0
        assert rows["Redis CPU per stored turn, a busy shard, the writes alone"]["value"] > 0
    assert any(name.startswith("per-turn cost") for name in rows)
    off = rows["per-turn cost, telemetry off (no SDK: the default)"]  # each in a child process
    assert min(off["value"], off["baseline"]) > 0
    assert off["target"] == 1.05
    assert rows["per-turn cost, telemetry on (SDK, every span exported)"]["baseline"] == off["value"]
    assert any(name.startswith("compaction cost incl. LiteLLM's CPU, excl. the LLM's wait") for name in rows)
    assert any(name.startswith("summarizer input tokens") for name in rows)
    assert Row(**{k: v for k, v in one.items() if k not in ("ratio", "met")}).met == one["met"]
    assert rows["cli: --help"]["target"] == 0.5
    cold = rows["worker: cold start (process start to consuming)"]
    assert min(cold["value"], cold["baseline"]) > 0  # the bare consumer's join measured beside it
    assert rows["worker: cold start beyond the group join"]["target"] == 3.0
    for model in ("claude-sonnet-4-20250514", "gpt-4o"):  # issue 36: the product beside a sliding window
        assert 0 < rows[f"prompt cache: share of prompt tokens served ({model})"]["baseline"] <= 1
        assert rows[f"prompt cache: dollars per session ({model})"]["value"] > 0
    written = rows["prompt cache: share served, model-written summaries as checked items (gpt-4o)"]
    assert 0 < written["baseline"] <= 1
    assert 0 < written["value"] <= 1
    compactions = rows["replays: compactions per 100 turns"]  # the published runs, at 4K when quick
    assert compactions["value"] > 0
    assert "4K" in compactions["note"]
    assert rows["replays: turns with several compaction runs per 100 turns"]["target"] == 0


def test_an_unknown_scenario_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["bench", "--only", "nope"])
    assert result.exit_code == 2
    assert "no scenario matches nope" in result.output


def test_a_baseline_source_must_be_a_checkout(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--baseline-source", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a checkout of compaction-worker" in result.output
