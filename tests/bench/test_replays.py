"""The replay rows of ``bench``: the published runs replayed per window, another checkout's beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from compaction_worker.bench.environment import BenchEnv, BenchError, WorkerSource
from compaction_worker.bench.replays import replay_rows
from compaction_worker.settings import Settings

ROOT = Path(__file__).parents[2]


def _env(baseline: WorkerSource | None) -> BenchEnv:
    return BenchEnv(Settings(), cast(Any, None), cast(Any, None), scale=0.05, baseline=baseline)


@pytest.mark.slow
async def test_a_baseline_checkout_s_replay_is_measured_beside_this_one_s() -> None:
    """The same checkout on both sides: every figure equals its baseline, and the invariant's
    figures carry their ceiling of 0 (docs/design.md, invariant 14)."""
    rows = {row.name: row for row in await replay_rows(_env(WorkerSource.of(ROOT)), lambda _: None)}
    assert len(rows) == 6
    assert all(row.baseline == row.value for row in rows.values())
    assert rows["replays: compactions per 100 turns"].value > 0
    small = rows["replays: compactions saving under 10% of a history within its window per 100 turns"]
    assert (small.target, small.target_on_value) == (0.0, True)
    assert "per window 4K" in small.note


async def test_a_baseline_whose_replay_predates_the_figures_is_an_error(tmp_path: Path) -> None:
    """A checkout whose ``replay --json`` has no per-100-turn totals cannot stand beside this one."""
    package = tmp_path / "old" / "compaction_worker" / "cli"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text('print(\'{"total": {"turns": 1}}\')\n')
    with pytest.raises(BenchError, match="predates them"):
        await replay_rows(_env(WorkerSource.of(tmp_path / "old")), lambda _: None)
