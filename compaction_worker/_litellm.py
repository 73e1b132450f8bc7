"""The one place that loads LiteLLM, set up for a process without internet access.

Importing this module is cheap: it fixes the environment LiteLLM and tiktoken read (the
local model map, the bundled tokenizer files) without importing LiteLLM, which takes
seconds. ``load()`` imports LiteLLM the first time a window lookup or an LLM call needs it
(a worker loads it off the event loop at start: ``runtime.worker.warm_up``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

# LiteLLM fetches its model map from the network on import unless this is set.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _bundled_tokenizers() -> Path:
    """LiteLLM's bundled tiktoken files, found without importing LiteLLM."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise ModuleNotFoundError("litellm")
    return Path(spec.submodule_search_locations[0]) / "litellm_core_utils" / "tokenizers"


# What LiteLLM's default_encoding module sets on import (a custom directory wins), set here
# before tiktoken is first asked for an encoding, so counting works offline without LiteLLM.
os.environ["TIKTOKEN_CACHE_DIR"] = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or str(_bundled_tokenizers())

TIKTOKEN_CACHE_DIR = Path(os.environ["TIKTOKEN_CACHE_DIR"])
"""Where tiktoken reads its encodings from in this process."""


@functools.cache
def load() -> Any:
    """LiteLLM, imported on first use."""
    module = importlib.import_module("litellm")
    # "Provider List: ..." banners on stdout for every unmapped model otherwise.
    module.suppress_debug_info = True  # type: ignore[attr-defined]  # LiteLLM's flag, not in ModuleType
    return module


def __getattr__(name: str) -> Any:
    # ``from compaction_worker._litellm import litellm`` loads it on first use.
    if name == "litellm":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TIKTOKEN_CACHE_DIR", "load"]
