"""The LiteLLM summarizer over a model's input: tool outputs cut first, then the caller splits the span."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_worker._litellm import litellm
from compaction_worker.contracts.events import LlmUsage
from compaction_worker.summaries.contract import InputTooLargeError, SummarizerError, transcript_limit
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.prompts import transcript_costs
from compaction_worker.testing import FakeLLMServer
from tests.summaries.helpers import GOOD_SUMMARY, count, request, summarizer, user_text


def long_session(exchanges: int = 20) -> list[dict[str, Any]]:
    """``exchanges`` steps between a first and a last request, each with a long tool output."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "FIRST: migrate the billing service."}]
    for i in range(exchanges):
        messages += [
            {
                "role": "assistant",
                "content": f"Step {i}: reading logs.",
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"log line {i} " * 800},
        ]
    messages.append({"role": "user", "content": "LAST: now deploy it."})
    return messages


def prompt_size(body: dict[str, Any]) -> int:
    """A sent prompt's size as the summarizer counts it."""
    return sum(count(m["content"]) + 4 for m in body["messages"])


CUT = "characters of this tool output omitted"


class TestEscalation:
    """Over the model's input: tool outputs are cut; if it is still over, the caller must split the span."""

    async def test_overflow_clamps_tool_outputs(self, fake_llm: FakeLLMServer) -> None:
        """Reference 004 (an overflow is not retried as it was): after one overflow the retry cuts each tool output to head and tail with a notice."""
        fake_llm.overflow_next(1, "openai", actual=90_000, maximum=100_000)
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm).summarize(request(long_session()))
        assert result.text == GOOD_SUMMARY
        first, second = (user_text(r) for r in fake_llm.requests)
        assert CUT not in first
        assert second.count(CUT) == 20
        assert len(second) < len(first) / 3

    async def test_second_overflow_asks_for_a_split(self, fake_llm: FakeLLMServer) -> None:
        """Issue 9: overflowing with tool outputs cut, no message is dropped; the caller learns the limit."""
        messages = long_session()
        summ = summarizer(fake_llm)
        fake_llm.overflow_next(2, "openai", actual=200_000, maximum=100_000)
        with pytest.raises(InputTooLargeError, match="too large") as info:
            await summ.summarize(request(messages))
        assert len(fake_llm.requests) == 2
        second = fake_llm.requests[1]
        assert "FIRST: migrate" in user_text(second)
        assert all(f"Step {i}: reading logs." in user_text(second) for i in range(20))
        # The provider's window scaled to our counter: about half the refused prompt.
        limit = info.value.transcript_limit
        assert limit is not None
        assert limit == summ.transcript_limit(request(messages))
        assert limit < prompt_size(second) / 2
        assert isinstance(info.value.__cause__, litellm.exceptions.ContextWindowExceededError)
        assert info.value.usage == LlmUsage(calls=2)

    async def test_limit_without_numbers_halves_the_transcript(self, fake_llm: FakeLLMServer) -> None:
        """An overflow that names no numbers: the next guess is half the refused transcript."""
        body = {
            "error": {
                "message": "The input length exceeds the context length",
                "type": "invalid_request_error",
            }
        }
        fake_llm.fail_next(1, 400, body)
        summ = summarizer(fake_llm)
        messages = [{"role": "user", "content": "word " * 3000}]
        assert summ.transcript_limit(request(messages)) is None
        with pytest.raises(InputTooLargeError) as info:
            await summ.summarize(request(messages))
        assert len(fake_llm.requests) == 1  # nothing to cut: the same prompt is not sent again
        limit = info.value.transcript_limit
        assert limit is not None
        assert abs(limit - 3000 // 2) < 60

    async def test_span_over_the_configured_limit_is_refused_without_a_call(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """Issue 9: twenty cut tool outputs still over max_input_tokens: no call, no message dropped, a split asked for."""
        summ = summarizer(fake_llm, max_input_tokens=2000)
        with pytest.raises(InputTooLargeError, match="over its limit") as info:
            await summ.summarize(request(long_session()))
        assert fake_llm.requests == []
        limit = summ.transcript_limit(request(long_session()))
        assert info.value.transcript_limit == limit
        assert limit is not None
        assert 1000 < limit < 2000

    async def test_configured_input_limit_shrinks_before_calling(self, fake_llm: FakeLLMServer) -> None:
        """A prompt over max_input_tokens has its tool outputs cut before the first call, which fits."""
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm, max_input_tokens=2000).summarize(request(long_session(2)))
        (sent,) = fake_llm.requests
        assert prompt_size(sent) <= 2000
        assert user_text(sent).count(CUT) == 2

    async def test_model_window_from_litellm_shrinks_before_calling(self, fake_llm: FakeLLMServer) -> None:
        """Reference 000 (output tokens reserved for the summary): a model LiteLLM knows (gpt-4, 8192 tokens) gets a prompt that leaves room for the reply."""
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm, model="openai/gpt-4").summarize(
            request(long_session(4), max_summary_tokens=1000)
        )
        (sent,) = fake_llm.requests
        assert CUT in user_text(sent)
        assert prompt_size(sent) <= 8192 - 1000

    async def test_nothing_fits_gives_up_without_calling(self, fake_llm: FakeLLMServer) -> None:
        """One message over the limit, with no tool output to cut: no call, a split asked for."""
        huge = [{"role": "user", "content": "word " * 5000}]
        with pytest.raises(InputTooLargeError, match="over its limit"):
            await summarizer(fake_llm, max_input_tokens=300).summarize(request(huge))
        assert fake_llm.requests == []

    async def test_a_transcript_within_the_limit_is_sent_whole(self, fake_llm: FakeLLMServer) -> None:
        """What transcript_limit allows, measured as the stage measures it, goes in one call, uncut."""
        fake_llm.set_reply(GOOD_SUMMARY)
        summ = summarizer(fake_llm, max_input_tokens=3000)
        limit = summ.transcript_limit(request([]))
        assert limit is not None
        messages = long_session(20)
        while sum(transcript_costs(messages, count)) > limit:
            messages = messages[:-1]
        await summ.summarize(request(messages))
        (sent,) = fake_llm.requests
        assert CUT not in user_text(sent)
        assert prompt_size(sent) <= 3000

    def test_earlier_summaries_and_the_reply_take_room(self, fake_llm: FakeLLMServer) -> None:
        """The limit is what is left for the transcript around the frame, earlier summaries included."""
        summ = summarizer(fake_llm, max_input_tokens=3000)
        bare = summ.transcript_limit(request([]))
        folded = summ.transcript_limit(request([], previous_summaries=["word " * 500]))
        assert bare is not None
        assert folded is not None
        assert 500 <= bare - folded <= 560
        gpt4 = summarizer(fake_llm, model="openai/gpt-4")
        small, large = (gpt4.transcript_limit(request([], max_summary_tokens=m)) for m in (500, 2500))
        assert small is not None
        assert large is not None
        assert 1900 <= small - large <= 2000

    def test_no_known_limit(self, fake_llm: FakeLLMServer) -> None:
        """A model LiteLLM does not know, without max_input_tokens, has no limit; nor has the extractive summary."""
        assert summarizer(fake_llm).transcript_limit(request()) is None
        assert transcript_limit(ExtractiveSummarizer(count), request()) is None
        assert transcript_limit(summarizer(fake_llm, max_input_tokens=1000), request()) is not None

    async def test_a_fallback_model_with_room_takes_what_the_first_cannot(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """The first model's window is too small: no call to it; the fallback (no known limit) answers."""
        fake_llm.set_reply(GOOD_SUMMARY)
        summ = summarizer(fake_llm, model="openai/gpt-4", fallback_models=["openai/big-backup"])
        result = await summ.summarize(request(long_session()))
        assert result.model == "openai/big-backup"
        assert [r["model"] for r in fake_llm.requests] == ["big-backup"]

    async def test_a_fallback_model_too_small_is_a_failure_not_a_split(self, fake_llm: FakeLLMServer) -> None:
        """The first model failed for another reason: splitting for the fallback's window would not help it."""
        fake_llm.fail_next(1, 404)
        summ = summarizer(fake_llm, fallback_models=["openai/gpt-4"])
        with pytest.raises(SummarizerError) as info:
            await summ.summarize(request(long_session()))
        assert not isinstance(info.value, InputTooLargeError)
        assert "over its limit" in str(info.value)
