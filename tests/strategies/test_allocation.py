"""What stays when not everything fits (strategies/allocation.py): one order of value, one packing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compaction_worker.bench.short_sessions import session as short_session
from compaction_worker.bench.standing import MODEL
from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import STANDING, EffectiveHistory, render, text_of
from compaction_worker.settings import BudgetSettings
from compaction_worker.strategies import Draft, Limits, compact
from compaction_worker.strategies.allocation import (
    MIN_FLOOR,
    TASK_HEAD_TOKENS,
    Keeps,
    Part,
    Tier,
    Wants,
    allocate,
    pack,
)
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.extractive import ExtractiveSummarizer as Extractive
from compaction_worker.summaries.sentences import says_nothing_new
from compaction_worker.summaries.standing import TIERS, extract, merge

from .test_standing_state import Down


class TestPack:
    """The room is granted tier by tier; within a tier, by value per token."""

    def test_everything_fits(self) -> None:
        parts = [Part("a", Tier.RULES, 10), Part("b", Tier.NARRATIVE, 20, divisible=True)]
        assert pack(parts, 30) == {"a": 10, "b": 20}

    def test_a_higher_tier_is_served_first_whatever_the_order_given(self) -> None:
        parts = [Part("narrative", Tier.NARRATIVE, 50, divisible=True), Part("rule", Tier.RULES, 40)]
        assert pack(parts, 60) == {"rule": 40, "narrative": 20}

    def test_within_a_tier_the_cheapest_whole_parts_first_and_a_costly_one_is_passed_over(self) -> None:
        parts = [Part("long", Tier.FACTS, 30), Part("short", Tier.FACTS, 10), Part("mid", Tier.FACTS, 15)]
        assert pack(parts, 26) == {"long": 0, "short": 10, "mid": 15}

    def test_a_lower_tier_takes_what_a_whole_part_could_not(self) -> None:
        parts = [Part("goal", Tier.GOALS, 30), Part("words", Tier.BULK, 40, divisible=True)]
        assert pack(parts, 20) == {"goal": 0, "words": 20}

    def test_divisible_parts_of_a_tier_share_in_proportion(self) -> None:
        parts = [Part("words", Tier.BULK, 300, divisible=True), Part("task", Tier.BULK, 100, divisible=True)]
        grants = pack(parts, 200)
        assert grants == {"words": 150, "task": 50}

    def test_nothing_is_granted_past_the_room(self) -> None:
        parts = [Part(str(i), Tier(i % 7), 37 + i, divisible=bool(i % 2)) for i in range(20)]
        for room in (0, 1, 50, 333, 10_000):
            assert sum(pack(parts, room).values()) <= room


class TestAllocate:
    """Beside a new summary: the task, the newest step, the ledger, the words, the narrative and the tail."""

    def test_what_fits_is_kept_whole(self) -> None:
        wants = Wants(Keeps(task=200, user_words=300, tail=500), step=200, summary=400)
        assert allocate(1_400, wants) == wants.keeps

    def test_the_older_tail_and_the_narrative_give_way_before_the_words(self) -> None:
        wants = Wants(Keeps(task=0, user_words=300, tail=500), step=200, summary=400)
        keeps = allocate(MIN_FLOOR + 200 + 300 + 100, wants)
        assert keeps.user_words == 300
        assert 200 <= keeps.tail < 500

    def test_the_words_give_way_before_the_newest_step(self) -> None:
        wants = Wants(Keeps(task=0, user_words=300, tail=500), step=200, summary=400)
        keeps = allocate(MIN_FLOOR + 200 + 50, wants)
        assert keeps.tail == 200
        assert keeps.user_words <= 50

    def test_the_ledger_ranks_above_the_words(self) -> None:
        wants = Wants(Keeps(task=0, user_words=300, tail=0), step=0, summary=400, ledger=150)
        keeps = allocate(MIN_FLOOR + 150 + 100, wants)
        assert keeps.user_words == 100

    def test_on_the_last_aim_the_task_keeps_its_head_before_the_step(self) -> None:
        wants = Wants(Keeps(task=1_000, user_words=0, tail=300), step=300, summary=400)
        keeps = allocate(MIN_FLOOR + TASK_HEAD_TOKENS + 100, wants)
        assert keeps.task == TASK_HEAD_TOKENS
        assert keeps.tail == 100

    def test_before_the_last_aim_the_task_is_never_cut(self) -> None:
        wants = Wants(Keeps(task=1_000, user_words=200, tail=300), step=300, summary=400)
        assert allocate(MIN_FLOOR + 1_100, wants, last_aim=False) == Keeps(1_000, 0, 100)
        # No room beside the whole task: it is kept whole and the run aims higher.
        assert allocate(500, wants, last_aim=False) == Keeps(1_000, 0, 0)

    def test_filler_at_the_end_of_the_tail_is_given_no_room(self) -> None:
        wants = Wants(Keeps(task=0, user_words=0, tail=30), step=0, summary=400, filler=30)
        assert allocate(MIN_FLOOR + 10, wants).tail == 0

    @pytest.mark.parametrize("free", [0, 40, 100, 333, 900, 1_500, 3_000])
    def test_never_more_than_the_room_beside_the_summary_floor(self, free: int) -> None:
        wants = Wants(Keeps(task=500, user_words=700, tail=900), step=400, summary=600, ledger=200)
        keeps = allocate(free, wants)
        # The task is never cut below its head here; the rest fits beside the floor.
        assert keeps.user_words + keeps.tail <= max(0, free - MIN_FLOOR)
        assert keeps.task >= min(wants.keeps.task, TASK_HEAD_TOKENS, max(0, free - MIN_FLOOR))


class TestTheOrderOnEveryPath:
    """Invariant 13, end to end: on a short session of typed items among remarks (bench/short_sessions.py)
    held to a tenth and a fifth of its tokens, whatever the path (threshold, forced, reactive, the LLM
    down, a compaction of the compacted history), no item is let go while one of a lower tier is shown in
    the standing state, and no remark stays verbatim while an item is let go."""

    PATHS = ("threshold", "forced", "reactive", "fallback", "again")

    @pytest.mark.parametrize("path", PATHS)
    @pytest.mark.parametrize("share", [0.1, 0.2])
    @pytest.mark.parametrize("seed", [7, 9])
    async def test_what_stays_follows_the_order_of_value(self, path: str, share: float, seed: int) -> None:
        counter = counter_for(MODEL, BudgetSettings())
        s = short_session(seed, counter)
        history = EffectiveHistory((), tuple(s.entries))
        target = int(share * s.tokens)
        ceilings = () if path in ("forced", "reactive", "fallback", "again") else (int(1.2 * target),)
        limits = Limits(
            target=target,
            fixed_tokens=0,
            window=128_000,
            tail_max_messages=6,
            tail_max_tokens=32_000,
            max_summary_tokens=2_048,
            chunk_budget=max(1, target // 2),
            force=path != "threshold",
            task_max_tokens=20_000,
            user_words_max_tokens=12_800,
            ceilings=ceilings,
        )
        summarizers: list[Summarizer] = [Extractive(counter.text)]
        if path == "fallback":
            summarizers.insert(0, Down())
        result = await compact(history, limits, summarizers, counter)
        assert result.outcome is Outcome.COMPACTED, result.error
        if path == "again":
            history = history.with_parts(result.draft.chunks, result.draft.entries)
            result = await compact(history, limits, summarizers, counter)
            assert result.outcome in (Outcome.COMPACTED, Outcome.NOOP), result.error
            if result.outcome is Outcome.NOOP:
                result = replace(result, draft=Draft(history.chunks, history.entries))
        assert counter.messages(render(EffectiveHistory(result.draft.chunks, result.draft.entries))) <= target
        items = [
            i
            for i in merge(
                [],
                [x for e in s.entries if e.role == "user" for x in extract(text_of(e.message), e.seq, e.n)],
            )
            if i.current
        ]
        shown = "\n".join(
            text_of(m) for m in render(EffectiveHistory(result.draft.chunks, result.draft.entries))
        )
        state = "\n".join(text_of(e.message) for e in result.draft.entries if e.edit == STANDING)
        verbatim = "\n".join(text_of(e.message) for e in result.draft.entries if e.edit != STANDING)
        lost = [i for i in items if i.text not in shown]
        listed = [i for i in items if i.text in state and i.text not in verbatim]
        for item in lost:
            below = [b.text for b in listed if TIERS[b.kind] > TIERS[item.kind]]
            assert not below, (path, item.kind, item.text, below)
        if lost:
            # Filler gives way first: no remark that names nothing is kept as a verbatim user line.
            users = [text_of(e.message) for e in result.draft.entries if e.role == "user" and e.edit is None]
            assert not [u for u in users if says_nothing_new(u)], (path, users)
