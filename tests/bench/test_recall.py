"""``bench --only recall``: the recall rows run on their own and report p50 and p99 in both cases."""

from __future__ import annotations

import json

from click.testing import CliRunner

from compaction_worker.bench.recall import queries
from compaction_worker.bench.report import quantile
from compaction_worker.cli import main


def test_quick_recall_rows_report_p50_and_p99_cached_and_after_a_compaction() -> None:
    result = CliRunner().invoke(main, ["bench", "--quick", "--json", "--no-progress", "--only", "recall"])
    assert result.exit_code == 0, result.output + (result.stderr or "") + repr(result.exception)
    rows = {row["name"].split(" (")[0]: row for row in json.loads(result.stdout)["rows"]}
    assert set(rows) == {
        "recall p50, index cached",
        "recall p99, index cached",
        "recall p50, first after a compaction",
        "recall p99, first after a compaction",
    }
    assert all(row["value"] > 0 and row["unit"] == "ms" for row in rows.values())  # measured, never bounded
    assert "compacted away" in rows["recall p50, index cached"]["note"]


def test_the_queries_and_the_quantile() -> None:
    assert len(queries(100)) == 200  # four a turn, for every other turn
    assert quantile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert quantile([float(v) for v in range(1, 101)], 0.99) == 99.0
