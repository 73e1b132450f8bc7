"""The context-window registry: how many input tokens a model accepts, and where that came from.

Priority: the event's ``context_window``, ``budget.window_overrides``, LiteLLM's model map
(under any of a model's spellings), ``budget.fallback_window``. Nothing here raises or logs.

The map is LiteLLM's bundled file, read without importing LiteLLM (seconds a process); a name
is looked up as LiteLLM's own provider rules would match it (``_lookup``), and
``tests/budget/test_windows.py`` compares the result with ``litellm.get_model_info``.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from compaction_worker import _litellm
from compaction_worker.settings import BudgetSettings

DEFAULT_FALLBACK_WINDOW = 32_768
"""The fallback when ``fallback_window`` is unset: small enough to be safe for most models."""

# Longer strings are not model names; they would only bloat the caches.
_MAX_MODEL_LEN = 256
_DATED = re.compile(r"^(?P<stem>.+?)-(?P<date>\d{8}|latest)$")
_MISTRAL_FAMILY = (
    "mistral",
    "open-mistral",
    "open-mixtral",
    "mixtral",
    "codestral",
    "ministral",
    "magistral",
    "devstral",
    "pixtral",
)
_OPENAI_FAMILY = re.compile(r"^(gpt-|chatgpt-|o\d(-|$)|text-embedding-)")
# Bedrock's cross-region inference profiles put the region before the vendor.
_BEDROCK_REGION = re.compile(r"^(?:us|eu|apac|global|au|jp|ca|us-gov)\.(?P<rest>.+)$")
# Vendor (and region) prefixes of host-specific ids: "us.anthropic.", "meta.", "amazon.".
# Letters only, so that "gpt-4.1" or "llama3.1" keep their dots.
_VENDOR_DOTS = re.compile(r"^(?:[a-z]+(?:-[a-z]+)*\.)+")
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+)?$")
_VERTEX_VERSION = re.compile(r"(?:-v\d+)?@(?P<tag>\w+)$")
_OLLAMA_TAG = re.compile(r":[\w.-]+$")
_DIGIT_DOT = re.compile(r"(?<=\d)\.(?=\d)")
# OpenRouter's order, "gemini-pro-1.5", for Google's "gemini-1.5-pro".
_GEMINI_TIER_FIRST = re.compile(
    r"^gemini-(?P<tier>pro|flash-lite|flash)-(?P<version>\d+(?:\.\d+)?)(?P<rest>-.*)?$"
)
_GEMINI = re.compile(r"^gemini-(?P<version>\d+(?:\.\d+)?)-(?P<tier>pro|flash-lite|flash)(?:-|$)")
# Map entries that describe chat models (others, such as embeddings, share names with them).
_CHAT_MODES = frozenset({"chat", "completion", "responses", None})


@dataclass(slots=True)
class WindowInfo:
    """A model's context window (max input tokens) and the source it was resolved from."""

    model: str
    window: int
    """Max input tokens."""
    max_output_tokens: int | None
    source: Literal["event", "override", "registry", "fallback", "provider"]
    """``provider``: a provider's overflow error stated a smaller maximum than the others did."""


def resolve_window(model: str, settings: BudgetSettings, event_window: int | None = None) -> WindowInfo:
    """The window for ``model``: event, then configured override, then registry, then fallback.

    Never raises. With ``fallback_window`` unset (the deployment rejects unknown models) the
    result still says ``source="fallback"``, with :data:`DEFAULT_FALLBACK_WINDOW`, so that the
    caller can reject the event and anything already accepted keeps a usable budget.
    """
    known = _registry(model)
    max_output = known[1] if known else None
    if event_window is not None and event_window > 0:
        return WindowInfo(model, event_window, max_output, "event")
    override = _override(model, settings.window_overrides)
    if override is not None:
        return WindowInfo(model, override, max_output, "override")
    if known is not None:
        return WindowInfo(model, known[0], max_output, "registry")
    return WindowInfo(model, settings.fallback_window or DEFAULT_FALLBACK_WINDOW, None, "fallback")


def known_window(model: str) -> int | None:
    """``model``'s window in LiteLLM's bundled registry (under any of its spellings), None when unknown."""
    known = _registry(model)
    return known[0] if known else None


def _override(model: str, overrides: dict[str, int]) -> int | None:
    if not overrides:
        return None
    for name in (model, model.strip(), model.strip().rsplit("/", 1)[-1]):
        value = overrides.get(name)
        if value is not None and value > 0:
            return value
    return None


def _registry(model: str) -> tuple[int, int | None] | None:
    """``(window, max_output_tokens)`` from LiteLLM's bundled map, or None when unknown."""
    if len(model) > _MAX_MODEL_LEN:
        return None
    return _registry_cached(model)


@lru_cache(maxsize=1024)
def _registry_cached(model: str) -> tuple[int, int | None] | None:
    for name in _candidates(model):
        found = _lookup(name)
        if found is not None:
            return found
    return _by_base_name(model) or _gemini_tier(model)


def _lookup(name: str) -> tuple[int, int | None] | None:
    """``name``'s limits in the map (:func:`_entry`)."""
    info = _entry(name)
    return None if info is None else _limits(info)


def _limits(info: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """A map entry's ``(window, max_output_tokens)``; None when it states no window."""
    # Some entries exist with every limit set to None (e.g. "o1-mini"): not a match.
    window = _positive(info.get("max_input_tokens")) or _positive(info.get("max_tokens"))
    if window is None:
        return None
    return window, _positive(info.get("max_output_tokens"))


def _entry(name: str) -> Mapping[str, Any] | None:
    """``name``'s own entry, or for "provider/model" the entry of "model" when that entry
    belongs to the provider (LiteLLM's provider match)."""
    entries = _litellm.model_map()
    info = entries.get(name)
    if info is None and "/" in name:
        provider, rest = name.split("/", 1)
        entry = entries.get(rest)
        if entry is not None and _same_provider(provider.lower(), entry.get("litellm_provider")):
            info = entry
    return info


def priced_entry(model: str) -> Mapping[str, Any] | None:
    """The map entry that prices ``model`` (under the first of its spellings listed with an
    input price, as for its window), None when the map prices none of them."""
    if len(model) > _MAX_MODEL_LEN:
        return None
    return _priced_cached(model)


@lru_cache(maxsize=1024)
def _priced_cached(model: str) -> Mapping[str, Any] | None:
    for name in _candidates(model):
        entry = _entry(name)
        if entry is not None and _positive_price(entry.get("input_cost_per_token")):
            return entry
    return None


def _positive_price(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def _same_provider(provider: str, listed: object) -> bool:
    """Whether an entry listed under ``listed`` serves "provider/..." (LiteLLM's
    ``_check_provider_match``: Vertex, Fireworks and Bedrock families, a LiteLLM proxy serves
    any, Azure AI serves Azure's and OpenAI's)."""
    if not isinstance(listed, str) or listed == provider:
        return True
    if provider in ("vertex_ai", "fireworks_ai"):
        return listed.startswith(provider)
    if provider.startswith("bedrock"):
        return listed.startswith("bedrock")
    if provider in ("litellm_proxy", "github"):
        return True
    return provider == "azure_ai" and listed in ("azure", "openai")


def _positive(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 1:
        return None
    return int(value)


def _candidates(model: str) -> list[str]:
    """Names to try in LiteLLM's map, most specific first.

    LiteLLM's map misses many names runtimes actually send: router prefixes
    ("openrouter/openai/gpt-4o"), first-party names it only keeps under another host
    (Anthropic's dated Claude 3.x ids survive only as Bedrock or Vertex ids), providers'
    names without LiteLLM's prefix ("mistral-large-latest"), Bedrock regions it does not
    list, Ollama tags ("llama3.1:8b") and OpenRouter's dotted versions ("claude-3.5-sonnet").
    """
    name = model.strip()
    parts = [p for p in name.split("/") if p]
    names = [name] + ["/".join(parts[i:]) for i in range(len(parts))]
    base = parts[-1] if parts else ""
    if (region := _BEDROCK_REGION.match(base)) is not None:
        names.append(region.group("rest"))  # the id without its cross-region profile
        base = _VENDOR_DOTS.sub("", _BEDROCK_VERSION.sub("", base))
    elif base.startswith("anthropic."):
        base = _BEDROCK_VERSION.sub("", base.removeprefix("anthropic."))
    if parts and parts[0].lower() in ("ollama", "ollama_chat"):
        bare = _OLLAMA_TAG.sub("", "/".join(parts[1:]))
        names += [f"ollama/{'/'.join(parts[1:])}", f"ollama/{bare}"]
    lower = base.lower()
    if lower.startswith("claude"):
        base = _DIGIT_DOT.sub("-", base)
        names.append(f"anthropic/{base}")
        dated = _DATED.match(base)
        stem = dated.group("stem") if dated else base
        if dated and dated.group("date") != "latest":
            date = dated.group("date")
            names += [f"anthropic.{base}-v1:0", f"anthropic.{base}-v2:0"]
            names.append(f"vertex_ai/{stem}@{date}")
        names.append(f"vertex_ai/{stem}")
    elif lower.startswith(("gemini", "gemma")):
        if (reordered := _GEMINI_TIER_FIRST.match(lower)) is not None:
            base = f"gemini-{reordered['version']}-{reordered['tier']}{reordered['rest'] or ''}"
        names += [f"gemini/{base}", f"vertex_ai/{base}"]
    elif lower.startswith(_MISTRAL_FAMILY):
        names.append(f"mistral/{base}")
        if not _DATED.match(base) and not re.search(r"-\d{4}$", base):
            names.append(f"mistral/{base}-latest")  # OpenRouter's "mistralai/mistral-large"
    elif lower.startswith("grok"):
        names.append(f"xai/{base}")
    elif _OPENAI_FAMILY.match(lower):
        # OpenAI's own entry is sometimes empty where Azure's is not (e.g. o1-mini).
        names += [f"openai/{base}", f"azure/{base}"]
    if lower != base:
        names.append(lower)
    return [n for n in dict.fromkeys(names) if n]


def base_name(model: str) -> str:
    """A model's name without host, region, vendor prefix, version suffix or tag, lower case.

    "bedrock/us.anthropic.claude-3-5-sonnet-20241022-v2:0",
    "vertex_ai/claude-3-5-sonnet-v2@20241022" and "claude-3-5-sonnet-20241022" all become
    "claude-3-5-sonnet-20241022"; "openrouter/anthropic/claude-3.5-sonnet" becomes
    "claude-3-5-sonnet"; "ollama/llama3.1:8b" becomes "llama3.1".
    """
    base = model.strip().rsplit("/", 1)[-1].lower()
    if base.startswith("ft:"):
        return ""  # a fine-tune's id: its own model, not the base model's
    base = _VENDOR_DOTS.sub("", base)
    if (vertex := _VERTEX_VERSION.search(base)) is not None:
        tag = vertex.group("tag")
        base = base[: vertex.start()] + (f"-{tag}" if tag.isdigit() else "")
    base = _OLLAMA_TAG.sub("", _BEDROCK_VERSION.sub("", base))
    if base.startswith("claude"):
        base = _DIGIT_DOT.sub("-", base)
    if (reordered := _GEMINI_TIER_FIRST.match(base)) is not None:
        base = f"gemini-{reordered['version']}-{reordered['tier']}{reordered['rest'] or ''}"
    return base


@lru_cache(maxsize=1)
def _base_index() -> dict[str, tuple[int, int | None]]:
    """Every chat model in LiteLLM's map by :func:`base_name`, with one window each.

    Where several hosts list one model, the window most of them list wins (the smaller on
    a tie): one host that caps the context far below the model's own must not decide.
    """
    found: defaultdict[str, list[tuple[int, int | None]]] = defaultdict(list)
    for key, info in _litellm.model_map().items():
        if info.get("mode") not in _CHAT_MODES:
            continue
        known = _limits(info)
        base = base_name(key)
        if known is not None and base:
            found[base].append(known)
    index: dict[str, tuple[int, int | None]] = {}
    for base, limits in found.items():
        counts = Counter(window for window, _ in limits)
        window = min(counts, key=lambda w: (-counts[w], w))
        outputs = [out for w, out in limits if w == window and out is not None]
        index[base] = (window, min(outputs) if outputs else None)
    return index


def _by_base_name(model: str) -> tuple[int, int | None] | None:
    """LiteLLM's window for the same model under any host ("groq/llama-3.3-70b-versatile")."""
    base = base_name(model)
    if not base:
        return None
    index = _base_index()
    return index.get(base) or index.get(base.removesuffix("-latest"))


def _gemini_tier(model: str) -> tuple[int, int | None] | None:
    """A Gemini version LiteLLM no longer lists, as its tier's ``-latest`` entry.

    Google retired Gemini 1.5 and 2.0 and LiteLLM's map dropped them; every Gemini since
    1.5 accepts at least the tier's current window (1.5 Pro took twice as much), so the
    tier's alias is a window the model is known to accept, not a guess above it.
    """
    match = _GEMINI.match(base_name(model))
    if match is None or float(match.group("version")) < 1.5:
        return None  # Gemini 1.0 had 32K: no later tier speaks for it
    return _lookup(f"gemini/gemini-{match.group('tier')}-latest")
