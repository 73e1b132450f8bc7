"""Scenario selection for ``--only`` and the scenario list the CLI's help names."""

from __future__ import annotations

import pytest

from compaction_worker.bench import costs
from compaction_worker.bench.options import SCENARIO_NAMES
from compaction_worker.bench.runner import SCENARIOS, select


def test_help_names_every_scenario_in_order() -> None:
    assert tuple(SCENARIOS) == SCENARIO_NAMES


def test_every_cost_scenario_is_a_bench_scenario() -> None:
    assert (
        len(SCENARIOS) == 4 + len(costs.ROWS) + 4
    )  # startup, cold_backlog, throughput, head_of_line; telemetry, recall, cache, replays


def test_recall_is_a_scenario_of_its_own() -> None:
    assert select(["recall"]) == ["recall"]


def test_only_picks_by_name_or_part_of_one_in_table_order() -> None:
    assert select([]) == list(SCENARIOS)
    assert select(["head", "throughput"]) == ["throughput", "head_of_line"]
    assert select(["compaction"]) == ["compaction"]


def test_only_with_an_unknown_name_says_which_exist() -> None:
    with pytest.raises(
        ValueError, match="no scenario matches nope; scenarios: startup, cold_backlog, throughput"
    ):
        select(["nope"])
