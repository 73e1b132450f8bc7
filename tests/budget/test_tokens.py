"""Token counting (compaction_worker.budget.tokens): encodings, texts, messages, tools."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken_ext import openai_public  # type: ignore[import-untyped]  # ships no py.typed

from compaction_worker._litellm import TIKTOKEN_CACHE_DIR
from compaction_worker.budget import tokens
from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.settings import BudgetSettings

O200K = tiktoken.get_encoding("o200k_base")
CL100K = tiktoken.get_encoding("cl100k_base")
DEFAULTS = BudgetSettings()
GPT4O = counter_for("gpt-4o", DEFAULTS)
CLAUDE = counter_for("claude-3-5-sonnet-20241022", DEFAULTS)


def raw(encoding: tiktoken.Encoding, text: str) -> int:
    return len(encoding.encode_ordinary(text))


class Pieces:
    """A counter's tiktoken encoding, recording the length of every text it is given."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self.sizes: list[int] = []

    @classmethod
    def of(cls, counter: TokenCounter, monkeypatch: pytest.MonkeyPatch) -> Pieces:
        """Put one in ``counter`` for the test."""
        pieces = cls(counter._encoding)
        monkeypatch.setattr(counter, "_encoding", pieces)
        monkeypatch.setattr(counter, "_fast", None)  # every text through tiktoken, and so through here
        return pieces

    def encode_ordinary(self, text: str) -> list[int]:
        self.sizes.append(len(text))
        return self.encoding.encode_ordinary(text)


class TestOfflineEncodings:
    @pytest.mark.parametrize("name", ["o200k_base", "cl100k_base", "p50k_base"])
    def test_bundled_encoding_loads_without_network(self, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every encoding the counters use is read from LiteLLM's bundled files, never fetched."""
        real_read = tiktoken.load.read_file

        def local_only(blobpath: str) -> bytes:
            assert "://" not in blobpath, f"tiktoken tried to download {blobpath}"
            return real_read(blobpath)

        monkeypatch.setattr(tiktoken.load, "read_file", local_only)

        # The constructor bypasses tiktoken's in-process cache, so this really reads the file.
        ranks = openai_public.ENCODING_CONSTRUCTORS[name]()["mergeable_ranks"]

        assert len(ranks) > 50_000
        assert Path(os.environ["TIKTOKEN_CACHE_DIR"]) == TIKTOKEN_CACHE_DIR


class TestTokenizerChoice:
    @pytest.mark.parametrize(
        ("model", "expected"),
        [
            ("gpt-4o", "tiktoken:o200k_base"),
            ("gpt-4o-mini", "tiktoken:o200k_base"),
            ("openai/gpt-4.1", "tiktoken:o200k_base"),
            ("azure/gpt-5-mini", "tiktoken:o200k_base"),
            ("o1", "tiktoken:o200k_base"),
            ("o3-mini", "tiktoken:o200k_base"),
            ("o4-mini", "tiktoken:o200k_base"),
            ("openrouter/openai/gpt-4o", "tiktoken:o200k_base"),
            ("ft:gpt-4o-mini:acme::abc123", "tiktoken:o200k_base"),
            ("gpt-4", "tiktoken:cl100k_base"),
            ("gpt-4-turbo", "tiktoken:cl100k_base"),
            ("gpt-3.5-turbo", "tiktoken:cl100k_base"),
            ("azure/gpt-35-turbo", "tiktoken:cl100k_base"),
            ("text-embedding-3-small", "tiktoken:cl100k_base"),
            ("text-davinci-003", "tiktoken:p50k_base"),
            # r50k_base is not bundled; p50k_base is its closest bundled relative.
            ("davinci", "approx:p50k_base*1.0"),
            ("claude-3-5-sonnet-20241022", "approx:cl100k_base*1.23"),
            ("anthropic/claude-sonnet-4-20250514", "approx:cl100k_base*1.23"),
            ("bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0", "approx:cl100k_base*1.23"),
            ("bedrock/amazon.nova-pro-v1:0", "approx:cl100k_base*1.23"),
            ("vertex_ai/claude-3-5-sonnet", "approx:cl100k_base*1.23"),
            ("gemini/gemini-2.5-pro", "approx:cl100k_base*1.18"),
            ("vertex_ai/gemini-2.5-flash", "approx:cl100k_base*1.18"),
            ("mistral/mistral-large-latest", "approx:cl100k_base*1.26"),
            ("codestral-latest", "approx:cl100k_base*1.26"),
            ("ollama/llama3", "approx:cl100k_base*1.0"),
            ("azure/my-deployment", "approx:cl100k_base*1.0"),
            ("", "approx:cl100k_base*1.0"),
        ],
    )
    def test_counter_name(self, model: str, expected: str) -> None:
        """Reference 004 (provider multipliers): each model family gets its own encoding, or cl100k_base with its provider's ratio."""
        assert expected == counter_for(model, DEFAULTS).name

    def test_counters_are_shared(self) -> None:
        """Getting a counter is a cache hit, shared by models with the same tokenizer."""
        assert counter_for("gpt-4o", DEFAULTS) is counter_for("openai/gpt-4o-mini", BudgetSettings())

    def test_settings_change_the_counter(self) -> None:
        """Different image and overhead estimates give a different counter."""
        custom = counter_for("gpt-4o", BudgetSettings(image_tokens=85, message_overhead_tokens=0))

        expected = (85, 0)

        assert expected == (custom.image_tokens, custom.message_overhead)


class TestText:
    @pytest.mark.parametrize(
        "text",
        ["", "hello", "Hello, world!\n", "naïve café 漢字 🙂", "def f(x):\n    return x * 2\n"],
    )
    def test_matches_tiktoken(self, text: str) -> None:
        """Reference 003 (tiktoken): for OpenAI models the count is exactly tiktoken's."""
        assert raw(O200K, text) == GPT4O.text(text)
        assert raw(CL100K, text) == counter_for("gpt-4", DEFAULTS).text(text)

    def test_special_tokens_are_text(self) -> None:
        """A message containing '<|endoftext|>' is counted as text, not rejected."""
        text = "before <|endoftext|> after"

        assert raw(O200K, text) == GPT4O.text(text)

    def test_multiplier(self) -> None:
        """Reference 004 (provider multipliers): approximate counters scale cl100k_base by the provider's ratio, rounding up."""
        text = "The quick brown fox jumps over the lazy dog. " * 10

        assert math.ceil(raw(CL100K, text) * 1.23) == CLAUDE.text(text)
        assert CLAUDE.text(text) > raw(CL100K, text)

    def test_megabyte_is_counted_in_pieces_and_close(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """1 MB of prose goes to tiktoken in pieces it is quick on, and counts within 0.1% of one call."""
        text = ("The quick brown fox jumps over the lazy dog; " * 25_000)[:1_000_000]
        exact = raw(O200K, text)
        encoding = Pieces.of(GPT4O, monkeypatch)

        counted = GPT4O.text(text)

        assert abs(counted - exact) <= exact // 1000
        assert len(encoding.sizes) > 1
        assert max(encoding.sizes) <= tokens._CHUNK

    @pytest.mark.parametrize("unit", [" ", "\t", "漢", "a"], ids=["spaces", "tabs", "cjk", "letters"])
    def test_pathological_megabytes(self, unit: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """Long runs that make tiktoken slow, or panic in one call, are counted in chunks."""
        text = unit * 1_200_000
        encoding = Pieces.of(GPT4O, monkeypatch)

        counted = GPT4O.text(text)

        assert counted > 0
        assert sum(encoding.sizes) == len(text)
        assert max(encoding.sizes) <= tokens._CHUNK


class TestMessage:
    def test_string_content(self) -> None:
        """Reference 004 (TOKENS_PER_MESSAGE 4): a text message is its content's tokens plus the per-message overhead."""
        message = {"role": "user", "content": "What is the capital of France?"}

        assert raw(O200K, message["content"]) + 4 == GPT4O.message(message)

    @pytest.mark.parametrize(
        "message",
        [{}, {"role": "user"}, {"role": "user", "content": ""}, {"role": "assistant", "content": None}],
    )
    def test_empty_message_is_overhead(self, message: dict[str, Any]) -> None:
        """A message without content costs only the overhead."""
        assert DEFAULTS.message_overhead_tokens == GPT4O.message(message)

    def test_role_and_pinned_are_not_counted(self) -> None:
        """The role is part of the overhead, and the private 'pinned' flag never reaches a model."""
        plain = {"role": "user", "content": "keep this"}
        pinned = {"role": "assistant", "content": "keep this", "pinned": True}

        assert GPT4O.message(plain) == GPT4O.message(pinned)

    def test_content_parts(self) -> None:
        """References 002 and 004 (a fixed image estimate, 1,024 tokens by default): text parts count their text; each image counts the configured estimate."""
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}}
        message = {
            "role": "user",
            "content": [{"type": "text", "text": "Describe"}, image, {"type": "text", "text": "this"}],
        }

        assert raw(O200K, "Describe") + raw(O200K, "this") + 1024 + 4 == GPT4O.message(message)

    def test_image_estimate_is_not_scaled(self) -> None:
        """The provider multiplier applies to text, not to the fixed image estimate."""
        message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        expected = DEFAULTS.image_tokens + DEFAULTS.message_overhead_tokens

        assert expected == CLAUDE.message(message)

    def test_other_parts_count_their_json(self) -> None:
        """Reference 004 (file attachments count): a non-text, non-image part counts as its compact JSON."""
        part = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
        message = {"role": "user", "content": [part]}
        dumped = json.dumps(part, sort_keys=True, separators=(",", ":"))

        assert raw(O200K, dumped) + 4 == GPT4O.message(message)

    @pytest.mark.parametrize(
        "content",
        [42, {"unexpected": "shape"}, [{"type": ["not", "a", "string"]}], [None, 3.5], ["bare string"]],
    )
    def test_malformed_content_never_raises(self, content: Any) -> None:
        """Content of an unexpected shape counts as its JSON (or text) instead of raising."""
        counted = GPT4O.message({"role": "user", "content": content})

        assert counted > DEFAULTS.message_overhead_tokens

    def test_tool_calls(self) -> None:
        """Reference 002 (tool use from its serialized input): a tool call counts its name, arguments and id, plus a few tokens of structure."""
        call = {
            "id": "call_abc123",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        expected = raw(O200K, "read_file") + raw(O200K, '{"path": "src/app.py"}') + raw(O200K, "call_abc123")

        assert expected + 3 + 4 == GPT4O.message(message)

    def test_tool_call_arguments_as_object(self) -> None:
        """Arguments given as an object instead of a JSON string count as compact JSON."""
        as_text = {"function": {"name": "f", "arguments": '{"a":1}'}}
        as_object = {"function": {"name": "f", "arguments": {"a": 1}}}

        def count(call: dict[str, Any]) -> int:
            return GPT4O.message({"role": "assistant", "tool_calls": [call]})

        assert count(as_text) == count(as_object)

    def test_tool_result(self) -> None:
        """A tool result counts its content, tool_call_id and name."""
        message = {"role": "tool", "tool_call_id": "call_abc123", "name": "read_file", "content": "42"}
        expected = raw(O200K, "42") + raw(O200K, "call_abc123") + raw(O200K, "read_file") + 4

        assert expected == GPT4O.message(message)

    def test_settings_estimates(self) -> None:
        """Image tokens and per-message overhead come from the settings."""
        counter = counter_for("gpt-4o", BudgetSettings(image_tokens=85, message_overhead_tokens=0))
        message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        expected = 85

        assert expected == counter.message(message)

    def test_messages_is_the_sum(self) -> None:
        """A list of messages costs the sum of its messages, so totals can be kept incrementally."""
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
        ]

        assert sum(GPT4O.message(m) for m in messages) == GPT4O.messages(messages)
        assert not GPT4O.messages([])


class TestTools:
    SCHEMA: dict[str, Any] = {  # noqa: RUF012  # read-only test data
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }

    @pytest.mark.parametrize("tools", [None, []])
    def test_no_tools(self, tools: list[dict[str, Any]] | None) -> None:
        """No tools cost nothing."""
        assert not GPT4O.tools(tools)

    def test_schema_json(self) -> None:
        """Reference 004 (tool definitions from their JSON): tool schemas count as their compact, key-sorted JSON."""
        dumped = json.dumps([self.SCHEMA], sort_keys=True, separators=(",", ":"))

        assert raw(O200K, dumped) == GPT4O.tools([self.SCHEMA])

    def test_key_order_does_not_matter(self) -> None:
        """The same schema with its keys in another order costs the same."""
        reordered = dict(reversed(list(self.SCHEMA.items())))

        assert GPT4O.tools([self.SCHEMA]) == GPT4O.tools([reordered])

    def test_scaled_for_other_providers(self) -> None:
        """Approximate counters apply their multiplier to tool schemas too."""
        dumped = json.dumps([self.SCHEMA], sort_keys=True, separators=(",", ":"))

        assert math.ceil(raw(CL100K, dumped) * 1.23) == CLAUDE.tools([self.SCHEMA])


messages_strategy = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
        optional={
            "content": st.one_of(
                st.none(),
                st.text(max_size=200),
                st.lists(
                    st.one_of(
                        st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=50)),
                        st.just({"type": "image_url", "image_url": {"url": "x"}}),
                    ),
                    max_size=4,
                ),
            ),
            "name": st.text(max_size=20),
            "tool_call_id": st.text(max_size=20),
        },
    ),
    max_size=8,
)
models_strategy = st.sampled_from(["gpt-4o", "gpt-4", "claude-3-5-sonnet-20241022", "gemini/gemini-2.5-pro"])


class TestProperties:
    @given(model=models_strategy, first=messages_strategy, second=messages_strategy)
    @settings(max_examples=150, deadline=None)
    def test_messages_additive(
        self, model: str, first: list[dict[str, Any]], second: list[dict[str, Any]]
    ) -> None:
        """Counting two lists together equals counting them apart, and never goes below overheads."""
        counter = counter_for(model, DEFAULTS)

        together = counter.messages(first + second)

        assert counter.messages(first) + counter.messages(second) == together
        assert together >= 4 * (len(first) + len(second))

    @given(model=models_strategy, parts=st.lists(st.text(max_size=80), max_size=6), extra=st.text())
    @settings(max_examples=150, deadline=None)
    def test_monotone_in_content(self, model: str, parts: list[str], extra: str) -> None:
        """Adding a content part never makes a message cheaper.

        (Appending characters to one string can: BPE encodes ' thei' as two tokens but
        ' their' as one, so monotonicity holds per part, not per character.)
        """
        counter = counter_for(model, DEFAULTS)

        def message(texts: list[str]) -> dict[str, Any]:
            return {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}

        assert counter.message(message(parts)) <= counter.message(message([*parts, extra]))

    @given(model=models_strategy, text=st.text(max_size=300))
    @settings(max_examples=150, deadline=None)
    def test_approximation_never_undercounts_cl100k(self, model: str, text: str) -> None:
        """Counters are non-negative, and approximations are at least cl100k_base's count."""
        counter = counter_for(model, DEFAULTS)
        counted = counter.text(text)

        assert counted >= 0
        if not counter.exact:
            assert counted >= raw(CL100K, text)


def test_counter_is_reusable_directly() -> None:
    """A TokenCounter can be built for an encoding without going through a model name."""
    expected = ("tiktoken:p50k_base", 1 + 1)

    counter = TokenCounter("p50k_base", image_tokens=10, message_overhead=1)

    assert expected == (counter.name, counter.message({"content": "hello"}))


def test_short_texts_counts_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger's items are counted again and again; the memo answers as the tokenizer does, and stays bounded."""
    counter = TokenCounter("cl100k_base")
    monkeypatch.setattr(tokens, "_MEMO_ENTRIES", 3)
    texts = ["path: src/a.py", "cmd: make test", "error: boom", "url: https://x.io"]
    assert [counter.text(t) for t in texts] == [len(counter._encoding.encode_ordinary(t)) for t in texts]
    assert len(counter._memo) <= 3
    long = "word " * 100  # over the memo's length: counted, not kept
    assert counter.text(long) == len(CL100K.encode_ordinary(long))
    assert long not in counter._memo
