"""Recognise a provider's "your input does not fit the context window" error and read its numbers.

Reactive compaction starts from the error text the runtime got back (or from an exception
raised by LiteLLM), so this module reads the wordings providers really send; the test
corpus quotes them with their sources. Numbers are read where the text has them:
``actual_tokens`` is the provider's count of the *input* (when the text splits input and
requested output, only the input part), ``max_tokens`` the context window it enforced.

Two kinds of look-alikes are deliberately rejected, because compacting the history does
not fix them: rate limits and quotas ("tokens per minute", "Too many tokens, please wait"),
and output caps that do not depend on the input ("max_tokens is too large: 128000. This
model supports at most 16384 completion tokens", "The maximum tokens you requested
exceeds the model limit of 4096"). An error that ties the output budget to the *window*
("input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000") is an
overflow: a shorter input makes room for the output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["OverflowInfo", "detect_overflow"]


@dataclass(frozen=True, slots=True)
class OverflowInfo:
    """A recognised context overflow: who said so and, when the text has them, the numbers."""

    provider: str | None
    actual_tokens: int | None
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class _Pattern:
    regex: re.Pattern[str]
    provider: str | None
    strong: bool = True
    """Weak patterns are generic phrases; a rate-limit or quota word next to them wins."""
    numbers_are_tokens: bool = True


# Numbers may carry thousands separators ("30,000"); bounded so no pattern can backtrack far.
_ACT = r"(?P<actual>\d[\d,]{0,14})"
_MAX = r"(?P<max>\d[\d,]{0,14})"
_NUM = r"\d[\d,]{0,14}"


def _p(pattern: str, provider: str | None, *, strong: bool = True, tokens: bool = True) -> _Pattern:
    return _Pattern(re.compile(pattern, re.IGNORECASE), provider, strong, tokens)


# Most specific first: the first pattern that matches decides provider and numbers.
# ``max`` is the window, ``actual`` the input tokens; without ``actual``, the input is read
# from the sentence after the match (see ``_actual``).
_PATTERNS: Final[tuple[_Pattern, ...]] = (
    # Anthropic (also behind Bedrock, Vertex AI and LiteLLM proxies).
    _p(rf"prompt is too long: {_ACT} tokens > {_MAX} maximum", "anthropic"),
    _p(
        rf"input length and [`'\"]?max_tokens[`'\"]? exceed context limit: "
        rf"{_ACT} \+ {_NUM} > {_MAX}",
        "anthropic",
    ),
    _p(r"prompt is too long", "anthropic"),
    # Gemini / Vertex AI.
    _p(
        rf"input token count \({_ACT}\) exceeds the maximum number of tokens allowed \({_MAX}\)",
        "gemini",
    ),
    _p(r"exceeds the maximum number of tokens allowed", "gemini"),
    # Mistral; the part between the numbers varies ("and 0 draft tokens", "and 0 images").
    _p(
        rf"prompt contains {_ACT} tokens[^.]{{0,60}}?too large for model with "
        rf"{_MAX} maximum context length",
        "mistral",
    ),
    # Bedrock.
    _p(
        rf"too many input tokens\W{{0,3}}max input tokens: {_MAX}, "
        rf"request input token count: {_ACT}",
        "bedrock",
    ),
    _p(rf"prompt tokens \({_ACT}\) exceed model maximum \({_MAX}\)", "bedrock"),
    _p(r"input is too long for requested model", "bedrock"),
    _p(r"too many input tokens", "bedrock"),
    # Titan's limit is in characters: an overflow, but its numbers are not tokens.
    _p(rf"expected maxLength: {_MAX}, actual: {_ACT}", "bedrock", tokens=False),
    # Claude 4.5 / Bedrock Converse stop reason for an input+output overshoot.
    _p(r"model_context_window_exceeded", None),
    # OpenAI, Azure OpenAI, vLLM, DeepSeek and OpenRouter share this sentence.
    _p(rf"maximum context length is {_MAX} tokens", "openai"),
    _p(r"your input exceeds the context window", "openai"),
    _p(rf"input tokens exceed the configured limit of {_MAX} tokens", "openai"),
    _p(rf"exceeds the model'?s maximum context length(?: of {_MAX})?", None),
    _p(rf"maximum prompt length is {_MAX} but the request contains {_ACT} tokens", "xai"),
    # vLLM's engine-level messages.
    _p(
        rf"the prompt \(total length {_ACT}\) is too long to fit into the model "
        rf"\(context length {_MAX}\)",
        "vllm",
    ),
    _p(rf"input prompt \({_ACT} tokens\) is too long and exceeds limit of {_MAX}", "vllm"),
    # SGLang / Together.
    _p(
        rf"input \({_ACT} tokens\) is longer than the model'?s context length \({_MAX} tokens\)",
        None,
    ),
    _p(r"is longer than the model'?s context length", None),
    # Ollama.
    _p(r"prompt too long; exceeded (?:max )?context length", "ollama"),
    _p(r"the input length exceeds the context length", "ollama"),
    # LM Studio, llama.cpp, Cerebras, Moonshot, Cohere.
    _p(rf"input length {_ACT} exceeds context length {_MAX}", None),
    _p(r"greater than the context length", None),
    _p(
        rf"request \({_ACT} tokens\) exceeds the available context size \({_MAX} tokens\)",
        "llama.cpp",
    ),
    _p(r"exceeds the available context size", "llama.cpp"),
    _p(rf"current length is {_ACT} while limit is {_MAX}", None),
    _p(rf"exceeded model token limit: {_MAX}(?: \(requested: {_ACT}\))?", "moonshot"),
    _p(rf"tokens in the prompt exceeds the limit of {_MAX}", "cohere"),
    # OpenAI's error code, also relayed by Azure and gateways.
    _p(r"context_length_exceeded", None),
    # Generic phrases count only when no rate-limit or quota word is next to them. Azure's
    # "content_length_exceeded" comes from the reference design; no real sample was found.
    _p(
        r"context (?:length|window) exceeded|exceeds? the context (?:length|window)",
        None,
        strong=False,
    ),
    _p(r"content_length_exceeded", "azure", strong=False),
    _p(r"too many tokens", None, strong=False),
    _p(r"token limit exceeded", None, strong=False),
    # Reference 004's per-provider phrases on their own (002: Anthropic's prompt_too_long, 413).
    # Weak: a rate limit's text may share the words; output caps say "output" or "completion".
    _p(r"prompt_too_long", "anthropic", strong=False),
    _p(r"reduce the length of the messages", "openai", strong=False),
    _p(r"\b(?:input|content) is too long", None, strong=False),
    _p(r"exceeds the model'?s maximum(?! (?:allowed )?(?:output|completion))", None, strong=False),
    _p(
        r"maximum number of tokens(?! (?:to generate|for (?:the )?(?:output|completion)))", None, strong=False
    ),
)

# Words of a rate limit, quota or throttle: the request may fit, the account is just busy.
_NOT_OVERFLOW: Final = re.compile(
    r"rate.?limit|tokens per min|per minute|\b[TR]PM\b|quota|throttl|too many requests|please wait"
    r"|try again in|resource_exhausted|billing|insufficient.?credits",
    re.IGNORECASE,
)

# Exception-text markers of the provider that produced the error (LiteLLM prefixes its
# messages with "<Provider>Exception -"; proxies nest several). The one nearest before the
# match names the provider that actually refused.
_PROVIDER_MARKERS: Final = re.compile(
    r"(?P<name>anthropic|azure_ai|azure|bedrock|vertex_?ai|gemini|mistral|hosted_vllm|vllm|ollama"
    r"|openrouter|deepseek|groq|xai|cohere|openai)(?:error|exception)\b",
    re.IGNORECASE,
)
_MARKER_NAMES: Final = {"vertexai": "vertex_ai", "hosted_vllm": "vllm"}

_MAX_TEXT = 50_000  # error texts can embed whole request bodies; the verdict is near the top
_MAX_CHAIN = 8


def detect_overflow(error: BaseException | str) -> OverflowInfo | None:
    """Return what the error says about a context overflow, or None when it is no overflow."""
    texts, typed, attr_provider = _collect(error)
    text = "\n".join(texts)[:_MAX_TEXT]
    blocked = _NOT_OVERFLOW.search(text) is not None
    for pattern in _PATTERNS:
        match = pattern.regex.search(text)
        if match is None or (blocked and not pattern.strong):
            continue
        provider = _marker_before(text, match.start()) or attr_provider or pattern.provider
        if not pattern.numbers_are_tokens:
            return OverflowInfo(provider, None, None)
        return OverflowInfo(provider, _actual(match, text), _int(match.groupdict().get("max")))
    if typed:
        return OverflowInfo(_marker_before(text, len(text)) or attr_provider, None, None)
    return None


def _collect(error: BaseException | str) -> tuple[list[str], bool, str | None]:
    """Texts of the error and its causes, whether LiteLLM typed it as an overflow, its provider."""
    if isinstance(error, str):
        return [error], False, None
    texts: list[str] = []
    typed = False
    provider: str | None = None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        # By class name, so this module needs no LiteLLM import to recognise LiteLLM's type.
        typed = typed or any(c.__name__ == "ContextWindowExceededError" for c in type(current).__mro__)
        attr = getattr(current, "llm_provider", None)
        if provider is None and isinstance(attr, str) and attr:
            provider = attr
        texts.append(_safe_str(current))
        body = getattr(current, "body", None)
        if isinstance(body, dict | list):
            texts.append(json.dumps(body, default=str)[:_MAX_TEXT])
        current = current.__cause__ or current.__context__
    return texts, typed, provider


def _safe_str(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:_MAX_TEXT]
    except Exception:  # a broken __str__ must not hide the overflow of its cause
        return type(exc).__name__


def _marker_before(text: str, end: int) -> str | None:
    name: str | None = None
    for marker in _PROVIDER_MARKERS.finditer(text, 0, end):
        name = marker.group("name").lower()
    return _MARKER_NAMES.get(name, name) if name else None


_INPUT_TOKENS: Final = re.compile(
    rf"(?:prompt contains|request has|resulted in) (?P<n>{_NUM}) (?:input )?tokens",
    re.IGNORECASE,
)
_REQUESTED: Final = re.compile(rf"you requested (?:about )?(?P<n>{_NUM}) tokens", re.IGNORECASE)
_OUTPUT_PART: Final = re.compile(rf"(?P<n>{_NUM}) (?:in|for) the (?:completion|output)", re.IGNORECASE)


def _actual(match: re.Match[str], text: str) -> int | None:
    """The input tokens: from the pattern itself, else from the sentence that follows it.

    "you requested 5000 tokens (4000 in the messages, 1000 in the completion)" counts the
    requested output too; the input is the total minus that part.
    """
    direct = _int(match.groupdict().get("actual"))
    if direct is not None or "max" not in match.re.groupindex:
        return direct
    tail = text[match.end() : match.end() + 400]
    found = _INPUT_TOKENS.search(tail)
    if found:
        return _int(found.group("n"))
    requested = _REQUESTED.search(tail)
    total = _int(requested.group("n")) if requested else None
    output = _OUTPUT_PART.search(tail)
    if total is not None and output is not None:
        return total - (_int(output.group("n")) or 0)
    return total


def _int(value: str | None) -> int | None:
    if not value:
        return None
    digits = value.replace(",", "")
    return int(digits) if digits.isdigit() else None
