"""What a provider's prompt cache serves over a replayed conversation, and what its calls cost.

The model of a conversation's calls: one call per turn, made once the turn is stored (and
compacted), with the effective history as its prompt; the next turn's assistant messages are
that call's output. A provider serves from its cache the leading blocks (messages, a text
message's paragraphs: :func:`message_blocks`) a call shares with the call before it (OpenAI
and Anthropic cache a prefix of at least :data:`MIN_CACHED_TOKENS`); the rest of the prompt is
new input, which Anthropic bills as a
cache write (1.25x input) and OpenAI and Gemini as input. A call whose prompt does not start
with the whole previous prompt is a cache break: something before the end of what the
provider had cached changed. Prices are LiteLLM's (its bundled map, per token).

Beside the product, the simple strategies peers use are replayed on the same turns:
``none`` (the whole transcript every call, over the window or not), ``sliding window`` (at
the threshold, the oldest turns go until the prompt is under the target) and ``summarize
everything`` (at the threshold, everything but the system prompt becomes one new summary of
the product's summary reserve, written by the conversation's model).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction_worker.budget.economics import Prices

MIN_CACHED_TOKENS = 1024
"""The shortest prefix OpenAI's and Anthropic's caches serve."""

PEERS = ("none", "sliding window", "summarize everything")
"""The simple strategies replayed beside the product."""

Block = tuple[str, int]
"""One message of a prompt: its digest and its tokens."""


def block(message: Mapping[str, Any], tokens: int) -> Block:
    """``message`` as a prompt block: two messages are one block when their JSON is identical."""
    return _digest(message), tokens


def message_blocks(message: Mapping[str, Any], tokens: int, count: Callable[[str], int]) -> list[Block]:
    """``message`` as prompt blocks: a text message one block per paragraph, any other whole.

    A provider's cache serves a prompt's prefix to the token (OpenAI, in 128-token steps); a
    paragraph is how finely this measure resolves it, so a summary message that keeps its earlier
    chunks and adds one shares them with the previous prompt. The first block carries the
    message's framing; ``count`` counts a paragraph's tokens.
    """
    content = message.get("content")
    if not isinstance(content, str) or "\n\n" not in content or message.get("tool_calls"):
        return [block(message, tokens)]
    paragraphs = content.split("\n\n")
    rest = [(_digest({"paragraph": p}), count(p)) for p in paragraphs[1:]]
    first = {**message, "content": paragraphs[0]}
    return [(_digest(first), max(0, tokens - sum(t for _, t in rest))), *rest]


def _digest(value: Mapping[str, Any]) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class Dollars:
    """What a conversation's calls cost, by part."""

    input: float = 0.0
    cached: float = 0.0
    write: float = 0.0
    output: float = 0.0
    summarizer: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.cached + self.write + self.output + self.summarizer


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """One strategy over one conversation: the prompts it sent and what a cache served of them."""

    strategy: str
    calls: int
    prompt_tokens: int
    cached_tokens: int
    breaks: int
    """Calls whose prompt did not start with the whole previous prompt."""
    peak_tokens: int
    output_tokens: int
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    dollars: Dollars | None = None
    """None when LiteLLM's map prices neither the model nor the summarizer's."""

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def breaks_per_100_turns(self) -> float:
        return 100 * self.breaks / self.calls if self.calls else 0.0


@dataclass(slots=True)
class CacheMeter:
    """Feeds on a conversation's prompts, one call at a time."""

    previous: list[Block] = field(default_factory=list)
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    breaks: int = 0
    peak_tokens: int = 0

    def call(self, prompt: Sequence[Block], tokens: int | None = None) -> None:
        """One call with ``prompt``; ``tokens`` is its size as the context meter counts it (the request's
        framing included), which its blocks' sum is when not given."""
        shared = 0
        common = 0
        for old, new in zip(self.previous, prompt, strict=False):
            if old[0] != new[0]:
                break
            shared += new[1]
            common += 1
        total = sum(size for _, size in prompt) if tokens is None else tokens
        if self.calls and common < len(self.previous):
            self.breaks += 1
        self.calls += 1
        self.prompt_tokens += total
        self.cached_tokens += shared if shared >= MIN_CACHED_TOKENS else 0
        self.peak_tokens = max(self.peak_tokens, total)
        self.previous = list(prompt)

    def figures(
        self,
        strategy: str,
        output_tokens: int,
        prices: Prices | None,
        *,
        summarizer: tuple[int, int] = (0, 0),
        summarizer_prices: Prices | None = None,
    ) -> CacheFigures:
        """The figures so far; ``summarizer`` is the summary calls' (input, output) tokens."""
        new = self.prompt_tokens - self.cached_tokens
        dollars = None
        if prices is not None:
            by = summarizer_prices or prices
            dollars = Dollars(
                input=0.0 if prices.write is not None else new * prices.input,
                cached=self.cached_tokens * prices.cached,
                write=new * prices.write if prices.write is not None else 0.0,
                output=output_tokens * prices.output,
                summarizer=summarizer[0] * by.input + summarizer[1] * by.output,
            )
        return CacheFigures(
            strategy,
            self.calls,
            self.prompt_tokens,
            self.cached_tokens,
            self.breaks,
            self.peak_tokens,
            output_tokens,
            summarizer[0],
            summarizer[1],
            dollars,
        )


def peer(
    strategy: str,
    head: Sequence[Block],
    turns: Sequence[Sequence[Block]],
    *,
    threshold: int,
    target: int,
    summary_tokens: int,
    framing: int = 0,
) -> tuple[CacheMeter, tuple[int, int]]:
    """Replay a simple strategy (one of :data:`PEERS`) on the turns' blocks, after ``head``
    (system prompt, tools); the meter and its summary calls' (input, output) tokens. ``framing``
    is what every request adds (reply priming), counted in each prompt as the context meter does."""
    if strategy not in PEERS:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(PEERS)}")
    meter = CacheMeter()
    kept: list[Sequence[Block]] = []
    summary: list[Block] = []
    read = written = 0
    for seq, turn in enumerate(turns, start=1):
        kept.append(turn)
        prompt = [*head, *summary, *(b for t in kept for b in t)]
        size = sum(tokens for _, tokens in prompt)
        if strategy == "sliding window" and size > threshold:
            while len(kept) > 1 and size > target:
                size -= sum(tokens for _, tokens in kept.pop(0))
            prompt = [*head, *(b for t in kept for b in t)]
        elif strategy == "summarize everything" and size > threshold:
            read, written = read + size, written + summary_tokens
            summary, kept = [(f"summary of turns 1-{seq}", summary_tokens)], []
            prompt = [*head, *summary]
        meter.call(prompt, sum(tokens for _, tokens in prompt) + framing)
    return meter, (read, written)
