"""The summarizer: validation, the LiteLLM path (retries, fallbacks, input limits, logs) and the choice.

LLM calls go through LiteLLM's real HTTP client to the FakeLLMServer (``model="openai/..."``,
``api_base=server.url``), so request building, exception mapping and usage parsing are the
production ones.
"""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from compaction_worker._litellm import litellm
from compaction_worker.contracts.events import LlmUsage
from compaction_worker.errors import SummarizerError
from compaction_worker.settings import SummarizerSettings
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.llm import (
    ERROR_TEXT_PATTERNS,
    InputTooLargeError,
    LiteLLMSummarizer,
    make_summarizer,
    transcript_limit,
    validate_summary,
)
from compaction_worker.summaries.prompts import SECTIONS, build_prompt, transcript_costs
from compaction_worker.testing import FakeLLMServer
from tests.summaries.helpers import count, request


def llm_settings(server: FakeLLMServer, **fields: Any) -> SummarizerSettings:
    """Settings that point the summarizer at the fake server."""
    values: dict[str, Any] = {
        "model": "openai/fake-summarizer",
        "api_base": server.url,
        "api_key": SecretStr("fake"),
        "timeout_seconds": 5,
        "max_retries": 2,
    }
    return SummarizerSettings(**(values | fields))


class Sleeps:
    """An injectable sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def summarizer(server: FakeLLMServer, sleeps: Sleeps | None = None, **fields: Any) -> LiteLLMSummarizer:
    """A LiteLLMSummarizer against the fake server, with recorded sleeps and a fixed jitter."""
    return LiteLLMSummarizer(
        llm_settings(server, **fields), count, sleep=sleeps or Sleeps(), jitter=lambda: 0.5
    )


def user_text(body: dict[str, Any]) -> str:
    """The user message of a request the fake server received."""
    content: str = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return content


GOOD_SUMMARY = "\n".join(f"## {s}\n- noted" for s in SECTIONS)


# --- validation ---------------------------------------------------------------------------

ERROR_TEXTS = [
    "Error: upstream request failed",
    "An error occurred while processing your request.",
    "I'm sorry, but I can't help with that.",
    "Sorry, something went wrong.",
    "I cannot summarize this conversation.",
    "As an AI language model, I do not have access to the transcript.",
    "502 Bad Gateway",
    "Rate limit reached for requests",
    "Too Many Requests",
    "You exceeded your current quota.",
    "This model's context length was exceeded.",
    "The maximum context was reached.",
    "Internal Server Error",
    "Service Unavailable: the server is temporarily unavailable",
    "Gateway Timeout",
    "The model is overloaded. Please try again later.",
    "Request timed out.",
    "Invalid API key provided",
    "<html><body><h1>503</h1></body></html>",
    '{"error": {"message": "bad request"}}',
]


class TestValidation:
    """validate_summary: what is not a summary never passes."""

    @pytest.mark.parametrize("text", ERROR_TEXTS)
    def test_error_texts_are_rejected(self, text: str) -> None:
        """An LLM or proxy error returned as content is rejected."""
        with pytest.raises(SummarizerError, match="error text"):
            validate_summary(text, count(text), request())

    def test_every_error_pattern_is_exercised(self) -> None:
        """Each pattern of ERROR_TEXT_PATTERNS matches at least one sample error text."""
        unused = [p.pattern for p in ERROR_TEXT_PATTERNS if not any(p.search(t) for t in ERROR_TEXTS)]
        assert unused == []

    def test_summary_that_mentions_errors_is_valid(self) -> None:
        """A structured summary quoting a rate limit and a 500 in its Errors section passes."""
        text = (
            "## Errors\n- `curl /api` returned 500 Internal Server Error; rate limit exceeded at 14:02\n"
            "## Current state\n- Retrying with backoff."
        )
        validate_summary(text, count(text), request())

    def test_long_html_page_is_rejected(self) -> None:
        """An HTML page is an error whatever its length."""
        text = "<!DOCTYPE html><html>" + "<p>proxy error</p>" * 200 + "</html>"
        with pytest.raises(SummarizerError, match="error text"):
            validate_summary(text, count(text), request())

    @pytest.mark.parametrize("text", ["", "   \n\t "])
    def test_empty_summary_is_rejected(self, text: str) -> None:
        """An empty or whitespace-only summary is rejected."""
        with pytest.raises(SummarizerError, match="empty"):
            validate_summary(text, 0, request())

    def test_oversized_summary_is_rejected(self) -> None:
        """Reference 003 (a bounded summary size): a summary over max_summary_tokens is rejected."""
        with pytest.raises(SummarizerError, match="over its budget of 100"):
            validate_summary(GOOD_SUMMARY, 101, request(max_summary_tokens=100))

    def test_summary_not_smaller_than_what_it_replaces_is_rejected(self) -> None:
        """Reference 000 (no-op rejection): a summary as large as what it replaces is rejected; one token less passes."""
        with pytest.raises(SummarizerError, match="not smaller"):
            validate_summary(GOOD_SUMMARY, 50, request(replaced_tokens=50))
        validate_summary(GOOD_SUMMARY, 49, request(replaced_tokens=50))

    def test_unknown_replaced_size_is_not_checked(self) -> None:
        """replaced_tokens=0 means unknown: only the budget applies."""
        validate_summary(GOOD_SUMMARY, 2000, request(replaced_tokens=0))


# --- the LiteLLM summarizer ---------------------------------------------------------------


class TestLiteLLMCalls:
    """Calls through LiteLLM's real HTTP path: replies, usage and cost, call parameters."""

    async def test_valid_reply_is_returned_with_usage(self, fake_llm: FakeLLMServer) -> None:
        """Reference 003 (a provider-agnostic LLM summary): a valid reply becomes the result, with the server's usage and no cost for an unknown model."""
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm).summarize(request())
        assert result.text == GOOD_SUMMARY
        assert result.model == "openai/fake-summarizer"
        assert result.tokens == count(GOOD_SUMMARY)
        chars = sum(len(m["content"]) for m in fake_llm.requests[0]["messages"])
        expected_prompt = -(-chars // 4)
        expected_completion = -(-len(GOOD_SUMMARY) // 4)
        assert result.usage == LlmUsage(
            calls=1,
            prompt_tokens=expected_prompt,
            completion_tokens=expected_completion,
            total_tokens=expected_prompt + expected_completion,
            cost_usd=None,
        )

    async def test_cost_of_a_priced_model(self, fake_llm: FakeLLMServer) -> None:
        """A model in LiteLLM's price map gets its cost from completion_cost."""
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm, model="openai/gpt-4o-mini").summarize(request())
        price = litellm.model_cost["gpt-4o-mini"]
        expected = (
            result.usage.prompt_tokens * price["input_cost_per_token"]
            + result.usage.completion_tokens * price["output_cost_per_token"]
        )
        assert result.usage.cost_usd == pytest.approx(expected)
        assert expected > 0

    async def test_call_parameters(self, fake_llm: FakeLLMServer) -> None:
        """max_tokens, temperature and the built prompt reach the provider."""
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm, temperature=0.3).summarize(request(max_summary_tokens=777))
        body = fake_llm.requests[0]
        assert body["model"] == "fake-summarizer"
        assert body["max_tokens"] == 777
        assert body["temperature"] == 0.3
        assert body["messages"] == build_prompt(request(max_summary_tokens=777))

    async def test_custom_prompt_replaces_the_instructions(self, fake_llm: FakeLLMServer) -> None:
        """References 000 (summaryPrompt) and 003 (a domain-specific prompt): settings.prompt becomes the system message of the call."""
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm, prompt="Summarize for billing support.").summarize(request())
        assert fake_llm.requests[0]["messages"][0] == {
            "role": "system",
            "content": "Summarize for billing support.",
        }

    async def test_prompt_file_replaces_the_instructions(
        self, fake_llm: FakeLLMServer, tmp_path: Path
    ) -> None:
        """Reference 003 (a deployment's own prompt): the contents of settings.prompt_file become the system message."""
        prompt_file = tmp_path / "prompt.txt"
        prompt_file.write_text("Keep only decisions.", encoding="utf-8")
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm, prompt_file=prompt_file).summarize(request())
        assert fake_llm.requests[0]["messages"][0]["content"] == "Keep only decisions."

    async def test_missing_prompt_file_is_a_summarizer_error(
        self, fake_llm: FakeLLMServer, tmp_path: Path
    ) -> None:
        """An unreadable prompt file fails the summary, without calling the LLM."""
        with pytest.raises(SummarizerError, match="prompt file"):
            await summarizer(fake_llm, prompt_file=tmp_path / "missing.txt").summarize(request())
        assert fake_llm.requests == []

    async def test_conversation_model(self, fake_llm: FakeLLMServer) -> None:
        """Reference 003 (Decision 3, the query's own model): model='conversation' summarizes with the request's conversation model."""
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm, model="conversation").summarize(
            request(conversation_model="openai/the-chat-model")
        )
        assert result.model == "openai/the-chat-model"
        assert fake_llm.requests[0]["model"] == "the-chat-model"

    async def test_conversation_model_missing(self, fake_llm: FakeLLMServer) -> None:
        """model='conversation' without a conversation model fails before any call."""
        with pytest.raises(SummarizerError, match="no summarizer model"):
            await summarizer(fake_llm, model="conversation").summarize(request())
        assert fake_llm.requests == []

    async def test_cut_off_reply_is_invalid(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A reply with finish_reason 'length' is never returned, however good it looks."""

        async def cut_off(**kwargs: Any) -> Any:
            return litellm.ModelResponse(
                model="m",
                choices=[
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": GOOD_SUMMARY},
                        "finish_reason": "length",
                    }
                ],
            )

        monkeypatch.setattr(litellm, "acompletion", cut_off)
        summ = LiteLLMSummarizer(SummarizerSettings(model="openai/m"), count, sleep=Sleeps())
        with pytest.raises(SummarizerError, match="cut off"):
            await summ.summarize(request())


class TestRetries:
    """Retryable failures are asked again with backoff; others are not."""

    async def test_server_errors_are_retried_with_backoff(self, fake_llm: FakeLLMServer) -> None:
        """Two 500s then a reply: three calls, two growing delays, one result."""
        fake_llm.fail_next(2, 500)
        fake_llm.set_reply(GOOD_SUMMARY)
        sleeps = Sleeps()
        result = await summarizer(fake_llm, sleeps).summarize(request())
        assert result.text == GOOD_SUMMARY
        assert len(fake_llm.requests) == 3
        assert sleeps.delays == [0.375, 0.75]  # 0.5 s base, doubled, times the fixed jitter 0.75
        assert result.usage.calls == 3

    @pytest.mark.parametrize("status", [429, 502, 503, 529])
    async def test_retryable_statuses(self, fake_llm: FakeLLMServer, status: int) -> None:
        """429, 502, 503 and other 5xx are retried."""
        fake_llm.fail_next(1, status)
        fake_llm.set_reply(GOOD_SUMMARY)
        await summarizer(fake_llm).summarize(request())
        assert len(fake_llm.requests) == 2

    async def test_timeout_is_retried(self, fake_llm: FakeLLMServer) -> None:
        """A call that times out is retried; the retry succeeds once the server is fast again."""
        fake_llm.set_delay(2.0)
        fake_llm.set_reply(GOOD_SUMMARY)
        delays: list[float] = []

        async def sleep(seconds: float) -> None:
            delays.append(seconds)
            fake_llm.set_delay(0)

        summ = LiteLLMSummarizer(llm_settings(fake_llm, timeout_seconds=0.3), count, sleep=sleep)
        result = await summ.summarize(request())
        assert result.text == GOOD_SUMMARY
        assert len(delays) == 1

    async def test_retries_are_bounded(self, fake_llm: FakeLLMServer) -> None:
        """After max_retries the model gives up; the cause is chained."""
        fake_llm.fail_next(10, 503)
        with pytest.raises(SummarizerError, match="ServiceUnavailableError") as info:
            await summarizer(fake_llm, max_retries=2).summarize(request())
        assert len(fake_llm.requests) == 3
        assert isinstance(info.value.__cause__, litellm.exceptions.ServiceUnavailableError)

    @pytest.mark.parametrize(
        ("status", "kind"),
        [
            (400, "BadRequestError"),
            (401, "AuthenticationError"),
            (403, "HTTP 403"),
            (404, "NotFoundError"),
        ],
    )
    async def test_non_retryable_errors_are_not_retried(
        self, fake_llm: FakeLLMServer, status: int, kind: str
    ) -> None:
        """Reference 004 (a 400 breaks the retry loop): 400, 401, 403 and 404 fail at once: one call, no sleep."""
        fake_llm.fail_next(1, status)
        sleeps = Sleeps()
        with pytest.raises(SummarizerError, match=kind):
            await summarizer(fake_llm, sleeps).summarize(request())
        assert len(fake_llm.requests) == 1
        assert sleeps.delays == []

    async def test_error_text_reply_is_retried_then_fails(self, fake_llm: FakeLLMServer) -> None:
        """An apology instead of a summary is asked again, then rejected."""
        fake_llm.set_reply("I'm sorry, I cannot help with that.")
        with pytest.raises(SummarizerError, match="error text"):
            await summarizer(fake_llm, max_retries=1).summarize(request())
        assert len(fake_llm.requests) == 2

    async def test_oversized_reply_is_not_retried(self, fake_llm: FakeLLMServer) -> None:
        """A summary over its budget is rejected without asking the same model again."""
        fake_llm.set_reply(GOOD_SUMMARY + "\n" + "word " * 500)
        with pytest.raises(SummarizerError, match="over its budget"):
            await summarizer(fake_llm).summarize(request(max_summary_tokens=100))
        assert len(fake_llm.requests) == 1


class TestFallbacks:
    """Fallback models are tried in order when a model gives up."""

    async def test_fallback_after_non_retryable_error(self, fake_llm: FakeLLMServer) -> None:
        """A 404 on the primary moves on to the first fallback model."""
        fake_llm.fail_next(1, 404)
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm, fallback_models=["openai/backup-1", "openai/backup-2"]).summarize(
            request()
        )
        assert result.model == "openai/backup-1"
        assert [r["model"] for r in fake_llm.requests] == ["fake-summarizer", "backup-1"]
        assert result.usage.calls == 2

    async def test_fallback_after_exhausted_retries(self, fake_llm: FakeLLMServer) -> None:
        """Retries run out on the primary, then the fallback answers."""
        fake_llm.fail_next(2, 500)
        fake_llm.set_reply(GOOD_SUMMARY)
        result = await summarizer(fake_llm, max_retries=1, fallback_models=["openai/backup"]).summarize(
            request()
        )
        assert result.model == "openai/backup"
        assert [r["model"] for r in fake_llm.requests] == ["fake-summarizer", "fake-summarizer", "backup"]

    async def test_all_models_failing_names_each(self, fake_llm: FakeLLMServer) -> None:
        """When every model fails, the error says why for each one."""
        fake_llm.fail_next(2, 401)
        with pytest.raises(SummarizerError) as info:
            await summarizer(fake_llm, fallback_models=["openai/backup"]).summarize(request())
        message = str(info.value)
        assert re.search(r"openai/fake-summarizer: [^;]*AuthenticationError", message)
        assert re.search(r"openai/backup: [^;]*AuthenticationError", message)

    async def test_api_key_never_appears(
        self, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A provider that echoes the key: not in the error, its traceback, or the logs."""
        secret = "sk-live-TOPSECRET-123"
        fake_llm.fail_next(1, 500, {"error": {"message": f"upstream rejected key {secret}"}})
        fake_llm.fail_next(1, 401, {"error": {"message": f"Incorrect API key provided: {secret}"}})
        caplog.set_level(logging.DEBUG, logger="compaction_worker")
        with pytest.raises(SummarizerError) as info:
            await summarizer(fake_llm, api_key=SecretStr(secret)).summarize(request())
        rendered = "".join(traceback.format_exception(info.value))
        assert "AuthenticationError" in rendered
        assert secret not in rendered
        assert secret not in caplog.text
        assert "upstream rejected key ***" in caplog.text


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


class TestFailureLogs:
    """Issue 9: a rejected or failed LLM summary says why at WARNING, with the conversation id."""

    async def test_rejected_summary_is_logged_with_its_reason(
        self, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A summary over its budget is rejected (not retried): a warning names the model and the reason."""
        fake_llm.set_reply(GOOD_SUMMARY + "\n" + "word " * 500)
        caplog.set_level(logging.INFO, logger="compaction_worker")
        with pytest.raises(SummarizerError):
            await summarizer(fake_llm).summarize(request(max_summary_tokens=100))
        (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert record.__dict__["conversation_id"] == "conv-1"
        assert "openai/fake-summarizer" in record.getMessage()
        assert "over its budget of 100" in record.getMessage()

    async def test_failed_call_is_logged_with_its_reason(
        self, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A call refused for good (401) logs a warning with the error; the fallback's success does not hide it."""
        fake_llm.fail_next(1, 401)
        fake_llm.set_reply(GOOD_SUMMARY)
        caplog.set_level(logging.INFO, logger="compaction_worker")
        await summarizer(fake_llm, fallback_models=["openai/backup"]).summarize(request())
        (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert record.__dict__["conversation_id"] == "conv-1"
        assert "AuthenticationError" in record.getMessage()


class TestUsageOfFailures:
    """Calls made before a SummarizerError are paid for: the error carries their usage."""

    async def test_rejected_replies_report_their_tokens(self, fake_llm: FakeLLMServer) -> None:
        """Two answered calls whose replies were rejected: both calls and their tokens are reported."""
        fake_llm.set_reply("I'm sorry, I cannot help with that.")
        with pytest.raises(SummarizerError) as info:
            await summarizer(fake_llm, max_retries=1).summarize(request())
        usage = info.value.usage
        assert usage is not None
        assert usage.calls == 2
        assert usage.prompt_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    async def test_failed_calls_across_fallback_models_are_counted(self, fake_llm: FakeLLMServer) -> None:
        """A retried 500 and a 401 from the fallback model: three calls, no tokens reported."""
        fake_llm.fail_next(2, 500)
        fake_llm.fail_next(1, 401)
        with pytest.raises(SummarizerError) as info:
            await summarizer(fake_llm, max_retries=1, fallback_models=["openai/backup"]).summarize(request())
        assert info.value.usage == LlmUsage(calls=3)

    async def test_no_call_no_usage(self, tmp_path: Path) -> None:
        """A failure before any call (an unreadable prompt file) carries no usage."""
        settings = SummarizerSettings(model="openai/x", prompt_file=tmp_path / "missing.txt")
        with pytest.raises(SummarizerError) as info:
            await LiteLLMSummarizer(settings, count).summarize(request())
        assert info.value.usage is None


# --- choosing a summarizer ----------------------------------------------------------------


class TestMakeSummarizer:
    """make_summarizer picks LiteLLM with a model and the extractive summary without."""

    @pytest.mark.parametrize("model", [None, "", "   "])
    def test_no_model_is_extractive(self, model: str | None) -> None:
        """No model configured means the extractive summarizer."""
        chosen = make_summarizer(SummarizerSettings(model=model), count)
        assert isinstance(chosen, ExtractiveSummarizer)
        assert chosen.name == "extractive"

    @pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "conversation"])
    def test_model_is_litellm(self, model: str) -> None:
        """References 001 and 004 (a configurable summary model): a model string, or 'conversation', means the LiteLLM summarizer named after it."""
        chosen = make_summarizer(SummarizerSettings(model=model), count)
        assert isinstance(chosen, LiteLLMSummarizer)
        assert chosen.name == model
