"""The LiteLLM summarizer: calls, retries, fallbacks, input limits, logs, the cost of failures.

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
from compaction_worker.settings import SummarizerSettings
from compaction_worker.summaries.contract import SummarizerError
from compaction_worker.summaries.llm import LiteLLMSummarizer
from compaction_worker.summaries.prompts import build_prompt
from compaction_worker.testing import FakeLLMServer
from tests.summaries.helpers import GOOD_SUMMARY, Sleeps, count, llm_retry, llm_settings, request, summarizer


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
        await summarizer(fake_llm, temperature=0.3, output="markdown").summarize(
            request(max_summary_tokens=777)
        )
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
        summ = LiteLLMSummarizer(
            SummarizerSettings(model="openai/m"), count, retry=llm_retry(), sleep=Sleeps()
        )
        with pytest.raises(SummarizerError, match="cut off"):
            await summ.summarize(request())

    async def test_a_cut_off_summary_is_asked_again_shorter(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue 19: cut off at the output limit, the summary is asked again for fewer words, same limit."""
        calls: list[dict[str, Any]] = []

        async def first_cut_off(**kwargs: Any) -> Any:
            calls.append(kwargs)
            finish = "length" if len(calls) == 1 else "stop"
            return litellm.ModelResponse(
                model="m",
                choices=[
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": GOOD_SUMMARY},
                        "finish_reason": finish,
                    }
                ],
            )

        monkeypatch.setattr(litellm, "acompletion", first_cut_off)
        summ = LiteLLMSummarizer(
            SummarizerSettings(model="openai/m", output="markdown"), count, retry=llm_retry(), sleep=Sleeps()
        )

        result = await summ.summarize(request())

        assert result.text == GOOD_SUMMARY.strip()
        assert len(calls) == 2
        assert calls[0]["max_tokens"] == calls[1]["max_tokens"]
        first, second = (call["messages"][0]["content"] for call in calls)
        assert "was cut off" not in first
        assert second.startswith(first)
        assert "previous summary was cut off" in second
        assert "at most" in second


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
        assert sleeps.delays == [0.25, 0.5]  # under 0.5 s, then 1 s (full jitter, fixed at the midpoint)
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

        summ = LiteLLMSummarizer(
            llm_settings(fake_llm, timeout_seconds=0.3), count, retry=llm_retry(), sleep=sleep
        )
        result = await summ.summarize(request())
        assert result.text == GOOD_SUMMARY
        assert len(delays) == 1

    async def test_retries_are_bounded(self, fake_llm: FakeLLMServer) -> None:
        """After its attempts the model gives up; the cause is chained."""
        fake_llm.fail_next(10, 503)
        with pytest.raises(SummarizerError, match="ServiceUnavailableError") as info:
            await summarizer(fake_llm, attempts=3).summarize(request())
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
            await summarizer(fake_llm, attempts=2).summarize(request())
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
        result = await summarizer(fake_llm, attempts=2, fallback_models=["openai/backup"]).summarize(
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


class TestFailureLogs:
    """Issue 9: a rejected or failed LLM summary says why at WARNING (the run binds the conversation id: test_compactor)."""

    async def test_rejected_summary_is_logged_with_its_reason(
        self, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A summary over its budget is rejected (not retried): a warning names the model and the reason."""
        fake_llm.set_reply(GOOD_SUMMARY + "\n" + "word " * 500)
        caplog.set_level(logging.INFO, logger="compaction_worker")
        with pytest.raises(SummarizerError):
            await summarizer(fake_llm).summarize(request(max_summary_tokens=100))
        (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
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
        assert "AuthenticationError" in record.getMessage()


class TestUsageOfFailures:
    """Calls made before a SummarizerError are paid for: the error carries their usage."""

    async def test_rejected_replies_report_their_tokens(self, fake_llm: FakeLLMServer) -> None:
        """Two answered calls whose replies were rejected: both calls and their tokens are reported."""
        fake_llm.set_reply("I'm sorry, I cannot help with that.")
        with pytest.raises(SummarizerError) as info:
            await summarizer(fake_llm, attempts=2).summarize(request())
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
            await summarizer(fake_llm, attempts=2, fallback_models=["openai/backup"]).summarize(request())
        assert info.value.usage == LlmUsage(calls=3)

    async def test_no_call_no_usage(self, tmp_path: Path) -> None:
        """A failure before any call (an unreadable prompt file) carries no usage."""
        settings = SummarizerSettings(model="openai/x", prompt_file=tmp_path / "missing.txt")
        with pytest.raises(SummarizerError) as info:
            await LiteLLMSummarizer(settings, count, retry=llm_retry()).summarize(request())
        assert info.value.usage is None
