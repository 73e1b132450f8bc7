"""Tests for the prompt-cache figures of a replay (compaction_worker.replay.cache)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from compaction_worker.budget.economics import Prices
from compaction_worker.replay.cache import MIN_CACHED_TOKENS, PEERS, CacheMeter, block, peer


def blocks(*sizes: int, tag: str = "m") -> list[tuple[str, int]]:
    return [block({"role": "user", "content": f"{tag}{i}"}, size) for i, size in enumerate(sizes)]


class TestMeter:
    def test_a_prompt_that_extends_the_previous_is_served_from_the_cache_and_breaks_nothing(self) -> None:
        meter = CacheMeter()
        first = blocks(800, 400)
        meter.call(first)
        meter.call([*first, *blocks(300, tag="new")])

        assert (meter.calls, meter.prompt_tokens, meter.cached_tokens, meter.breaks) == (2, 2700, 1200, 0)

    def test_a_shared_prefix_under_the_providers_minimum_is_not_cached(self) -> None:
        meter = CacheMeter()
        first = blocks(MIN_CACHED_TOKENS - 1)
        meter.call(first)
        meter.call([*first, *blocks(10, tag="new")])

        assert meter.cached_tokens == 0

    def test_a_change_before_the_end_of_the_previous_prompt_is_a_break_and_only_the_prefix_before_it_is_cached(
        self,
    ) -> None:
        meter = CacheMeter()
        system, summary, tail = blocks(1500), blocks(200, tag="summary-1"), blocks(900, tag="tail")
        meter.call([*system, *summary, *tail])
        meter.call([*system, *blocks(250, tag="summary-2"), *tail[-1:]])

        assert (meter.breaks, meter.cached_tokens, meter.peak_tokens) == (1, 1500, 2650)

    def test_identical_messages_are_one_block_whatever_their_key_order(self) -> None:
        assert block({"role": "user", "content": "x"}, 5) == block({"content": "x", "role": "user"}, 5)
        assert block({"role": "user", "content": "x"}, 5) != block({"role": "user", "content": "y"}, 5)


class TestPrices:
    def test_openai_bills_new_input_at_the_input_price_and_cache_reads_at_its_own(self) -> None:
        prices = Prices.of("openrouter/openai/gpt-4o")
        assert prices is not None
        meter = CacheMeter()
        meter.call(blocks(2000))
        meter.call(blocks(2000, 1000))
        dollars = meter.figures("x", output_tokens=100, prices=prices).dollars

        assert dollars is not None
        assert dollars.cached == pytest.approx(2000 * prices.cached)
        assert dollars.input == pytest.approx(3000 * prices.input)
        assert dollars.write == 0.0
        assert dollars.output == pytest.approx(100 * prices.output)

    def test_anthropic_bills_new_input_as_a_cache_write(self) -> None:
        prices = Prices.of("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0")
        assert prices is not None
        assert prices.write is not None
        meter = CacheMeter()
        meter.call(blocks(2000))
        dollars = meter.figures("x", output_tokens=0, prices=prices).dollars

        assert dollars is not None
        assert dollars.input == 0.0
        assert dollars.write == pytest.approx(2000 * prices.write)

    def test_an_unpriced_model_has_no_dollars(self) -> None:
        meter = CacheMeter()
        meter.call(blocks(10))

        assert Prices.of("acme/unknown-model") is None
        assert meter.figures("x", 0, None).dollars is None

    def test_the_summary_calls_are_priced_at_the_summarizers_model(self) -> None:
        cheap, dear = Prices.of("gpt-4o-mini"), Prices.of("gpt-4o")
        assert cheap is not None
        assert dear is not None
        dollars = CacheMeter().figures("x", 0, dear, summarizer=(1000, 100), summarizer_prices=cheap).dollars

        assert dollars is not None
        assert dollars.summarizer == pytest.approx(1000 * cheap.input + 100 * cheap.output)


class TestPeers:
    TURNS: ClassVar = [blocks(300, 200, tag=f"turn{i}-") for i in range(12)]
    HEAD: ClassVar = blocks(1200, tag="system")

    def run(self, strategy: str) -> tuple[CacheMeter, tuple[int, int]]:
        return peer(strategy, self.HEAD, self.TURNS, threshold=3000, target=2000, summary_tokens=300)

    def test_none_sends_the_whole_transcript_and_never_breaks(self) -> None:
        meter, spent = self.run("none")

        assert (meter.calls, meter.breaks, spent) == (12, 0, (0, 0))
        assert meter.peak_tokens == 1200 + 12 * 500

    def test_the_sliding_window_stays_under_the_threshold_and_breaks_each_time_it_drops(self) -> None:
        meter, spent = self.run("sliding window")

        assert meter.peak_tokens <= 3000
        assert meter.breaks > 0
        assert spent == (0, 0)

    def test_summarize_everything_pays_for_its_summaries(self) -> None:
        meter, (read, written) = self.run("summarize everything")

        assert meter.peak_tokens <= 3000
        assert meter.breaks > 0
        assert written == 300 * meter.breaks
        assert read > 3000 * meter.breaks

    def test_every_peer_is_named_and_another_name_is_refused(self) -> None:
        assert PEERS == ("none", "sliding window", "summarize everything")
        with pytest.raises(ValueError, match="unknown strategy"):
            self.run("magic")
