"""The sweeper's timing: an idle sweep doubles its wait, a failed one waits the retry driver's jittered backoff."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_worker.runtime.sweeper import Chore, Sweeper
from compaction_worker.state.index import Sweep


def _chore(results: Sequence[Sweep | Exception]) -> Chore:
    left = list(results)

    async def sweep() -> Sweep:
        result = left.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    return Chore("jobs", sweep, floor=1.0)


async def test_an_idle_sweep_doubles_its_wait_up_to_idle_max_and_one_that_did_work_goes_back_to_the_floor() -> (
    None
):
    chore = _chore([Sweep(0, None)] * 5 + [Sweep(1, None)])
    sweeper = Sweeper([chore], interval=1.0, idle_max=8.0)
    waits = []
    for _ in range(6):
        await sweeper._sweep(chore)
        waits.append(chore.backoff)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 1.0]


async def test_failed_sweeps_wait_a_jittered_backoff_within_the_drivers_ceiling_and_a_success_resets_it() -> (
    None
):
    """Workers that lost Redis together must not sweep together once it is back: each failed
    sweep waits uniform(0, ceiling), the ceiling doubling from the floor to idle_max."""
    failures = 4
    chores = [_chore([ConnectionError("redis away")] * failures + [Sweep(0, None)]) for _ in range(30)]
    sweeper = Sweeper(chores, interval=1.0, idle_max=8.0)
    for tried in range(1, failures + 1):
        for chore in chores:
            await sweeper._sweep(chore)
        waits = [chore.backoff for chore in chores]
        assert all(0.0 <= wait <= min(8.0, 2.0 ** (tried - 1)) for wait in waits), (tried, waits)
        assert len(set(waits)) > 1, "every worker waits the same: no jitter"
        assert {chore.failures for chore in chores} == {tried}
    for chore in chores:
        await sweeper._sweep(chore)
    assert {(chore.failures, chore.backoff) for chore in chores} == {(0, 1.0)}  # idle again: from the floor
