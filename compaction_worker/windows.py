"""The context-window registry: how many input tokens a model accepts, and where that came from.

Priority: the event's ``context_window``, then ``budget.window_overrides``, then LiteLLM's
bundled model map, then ``budget.fallback_window`` (logged once per model). Nothing here
raises for an unknown or malformed model string; it falls back instead.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from compaction_worker._litellm import litellm
from compaction_worker.settings import BudgetSettings

log = logging.getLogger(__name__)

DEFAULT_FALLBACK_WINDOW = 32_768
"""The fallback when ``fallback_window`` is unset: small enough to be safe for most models."""

# Longer strings are not model names; they would only bloat the caches and the logs.
_MAX_MODEL_LEN = 256
_MAX_WARNED = 4096
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

# LiteLLM asks these providers' servers (or the Hugging Face Hub) when looking a model up;
# the budget check must stay offline and fast, so for them only the bundled map counts.
_DYNAMIC_PROVIDERS = frozenset({"ollama", "ollama_chat", "huggingface", "lemonade"})

_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
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
    fallback = settings.fallback_window or DEFAULT_FALLBACK_WINDOW
    _warn_once(model, fallback)
    return WindowInfo(model, fallback, None, "fallback")


def is_known_model(model: str) -> bool:
    """Whether LiteLLM's bundled registry knows ``model`` (directly or through an alias)."""
    return _registry(model) is not None


def _override(model: str, overrides: dict[str, int]) -> int | None:
    if not overrides:
        return None
    for name in (model, model.strip(), _strip_provider(model.strip())):
        value = overrides.get(name)
        if value is not None and value > 0:
            return value
    return None


def _strip_provider(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def _warn_once(model: str, fallback: int) -> None:
    if model in _warned:
        return
    if len(_warned) >= _MAX_WARNED:
        # Model strings come from events; an unbounded set would be a memory leak.
        _warned.clear()
    _warned.add(model)
    log.warning(
        "unknown model %r: no context window in the registry, using %d tokens",
        model[:_MAX_MODEL_LEN],
        fallback,
    )


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
    return None


def _lookup(name: str) -> tuple[int, int | None] | None:
    provider = name.split("/", 1)[0].lower() if "/" in name else ""
    try:
        if provider in _DYNAMIC_PROVIDERS:
            info = litellm.model_cost.get(name) or {}
        else:
            info = litellm.get_model_info(name)
    except Exception:  # LiteLLM raises several types for unmapped or malformed names.
        return None
    # Some entries exist with every limit set to None (e.g. "o1-mini"): not a match.
    window = _positive(info.get("max_input_tokens")) or _positive(info.get("max_tokens"))
    if window is None:
        return None
    return window, _positive(info.get("max_output_tokens"))


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
    (Anthropic's dated Claude 3.x ids survive only as Bedrock or Vertex ids), and providers'
    names without LiteLLM's prefix ("mistral-large-latest").
    """
    name = model.strip()
    parts = [p for p in name.split("/") if p]
    names = [name] + ["/".join(parts[i:]) for i in range(len(parts))]
    base = parts[-1] if parts else ""
    lower = base.lower()
    if lower.startswith("claude"):
        names.append(f"anthropic/{base}")
        dated = _DATED.match(base)
        stem = dated.group("stem") if dated else base
        if dated and dated.group("date") != "latest":
            date = dated.group("date")
            names += [f"anthropic.{base}-v1:0", f"anthropic.{base}-v2:0"]
            names.append(f"vertex_ai/{stem}@{date}")
        names.append(f"vertex_ai/{stem}")
    elif lower.startswith(("gemini", "gemma")):
        names += [f"gemini/{base}", f"vertex_ai/{base}"]
    elif lower.startswith(_MISTRAL_FAMILY):
        names.append(f"mistral/{base}")
    elif _OPENAI_FAMILY.match(lower):
        # OpenAI's own entry is sometimes empty where Azure's is not (e.g. o1-mini).
        names += [f"openai/{base}", f"azure/{base}"]
    if lower != base:
        names.append(lower)
    return [n for n in dict.fromkeys(names) if n]
