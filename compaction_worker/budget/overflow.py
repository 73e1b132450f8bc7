"""Recognise a provider's "your input does not fit the context window" error and read its numbers.

Rate limits, quotas and output caps are rejected: compacting the history does not fix them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit


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
_TGI_INPUTS = r"`?inputs?`?"


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
    # Hugging Face TGI's router (also behind Inference Endpoints and LiteLLM's huggingface/);
    # releases before 0.9 wrote the names without backticks, and "input" for "inputs".
    _p(
        rf"{_TGI_INPUTS} tokens \+ `?max_new_tokens`? must be <= {_MAX}\. Given: {_ACT} {_TGI_INPUTS} tokens",
        "huggingface",
    ),
    _p(rf"{_TGI_INPUTS} must have less than {_MAX} tokens\. Given: {_ACT}", "huggingface"),
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
    # HTTP 413: the body is too large (Anthropic's request_too_large, gateways, web servers).
    _p(r"request_too_large", "anthropic"),
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
    # A bare 413, last: any wording above says more about who refused and why.
    _p(r"request entity too large|payload too large", None),
    _p(r"\A\W{0,3}413\b|(?:error|status|code|http(?:/[\d.]+)?)(?: code)?\W{0,3}413\b", None),
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
    r"|openrouter|deepseek|groq|xai|cohere|huggingface|openai)(?:error|exception)\b",
    re.IGNORECASE,
)
_MARKER_NAMES: Final = {"vertexai": "vertex_ai", "hosted_vllm": "vllm"}

# What the SDKs of hosts that relay another vendor's wording add around it: Azure's .NET
# and Python SDKs ("Azure.RequestFailedException", azure-core's "(code) message\nCode:
# code", the "model_error" status), botocore and Bedrock's own framing.
_HOSTS: Final = (
    (
        "azure",
        re.compile(
            r"\bazure\b|\bmodel_error\b|^\((?P<code>[a-z_]+)\) .*\nCode: (?P=code)\b",
            re.IGNORECASE | re.MULTILINE,
        ),
    ),
    (
        "bedrock",
        re.compile(
            r"\bbedrock\b|ValidationException|the model returned the following errors"
            r"|when calling the (?:InvokeModel\w*|Converse\w*) operation",
            re.IGNORECASE,
        ),
    ),
)
_URL_HOSTS: Final = (
    ((".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com"), "azure"),
    ((".amazonaws.com",), "bedrock"),
    (("aiplatform.googleapis.com",), "vertex_ai"),
)
_STATUS_KEYS: Final = frozenset({"status", "status_code", "statuscode", "httpstatuscode", "code"})

_MAX_TEXT = 50_000  # error texts can embed whole request bodies; the verdict is near the top
_MAX_CHAIN = 8
_MAX_DEPTH = 6

ErrorInput = BaseException | str | Mapping[str, Any] | Sequence[Any]
"""An exception, its text, or a provider's error body as parsed JSON (nested dicts and lists)."""


def detect_overflow(error: ErrorInput) -> OverflowInfo | None:
    """Return what the error says about a context overflow, or None when it is no overflow."""
    texts, typed, attr_provider = _collect(error)
    text = "\n".join(texts)[:_MAX_TEXT]
    blocked = _NOT_OVERFLOW.search(text) is not None
    for pattern in _PATTERNS:
        match = pattern.regex.search(text)
        if match is None or (blocked and not pattern.strong):
            continue
        provider = _marker_before(text, match.start()) or attr_provider or _host_in(text) or pattern.provider
        if not pattern.numbers_are_tokens:
            return OverflowInfo(provider, None, None)
        return OverflowInfo(provider, _actual(match, text), _int(match.groupdict().get("max")))
    if typed:
        return OverflowInfo(_marker_before(text, len(text)) or attr_provider or _host_in(text), None, None)
    return None


def _collect(error: ErrorInput) -> tuple[list[str], bool, str | None]:
    """Texts of the error and its causes, whether it is typed as an overflow, its provider.

    Typed: LiteLLM's ContextWindowExceededError, or an HTTP status of 413 on an exception
    (or its response) or in an error body. The texts are each exception's message, its
    ``body`` and its ``response``'s text, so the verdict does not depend on how a client
    library words its messages.
    """
    if isinstance(error, str):
        return [error], False, None
    if not isinstance(error, BaseException):
        return [_dump(error)], _has_413(error), None
    texts: list[str] = []
    typed = False
    provider: str | None = None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        # By class name, so this module needs no LiteLLM import to recognise LiteLLM's type.
        typed = typed or any(c.__name__ == "ContextWindowExceededError" for c in type(current).__mro__)
        typed = typed or _status_of(current) == 413
        attr = getattr(current, "llm_provider", None)
        if provider is None and isinstance(attr, str) and attr:
            provider = attr
        provider = provider or _url_provider(current)
        texts.append(_safe_str(current))
        # The provider's own words: SDKs keep the body parsed (JSON) or as text, and the
        # HTTP response beside it; exception messages may leave the body out entirely.
        body = _safe_attr(current, "body")
        if isinstance(body, dict | list):
            texts.append(_dump(body))
            typed = typed or _has_413(body)
        elif isinstance(body, str):
            texts.append(body[:_MAX_TEXT])
        response_text = _safe_attr(_safe_attr(current, "response"), "text")
        if isinstance(response_text, str):
            texts.append(response_text[:_MAX_TEXT])
        current = current.__cause__ or current.__context__
    return list(dict.fromkeys(texts)), typed, provider


def _dump(body: object) -> str:
    try:
        return json.dumps(body, default=str, ensure_ascii=False)[:_MAX_TEXT]
    except (TypeError, ValueError, RecursionError):  # a circular or unserialisable body
        return repr(body)[:_MAX_TEXT]


def _has_413(body: object, depth: int = 0) -> bool:
    """Whether a parsed error body says 413 under a status or code key, at any nesting."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(body, Mapping):
        for key, value in body.items():
            if str(key).lower().lstrip("$") in _STATUS_KEYS and _is_413(value):
                return True
            if isinstance(value, Mapping | list) and _has_413(value, depth + 1):
                return True
        return False
    if isinstance(body, list):
        return any(_has_413(item, depth + 1) for item in body[:50])
    return False


def _is_413(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value == 413) or value == "413"


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK's exception carries (openai, anthropic, LiteLLM, httpx, aiohttp)."""
    for holder in (exc, _safe_attr(exc, "response")):
        for name in ("status_code", "status"):
            value = _safe_attr(holder, name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _url_provider(exc: BaseException) -> str | None:
    """The host the failed request went to, from the request an SDK's exception keeps."""
    request = _safe_attr(exc, "request") or _safe_attr(_safe_attr(exc, "response"), "request")
    url = _safe_attr(request, "url")
    if url is None:
        return None
    host = (urlsplit(str(url)).hostname or "").lower()
    for suffixes, name in _URL_HOSTS:
        if host.endswith(suffixes) and (name != "bedrock" or host.startswith("bedrock")):
            return name
    return None


def _safe_attr(obj: object, name: str) -> Any:
    # httpx raises RuntimeError for a response's missing request; SDK objects are not ours.
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _host_in(text: str) -> str | None:
    for name, regex in _HOSTS:
        if regex.search(text):
            return name
    return None


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
