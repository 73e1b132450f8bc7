"""What a compaction costs and saves at a provider's prices, with its prompt cache counted.

A compaction removes tokens every later call would have sent (read from the provider's cache,
at the cache-read price: the conservative saving), and rewrites the prompt after the leading
messages the new history shares with the old one: the next call sends those again, uncached
(Anthropic bills them as a cache write, 1.25x input; OpenAI and Gemini as input). With the
summary calls, that is what the compaction costs once; the break-even is after how many later
calls the savings have paid it. Prices are LiteLLM's (its bundled map, per token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_worker.budget.windows import priced_entry
from compaction_worker.contracts.events import CompactionCost


@dataclass(frozen=True, slots=True)
class Prices:
    """Dollars per token for one model."""

    input: float
    cached: float
    """A cache read; the input price where the map lists no cache price."""
    write: float | None
    """A cache write, where the provider bills one (Anthropic); None: new input costs ``input``."""
    output: float

    @classmethod
    def of(cls, model: str) -> Prices | None:
        """``model``'s prices in LiteLLM's map, None when it prices none of the model's names."""
        entry = priced_entry(model)
        if entry is None:
            return None
        price = float(entry["input_cost_per_token"])
        cached = entry.get("cache_read_input_token_cost")
        write = entry.get("cache_creation_input_token_cost")
        return cls(
            input=price,
            cached=float(cached) if isinstance(cached, int | float) else price,
            write=float(write) if isinstance(write, int | float) else None,
            output=float(entry.get("output_cost_per_token") or 0.0),
        )

    @property
    def uncached(self) -> float:
        """What a token the cache does not serve costs: a cache write where billed, else input."""
        return self.write if self.write is not None else self.input


def rewritten_tokens(
    old: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    count: Callable[[Mapping[str, Any]], int],
) -> int:
    """Tokens of ``new`` after the leading messages it shares with ``old``: what the next call
    cannot read from the cache."""
    shared = 0
    for before, after in zip(old, new, strict=False):
        if before != after:
            break
        shared += 1
    return sum(count(message) for message in new[shared:])


def compaction_cost(
    prices: Prices | None, *, tokens_removed: int, cache_write_tokens: int, summary_cost: float | None
) -> CompactionCost:
    """The compaction's cost and break-even at ``prices`` (the conversation model's; None: unpriced)."""
    removed, rewritten = max(0, tokens_removed), max(0, cache_write_tokens)
    if prices is None:
        return CompactionCost(tokens_removed=removed, cache_write_tokens=rewritten)
    write = rewritten * max(0.0, prices.uncached - prices.cached)
    saving = removed * prices.cached
    once = write + (summary_cost or 0.0)
    return CompactionCost(
        tokens_removed=removed,
        cache_write_tokens=rewritten,
        cache_write_cost=write,
        saving_per_call=saving,
        break_even_calls=once / saving if saving > 0 else None,
    )


def projected_break_even(prices: Prices | None, *, total: int, target: int, fixed: int) -> float:
    """Calls after which a compaction from ``total`` down to ``target`` would pay for the cache it
    rewrites (everything after the ``fixed`` system prompt and tools); ``inf`` when it removes
    nothing, 0 when unpriced (nothing says to wait). The summary's own cost is not projected."""
    if prices is None:
        return 0.0
    saving = max(0, total - target) * prices.cached
    if saving <= 0:
        return math.inf
    return max(0, target - fixed) * max(0.0, prices.uncached - prices.cached) / saving
