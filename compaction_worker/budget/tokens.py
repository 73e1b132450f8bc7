"""Token counting and the budget: pure functions of messages, settings and a model's window.

The budget turns a window and the settings into the thresholds that decide when a
conversation is compacted and how far down.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Protocol

import tiktoken

# Imported for its side effect: tiktoken finds LiteLLM's bundled encodings, offline
# (without importing LiteLLM itself).
from compaction_worker import _litellm  # noqa: F401
from compaction_worker.budget.windows import WindowInfo, resolve_window
from compaction_worker.contracts.history import PRIVATE_FIELDS
from compaction_worker.settings import BudgetSettings

DEFAULT_OUTPUT_RESERVE = 4096
CALIBRATION_WEIGHT = 0.3
CALIBRATION_BOUNDS = (0.5, 2.0)

# bpe-openai counts these encodings' tokens as tiktoken does, 2-3x faster (tests/budget/
# test_tokens_fast.py holds the counts equal on published agent trajectories); tiktoken counts the others, and
# everything where bpe-openai has no wheel.
_FAST_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})
# Above this size tiktoken's pre-tokenizer gets slow (superlinear) and, for a long enough
# run of whitespace, panics with a regex stack overflow; so long texts are counted in
# chunks cut before a space, which changes the count by a few tokens per megabyte at most.
_CHUNK = 16_384
# Tokens for the JSON structure around one tool call (id, type, function wrapper).
_TOOL_CALL_STRUCTURE = 3
# Content part types: an image (a fixed count) and a text, in every format the worker reads.
IMAGE_TYPES = frozenset({"image_url", "image", "input_image"})
TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
# Message fields that are not prompt text: the role is in the per-message overhead, and
# cache_control is a provider directive.
_NOT_COUNTED = frozenset({"role", "cache_control", *PRIVATE_FIELDS})
_CALL_FIELDS = frozenset({"tool_calls", "function_call"})  # the legacy function_call is one call

_O200K = re.compile(r"^(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|chatgpt-4o|gpt-oss|codex|o\d(-|$))")
_CL100K = re.compile(r"^(gpt-4|gpt-3\.5|gpt-35|text-embedding-)")
# tiktoken's names for encodings LiteLLM does not bundle, and the bundled stand-in.
_STAND_INS = {"r50k_base": "p50k_base", "gpt2": "p50k_base", "o200k_harmony": "o200k_base"}
_EXACT_STAND_INS = frozenset({"o200k_harmony"})  # same tokens for ordinary text
# Reference design's ratios of each provider's tokens to cl100k_base tokens.
_ANTHROPIC, _GOOGLE, _MISTRAL = 1.23, 1.18, 1.26
_FAMILY_MULTIPLIERS = (
    (("claude",), _ANTHROPIC),
    (("gemini", "gemma"), _GOOGLE),
    (("mistral", "mixtral", "codestral", "ministral", "magistral", "devstral", "pixtral"), _MISTRAL),
)
_PROVIDER_MULTIPLIERS = {
    "anthropic": _ANTHROPIC,
    "bedrock": _ANTHROPIC,
    "bedrock_converse": _ANTHROPIC,
    "gemini": _GOOGLE,
    "google": _GOOGLE,
    "google-ai": _GOOGLE,
    "google_ai": _GOOGLE,
    "vertex": _GOOGLE,
    "vertex_ai": _GOOGLE,
    "vertex_ai_beta": _GOOGLE,
    "mistral": _MISTRAL,
    "codestral": _MISTRAL,
}


_MEMO_CHARS = 300
"""Texts up to this long (a ledger item is at most MAX_ITEM_CHARS) have their counts remembered."""
_MEMO_ENTRIES = 50_000
"""The memo is emptied when it holds this many: a bound on its memory, not an eviction policy."""
_SHORT_CHARS = 64
"""Texts this short are remembered raw, in messages: tool names and call ids."""


class TokenCounter:
    """Counts tokens for one model: text, OpenAI-style messages and tool schemas."""

    __slots__ = (
        "_encoding",
        "_fast",
        "_memo",
        "_short",
        "encoding_name",
        "exact",
        "image_tokens",
        "message_overhead",
        "multiplier",
        "name",
    )

    def __init__(
        self,
        encoding_name: str,
        *,
        multiplier: float = 1.0,
        exact: bool = True,
        image_tokens: int = 1024,
        message_overhead: int = 4,
    ) -> None:
        self._encoding = tiktoken.get_encoding(encoding_name)
        self._fast = fast_count(encoding_name)
        self._memo: dict[str, int] = {}
        self._short: dict[str, int] = {}
        self.encoding_name = encoding_name
        self.multiplier = multiplier
        self.exact = exact
        self.image_tokens = image_tokens
        self.message_overhead = message_overhead
        self.name = f"tiktoken:{encoding_name}" if exact else f"approx:{encoding_name}*{multiplier}"

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r})"

    def text(self, text: str) -> int:
        """Tokens in ``text`` (special-token strings count as ordinary text)."""
        if len(text) > _MEMO_CHARS:
            return self._scaled(self._raw(text))
        # Short texts recur: ledger items are counted again each time a ledger is chosen.
        tokens = self._memo.get(text)
        if tokens is None:
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            tokens = self._memo[text] = self._scaled(self._raw(text))
        return tokens

    def message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one OpenAI-style message, including the per-message overhead."""
        raw = 0
        fixed = self.message_overhead
        for key, value in message.items():
            if key in _NOT_COUNTED or value is None:
                continue
            if key == "content":
                if isinstance(value, str):
                    raw += self._raw(value)
                else:
                    parts, more = self._content(value)
                    raw += parts
                    fixed += more
            elif key in _CALL_FIELDS:
                calls, more = self._calls(value if key == "tool_calls" else [value])
                raw += calls
                fixed += more
            else:
                raw += self._raw_short(_as_text(value))  # tool_call_id, name: they recur
        return self._scaled(raw) + fixed

    def _content(self, content: object) -> tuple[int, int]:
        """A non-text content's raw tokens, and its fixed ones (images)."""
        if not isinstance(content, list | tuple):
            return self._raw(_json(content)), 0
        raw = fixed = 0
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            kind = kind if isinstance(kind, str) else None  # a list would not hash
            if isinstance(part, str):
                raw += self._raw(part)
            elif kind in IMAGE_TYPES:
                fixed += self.image_tokens
            elif kind in TEXT_TYPES:
                raw += self._raw(_as_text(part.get("text")))
            else:
                raw += self._raw(_json(part))
        return raw, fixed

    def _calls(self, calls: object) -> tuple[int, int]:
        """Tool calls' raw tokens (name, arguments, id), and their fixed structure."""
        if not isinstance(calls, list | tuple):
            return 0, 0
        raw = fixed = 0
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            fixed += _TOOL_CALL_STRUCTURE
            function = call.get("function")
            function = function if isinstance(function, Mapping) else call
            raw += self._raw_short(_as_text(function.get("name")))
            raw += self._raw(_as_text(function.get("arguments")))
            raw += self._raw_short(_as_text(call.get("id")))
        return raw, fixed

    def messages(self, messages: Iterable[Mapping[str, Any]]) -> int:
        """Tokens of a list of messages: exactly the sum of :meth:`message` over them."""
        return sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        """Tokens of the tool schemas, counted as their compact JSON with sorted keys."""
        if not tools:
            return 0
        return self._scaled(self._raw(_json(list(tools))))

    def _raw_short(self, text: str) -> int:
        """:meth:`_raw`, remembered for short texts: tool names, call ids and names recur every turn."""
        if len(text) > _SHORT_CHARS:
            return self._raw(text)
        tokens = self._short.get(text)
        if tokens is None:
            if len(self._short) >= _MEMO_ENTRIES:
                self._short.clear()
            tokens = self._short[text] = self._raw(text)
        return tokens

    def _raw(self, text: str) -> int:
        if len(text) <= _CHUNK:
            return self._count(text)
        total, start, end_of_text = 0, 0, len(text)
        while start < end_of_text:
            end = start + _CHUNK
            if end < end_of_text:
                cut = text.rfind(" ", start + _CHUNK // 2, end)
                end = cut if cut > start else end
            total += self._count(text[start:end])
            start = end
        return total

    def _count(self, text: str) -> int:
        if self._fast is not None:
            try:
                return self._fast(text)
            except UnicodeEncodeError:
                pass  # a lone surrogate, which tiktoken counts as U+FFFD
        return len(self._encoding.encode_ordinary(text))

    def _scaled(self, raw: int) -> int:
        return raw if self.multiplier == 1.0 else math.ceil(raw * self.multiplier)


def fast_count(encoding_name: str) -> Callable[[str], int] | None:
    """bpe-openai's token count for ``encoding_name``, or None where tiktoken counts it."""
    if encoding_name not in _FAST_ENCODINGS:
        return None
    try:
        # Its Encoding class wraps this count in Python checks that cost ~2 us a text.
        from bpe_openai import _bindings  # noqa: PLC0415  # only when first counting (its import takes ~0.4 s)
    except ImportError:  # no wheel for this platform
        return None
    count: Callable[[str], int] = _bindings.tokenizer_for_encoding(encoding_name).count
    return count


def counter_for(model: str, settings: BudgetSettings) -> TokenCounter:
    """The counter for ``model`` with the settings' image and per-message estimates (cached)."""
    encoding, multiplier, exact = tokenizer_for(model)
    return _counter(
        encoding,
        multiplier=multiplier,
        exact=exact,
        image_tokens=settings.image_tokens,
        message_overhead=settings.message_overhead_tokens,
    )


# Keyed by tokenizer, not by model: a handful of entries however many model strings arrive.
_counter = lru_cache(maxsize=64)(TokenCounter)


@lru_cache(maxsize=4096)  # every turn asks; a model without an OpenAI encoding costs tiktoken a KeyError
def tokenizer_for(model: str) -> tuple[str, float, bool]:
    """``(encoding, multiplier, exact)`` for a LiteLLM model string."""
    parts = [p for p in model.strip().lower().split("/") if p]
    base, providers = (parts[-1], parts[:-1]) if parts else ("", [])
    openai = _openai_encoding(base)
    if openai is not None:
        return openai[0], 1.0, openai[1]
    return "cl100k_base", _multiplier(base, providers), False


def _openai_encoding(base: str) -> tuple[str, bool] | None:
    """The bundled encoding for an OpenAI model name, and whether it is the model's own."""
    if _O200K.match(base):
        return "o200k_base", True
    if _CL100K.match(base):
        return "cl100k_base", True
    try:
        encoding = tiktoken.encoding_name_for_model(base)
    except KeyError:
        return None
    stand_in = _STAND_INS.get(encoding, encoding)
    return stand_in, stand_in == encoding or encoding in _EXACT_STAND_INS


def _multiplier(base: str, providers: Sequence[str]) -> float:
    for prefixes, multiplier in _FAMILY_MULTIPLIERS:
        # Bedrock ids carry the vendor before a dot: "us.anthropic.claude-3-5-sonnet-...".
        if base.startswith(prefixes) or any(f".{p}" in base for p in prefixes):
            return multiplier
    for provider in providers:
        if provider in _PROVIDER_MULTIPLIERS:
            return _PROVIDER_MULTIPLIERS[provider]
    return 1.0


def _as_text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _json(value)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(slots=True)
class Budget:
    """Token thresholds for one conversation's model; every field is a whole number of tokens.

    Invariants: ``0 <= target < threshold <= available <= window``, ``soft_threshold <=
    threshold``, and ``available < window`` whenever the output reserve is positive.
    """

    window: int
    output_reserve: int
    available: int
    threshold: int
    """Compact before the next call when the history reaches this."""
    soft_threshold: int | None
    """Compact in the background from here, so the runtime never waits; None when off."""
    target: int
    """A compaction must bring the history to this or below."""
    reactive_target_fraction: float = 0.7

    def reactive_target(self, provider_max: int | None) -> int:
        """Where to compact after a provider rejected the request as too long.

        ``provider_max`` is the maximum the provider's error stated, when it could be parsed.
        """
        limit = self.window if provider_max is None or provider_max < 1 else min(provider_max, self.window)
        aim = math.floor(self.reactive_target_fraction * limit) - self.output_reserve
        return max(1, min(aim, self.target))


def compute_budget(
    info: WindowInfo, settings: BudgetSettings, max_output_tokens: int | None = None
) -> Budget:
    """The budget for a model's window under ``settings``.

    ``max_output_tokens`` is the event's explicit value; without it the reserve comes from
    the settings, then the registry, then a default, and it never exceeds
    ``max_output_reserve_fraction`` of the window.
    """
    window = max(1, info.window)
    if max_output_tokens is not None:
        wanted = max_output_tokens
    elif settings.output_reserve_tokens is not None:
        wanted = settings.output_reserve_tokens
    elif info.max_output_tokens is not None:
        wanted = info.max_output_tokens
    else:
        wanted = DEFAULT_OUTPUT_RESERVE
    reserve = max(0, min(wanted, math.floor(settings.max_output_reserve_fraction * window)))
    available = window - reserve
    threshold = max(math.floor(settings.trigger_fraction * available), settings.floor_tokens)
    threshold = max(1, min(threshold, available))
    soft = None
    if settings.soft_trigger_fraction is not None:
        soft = min(math.floor(settings.soft_trigger_fraction * available), threshold)
    target = min(math.floor(settings.target_fraction * available), threshold - 1)
    return Budget(
        window=window,
        output_reserve=reserve,
        available=available,
        threshold=threshold,
        soft_threshold=soft,
        target=max(0, target),
        reactive_target_fraction=settings.reactive_target_fraction,
    )


def calibrate(factor: float, estimated: int, reported: int) -> float:
    """The calibration factor once the provider reported ``reported`` tokens for our ``estimated``.

    An exponential moving average of reported/estimated, clamped; a zero on either side
    carries no information, and the factor is returned unchanged.
    """
    if estimated <= 0 or reported <= 0:
        return factor
    low, high = CALIBRATION_BOUNDS
    if not math.isfinite(factor):
        factor = 1.0
    ratio = reported / estimated
    updated = (1 - CALIBRATION_WEIGHT) * factor + CALIBRATION_WEIGHT * ratio
    return min(high, max(low, updated))


def budget_for(
    model: str,
    settings: BudgetSettings,
    context_window: int | None,
    max_output: int | None,
    observed_window: int | None = None,
) -> tuple[WindowInfo, Budget]:
    """The window and budget of a conversation's model, with the event's overrides applied.

    ``observed_window`` is the maximum a provider's overflow error stated for this
    conversation: the provider's word beats any registry or setting that claims more
    (a deployment's own limit, a proxy's, a model alias), so it caps the window.
    """
    info = resolve_window(model, settings, context_window)
    if observed_window is not None and 0 < observed_window < info.window:
        info = replace(info, window=observed_window, source="provider")
    return info, compute_budget(info, settings, max_output)


class BudgetFacts(Protocol):
    """What a conversation's stored metadata says about its budget (store.Meta has these)."""

    @property
    def model(self) -> str: ...
    @property
    def context_window(self) -> int | None: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def observed_window(self) -> int | None: ...


def conversation_budget(facts: BudgetFacts, settings: BudgetSettings) -> tuple[WindowInfo, Budget]:
    """:func:`budget_for` a stored conversation: its model, overrides and the provider's stated maximum."""
    return budget_for(
        facts.model, settings, facts.context_window, facts.max_output_tokens, facts.observed_window
    )
