"""Counting with bpe-openai (compaction_worker.budget.tokens.fast_count): tiktoken's counts, faster.

The worker counts every message of every turn, so the counter is the hot path; it only takes
bpe-openai's count where that count is tiktoken's. These tests hold the two equal on texts no
one here wrote (the published agent trajectories in tests/data), on generated Unicode, and
through TokenCounter.
"""

from __future__ import annotations

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_worker.budget.tokens import TokenCounter, counter_for, fast_count
from compaction_worker.settings import BudgetSettings
from tests.trajectories import load_trajectories

FAST = ["o200k_base", "cl100k_base"]
SAMPLES = [
    "héllo wörld, 日本語のテキスト, 🎉🎉 مرحبا بالعالم, Ελληνικά, हिन्दी",
    "\u00a0\u2028x\u200b\ufeffy",
    " " * 5000,
    "\n\n\n  \t\t x\r\n\r\n",
    "a" * 10_000,
    "😀" * 3000,
    "<|endoftext|> and <|im_start|> are ordinary text here",
    "don't I'LL we'Ve 123456789 1,000,000.00 x==y&&z",
]


def published_texts() -> list[str]:
    """Every message text and tool-call argument string of the published trajectories."""
    texts = list(SAMPLES)
    for trajectory in load_trajectories():
        for message in trajectory.messages:
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts += [part["text"] for part in content if isinstance(part.get("text"), str)]
            texts += [call["function"]["arguments"] for call in message.get("tool_calls") or []]
    return texts


def fast_or_skip(name: str) -> TokenCounter:
    counter = TokenCounter(name)
    if counter._fast is None:
        pytest.skip("bpe-openai has no wheel on this platform: tiktoken counts everything")
    return counter


@pytest.mark.parametrize("name", FAST)
def test_counts_are_tiktokens_on_published_trajectories(name: str) -> None:
    counter, encoding = fast_or_skip(name), tiktoken.get_encoding(name)
    texts = published_texts()

    counts = [counter._raw(text) for text in texts]

    assert len(texts) > 300
    assert counts == [len(encoding.encode_ordinary(text)) for text in texts]


@pytest.mark.parametrize("name", FAST)
def test_counts_are_tiktokens_on_generated_unicode(name: str) -> None:
    counter, encoding = fast_or_skip(name), tiktoken.get_encoding(name)
    mixed = st.text(alphabet=" \n\t\r\u00a0'sdtllvem0123!?.,:;aAZé日😀-_", max_size=200)

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200) | mixed)
    def same(text: str) -> None:
        assert counter._raw(text) == len(encoding.encode_ordinary(text))

    same()


def test_a_lone_surrogate_is_counted_as_tiktoken_counts_it() -> None:
    """bpe-openai takes UTF-8 only; a lone surrogate (valid in a JSON string) goes to tiktoken."""
    counter = fast_or_skip("o200k_base")
    text = "before \ud800 after"

    assert counter.text(text) == len(tiktoken.get_encoding("o200k_base").encode_ordinary(text))


def test_only_encodings_it_holds_equal_are_counted_fast() -> None:
    assert fast_count("p50k_base") is None
    assert counter_for("text-davinci-003", BudgetSettings())._fast is None
