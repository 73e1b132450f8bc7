"""The one place that loads LiteLLM, set up for a process without internet access.

Importing this module is cheap: it fixes the environment LiteLLM and tiktoken read (the
local model map, the bundled tokenizer files) without importing LiteLLM, which takes
seconds. ``model_map()`` reads LiteLLM's bundled model map without importing it (the window
registry needs nothing else); ``load()`` imports LiteLLM the first time an LLM call needs it
(a worker starts that on a thread once it consumes, ``runtime.worker.start_loading_litellm``,
and ``loaded()`` waits for it off the event loop).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

# LiteLLM fetches its model map from the network on import unless this is set.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _package_dir() -> Path:
    """LiteLLM's installed package directory, found without importing LiteLLM."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise ModuleNotFoundError("litellm")
    return Path(spec.submodule_search_locations[0])


# What LiteLLM's default_encoding module sets on import (a custom directory wins, else its
# bundled files), set here before tiktoken is first asked for an encoding, so counting works
# offline without LiteLLM.
os.environ["TIKTOKEN_CACHE_DIR"] = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or str(
    _package_dir() / "litellm_core_utils" / "tokenizers"
)

TIKTOKEN_CACHE_DIR = Path(os.environ["TIKTOKEN_CACHE_DIR"])
"""Where tiktoken reads its encodings from in this process."""


MODEL_MAP_FILE = "model_prices_and_context_window_backup.json"
"""LiteLLM's bundled model map: what ``litellm.model_cost`` holds offline."""


@functools.cache
def model_map() -> dict[str, dict[str, Any]]:
    """LiteLLM's bundled model map (name to limits and prices), read without importing LiteLLM.

    Its ``alias_of`` entries ("claude-haiku-latest") are resolved to the entry they name.
    ~30 ms, against seconds for importing LiteLLM: the window registry reads this, so a
    worker consumes before LiteLLM has loaded.
    """
    raw = json.loads((_package_dir() / MODEL_MAP_FILE).read_text(encoding="utf-8"))
    entries = {k: v for k, v in raw.items() if isinstance(v, dict) and k != "sample_spec"}
    for name in list(entries):
        entry, seen = entries[name], {name}
        while isinstance(target := entry.get("alias_of"), str) and target not in seen:
            seen.add(target)
            entry = entries.get(target, {})
        entries[name] = entry
    return {k: v for k, v in entries.items() if "alias_of" not in v and v}


@functools.cache
def load() -> Any:
    """LiteLLM, imported on first use (seconds: off the event loop, see :func:`loaded`)."""
    module = importlib.import_module("litellm")
    # "Provider List: ..." banners on stdout for every unmapped model otherwise.
    module.suppress_debug_info = True  # type: ignore[attr-defined]  # LiteLLM's flag, not in ModuleType
    return module


async def loaded() -> Any:
    """LiteLLM, imported on a thread the first time so that the event loop keeps running.

    A worker starts the import once it consumes (``runtime.worker.start_loading_litellm``); a
    compaction that needs LiteLLM before it ends waits here for it instead of importing it on the
    loop (which stalled lock renewals for seconds).
    """
    if load.cache_info().currsize:
        return load()
    return await asyncio.to_thread(load)


def __getattr__(name: str) -> Any:
    # ``from compaction_worker._litellm import litellm`` loads it on first use.
    if name == "litellm":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODEL_MAP_FILE", "TIKTOKEN_CACHE_DIR", "load", "loaded", "model_map"]
