"""Tests for the fakes and builders in compaction_worker.testing (the fake LLM through LiteLLM's real HTTP path)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
import uuid
from typing import Any

import httpx
import pytest
import tiktoken
from pydantic import ValidationError

from compaction_worker.budget.overflow import OverflowInfo, detect_overflow
from compaction_worker.contracts.events import TurnEvent
from compaction_worker.testing import (
    Chat,
    FakeLLMServer,
    WordCounter,
    default_summary,
    summary_chunk,
    turn_payload,
)
from compaction_worker.testing.replies import OVERFLOW_PROVIDERS, provider_overflow_error

try:
    # Sets LITELLM_LOCAL_MODEL_COST_MAP before litellm is imported anywhere.
    importlib.import_module("compaction_worker._litellm")
except ImportError:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm: Any = importlib.import_module("litellm")

TRANSCRIPT = "\n".join(
    [
        "[user #1]: Migrate the billing service from Python 3.8 to 3.11. Keep the public"
        " API stable and leave the database schema alone.",
        "[assistant #2]: I will read setup.py and the CI configuration first to see which"
        " interpreter versions and dependency pins are in place today.",
        "[tool #3]: setup.py declares python_requires='>=3.8' and pins flask==1.1 and"
        " sqlalchemy==1.3 among thirty other dependencies that all need a look.",
        "[assistant #4]: Flask 1.1 is not supported on 3.11, so the plan is to upgrade Flask"
        " to 2.3 and SQLAlchemy to 1.4 before touching the interpreter.",
        "[user #5]: Agreed. Run the whole test suite after every bump and report any"
        " failures before moving on to the next dependency.",
    ]
)
SUMMARIZE = [
    {"role": "system", "content": "You summarize conversations."},
    {
        "role": "user",
        "content": f"Summarize the transcript.\n<transcript>\n{TRANSCRIPT}\n</transcript>",
    },
]


async def complete(server: FakeLLMServer, **kwargs: Any) -> Any:
    """One litellm.acompletion call against the fake, with overridable arguments."""
    args: dict[str, Any] = {
        "model": "openai/fake-summarizer",
        "messages": [{"role": "user", "content": "hello"}],
        "api_base": server.url,
        "api_key": "fake",
        **kwargs,
    }
    return await litellm.acompletion(**args)


async def post(server: FakeLLMServer, **fields: Any) -> tuple[int, str, str]:
    """One raw chat-completions request: the status, content type and body the fake sends."""
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.url}/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}], **fields},
        )
    return response.status_code, response.headers.get("content-type", ""), response.text


class TestReplies:
    async def test_default_reply_is_a_structured_summary_of_the_transcript(
        self, fake_llm: FakeLLMServer
    ) -> None:
        """The default summary has the headings, a snippet per message, and is shorter."""
        response = await complete(fake_llm, messages=SUMMARIZE)

        text = response.choices[0].message.content
        assert "## Goals and constraints" in text
        assert "## Current state" in text
        assert "## Next steps" in text
        assert "- user: Migrate the billing service from Python 3.8 to 3.11." in text
        assert "Agreed. Run the whole test suite after every bump" in text
        assert "Summarize the transcript" not in text
        assert len(text) < len(TRANSCRIPT) * 0.8
        assert response.model == "fake-summarizer"
        assert response.choices[0].finish_reason == "stop"
        prompt_chars = sum(len(m["content"]) for m in SUMMARIZE)
        assert abs(response.usage.prompt_tokens - prompt_chars / 4) <= 1
        assert abs(response.usage.completion_tokens - len(text) / 4) <= 1

    async def test_fixed_reply_and_responder(self, fake_llm: FakeLLMServer) -> None:
        """set_reply fixes the text; set_responder computes it and takes precedence."""
        fake_llm.set_reply("fixed summary")
        fixed = await complete(fake_llm)
        fake_llm.set_responder(lambda body: f"{len(body['messages'])} messages")
        computed = await complete(fake_llm, messages=SUMMARIZE)
        fake_llm.set_responder(None)
        fake_llm.set_reply(None)
        default = await complete(fake_llm, messages=SUMMARIZE)

        assert fixed.choices[0].message.content == "fixed summary"
        assert computed.choices[0].message.content == "2 messages"
        assert default.choices[0].message.content.startswith("## Goals and constraints")

    def test_sync_completion_works_too(self, fake_llm: FakeLLMServer) -> None:
        """A sync test can call litellm.completion: the server has its own thread and loop."""
        fake_llm.set_reply("from a sync test")

        response = litellm.completion(
            model="openai/fake",
            messages=[{"role": "user", "content": "hi"}],
            api_base=fake_llm.url,
            api_key="fake",
        )

        assert response.choices[0].message.content == "from a sync test"

    async def test_requests_are_recorded_in_order(self, fake_llm: FakeLLMServer) -> None:
        """Every request body is kept, in arrival order, and reset() forgets them."""
        for n in range(3):
            await complete(fake_llm, messages=[{"role": "user", "content": f"call {n}"}])

        recorded = fake_llm.requests
        fake_llm.reset()

        assert [r["messages"][0]["content"] for r in recorded] == ["call 0", "call 1", "call 2"]
        assert recorded[0]["model"] == "fake-summarizer"
        assert fake_llm.requests == []

    async def test_streaming_is_refused_with_a_clear_error(self, fake_llm: FakeLLMServer) -> None:
        """stream=true gets a 400 that says why."""
        status, _, body = await post(fake_llm, stream=True)

        assert status == 400
        assert "does not support stream=true" in json.loads(body)["error"]["message"]

    async def test_delay_does_not_block_concurrent_calls(self, fake_llm: FakeLLMServer) -> None:
        """Two delayed calls are answered at the same time, not one after the other."""
        fake_llm.set_delay(1.0)
        started = time.monotonic()
        calls = asyncio.gather(complete(fake_llm), complete(fake_llm))
        most_at_once = 0
        while not calls.done():
            most_at_once = max(most_at_once, fake_llm.in_flight)
            await asyncio.sleep(0.01)
        await calls

        assert most_at_once == 2
        assert time.monotonic() - started >= 1.0, "the delay was not applied"


class TestFailures:
    async def test_fail_next_answers_with_the_failures_in_order(self, fake_llm: FakeLLMServer) -> None:
        """Injected failures are sent one per request, in order, then the server recovers."""
        fake_llm.fail_next(1, 500)
        fake_llm.fail_next(1, 429, {"error": {"message": "slow down", "type": "rate_limit"}})

        first, second, third = [await post(fake_llm) for _ in range(3)]

        assert first[0] == 500
        assert json.loads(first[2])["error"]["message"] == "FakeLLMServer: injected failure (HTTP 500)"
        assert (second[0], json.loads(second[2])) == (
            429,
            {"error": {"message": "slow down", "type": "rate_limit"}},
        )
        assert third[0] == 200
        assert json.loads(third[2])["choices"][0]["message"]["content"]
        assert len(fake_llm.requests) == 3

    async def test_text_body(self, fake_llm: FakeLLMServer) -> None:
        """A str body is sent as plain text with the status, as a proxy would."""
        fake_llm.fail_next(1, 400, "upstream said no")

        status, content_type, body = await post(fake_llm)

        assert (status, body) == (400, "upstream said no")
        assert content_type.startswith("text/plain")

    @pytest.mark.parametrize("provider", sorted(OVERFLOW_PROVIDERS))
    async def test_overflow_next_sends_the_providers_real_body(
        self, fake_llm: FakeLLMServer, provider: str
    ) -> None:
        """The provider's own status and JSON body, with the numbers asked for."""
        fake_llm.overflow_next(1, provider=provider, actual=9000, maximum=8192)

        status, content_type, body = await post(fake_llm)

        assert (status, json.loads(body)) == provider_overflow_error(provider, 9000, 8192)
        assert content_type.startswith("application/json")
        assert "9000" in body
        assert "8192" in body

    async def test_overflow_numbers_are_configurable(self, fake_llm: FakeLLMServer) -> None:
        """actual/maximum reach the overflow read from LiteLLM's exception, and only n calls fail."""
        fake_llm.overflow_next(2, actual=140_000, maximum=128_000)

        for _ in range(2):
            with pytest.raises(Exception) as caught:  # noqa: PT011  # the class is LiteLLM's choice
                await complete(fake_llm, max_retries=0)
            assert detect_overflow(caught.value) == OverflowInfo("openai", 140_000, 128_000)
        response = await complete(fake_llm)

        assert response.choices[0].message.content

    def test_unknown_provider_is_rejected(self, fake_llm: FakeLLMServer) -> None:
        """A provider without a known overflow body is a ValueError, not a silent default."""
        with pytest.raises(ValueError, match="unknown provider"):
            fake_llm.overflow_next(1, provider="nonesuch")


class TestDefaultSummary:
    """default_summary on plain request bodies, without the server."""

    def test_json_transcript(self) -> None:
        """A transcript given as a JSON list of messages yields one bullet per message."""
        messages = [
            ("user", "Build a parser for the config format. It must handle nested sections."),
            ("assistant", "I will start with the tokenizer. Tests come first, then the grammar."),
            ("user", "Good, then add error messages. Each one needs a line and a column."),
        ]
        transcript = json.dumps([{"role": r, "content": c} for r, c in messages])
        body = {"messages": [{"role": "user", "content": transcript}]}

        summary = default_summary(body)

        assert "- user: Build a parser for the config format." in summary
        assert "- assistant: I will start with the tokenizer." in summary
        assert "- Continue from: Good, then add error messages." in summary
        assert "nested sections" not in summary

    def test_long_transcripts_are_capped(self) -> None:
        """Hundreds of messages still give a summary of about 300 words."""
        lines = [
            f"user: message {n} talks about topic {n} in some detail, at length, for a while."
            for n in range(500)
        ]
        body = {"messages": [{"role": "user", "content": "\n".join(lines)}]}

        summary = default_summary(body)

        assert len(summary.split()) <= 330
        assert "more messages" in summary
        assert "message 0 talks" in summary
        assert "message 499 talks" in summary

    def test_the_requests_max_tokens_bounds_the_summary(self) -> None:
        """A model asked for at most max_tokens writes to fit them: so does the fake (tiktoken-counted)."""
        lines = [
            f"user: message {n} edits src/pkg/module_{n}.py and runs `pytest -k case_{n}` again."
            for n in range(200)
        ]
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "\n".join(lines)}]}
        unbounded = default_summary(body)
        encoding = tiktoken.get_encoding("o200k_base")
        assert len(encoding.encode(unbounded)) > 185

        bounded = default_summary({**body, "max_tokens": 185})

        assert len(encoding.encode(bounded)) <= 185
        assert "message 0 edits" in bounded

    def test_words_of_many_tokens_still_fit_max_tokens(self) -> None:
        """Paths and code take up to four tokens a word (the head-of-line bench's tool calls went 25%
        over at three): the reply is cut on its tokens too, to 80% of max_tokens (another model's
        counter may count it higher)."""
        lines = [
            f"assistant: ran /usr/lib/python3.11/site-packages/pkg_{n}/mod_{n}.py::test_{n} --flag=v_{n}"
            for n in range(200)
        ]
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "\n".join(lines)}]}
        encoding = tiktoken.get_encoding("o200k_base")

        for max_tokens in (100, 437, 2000):
            summary = default_summary({**body, "max_tokens": max_tokens})
            assert len(encoding.encode(summary)) <= 0.8 * max_tokens, max_tokens
            assert "## Goals and constraints" in summary

    def test_text_parts_and_no_role_headers(self) -> None:
        """Content parts are read; without role headers each paragraph is one entry."""
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "First paragraph about goals and limits.\n\n"},
                        {"type": "image_url", "image_url": {"url": "data:,"}},
                        {"type": "text", "text": "Second paragraph describing the current state."},
                    ],
                }
            ]
        }

        summary = default_summary(body)

        assert "- First paragraph about goals and limits." in summary
        assert "- Continue from: Second paragraph describing the current state." in summary


class TestTurnPayload:
    def test_builds_a_valid_event(self) -> None:
        """The payload is JSON-ready and validates back into the same TurnEvent."""
        event_id = uuid.uuid4()
        payload = turn_payload(
            "conv-1",
            3,
            [{"role": "user", "content": "hi"}],
            system_prompt="Be brief.",
            compaction={"mode": "force"},
            event_id=event_id,
        )

        assert payload["conversation_id"] == "conv-1"
        assert payload["turn_seq"] == 3
        assert payload["model"] == "gpt-4o-mini"
        assert payload["event_id"] == str(event_id)
        assert payload["compaction"] == {"mode": "force"}
        assert payload["messages"][0]["content"] == "hi"
        assert "usage" not in payload
        assert TurnEvent.model_validate(payload).model_dump(mode="json", exclude_none=True) == payload

    @pytest.mark.parametrize(
        ("args", "fields"),
        [
            (("conv-1", 0, [{"role": "user", "content": "hi"}]), {}),
            (("", 1, [{"role": "user", "content": "hi"}]), {}),
            (("conv-1", 1, [{"role": "tool", "content": "result"}]), {}),
            (("conv-1", 1, []), {}),
            (
                ("conv-1", 1, [{"role": "user", "content": "hi"}]),
                {"compaction": {"mode": "overflow"}},
            ),
        ],
        ids=[
            "seq-0",
            "empty-id",
            "tool-without-call-id",
            "empty-turn",
            "overflow-no-error",
        ],
    )
    def test_rejects_invalid_input(self, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        """Anything TurnEvent refuses raises ValidationError instead of a payload."""
        with pytest.raises(ValidationError):
            turn_payload(*args, **fields)

    def test_rejects_unknown_field_names(self) -> None:
        """A misspelt field is an error, not silently dropped (TurnEvent ignores extras)."""
        with pytest.raises(TypeError, match="system_promt"):
            turn_payload("conv-1", 1, [{"role": "user", "content": "hi"}], system_promt="Be brief.")


class TestWordCounter:
    def test_counts_words_and_fixed_costs(self) -> None:
        """A word a token; a message adds its fixed cost, images and tool calls' names and arguments."""
        counter = WordCounter()
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        call = {
            "id": "c",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
        }

        assert counter.text("three short words") == 3
        assert counter.message({"role": "user", "content": "two words"}) == WordCounter.PER_MESSAGE + 2
        assert counter.message({"role": "user", "content": [{"type": "text", "text": "look"}, image]}) == (
            WordCounter.PER_MESSAGE + 1 + WordCounter.PER_IMAGE
        )
        assert counter.message({"role": "assistant", "content": None, "tool_calls": [call]}) == (
            WordCounter.PER_MESSAGE + 1 + 2
        )


class TestChat:
    def test_numbers_and_counts_entries_as_the_store_would(self) -> None:
        """Ordinals and turns count up from ``start``; tokens are the counter's unless given."""
        chat = (
            Chat(start=3)
            .user("read it")
            .tool("call_1", "read_file", {"path": "a.py"}, "print(1)", pinned=True)
        )
        chat.add({"role": "assistant", "content": "done"}, seq=9, tokens=1, edit="pruned")

        assert [(e.n, e.seq, e.role) for e in chat.entries] == [
            (3, 3, "user"),
            (4, 4, "assistant"),
            (5, 5, "tool"),
            (6, 9, "assistant"),
        ]
        assert [e.tokens for e in chat.entries[:3]] == [WordCounter().message(m) for m in chat.messages[:3]]
        assert chat.entries[2].pinned
        assert (chat.entries[3].tokens, chat.entries[3].edit) == (1, "pruned")
        assert chat.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'
        assert chat.draft().entries == tuple(chat.entries)

    def test_summary_chunk_defaults(self) -> None:
        """A chunk covers its span, turns numbered as its messages, tokens the words of its text."""
        chunk = summary_chunk(2, 5, "four words of summary", kept=(3,))

        assert (chunk.first_n, chunk.last_n, chunk.first_seq, chunk.last_seq) == (2, 5, 2, 5)
        assert chunk.tokens == 4
        assert [n for n in range(1, 7) if chunk.covers(n)] == [2, 4, 5]
        assert summary_chunk(7).last_n == 7
