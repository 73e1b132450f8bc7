"""One allocation of the room (strategies/allocation.py): the summary's floor first, the rest in proportion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction_worker.strategies.allocation import KEEP_FLOORS, MIN_FLOOR, Keeps, allocate, summary_floor


def test_what_fits_is_kept_whole() -> None:
    wants = Keeps(task=400, user_words=200, tail=300)
    assert allocate(free=2_000, wants=wants, floor=300) == wants


def test_a_shortfall_shrinks_the_words_and_the_tail_in_proportion_and_keeps_the_task() -> None:
    wants = Keeps(task=800, user_words=400, tail=800)
    keeps = allocate(free=1_800, wants=wants, floor=300)
    assert keeps.task == 800
    assert keeps.total + 300 <= 1_800
    taken = {"words": 400 - keeps.user_words, "tail": 800 - keeps.tail}
    above = {"words": 400 * (1 - KEEP_FLOORS[0]), "tail": 800 * (1 - KEEP_FLOORS[1])}
    assert abs(taken["words"] / above["words"] - taken["tail"] / above["tail"]) < 0.01


def test_what_gives_way_last_is_the_summary_floor_then_the_task() -> None:
    wants = Keeps(task=1_000, user_words=1_000, tail=1_000)
    floors = Keeps(1_000, int(KEEP_FLOORS[0] * 1_000), int(KEEP_FLOORS[1] * 1_000))
    assert allocate(free=floors.total + 300, wants=wants, floor=300) == floors
    # The floors of the words and the tail go before the summary's.
    squeezed = allocate(free=1_000 + 300 + 70, wants=wants, floor=300)
    assert squeezed.task == 1_000
    assert squeezed.user_words + squeezed.tail <= 70
    # Then the summary's floor goes down to its least, and only then does the task give way.
    assert allocate(free=1_000 + 100, wants=wants, floor=300) == Keeps(1_000, 0, 0)
    assert allocate(free=600, wants=wants, floor=300) == Keeps(600 - MIN_FLOOR, 0, 0)


@given(
    st.integers(0, 5_000),
    st.integers(0, 5_000),
    st.integers(0, 5_000),
    st.integers(0, 20_000),
    st.integers(0, 2_000),
)
def test_never_more_than_wanted_never_negative_and_the_floor_is_left_when_it_can_be(
    task: int, words: int, tail: int, free: int, floor: int
) -> None:
    wants = Keeps(task, words, tail)
    keeps = allocate(free, wants, floor)
    assert 0 <= keeps.task <= task
    assert 0 <= keeps.user_words <= words
    assert 0 <= keeps.tail <= tail
    if keeps != wants:  # the summary keeps at least its least floor
        assert keeps.total <= max(0, free - min(floor, MIN_FLOOR))


def test_the_summary_floor_is_a_share_of_the_room_within_its_reserve() -> None:
    assert summary_floor(10_000, 2_000) == 1_500
    assert summary_floor(100, 2_000) == MIN_FLOOR
    assert summary_floor(10_000, 500) == 500
