"""Tests for a compaction's cost and break-even at a provider's prices (compaction_worker.budget.economics)."""

from __future__ import annotations

import math

import pytest

from compaction_worker.budget.economics import Prices, compaction_cost, projected_break_even, rewritten_tokens
from compaction_worker.budget.windows import priced_entry

OPENAI = Prices(input=2.5e-6, cached=1.25e-6, write=None, output=1e-5)
ANTHROPIC = Prices(input=3e-6, cached=3e-7, write=3.75e-6, output=1.5e-5)


class TestPrices:
    def test_openai_prices_come_from_the_map_under_any_spelling(self) -> None:
        prices = Prices.of("openrouter/openai/gpt-4o")
        entry = priced_entry("gpt-4o")
        assert prices is not None
        assert entry is not None
        assert (prices.input, prices.cached, prices.write) == (
            entry["input_cost_per_token"],
            entry["cache_read_input_token_cost"],
            None,
        )
        assert prices.uncached == prices.input

    def test_anthropic_bills_new_input_as_a_cache_write(self) -> None:
        prices = Prices.of("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0")
        assert prices is not None
        assert prices.write is not None
        assert prices.uncached == prices.write > prices.input > prices.cached

    def test_an_unpriced_model_has_no_prices(self) -> None:
        assert Prices.of("acme/unknown-model") is None


class TestCost:
    def test_the_next_call_rewrites_what_follows_the_shared_leading_messages(self) -> None:
        old = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
        ]
        new = [{"role": "system", "content": "s"}, {"role": "user", "content": "summary"}, old[2]]

        assert rewritten_tokens(old, new, lambda m: len(str(m["content"])) * 10) == 80

    def test_openai_pays_back_within_a_call_when_it_removes_more_than_it_rewrites(self) -> None:
        cost = compaction_cost(OPENAI, tokens_removed=20_000, cache_write_tokens=10_000, summary_cost=0.005)

        assert cost.cache_write_cost == pytest.approx(10_000 * (OPENAI.input - OPENAI.cached))
        assert cost.saving_per_call == pytest.approx(20_000 * OPENAI.cached)
        assert cost.break_even_calls == pytest.approx((0.0125 + 0.005) / 0.025)

    def test_anthropics_cheap_cache_reads_make_the_same_compaction_pay_back_slowly(self) -> None:
        openai = compaction_cost(OPENAI, tokens_removed=20_000, cache_write_tokens=10_000, summary_cost=None)
        anthropic = compaction_cost(
            ANTHROPIC, tokens_removed=20_000, cache_write_tokens=10_000, summary_cost=None
        )

        assert anthropic.break_even_calls == pytest.approx(10_000 * (3.75e-6 - 3e-7) / (20_000 * 3e-7))
        assert anthropic.break_even_calls is not None
        assert openai.break_even_calls is not None
        assert anthropic.break_even_calls > 10 * openai.break_even_calls

    def test_unpriced_or_nothing_removed_has_no_break_even(self) -> None:
        unpriced = compaction_cost(None, tokens_removed=100, cache_write_tokens=50, summary_cost=None)
        nothing = compaction_cost(OPENAI, tokens_removed=0, cache_write_tokens=50, summary_cost=None)

        assert (unpriced.tokens_removed, unpriced.cache_write_cost, unpriced.break_even_calls) == (
            100,
            None,
            None,
        )
        assert nothing.break_even_calls is None


class TestProjection:
    def test_the_projection_is_the_rewritten_part_against_the_removed_one(self) -> None:
        calls = projected_break_even(ANTHROPIC, total=70_000, target=40_000, fixed=5_000)

        assert calls == pytest.approx(35_000 * (3.75e-6 - 3e-7) / (30_000 * 3e-7))

    def test_more_growth_pays_back_sooner(self) -> None:
        early = projected_break_even(ANTHROPIC, total=50_000, target=40_000, fixed=5_000)
        later = projected_break_even(ANTHROPIC, total=80_000, target=40_000, fixed=5_000)

        assert later < early

    def test_nothing_to_remove_never_pays_and_an_unpriced_model_never_waits(self) -> None:
        assert projected_break_even(OPENAI, total=30_000, target=40_000, fixed=0) == math.inf
        assert projected_break_even(None, total=90_000, target=40_000, fixed=0) == 0.0
