"""Published agent trajectories on 4K-8K windows (`compaction-worker quality small-windows`, issue 33): every
compaction brings the history under the window or says why, keeps the newest step, and the
summarizer reads every message it replaces."""

from __future__ import annotations

import pytest

from compaction_worker.bench import small_windows
from tests.trajectories import load_trajectories


@pytest.mark.slow
@pytest.mark.parametrize("window", [4_096, 6_144, 8_192])
async def test_every_compaction_on_a_small_window_keeps_its_promises(window: int) -> None:
    rows = [await small_windows.replay(run, window) for run in load_trajectories()]
    assert sum(r.compactions for r in rows) >= 3
    for row in rows:
        assert row.over_window == 0, row
        assert row.newest_summarized == 0, row
        assert row.unread == 0, row
        assert not any(error.endswith(": None") for error in row.errors), row  # a no-op says why
